//! GGUF v3 reader: one file or split shards, memory-mapped, with zero-copy tensor views.
//!
//! A split model (`<prefix>-00001-of-0000N.gguf`) may be opened from any shard's path; every
//! shard is opened, `split.no`/`split.count` are checked per shard, tensor names must be unique
//! across shards and their total must equal `split.tensors.count` (docs/FORMATS.md §1).
//! `parse_bytes`/`parse_shards` run the same parser on bytes held in memory (fuzzing, tests).

mod cursor;
mod shard;
mod split;
mod value;

pub use shard::{Shard, ShardBytes, TensorInfo, DEFAULT_ALIGNMENT, MAX_DIMS, MAX_TENSORS};
pub use split::{parse_split_name, split_path, MAX_SPLITS};
pub use value::{Value, MAX_METADATA_ELEMENTS, MAX_STRING_BYTES};

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct Gguf {
    pub shards: Vec<Shard>,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
}

/// Parses one GGUF held in memory, exactly as `Gguf::open` parses a file; `name` stands for
/// the path in errors. A file that declares more than one shard is refused here (use
/// `parse_shards`).
pub fn parse_bytes(bytes: Vec<u8>, name: impl AsRef<Path>) -> Result<Gguf> {
    Gguf::from_shards(vec![Shard::from_bytes(name.as_ref(), bytes, 0)?])
}

/// Parses a split model held in memory: `(name, bytes)` per shard, in shard order.
pub fn parse_shards(parts: Vec<(PathBuf, Vec<u8>)>) -> Result<Gguf> {
    if parts.is_empty() {
        return Err(Error::gguf("<memory>", 0, "no shards given"));
    }
    let shards = parts
        .into_iter()
        .enumerate()
        .map(|(i, (name, bytes))| Shard::from_bytes(&name, bytes, i))
        .collect::<Result<Vec<_>>>()?;
    Gguf::from_shards(shards)
}

impl Gguf {
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref();
        let first = Shard::open(path, 0)?;
        let count = split::declared_count(&first)?;
        if count == 1 {
            return Self::from_shards(vec![first]);
        }
        let (paths, this_no) = split::shard_paths(path, &first, count)?;
        let mut first = Some(first);
        let mut shards = Vec::with_capacity(paths.len());
        for (i, p) in paths.iter().enumerate() {
            if i == this_no {
                shards.extend(first.take());
                continue;
            }
            if !p.exists() {
                return Err(Error::gguf(
                    p,
                    0,
                    format!(
                        "missing shard {} of {count} (opened from {})",
                        i + 1,
                        path.display()
                    ),
                ));
            }
            shards.push(Shard::open(p, i)?);
        }
        Self::from_shards(shards)
    }

    /// Shards in shard order: checks their `split.*` keys and indexes the tensors by name.
    fn from_shards(mut shards: Vec<Shard>) -> Result<Gguf> {
        split::check_shards(&mut shards)?;
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

    pub fn map_of(&self, t: &TensorInfo) -> &Arc<ShardBytes> {
        &self.shards[t.shard].map
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_split;
