//! GGUF v3 reader: one file or split shards, memory-mapped, with zero-copy tensor views.
//!
//! A split model (`<prefix>-00001-of-0000N.gguf`) may be opened from any shard's path; every
//! shard is opened, `split.no`/`split.count` are checked per shard, tensor names must be unique
//! across shards and their total must equal `split.tensors.count` (FORMATS.md §1).

mod cursor;
mod shard;
mod value;

pub use shard::{Shard, TensorInfo, DEFAULT_ALIGNMENT, MAX_DIMS};
pub use value::Value;

use crate::error::{Error, Result};
use memmap2::Mmap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct Gguf {
    pub shards: Vec<Shard>,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
}

/// `(prefix, shard number 1-based, count)` when the file name follows the split rule.
pub fn parse_split_name(path: &Path) -> Option<(String, u32, u32)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    // "<prefix>-NNNNN-of-MMMMM"
    if stem.len() < 15 {
        return None;
    }
    let (prefix, tail) = stem.split_at(stem.len() - 15);
    let b = tail.as_bytes();
    if b[0] != b'-' || &tail[6..10] != "-of-" {
        return None;
    }
    let no: u32 = tail[1..6].parse().ok()?;
    let count: u32 = tail[10..15].parse().ok()?;
    Some((prefix.to_string(), no, count))
}

pub fn split_path(dir: &Path, prefix: &str, no: u32, count: u32) -> PathBuf {
    dir.join(format!("{prefix}-{no:05}-of-{count:05}.gguf"))
}

fn split_u(shard: &Shard, key: &str) -> Result<Option<u64>> {
    match shard.get(key) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            Error::gguf(
                &shard.path,
                0,
                format!("{key} must be an integer, found {}", v.type_name()),
            )
        }),
    }
}

impl Gguf {
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref();
        let first = Shard::open(path, 0)?;
        let count = split_u(&first, "split.count")?.unwrap_or(1);
        if count <= 1 {
            let no = split_u(&first, "split.no")?.unwrap_or(0);
            if no != 0 {
                return Err(Error::gguf(
                    path,
                    0,
                    format!("split.no is {no} but split.count is {count}"),
                ));
            }
            return Self::from_shards(vec![first], None);
        }
        if count > 9999 {
            return Err(Error::gguf(
                path,
                0,
                format!("split.count {count} is implausible"),
            ));
        }
        let (prefix, _, name_count) = parse_split_name(path).ok_or_else(|| {
            Error::gguf(path, 0, format!(
                "file has split.count = {count} but its name does not follow <prefix>-NNNNN-of-MMMMM.gguf"
            ))
        })?;
        if name_count as u64 != count {
            return Err(Error::gguf(
                path,
                0,
                format!("file name says {name_count} shards but split.count is {count}"),
            ));
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let this_no = split_u(&first, "split.no")?.unwrap_or(0);
        let mut slots: Vec<Option<Shard>> = (0..count).map(|_| None).collect();
        if this_no >= count {
            return Err(Error::gguf(
                path,
                0,
                format!("split.no {this_no} is not below split.count {count}"),
            ));
        }
        let mut first = Some(first);
        for i in 0..count {
            let p = split_path(dir, &prefix, i as u32 + 1, count as u32);
            let shard = if i == this_no {
                let mut s = first.take().unwrap();
                s.tensors.iter_mut().for_each(|t| t.shard = i as usize);
                s
            } else {
                if !p.exists() {
                    return Err(Error::gguf(
                        &p,
                        0,
                        format!(
                            "missing shard {} of {count} (opened from {})",
                            i + 1,
                            path.display()
                        ),
                    ));
                }
                Shard::open(&p, i as usize)?
            };
            let no = split_u(&shard, "split.no")?;
            if no != Some(i) {
                return Err(Error::gguf(
                    &shard.path,
                    0,
                    format!(
                        "shard {} of {count} has split.no {no:?}, expected {i}",
                        i + 1
                    ),
                ));
            }
            let c = split_u(&shard, "split.count")?;
            if c != Some(count) {
                return Err(Error::gguf(
                    &shard.path,
                    0,
                    format!("shard {} has split.count {c:?}, expected {count}", i + 1),
                ));
            }
            slots[i as usize] = Some(shard);
        }
        let shards: Vec<Shard> = slots.into_iter().map(|s| s.unwrap()).collect();
        let expected = split_u(&shards[0], "split.tensors.count")?;
        Self::from_shards(shards, expected)
    }

    fn from_shards(shards: Vec<Shard>, expected: Option<u64>) -> Result<Gguf> {
        let mut tensors = Vec::new();
        let mut index = HashMap::new();
        for s in &shards {
            for t in &s.tensors {
                if index.insert(t.name.clone(), tensors.len()).is_some() {
                    return Err(Error::gguf(
                        &s.path,
                        0,
                        format!("tensor {:?} appears in more than one shard", t.name),
                    ));
                }
                tensors.push(t.clone());
            }
        }
        if let Some(n) = expected {
            if n != tensors.len() as u64 {
                return Err(Error::gguf(
                    &shards[0].path,
                    0,
                    format!(
                        "split.tensors.count is {n} but the shards hold {} tensors",
                        tensors.len()
                    ),
                ));
            }
        }
        Ok(Gguf {
            shards,
            tensors,
            index,
        })
    }

    pub fn path(&self) -> &Path {
        &self.shards[0].path
    }

    /// Metadata of the model: shard 0's key/values, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.shards[0].kv
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.shards[0].get(key)
    }

    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(Value::as_str)
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes, zero-copy from the map.
    pub fn data(&self, t: &TensorInfo) -> &[u8] {
        &self.shards[t.shard].map[t.offset..t.offset + t.nbytes]
    }

    pub fn map_of(&self, t: &TensorInfo) -> &Arc<Mmap> {
        &self.shards[t.shard].map
    }
}

#[cfg(test)]
mod tests;
