//! libFuzzer target for the GGUF parser (`strata_core::gguf`).
//!
//! The input is one GGUF file, or a split model: shards joined by `SEP` (at most 4; the
//! seeds hold both kinds). Bad input must give `Error::Gguf`, never a panic, a hang or a large
//! allocation; good input must give tensor views and metadata that every accessor can use
//! (the tensor bytes are also dequantized where the kernels support the type).

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use strata_core::gguf::{self, Gguf, TensorInfo, Value};
use strata_core::quant;
use strata_core::Error;

const SEP: &[u8] = b"#GGUF-SHARD#";
const MAX_PARTS: usize = 4;
/// Dequantize tensors up to this many elements (the input bounds them anyway).
const MAX_DEQUANT: u64 = 1 << 16;

fn split_parts(data: &[u8]) -> Vec<&[u8]> {
    let mut parts = Vec::new();
    let mut rest = data;
    while parts.len() + 1 < MAX_PARTS {
        match rest.windows(SEP.len()).position(|w| w == SEP) {
            Some(i) => {
                parts.push(&rest[..i]);
                rest = &rest[i + SEP.len()..];
            }
            None => break,
        }
    }
    parts.push(rest);
    parts
}

fn touch_value(v: &Value) {
    let _ = (v.as_u64(), v.as_f64(), v.as_str(), v.type_name());
    if let Value::Array(items) = v {
        items.iter().for_each(touch_value);
    }
}

fn check_tensor(g: &Gguf, t: &TensorInfo) {
    let d = g.data(t);
    assert_eq!(d.len(), t.nbytes);
    assert!((1..=gguf::MAX_DIMS).contains(&t.dims.len()));
    let n = t.n_elements();
    assert_eq!(t.shape().iter().map(|&x| x as u64).product::<u64>(), n);
    let (bs, ts) = t.ty.block();
    assert_eq!(n % bs as u64, 0);
    assert_eq!(n / bs as u64 * ts as u64, t.nbytes as u64);
    assert!(std::ptr::eq(g.tensor(&t.name).unwrap(), t));
    let shard = &g.shards[t.shard];
    assert!(t.offset as u64 >= shard.data_offset);
    assert_eq!((t.offset as u64 - shard.data_offset) % shard.alignment, 0);
    if n <= MAX_DEQUANT {
        let mut out = vec![0f32; n as usize];
        match quant::dequantize(t.ty, d, &mut out) {
            Ok(()) | Err(Error::Quant(_)) => {}
            Err(e) => panic!("dequantize gave {e}"),
        }
    }
}

fn exercise(g: &Gguf) {
    for (k, v) in g.metadata() {
        assert!(!k.is_empty());
        assert!(g.get(k).is_some());
        touch_value(v);
    }
    let _ = g.architecture();
    let _ = g.path();
    for t in g.tensors() {
        check_tensor(g, t);
    }
}

fuzz_target!(|data: &[u8]| {
    let parts = split_parts(data);
    let result = if parts.len() == 1 {
        gguf::parse_bytes(data.to_vec(), "fuzz.gguf")
    } else {
        let n = parts.len() as u32;
        gguf::parse_shards(
            parts
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let name: PathBuf = gguf::split_path("".as_ref(), "fuzz", i as u32 + 1, n);
                    (name, p.to_vec())
                })
                .collect(),
        )
    };
    match result {
        Ok(g) => exercise(&g),
        Err(Error::Gguf { .. }) => {}
        Err(e) => panic!("parser gave a non-GGUF error: {e}"),
    }
});
