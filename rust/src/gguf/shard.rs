//! One GGUF file: header, metadata, tensor infos and the mapped data section
//! (docs/FORMATS.md §1). All arithmetic on sizes is overflow-checked and every tensor's bytes
//! must lie inside the file.

use super::cursor::Cursor;
use super::value::{read_value, Value, MAX_KEY_BYTES, MAX_METADATA_ELEMENTS};
use crate::error::{Error, Result};
use crate::quant::GgmlType;
use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
pub const MAX_TENSORS: u64 = 1 << 20;
pub const MAX_KV: u64 = 1 << 20;
pub const MAX_DIMS: usize = 4;
pub const MAX_TENSOR_NAME: usize = 63;
/// Up-front reservations are capped here; larger tables grow as their entries are read, so a
/// crafted count costs memory only in proportion to the bytes that back it.
const PREALLOC_CAP: usize = 4096;

/// Where a tensor is and what it holds. `dims` are ggml `ne` (dims[0] fastest).
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<u64>,
    /// Index of the shard holding the bytes.
    pub shard: usize,
    /// Absolute byte offset inside that shard's file.
    pub offset: usize,
    pub nbytes: usize,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Numpy order: the dims reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// The bytes behind a shard: a read-only map of its file, or an owned buffer
/// (`gguf::parse_bytes`, fuzzing). Both parse through the same code.
pub enum ShardBytes {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for ShardBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ShardBytes::Map(m) => m,
            ShardBytes::Owned(v) => v,
        }
    }
}

pub struct Shard {
    /// The file's path, or for an in-memory shard the name its errors carry.
    pub path: PathBuf,
    pub map: Arc<ShardBytes>,
    pub version: u32,
    pub alignment: u64,
    pub data_offset: u64,
    /// Metadata in file order.
    pub kv: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
}

