//! Parser tests on files built byte by byte here, so every malformed variant is exact.

use super::*;
use std::io::Write;

pub(super) struct W(pub Vec<u8>);
impl W {
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn s(&mut self, v: &str) -> &mut Self {
        self.u64(v.len() as u64);
        self.0.extend_from_slice(v.as_bytes());
        self
    }
}

/// A valid file: two KVs, one F32 tensor [4] and one Q8_0 tensor [32, 2].
fn sample(extra_kv: &[(&str, u32, &[u8])]) -> Vec<u8> {
    let mut w = W(Vec::new());
    w.0.extend_from_slice(b"GGUF");
    w.u32(3).u64(2).u64(2 + extra_kv.len() as u64);
    w.s("general.architecture").u32(8).s("qwen3moe");
    w.s("general.tokens").u32(9).u32(8).u64(2).s("a").s("bc");
    for (k, ty, raw) in extra_kv {
        w.s(k).u32(*ty);
        w.0.extend_from_slice(raw);
    }
    w.s("a.weight").u32(1).u64(4).u32(0).u64(0);
    w.s("b.weight").u32(2).u64(32).u64(2).u32(8).u64(32);
    while !w.0.len().is_multiple_of(32) {
        w.0.push(0);
    }
    for i in 0..4 {
        w.0.extend_from_slice(&(i as f32).to_le_bytes());
    }
    w.0.extend_from_slice(&[0u8; 16]);
    w.0.extend_from_slice(&[7u8; 68]);
    w.0
}

/// A fresh folder per test (tests run in parallel threads of one process).
pub(super) fn tmp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-gguf-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_tmp(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
    p
}

#[test]
fn reads_sample() {
    let p = write_tmp("ok.gguf", &sample(&[]));
    let g = Gguf::open(&p).unwrap();
    assert_eq!(g.architecture(), Some("qwen3moe"));
    assert_eq!(g.tensors().len(), 2);
    let a = g.tensor("a.weight").unwrap();
    assert_eq!(a.shape(), vec![4]);
    let d = g.data(a);
    assert_eq!(f32::from_le_bytes(d[4..8].try_into().unwrap()), 1.0);
    let b = g.tensor("b.weight").unwrap();
    assert_eq!(b.shape(), vec![2, 32]);
    assert_eq!(b.nbytes, 68);
    assert!(g.data(b).iter().all(|&x| x == 7));
    match g.get("general.tokens").unwrap() {
        Value::Array(v) => assert_eq!(v.len(), 2),
        _ => panic!(),
    }
}

#[test]
fn every_truncation_is_refused() {
    let full = sample(&[]);
    for n in 0..full.len() {
        let p = write_tmp("trunc.gguf", &full[..n]);
        match Gguf::open(&p) {
            Err(Error::Gguf { .. }) => {}
            Err(e) => panic!("len {n}: wrong error {e}"),
            Ok(_) => panic!("len {n}: truncated file accepted"),
        }
    }
}

/// `r` must be a GGUF error whose message contains `needle`.
pub(super) fn assert_gguf_err(r: Result<Gguf>, needle: &str) {
    match r {
        Err(e @ Error::Gguf { .. }) => {
            let m = e.to_string();
            assert!(m.contains(needle), "{m:?} lacks {needle:?}")
        }
        Err(e) => panic!("wrong error kind {e}"),
        Ok(_) => panic!("accepted a bad file ({needle})"),
    }
}

/// In memory (`parse_bytes`), so parallel tests share no file.
pub(super) fn expect_err(bytes: &[u8], needle: &str) {
    assert_gguf_err(parse_bytes(bytes.to_vec(), "bad.gguf"), needle)
}

