//! Split models (docs/FORMATS.md §1): the shard naming rule, finding a model's shards from any
//! one shard's path, and the checks every set of shards passes, whether read from files or
//! from memory: `split.no` equals the shard's place, every shard agrees on `split.count`
//! and `split.tensors.count`, and the shards hold exactly that many uniquely named tensors.

use super::shard::Shard;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// More shards than this is a crafted file, not a model (the name format allows 99999).
pub const MAX_SPLITS: u64 = 9999;

/// `(prefix, shard number 1-based, count)` when the file name follows the split rule.
/// Works on bytes: a name whose last 15 bytes cut through a UTF-8 character is no split name.
pub fn parse_split_name(path: &Path) -> Option<(String, u32, u32)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?.as_bytes();
    // "<prefix>-NNNNN-of-MMMMM"
    let cut = stem.len().checked_sub(15)?;
    let (prefix, tail) = stem.split_at(cut);
    if tail[0] != b'-' || &tail[6..10] != b"-of-" {
        return None;
    }
    let number = |d: &[u8]| -> Option<u32> {
        d.iter().try_fold(0u32, |acc, &c| {
            c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
        })
    };
    let no = number(&tail[1..6])?;
    let count = number(&tail[10..15])?;
    // `prefix` ends where the ASCII '-' begins, so it is whole UTF-8.
    Some((String::from_utf8(prefix.to_vec()).ok()?, no, count))
}

pub fn split_path(dir: &Path, prefix: &str, no: u32, count: u32) -> PathBuf {
    dir.join(format!("{prefix}-{no:05}-of-{count:05}.gguf"))
}

/// A `split.*` key as a non-negative integer, `None` when absent.
fn split_u(shard: &Shard, key: &str) -> Result<Option<u64>> {
    match shard.get(key) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            Error::gguf(
                &shard.path,
                0,
                format!("{key} must be a non-negative integer, found {v:?}"),
            )
        }),
    }
}

/// The shard count a shard declares: `split.count`, absent, 0 and 1 all meaning one file.
pub fn declared_count(shard: &Shard) -> Result<u64> {
    let count = split_u(shard, "split.count")?.unwrap_or(1).max(1);
    if count > MAX_SPLITS {
        return Err(Error::gguf(
            &shard.path,
            0,
            format!("split.count {count} exceeds the cap of {MAX_SPLITS}"),
        ));
    }
    Ok(count)
}

/// The paths of every shard of the model that `first` (opened from `path`) belongs to, in
/// shard order, and `first`'s place among them. `count` is `declared_count(first)`, > 1.
pub fn shard_paths(path: &Path, first: &Shard, count: u64) -> Result<(Vec<PathBuf>, usize)> {
    let (prefix, name_no, name_count) = parse_split_name(path).ok_or_else(|| {
        Error::gguf(
            path,
            0,
            format!(
                "file has split.count {count} but its name does not follow \
                 <prefix>-NNNNN-of-MMMMM.gguf"
            ),
        )
    })?;
    if u64::from(name_count) != count {
        return Err(Error::gguf(
            path,
            0,
            format!("file name says {name_count} shards but split.count is {count}"),
        ));
    }
    let no = split_u(first, "split.no")?
        .ok_or_else(|| Error::gguf(path, 0, "split file without split.no"))?;
    if no >= count || u64::from(name_no) != no + 1 {
        return Err(Error::gguf(
            path,
            0,
            format!("split.no is {no} (0-based) but the file name says shard {name_no} of {count}"),
        ));
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let paths = (1..=count as u32)
        .map(|i| split_path(dir, &prefix, i, count as u32))
        .collect();
    Ok((paths, no as usize))
}

/// Checks a model's shards, given in shard order, against their `split.*` keys. Sets each
/// tensor's `shard` to its shard's place.
pub fn check_shards(shards: &mut [Shard]) -> Result<()> {
    let n = shards.len() as u64;
    let count = declared_count(&shards[0])?;
    if count != n {
        return Err(Error::gguf(
            &shards[0].path,
            0,
            format!("split.count is {count} but {n} shard(s) were given"),
        ));
    }
    let expected = split_u(&shards[0], "split.tensors.count")?;
    if n > 1 && expected.is_none() {
        return Err(Error::gguf(
            &shards[0].path,
            0,
            "split model without split.tensors.count",
        ));
    }
    for (i, s) in shards.iter_mut().enumerate() {
        s.tensors.iter_mut().for_each(|t| t.shard = i);
        let no = split_u(s, "split.no")?;
        let ok = match no {
            Some(no) => no == i as u64,
            None => n == 1,
        };
        if !ok {
            return Err(Error::gguf(
                &s.path,
                0,
                format!("shard {} of {n} has split.no {no:?}, expected {i}", i + 1),
            ));
        }
        if i > 0 {
            let c = declared_count(s)?;
            if c != n {
                return Err(Error::gguf(
                    &s.path,
                    0,
                    format!("shard {} has split.count {c}, expected {n}", i + 1),
                ));
            }
            let t = split_u(s, "split.tensors.count")?;
            if t.is_some() && t != expected {
                return Err(Error::gguf(
                    &s.path,
                    0,
                    format!(
                        "shard {} has split.tensors.count {t:?}, shard 1 has {expected:?}",
                        i + 1
                    ),
                ));
            }
        }
    }
    let total: u64 = shards.iter().map(|s| s.tensors.len() as u64).sum();
    if let Some(e) = expected {
        if e != total {
            return Err(Error::gguf(
                &shards[0].path,
                0,
                format!("split.tensors.count is {e} but the shards hold {total} tensors"),
            ));
        }
    }
    Ok(())
}
