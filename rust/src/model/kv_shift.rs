//! KV shifting (llama-server's `--cache-reuse`): chunks of a slot's cached positions moved to
//! earlier positions, their keys rotated by the move. RoPE at position p rotates each pair
//! by p·θᵢ (YaRN's mix and linear scaling keep the angle linear in p), so a key stored at p
//! moves to p + Δ by one more rotation of Δ·θᵢ — with no YaRN attention scale, which the key
//! already carries. Values do not depend on the position; they move as they are.
//!
//! The work is done on a `kv_blob` (the slot's export), so that the CPU and the GPU caches,
//! which export and import the same bytes, share it.

use super::kv::{fwht, rot_sizes, store_row, KvType};
use super::kv_blob::HEADER_BYTES;
use super::ops::Rope;
use crate::error::{Error, Result};
use crate::quant::dequantize;

/// A chunk of cached positions [from, from + n) to keep.
pub type Chunk = (usize, usize);

/// The blob of `keep` positions followed by each chunk in order, each moved to the position
/// after the last (keys rotated by the move). `blob`: an export of at least every chunk's
/// end, in cache type `ty` with `head_dim`-wide heads.
pub fn shift_blob(
    blob: &[u8],
    keep: usize,
    chunks: &[Chunk],
    rope: &Rope,
    head_dim: usize,
    ty: KvType,
) -> Result<Vec<u8>> {
    let word = |i: usize| u32::from_le_bytes(blob[4 + 4 * i..8 + 4 * i].try_into().unwrap());
    if blob.len() < HEADER_BYTES {
        return Err(Error::Input("KV shift: no KV export".into()));
    }
    let (n_layer, row_bytes, n) = (word(2) as usize, word(3) as usize, word(4) as usize);
    let head_bytes = ty.ggml().row_bytes(head_dim).unwrap_or(0);
    let need = (2 * n_layer)
        .checked_mul(n)
        .and_then(|x| x.checked_mul(row_bytes))
        .and_then(|x| x.checked_add(HEADER_BYTES));
    if head_bytes == 0
        || !row_bytes.is_multiple_of(head_bytes)
        || need.is_none_or(|b| blob.len() < b)
    {
        return Err(Error::Input(
            "KV shift: the export does not match the cache's layout".into(),
        ));
    }
    if keep > n {
        return Err(Error::Input(format!(
            "KV shift: cannot keep {keep} of {n} positions"
        )));
    }
    let (mut dst, mut read) = (keep, keep);
    for &(from, len) in chunks {
        let end = from.checked_add(len).filter(|&e| from >= read && e <= n);
        let Some(end) = end else {
            return Err(Error::Input(format!(
                "KV shift: chunk ({from}, {len}) out of order or past {n} positions (next \
                 free position {dst})"
            )));
        };
        dst += len;
        read = end;
    }
    let n_out = dst;
    let mut out = vec![0u8; HEADER_BYTES + 2 * n_layer * n_out * row_bytes];
    out[..HEADER_BYTES].copy_from_slice(&blob[..HEADER_BYTES]);
    out[20..24].copy_from_slice(&(n_out as u32).to_le_bytes());
    let (k_in, v_in) = blob[HEADER_BYTES..].split_at(n_layer * n * row_bytes);
    let (k_out, v_out) = out[HEADER_BYTES..].split_at_mut(n_layer * n_out * row_bytes);
    let mut mover = KeyMover::new(rope, head_dim, ty, row_bytes / head_bytes * head_dim);
    for l in 0..n_layer {
        let (ki, vi) = (&k_in[l * n * row_bytes..], &v_in[l * n * row_bytes..]);
        let (ko, vo) = (
            &mut k_out[l * n_out * row_bytes..(l + 1) * n_out * row_bytes],
            &mut v_out[l * n_out * row_bytes..(l + 1) * n_out * row_bytes],
        );
        ko[..keep * row_bytes].copy_from_slice(&ki[..keep * row_bytes]);
        vo[..keep * row_bytes].copy_from_slice(&vi[..keep * row_bytes]);
        let mut at = keep;
        for &(from, len) in chunks {
            let src = from * row_bytes..(from + len) * row_bytes;
            let out = at * row_bytes..(at + len) * row_bytes;
            vo[out.clone()].copy_from_slice(&vi[src.clone()]);
            if at == from {
                ko[out].copy_from_slice(&ki[src]);
            } else {
                mover.set_delta(at as i64 - from as i64);
                for (a, b) in ki[src]
                    .chunks_exact(row_bytes)
                    .zip(ko[out].chunks_exact_mut(row_bytes))
                {
                    mover.rotate(a, b)?;
                }
            }
            at += len;
        }
    }
    Ok(out)
}

