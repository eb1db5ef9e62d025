//! A slot's KV cache as bytes (`kv_export` / `kv_import`): the first n positions of every
//! layer's keys and values, in the cache type, behind a header that names the model and
//! the layout so that data from another model or KV type is refused.
//!
//! Layout (little-endian): a 40-byte header
//! `b"STKV" | version u32 | kv type u32 (ggml id) | n_layer u32 | row_bytes u32 | n u32 |
//!  fingerprint u64 | reserved u64`,
//! then K as [L, n, row_bytes] bytes, then V as [L, n, row_bytes] (row_bytes = one
//! position's Nkv·D elements stored in the KV type).

use super::hparams::HParams;
use super::kv::KvType;
use super::weights::Weights;
use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"STKV";
const VERSION: u32 = 1;
pub const HEADER_BYTES: usize = 40;

/// What a blob must match to be imported: the model and the cache layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayoutId {
    pub ty: KvType,
    pub n_layer: usize,
    pub row_bytes: usize,
    pub fingerprint: u64,
}

/// FNV-1a over the hyper-parameters, the bits of two norm vectors and the first bytes of the
/// first attention layer's K and V projections (their file bytes, as every path reads them):
/// models of one shape with different weights get different fingerprints.
pub fn fingerprint(hp: &HParams, w: &Weights) -> u64 {
    const SAMPLE: usize = 64 << 10; // bytes of each projection hashed
    let mut bytes: Vec<u8> = Vec::with_capacity(2 * SAMPLE + 4096);
    for v in [
        hp.n_layer,
        hp.n_embd,
        hp.n_head,
        hp.n_head_kv,
        hp.head_dim,
        hp.n_rot,
        hp.n_expert,
        hp.n_expert_used,
        hp.n_vocab,
    ] {
        bytes.extend((v as u64).to_le_bytes());
    }
    bytes.extend((hp.rms_eps.to_bits() as u64).to_le_bytes());
    bytes.extend((hp.rope_freq_base.to_bits() as u64).to_le_bytes());
    let attn_norm0 = w.layers.first().map_or(&[][..], |l| &l.attn_norm[..]);
    for v in w.output_norm.iter().chain(attn_norm0) {
        bytes.extend((v.to_bits() as u64).to_le_bytes());
    }
    if let Some(l) = w.layers.iter().find(|l| l.wk.nbytes > 0) {
        for t in [&l.wk, &l.wv] {
            bytes.extend((t.ty as u64).to_le_bytes());
            let d = w.gguf.data(t);
            bytes.extend_from_slice(&d[..d.len().min(SAMPLE)]);
        }
    }
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h: u64, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

fn ty_id(ty: KvType) -> u32 {
    ty.ggml() as u32
}

/// Bytes of a blob of `n` positions.
pub fn blob_bytes(id: &KvLayoutId, n: usize) -> usize {
    HEADER_BYTES + 2 * id.n_layer * n * id.row_bytes
}

/// Writes the header of an `n`-position blob into `out[..HEADER_BYTES]`.
pub fn write_header(id: &KvLayoutId, n: usize, out: &mut [u8]) {
    let words = [
        VERSION,
        ty_id(id.ty),
        id.n_layer as u32,
        id.row_bytes as u32,
        n as u32,
    ];
    out[..4].copy_from_slice(MAGIC);
    for (c, w) in out[4..24].chunks_exact_mut(4).zip(words) {
        c.copy_from_slice(&w.to_le_bytes());
    }
    out[24..32].copy_from_slice(&id.fingerprint.to_le_bytes());
    out[32..40].fill(0);
}

/// Checks `data` against `id` and the context; returns its position count n. The K section
/// is `data[HEADER_BYTES..][..L·n·row_bytes]`, V the same length after it.
pub fn parse(id: &KvLayoutId, n_ctx: usize, data: &[u8]) -> Result<usize> {
    let bad = |m: String| Err(Error::Input(format!("KV data: {m}")));
    if data.len() < HEADER_BYTES || &data[..4] != MAGIC {
        return bad("not a Strata KV export (no STKV header)".into());
    }
    let word = |i: usize| u32::from_le_bytes(data[4 + 4 * i..8 + 4 * i].try_into().unwrap());
    let (ver, ty, nl, rb, n) = (word(0), word(1), word(2), word(3), word(4));
    let fp = u64::from_le_bytes(data[24..32].try_into().unwrap());
    if ver != VERSION {
        return bad(format!("format version {ver}, this build reads {VERSION}"));
    }
    if ty != ty_id(id.ty) {
        return bad(format!(
            "KV type id {ty}, this model's cache is {} (id {})",
            id.ty.name(),
            ty_id(id.ty)
        ));
    }
    if nl as usize != id.n_layer || rb as usize != id.row_bytes {
        return bad(format!(
            "{nl} layers of {rb}-byte rows, this model's cache has {} of {}",
            id.n_layer, id.row_bytes
        ));
    }
    if fp != id.fingerprint {
        return bad("exported from another model (fingerprint differs)".into());
    }
    let n = n as usize;
    if n > n_ctx {
        return bad(format!("{n} positions exceed n_ctx = {n_ctx}"));
    }
    if data.len() != blob_bytes(id, n) {
        return bad(format!(
            "{} bytes, expected {} for {n} positions",
            data.len(),
            blob_bytes(id, n)
        ));
    }
    Ok(n)
}
