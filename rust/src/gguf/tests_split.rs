//! Split models: shard files written byte by byte into a temp folder, opened from any shard,
//! and every way a set of shards can disagree with its `split.*` keys.

use super::tests::{assert_gguf_err, expect_err, tmp_dir, W};
use super::*;

/// One shard: `split.no` (UINT16), `split.count` (UINT16), `split.tensors.count` (INT32), each
/// left out when `None`, then one F32 [4] tensor per name holding `[k, k+1, k+2, k+3]` where
/// k is the tensor's place in `names`·10.
/// The file ends with the last tensor's bytes, so every shorter prefix is a truncation.
fn shard(no: Option<u16>, count: Option<u16>, total: Option<i32>, names: &[&str]) -> Vec<u8> {
    let mut w = W(Vec::new());
    w.0.extend_from_slice(b"GGUF");
    let n_kv = [no.is_some(), count.is_some(), total.is_some()]
        .iter()
        .filter(|&&b| b)
        .count();
    w.u32(3).u64(names.len() as u64).u64(n_kv as u64);
    if let Some(v) = no {
        w.s("split.no").u32(2).u16(v);
    }
    if let Some(v) = count {
        w.s("split.count").u32(2).u16(v);
    }
    if let Some(v) = total {
        w.s("split.tensors.count").u32(5).u32(v as u32);
    }
    for (i, name) in names.iter().enumerate() {
        w.s(name).u32(1).u64(4).u32(0).u64(32 * i as u64);
    }
    while !w.0.len().is_multiple_of(32) {
        w.0.push(0);
    }
    // Each tensor's 16 bytes, padded to 32 except the last: the file ends with its data.
    for i in 0..names.len() {
        let n = if i + 1 == names.len() { 4 } else { 8 };
        for k in 0..n {
            w.0.extend_from_slice(&((i * 10 + k) as f32).to_le_bytes());
        }
    }
    w.0
}

/// A good 3-shard model: a, b | c | d, e.
fn good() -> Vec<Vec<u8>> {
    vec![
        shard(Some(0), Some(3), Some(5), &["a", "b"]),
        shard(Some(1), Some(3), Some(5), &["c"]),
        shard(Some(2), Some(3), Some(5), &["d", "e"]),
    ]
}

/// `good()` with shard `i` (0-based) replaced.
fn good_but(i: usize, b: Vec<u8>) -> Vec<Vec<u8>> {
    let mut s = good();
    s[i] = b;
    s
}

fn write_set(test: &str, shards: &[Vec<u8>]) -> Vec<PathBuf> {
    let dir = tmp_dir(test);
    let n = shards.len() as u32;
    shards
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let p = split_path(&dir, "m", i as u32 + 1, n);
            std::fs::write(&p, b).unwrap();
            p
        })
        .collect()
}

fn open_err(p: &Path, needle: &str) {
    assert_gguf_err(Gguf::open(p), needle)
}

fn mem_err(shards: Vec<Vec<u8>>, needle: &str) {
    let n = shards.len() as u32;
    let parts = shards
        .into_iter()
        .enumerate()
        .map(|(i, b)| (split_path(Path::new(""), "m", i as u32 + 1, n), b))
        .collect();
    assert_gguf_err(parse_shards(parts), needle)
}

#[test]
fn opens_from_any_shard() {
    let paths = write_set("any", &good());
    for p in &paths {
        let g = Gguf::open(p).unwrap();
        assert_eq!(g.shards.len(), 3);
        assert_eq!(g.path(), paths[0].as_path());
        let names: Vec<&str> = g.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "d", "e"]);
        let shard_of: Vec<usize> = g.tensors().iter().map(|t| t.shard).collect();
        assert_eq!(shard_of, [0, 0, 1, 2, 2]);
        let e = g.tensor("e").unwrap();
        let d = g.data(e);
        assert_eq!(f32::from_le_bytes(d[4..8].try_into().unwrap()), 11.0);
        assert_eq!(g.get("split.count").and_then(Value::as_u64), Some(3));
    }
    let parts = good()
        .into_iter()
        .enumerate()
        .map(|(i, b)| (PathBuf::from(format!("mem{i}")), b))
        .collect();
    assert_eq!(parse_shards(parts).unwrap().tensors().len(), 5);
}

#[test]
fn missing_shard() {
    let paths = write_set("missing", &good());
    std::fs::remove_file(&paths[1]).unwrap();
    open_err(&paths[0], "missing shard 2 of 3");
    open_err(&paths[2], "missing shard 2 of 3");
    // Given in memory, a set one short disagrees with split.count.
    let mut s = good();
    s.remove(1);
    mem_err(s, "split.count is 3 but 2 shard(s)");
}