#[test]
fn crafted_files_are_refused() {
    let good = sample(&[]);
    let mut b = good.clone();
    b[0] = b'X';
    expect_err(&b, "magic");
    let mut b = good.clone();
    b[4..8].copy_from_slice(&0x0300_0000u32.to_le_bytes());
    expect_err(&b, "big-endian");
    let mut b = good.clone();
    b[4..8].copy_from_slice(&4u32.to_le_bytes());
    expect_err(&b, "version");
    let mut b = good.clone();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    expect_err(&b, "tensor count");
    let mut b = good.clone();
    b[16..24].copy_from_slice(&(1u64 << 19).to_le_bytes());
    expect_err(&b, "cannot fit");
    // A huge string length in the first key.
    let mut b = good.clone();
    b[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
    expect_err(&b, "cap");
    // A huge array count.
    let mut w = W(Vec::new());
    w.u32(4).u64(1 << 25);
    expect_err(&sample(&[("x.arr", 9, &w.0)]), "cannot fit");
    // Nested array.
    let mut w = W(Vec::new());
    w.u32(9).u64(1);
    expect_err(&sample(&[("x.nested", 9, &w.0)]), "nested");
    // Unknown value type.
    expect_err(&sample(&[("x.bad", 13, &[])]), "unknown value type");
    // Duplicate key.
    let mut w = W(Vec::new());
    w.s("qwen3moe");
    expect_err(
        &sample(&[("general.architecture", 8, &w.0)]),
        "duplicate metadata key",
    );
    // Bad alignment: not a power of two, or below the format's 8 (f32 rows read in place).
    for a in [3u32, 4] {
        expect_err(
            &sample(&[("general.alignment", 4, &a.to_le_bytes())]),
            "alignment",
        );
    }
}

fn patch_tensor(f: impl Fn(&mut Vec<u8>, usize)) -> Vec<u8> {
    let mut b = sample(&[]);
    let pos = b.windows(8).position(|w| w == b"b.weight").unwrap() + 8;
    f(&mut b, pos);
    b
}

#[test]
fn crafted_tensor_infos_are_refused() {
    // n_dims = 5
    expect_err(
        &patch_tensor(|b, p| b[p..p + 4].copy_from_slice(&5u32.to_le_bytes())),
        "n_dims",
    );
    // dim overflow
    expect_err(
        &patch_tensor(|b, p| b[p + 4..p + 12].copy_from_slice(&(1u64 << 62).to_le_bytes())),
        "",
    );
    // unknown type
    expect_err(
        &patch_tensor(|b, p| b[p + 20..p + 24].copy_from_slice(&4u32.to_le_bytes())),
        "unknown ggml type",
    );
    // unaligned offset
    expect_err(
        &patch_tensor(|b, p| b[p + 24..p + 32].copy_from_slice(&33u64.to_le_bytes())),
        "alignment",
    );
    // b's offset moved onto a's bytes (32 = a's 16 bytes, rounded up to the alignment, is
    // b's own): two tensors over one range
    expect_err(
        &patch_tensor(|b, p| b[p + 24..p + 32].copy_from_slice(&0u64.to_le_bytes())),
        "overlaps",
    );
    // offset past end
    expect_err(
        &patch_tensor(|b, p| b[p + 24..p + 32].copy_from_slice(&(1u64 << 40).to_le_bytes())),
        "past the end",
    );
    // duplicate tensor name
    expect_err(
        &patch_tensor(|b, p| {
            let q = p - 8;
            b[q..q + 8].copy_from_slice(b"a.weight");
        }),
        "duplicate tensor",
    );
}

#[test]
fn split_names() {
    assert_eq!(
        parse_split_name(Path::new("/x/model-00002-of-00003.gguf")),
        Some(("model".into(), 2, 3))
    );
    assert_eq!(parse_split_name(Path::new("model.gguf")), None);
    assert_eq!(
        parse_split_name(Path::new("-00001-of-00001.gguf")),
        Some(("".into(), 1, 1))
    );
    // Review finding: the name was sliced as a str at fixed byte offsets, which panics when
    // an offset falls inside a multi-byte character; '+' was also taken as a digit.
    for name in [
        "m-0000éof-00002.gguf", // byte 6 of the tail is inside 'é': panicked
        "éxxxxxxxxxxxxxx.gguf", // the 15-byte cut is inside 'é': panicked
        "m-0000é-of-00002.gguf",
        "m-00001-of-é0002.gguf",
        "m-+0001-of-00002.gguf",
        "m-00001-of-+0002.gguf",
        "m-00001-to-00002.gguf",
    ] {
        assert_eq!(parse_split_name(Path::new(name)), None, "{name}");
    }
}

#[test]
fn parse_bytes_equals_open() {
    let bytes = sample(&[]);
    let p = write_tmp("same.gguf", &bytes);
    let (a, b) = (
        Gguf::open(&p).unwrap(),
        parse_bytes(bytes, "mem.gguf").unwrap(),
    );
    assert_eq!(a.metadata(), b.metadata());
    assert_eq!(a.tensors().len(), b.tensors().len());
    for (x, y) in a.tensors().iter().zip(b.tensors()) {
        assert_eq!((&x.name, x.offset, x.nbytes), (&y.name, y.offset, y.nbytes));
        assert_eq!(a.data(x), b.data(y));
    }
    assert_eq!(b.path(), Path::new("mem.gguf"));
}

#[test]
fn metadata_element_budget() {
    // Review finding: a UINT8 array decodes each 1-byte element into a 32-byte Value, so a
    // file of N bytes could make the reader hold 32·N bytes. The total is now capped.
    assert_eq!(std::mem::size_of::<Value>(), 32);
    let n = MAX_METADATA_ELEMENTS;
    let mut w = W(Vec::new());
    w.u32(0).u64(n / 2 + 1);
    w.0.resize(w.0.len() + (n / 2 + 1) as usize, 1);
    let half = w.0.clone();
    // One array of just over half the budget is read...
    let ok = sample(&[("x.a", 9, &half)]);
    assert!(parse_bytes(ok, "ok.gguf").is_ok());
    // ...two are refused.
    expect_err(
        &sample(&[("x.a", 9, &half), ("x.b", 9, &half)]),
        "array elements in all",
    );
}

#[test]
fn version_zero_is_not_called_big_endian() {
    let mut b = sample(&[]);
    b[4..8].copy_from_slice(&0u32.to_le_bytes());
    expect_err(&b, "unsupported GGUF version 0");
}

/// One F32 tensor "t" with the given dims and no data (its byte count is 0 when a dim is 0).
fn one_tensor(dims: &[u64]) -> Vec<u8> {
    let mut w = W(Vec::new());
    w.0.extend_from_slice(b"GGUF");
    w.u32(3).u64(1).u64(0);
    w.s("t").u32(dims.len() as u32);
    dims.iter().for_each(|&d| {
        w.u64(d);
    });
    w.u32(0).u64(0);
    while !w.0.len().is_multiple_of(32) {
        w.0.push(0);
    }
    w.0
}

#[test]
fn zero_dim_does_not_excuse_huge_dims() {
    // Fuzz finding 1: dims [2^40, 2^40, 0] made 0 elements, so the file was read, but the
    // shape's product in numpy order (2^40·2^40·0) overflowed at the first multiply.
    expect_err(
        &one_tensor(&[1 << 40, 1 << 40, 0]),
        "element count overflows",
    );
    expect_err(
        &one_tensor(&[0, 1 << 40, 1 << 40]),
        "element count overflows",
    );
    // Zero-sized tensors with sane dims stay readable.
    let g = parse_bytes(one_tensor(&[0, 1 << 40]), "z.gguf").unwrap();
    let t = g.tensor("t").unwrap();
    assert_eq!(
        (t.n_elements(), t.nbytes, t.shape()),
        (0, 0, vec![1 << 40, 0])
    );
}

/// Every input a fuzz run found (fuzz/regressions/) is refused with a GGUF error or read
/// with consistent sizes.
#[test]
fn fuzz_regressions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        n += 1;
        match parse_bytes(std::fs::read(&p).unwrap(), &p) {
            Err(Error::Gguf { .. }) => {}
            Err(e) => panic!("{}: wrong error {e}", p.display()),
            Ok(g) => {
                for t in g.tensors() {
                    let shape_nel = t
                        .shape()
                        .iter()
                        .try_fold(1u64, |a, &d| a.checked_mul(d as u64));
                    assert_eq!(shape_nel, Some(t.n_elements()), "{}", p.display());
                    assert_eq!(g.data(t).len(), t.nbytes);
                }
            }
        }
    }
    assert!(n >= 1);
}