/// Rotates stored key rows by one move's angles.
struct KeyMover<'a> {
    rope: &'a Rope,
    head_dim: usize,
    ty: KvType,
    /// K's Walsh-Hadamard block where the cache stores K rotated (`rot_sizes`).
    wht: Option<usize>,
    cos: Vec<f32>, // [n_rot/2] of the move
    sin: Vec<f32>,
    x: Vec<f32>, // [Nkv·D] one row
}

impl<'a> KeyMover<'a> {
    fn new(rope: &'a Rope, head_dim: usize, ty: KvType, elems: usize) -> KeyMover<'a> {
        KeyMover {
            rope,
            head_dim,
            ty,
            wht: rot_sizes(ty, head_dim).map(|(k, _)| k),
            cos: vec![0.0; rope.n_rot / 2],
            sin: vec![0.0; rope.n_rot / 2],
            x: vec![0.0; elems],
        }
    }

    fn set_delta(&mut self, delta: i64) {
        self.rope.rotation(delta, &mut self.cos, &mut self.sin);
    }

    fn rotate(&mut self, row: &[u8], out: &mut [u8]) -> Result<()> {
        dequantize(self.ty.ggml(), row, &mut self.x)?;
        if let Some(n) = self.wht {
            fwht(&mut self.x, n); // orthonormal and its own inverse: back to the keys
        }
        self.rope
            .apply(&mut self.x, self.head_dim, &self.cos, &self.sin);
        if let Some(n) = self.wht {
            fwht(&mut self.x, n);
        }
        store_row(self.ty, &self.x, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::arch::RopeMode;
    use crate::model::kv::KvCache;

    const D: usize = 64;
    const NKV: usize = 2;
    const NL: usize = 2;

    /// ggml's plain NEOX rope (base 10⁴) and a YaRN-like one (ramped mix, scaled angles, an
    /// attention scale the stored keys carry once).
    fn ropes() -> [Rope; 2] {
        let theta_scale = 10_000f32.powf(-2.0 / D as f32);
        let plain = Rope {
            mode: RopeMode::Neox,
            n_rot: D,
            theta_scale,
            freq_scale: 1.0,
            mix: Vec::new(),
            mscale: 1.0,
        };
        let yarn = Rope {
            mode: RopeMode::Norm,
            freq_scale: 0.25,
            mix: (0..D / 2)
                .map(|i| (1.0 - i as f32 / 16.0).clamp(0.0, 1.0))
                .collect(),
            mscale: 1.3,
            ..plain.clone()
        };
        [plain, yarn]
    }

    fn raw(l: usize, p: usize) -> Vec<f32> {
        (0..NKV * D)
            .map(|i| (((l * 131 + p * 31 + i * 7) % 97) as f32 - 48.0) / 24.0)
            .collect()
    }

    fn roped(rope: &Rope, l: usize, p: usize, at: usize) -> Vec<f32> {
        let mut x = raw(l, p);
        let (mut c, mut s) = (vec![0.0; rope.n_rot / 2], vec![0.0; rope.n_rot / 2]);
        rope.table(at, &mut c, &mut s);
        rope.apply(&mut x, D, &c, &s);
        x
    }

    /// A cache whose position q holds source position `src(q)`'s key roped at q.
    fn filled(ty: KvType, rope: &Rope, n: usize, src: impl Fn(usize) -> usize) -> KvCache {
        let mut kv = KvCache::new(ty, NL, 64, NKV, D, 1).unwrap();
        for q in 0..n {
            for l in 0..NL {
                let (k, v) = (roped(rope, l, src(q), q), raw(l + 7, src(q)));
                kv.write(0, l, q, &k, &v).unwrap();
            }
        }
        kv.set_len(0, n);
        kv
    }

    fn keys(b: &[u8], ty: KvType, n: usize, rb: usize) -> Vec<f32> {
        let mut out = vec![0.0; NL * n * NKV * D];
        let sec = &b[HEADER_BYTES..][..NL * n * rb];
        for (src, dst) in sec.chunks_exact(rb).zip(out.chunks_exact_mut(NKV * D)) {
            dequantize(ty.ggml(), src, dst).unwrap();
        }
        out
    }

    /// Keys roped at their positions, stored, then moved: equal (to the cache type's
    /// rounding) to the same keys roped at the new positions and stored; values bitwise.
    #[test]
    fn moved_keys_equal_keys_roped_at_the_new_positions() {
        for rope in ropes() {
            for ty in [KvType::F32, KvType::F16, KvType::Q8_0, KvType::Q4_0] {
                let kv = filled(ty, &rope, 40, |q| q);
                let blob = kv.export(0, 40, 0).unwrap();
                // keep 5, then [12, 20) at 5 and [30, 38) at 13
                let out = shift_blob(&blob, 5, &[(12, 8), (30, 8)], &rope, D, ty).unwrap();
                let src = |q: usize| {
                    if q < 5 {
                        q
                    } else if q < 13 {
                        q + 7
                    } else {
                        q + 17
                    }
                };
                let want = filled(ty, &rope, 21, src).export(0, 21, 0).unwrap();
                assert_eq!(out.len(), want.len(), "{ty:?}");
                let rb = kv.row_bytes;
                let (got, exp) = (keys(&out, ty, 21, rb), keys(&want, ty, 21, rb));
                let worst = got
                    .iter()
                    .zip(&exp)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                let top = exp.iter().map(|v| v.abs()).fold(0.0, f32::max);
                // relative to the largest key: each cache type's rounding, twice (stored, moved)
                let tol = top
                    * match ty {
                        KvType::F32 => 1e-5,
                        KvType::F16 => 1e-3,
                        KvType::Q8_0 => 0.02,
                        KvType::Q4_0 => 0.3,
                    };
                assert!(worst <= tol, "{ty:?} mscale {}: worst {worst}", rope.mscale);
                let sec = NL * 21 * rb;
                assert_eq!(
                    out[HEADER_BYTES + sec..],
                    want[HEADER_BYTES + sec..],
                    "{ty:?}"
                );
                assert_eq!(
                    out[HEADER_BYTES..][..5 * rb],
                    blob[HEADER_BYTES..][..5 * rb]
                );
            }
        }
    }

    #[test]
    fn chunks_out_of_order_or_past_the_end_are_refused() {
        let [rope, _] = ropes();
        let ty = KvType::F16;
        let blob = filled(ty, &rope, 10, |q| q).export(0, 10, 0).unwrap();
        assert!(shift_blob(&blob, 4, &[(2, 2)], &rope, D, ty).is_err()); // backwards
        assert!(shift_blob(&blob, 4, &[(8, 4)], &rope, D, ty).is_err()); // past the end
        assert!(shift_blob(&blob, 4, &[(6, 2), (6, 2)], &rope, D, ty).is_err()); // overlapping
        assert!(shift_blob(&blob[..30], 4, &[(6, 2)], &rope, D, ty).is_err()); // cut short
        let same = shift_blob(&blob, 4, &[(4, 6)], &rope, D, ty).unwrap();
        assert_eq!(same, blob); // nothing moves
    }
}