fn io_err(path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

impl Shard {
    pub fn open(path: &Path, shard_index: usize) -> Result<Shard> {
        // the kind first: opening a FIFO (or a device) for reading may block for good
        let kind = std::fs::metadata(path).map_err(|e| io_err(path, e))?;
        if !kind.is_file() {
            return Err(Error::gguf(path, 0, "not a regular file"));
        }
        let file = File::open(path).map_err(|e| io_err(path, e))?;
        let meta = file.metadata().map_err(|e| io_err(path, e))?;
        if !meta.is_file() {
            return Err(Error::gguf(path, 0, "not a regular file"));
        }
        if meta.len() < 24 {
            return Err(Error::gguf(
                path,
                meta.len(),
                "file is too short for a GGUF header",
            ));
        }
        // SAFETY: the map is read-only; the file is not ours to modify. A file truncated by
        // another process while mapped is outside what any reader can defend against.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| io_err(path, e))?;
        Self::parse(path, Arc::new(ShardBytes::Map(map)), shard_index)
    }

    /// Parses a shard held in memory; `name` stands for the path in errors.
    pub fn from_bytes(name: &Path, bytes: Vec<u8>, shard_index: usize) -> Result<Shard> {
        Self::parse(name, Arc::new(ShardBytes::Owned(bytes)), shard_index)
    }

    fn parse(path: &Path, map: Arc<ShardBytes>, shard_index: usize) -> Result<Shard> {
        let buf: &[u8] = &map;
        let mut c = Cursor::new(buf, path);
        let magic = c.array::<4>("magic")?;
        if &magic != GGUF_MAGIC {
            return Err(c.err(0, format!("bad magic {magic:02x?}, expected \"GGUF\"")));
        }
        let version = c.u32("version")?;
        if version != 0 && version & 0xFFFF == 0 {
            return Err(c.err(
                4,
                format!("version field {version:#010x}: a big-endian GGUF; only little-endian files are supported"),
            ));
        }
        if !(2..=3).contains(&version) {
            return Err(c.err(
                4,
                format!("unsupported GGUF version {version} (2 and 3 are read)"),
            ));
        }
        let n_tensors = c.u64("tensor count")?;
        if n_tensors > MAX_TENSORS {
            return Err(c.err(
                8,
                format!("tensor count {n_tensors} exceeds the cap of {MAX_TENSORS}"),
            ));
        }
        let n_kv = c.u64("metadata count")?;
        if n_kv > MAX_KV {
            return Err(c.err(
                16,
                format!("metadata count {n_kv} exceeds the cap of {MAX_KV}"),
            ));
        }
        // Each KV needs at least 12 bytes (key length + value type) and each tensor info 24:
        // refuse counts the file cannot hold before reserving anything.
        let min_need = n_kv
            .saturating_mul(12)
            .saturating_add(n_tensors.saturating_mul(24));
        if min_need > c.remaining() as u64 {
            return Err(c.err(
                8,
                format!(
                "{n_kv} metadata entries and {n_tensors} tensors cannot fit in the {} bytes left",
                c.remaining()
            ),
            ));
        }

        let kv_cap = (n_kv as usize).min(PREALLOC_CAP);
        let mut kv: Vec<(String, Value)> = Vec::with_capacity(kv_cap);
        let mut seen: HashMap<String, ()> = HashMap::with_capacity(kv_cap);
        let mut elements_left = MAX_METADATA_ELEMENTS;
        for _ in 0..n_kv {
            let at = c.pos();
            let key = c.utf8("metadata key", MAX_KEY_BYTES)?;
            if key.is_empty() {
                return Err(c.err(at, "empty metadata key"));
            }
            let ty = c.u32("value type")?;
            let what = format!("value of {key:?}");
            let value = read_value(&mut c, ty, &what, 0, &mut elements_left)?;
            if seen.insert(key.to_string(), ()).is_some() {
                return Err(c.err(at, format!("duplicate metadata key {key:?}")));
            }
            kv.push((key.to_string(), value));
        }

        let mut alignment = DEFAULT_ALIGNMENT;
        if let Some((_, v)) = kv.iter().find(|(k, _)| k == "general.alignment") {
            match v {
                // at least 8 (the format's rule): f32 and f16 rows are read in place
                Value::U32(a) if *a >= 8 && a.is_power_of_two() => alignment = *a as u64,
                other => {
                    return Err(c.err(
                        0,
                        format!(
                            "general.alignment must be a power-of-two UINT32 of at least 8, \
                             found {other:?}"
                        ),
                    ))
                }
            }
        }

        struct Raw {
            at: usize,
            name: String,
            ty: GgmlType,
            dims: Vec<u64>,
            offset: u64,
        }
        let t_cap = (n_tensors as usize).min(PREALLOC_CAP);
        let mut raws: Vec<Raw> = Vec::with_capacity(t_cap);
        let mut names: HashMap<String, ()> = HashMap::with_capacity(t_cap);
        for _ in 0..n_tensors {
            let at = c.pos();
            let name = c.utf8("tensor name", MAX_KEY_BYTES)?;
            if name.len() > MAX_TENSOR_NAME {
                return Err(c.err(
                    at,
                    format!("tensor name {name:?} is longer than {MAX_TENSOR_NAME} bytes"),
                ));
            }
            let nd_at = c.pos();
            let n_dims = c.u32("tensor n_dims")? as usize;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(c.err(
                    nd_at,
                    format!("tensor {name:?}: n_dims {n_dims} not in 1..=4"),
                ));
            }
            let mut dims = Vec::with_capacity(n_dims);
            // The product of the dims with zeros read as 1 stays within i64, so no product of
            // any subset of them, in any order (shapes, strides), can overflow; a zero dim does
            // not excuse absurd other dims (fuzz finding 1, docs/FUZZING.md).
            let mut nel_nonzero: u64 = 1;
            for _ in 0..n_dims {
                let d_at = c.pos();
                let d = c.u64("tensor dim")?;
                if d > i64::MAX as u64 {
                    return Err(c.err(
                        d_at,
                        format!("tensor {name:?}: dimension {d} is negative as i64"),
                    ));
                }
                nel_nonzero = nel_nonzero
                    .checked_mul(d.max(1))
                    .filter(|&n| n <= i64::MAX as u64)
                    .ok_or_else(|| {
                        c.err(d_at, format!("tensor {name:?}: element count overflows"))
                    })?;
                dims.push(d);
            }
            let ty_at = c.pos();
            let ty_id = c.u32("tensor type")?;
            let ty = GgmlType::from_id(ty_id).ok_or_else(|| {
                c.err(ty_at, format!("tensor {name:?}: unknown ggml type {ty_id}"))
            })?;
            if dims[0] % ty.block_size() as u64 != 0 {
                return Err(c.err(
                    ty_at,
                    format!(
                    "tensor {name:?}: first dimension {} is not a multiple of the {} block size {}",
                    dims[0], ty.name(), ty.block_size()
                ),
                ));
            }
            let off_at = c.pos();
            let offset = c.u64("tensor offset")?;
            if offset % alignment != 0 {
                return Err(c.err(off_at, format!(
                    "tensor {name:?}: offset {offset} is not a multiple of the alignment {alignment}"
                )));
            }
            if names.insert(name.to_string(), ()).is_some() {
                return Err(c.err(at, format!("duplicate tensor name {name:?}")));
            }
            raws.push(Raw {
                at,
                name: name.to_string(),
                ty,
                dims,
                offset,
            });
        }

        let end_infos = c.pos() as u64;
        let data_offset = end_infos
            .checked_add((alignment - end_infos % alignment) % alignment)
            .ok_or_else(|| c.err(end_infos as usize, "data offset overflows"))?;
        let file_len = buf.len() as u64;
        if !raws.is_empty() && data_offset > file_len {
            return Err(c.err(
                end_infos as usize,
                format!(
                "data section starts at {data_offset}, past the end of the file ({file_len} bytes)"
            ),
            ));
        }

        let mut tensors = Vec::with_capacity(raws.len());
        for r in raws {
            let nel = r.dims.iter().product::<u64>();
            let (bs, ts) = r.ty.block();
            let nbytes = (nel / bs as u64).checked_mul(ts as u64);
            let start = data_offset.checked_add(r.offset);
            let end = match (start, nbytes) {
                (Some(s), Some(n)) => s.checked_add(n),
                _ => None,
            };
            match end {
                Some(e) if e <= file_len => {}
                _ => {
                    return Err(c.err(r.at, format!(
                        "tensor {:?} ({} bytes at data offset {}) extends past the end of the file ({} bytes)",
                        r.name,
                        nbytes.map_or("overflowing".to_string(), |n| n.to_string()),
                        r.offset,
                        file_len
                    )))
                }
            }
            tensors.push(TensorInfo {
                name: r.name,
                ty: r.ty,
                dims: r.dims,
                shard: shard_index,
                offset: start.unwrap() as usize,
                nbytes: nbytes.unwrap() as usize,
            });
        }
        // each tensor's bytes are its own: ranges that overlap (two names for one weight, or
        // a shifted offset) are a broken file
        let mut spans: Vec<(usize, usize, &str)> = tensors
            .iter()
            .filter(|t| t.nbytes > 0)
            .map(|t| (t.offset, t.offset + t.nbytes, t.name.as_str()))
            .collect();
        spans.sort_unstable();
        if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
            return Err(Error::gguf(
                path,
                w[1].0 as u64,
                format!("tensor {:?} overlaps tensor {:?}", w[1].2, w[0].2),
            ));
        }

        Ok(Shard {
            path: path.to_path_buf(),
            map,
            version,
            alignment,
            data_offset,
            kv,
            tensors,
        })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kv.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}