#[test]
fn wrong_split_no() {
    let s = good_but(1, shard(Some(2), Some(3), Some(5), &["c"]));
    let paths = write_set("wrongno", &s);
    // Opened from another shard, the bad one is found by its split.no.
    open_err(&paths[0], "has split.no Some(2), expected 1");
    // Opened from itself, its split.no disagrees with its name.
    open_err(&paths[1], "file name says shard 2 of 3");
    mem_err(s, "expected 1");
    let s = good_but(2, shard(None, Some(3), Some(5), &["d", "e"]));
    let paths = write_set("nono", &s);
    open_err(&paths[0], "has split.no None");
    open_err(&paths[2], "without split.no");
}

#[test]
fn disagreeing_counts() {
    let s = good_but(2, shard(Some(2), Some(4), Some(5), &["d", "e"]));
    let paths = write_set("count", &s);
    open_err(&paths[0], "shard 3 has split.count 4, expected 3");
    // From the odd shard: its own split.count says 4, its name says 3.
    open_err(&paths[2], "file name says 3 shards but split.count is 4");
    let s = good_but(1, shard(Some(1), Some(3), Some(6), &["c"]));
    open_err(
        &write_set("tcount2", &s)[0],
        "shard 2 has split.tensors.count",
    );
}

#[test]
fn duplicate_tensor_across_shards() {
    let s = good_but(2, shard(Some(2), Some(3), Some(5), &["d", "a"]));
    let paths = write_set("dup", &s);
    open_err(&paths[1], "tensor \"a\" appears in more than one shard");
    mem_err(s, "more than one shard");
}

#[test]
fn wrong_tensors_count() {
    let s: Vec<Vec<u8>> = [(0, "a"), (1, "c")]
        .iter()
        .map(|&(no, name)| shard(Some(no), Some(2), Some(3), &[name]))
        .collect();
    let paths = write_set("tcount", &s);
    open_err(
        &paths[1],
        "split.tensors.count is 3 but the shards hold 2 tensors",
    );
    let s: Vec<Vec<u8>> = [(0, "a"), (1, "c")]
        .iter()
        .map(|&(no, name)| shard(Some(no), Some(2), None, &[name]))
        .collect();
    open_err(&write_set("tnone", &s)[0], "without split.tensors.count");
    // A negative INT32 count.
    let s = good_but(0, shard(Some(0), Some(3), Some(-5), &["a", "b"]));
    open_err(&write_set("tneg", &s)[0], "non-negative integer");
}

#[test]
fn split_keys_on_single_files() {
    // split.count 2 on a file not named as a shard.
    let dir = tmp_dir("single");
    let p = dir.join("model.gguf");
    std::fs::write(&p, shard(Some(0), Some(2), Some(1), &["a"])).unwrap();
    open_err(&p, "does not follow");
    // One file held in memory cannot be a two-shard model.
    expect_err_bytes(shard(Some(0), Some(2), Some(1), &["a"]), "2 but 1 shard(s)");
    // A one-shard "split" model is a plain file whose split keys must still agree.
    let one = shard(Some(0), Some(1), Some(1), &["a"]);
    assert_eq!(parse_bytes(one, "x").unwrap().tensors().len(), 1);
    expect_err_bytes(shard(Some(1), Some(1), Some(1), &["a"]), "split.no Some(1)");
    expect_err_bytes(shard(Some(0), Some(1), Some(2), &["a"]), "is 2 but");
    expect_err_bytes(shard(Some(0), Some(10_000), None, &["a"]), "cap of 9999");
}

fn expect_err_bytes(b: Vec<u8>, needle: &str) {
    expect_err(&b, needle)
}

#[test]
fn every_truncated_shard_is_refused() {
    let s = good();
    let paths = write_set("trunc", &s);
    for (i, full) in s.iter().enumerate() {
        for n in 0..full.len() {
            std::fs::write(&paths[i], &full[..n]).unwrap();
            for p in [&paths[0], &paths[i]] {
                match Gguf::open(p) {
                    Err(Error::Gguf { .. }) => {}
                    Err(e) => panic!("shard {i} len {n}: wrong error {e}"),
                    Ok(_) => panic!("shard {i} len {n}: truncated shard accepted"),
                }
            }
        }
        std::fs::write(&paths[i], full).unwrap();
    }
}
