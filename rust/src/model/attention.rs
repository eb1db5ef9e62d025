//! Causal GQA attention of one query position over the KV cache, in f32.
//!
//! Shapes: Nh = query heads, Nkv = KV heads, D = head dim, n = visible positions.
//! q is [Nh, D]; the cache layer holds K and V as [n, Nkv, D] rows in the cache type; the
//! output is [Nh, D]. Query head h reads KV head h / (Nh / Nkv).
//!
//! Numerics follow llama.cpp's (non-flash) CPU path so that quantized models agree: q is
//! converted to the key type's dot type (f16 for an f16 cache) before q·k, scores are
//! scaled by 1/√D and soft-maxed in f32, and the probabilities are rounded to f16 before
//! they weight an f16 V (f32 otherwise).

use super::attn_avx2;
use super::kv::{axpy_row, fwht, rot_sizes, KvCache, KvType};
use crate::quant::dequant::f16_at;
use crate::quant::dot::{common_reduce8, quantize_act, reduce_4x8, vec_dot, vec_dot_t};
use crate::quant::vexp::{softmax, softmax_sink};
use crate::quant::GgmlType;
use half::f16;
use half::slice::HalfFloatSliceExt;

/// Per-call scratch, sized at load: scores [C] and one quantized query head.
pub struct AttnScratch {
    pub scores: Vec<f32>,
    pub q_act: Vec<u8>,
    /// F16 cache: the query head and one K or V head row widened to f32 ([D] each). The
    /// widening is exact, so the products and their order are those of the f16 arithmetic.
    pub qf: Vec<f32>,
    pub rowf: Vec<f32>,
    /// F16 cache: the lane accumulators of the probabilities-times-V product ([32·D]).
    pub pv: Vec<f32>,
}

impl AttnScratch {
    pub fn new(n_ctx: usize, ty: KvType, head_dim: usize) -> AttnScratch {
        let act = ty.ggml().vec_dot_type().row_bytes(head_dim).unwrap_or(0);
        AttnScratch {
            scores: vec![0f32; n_ctx],
            q_act: vec![0u8; act],
            qf: vec![0f32; head_dim],
            rowf: vec![0f32; head_dim],
            pv: vec![0f32; 32 * head_dim],
        }
    }
}

pub struct AttnShape<'a> {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub ty: KvType,
    /// Bytes of one position's row (Nkv heads) and of one head in the cache type.
    pub row_bytes: usize,
    pub head_bytes: usize,
    /// Per query head [Nh], one more logit in the softmax with no value (attention sinks).
    pub sinks: Option<&'a [f32]>,
    /// Some(W): position p sees only keys p - W < j ≤ p (sliding-window attention).
    pub window: Option<usize>,
}

impl<'a> AttnShape<'a> {
    /// The shape of `n_head` query heads over `kv`'s `n_head_kv` heads of `head_dim`.
    pub fn of(kv: &KvCache, n_head: usize, n_head_kv: usize, head_dim: usize) -> AttnShape<'a> {
        AttnShape {
            n_head,
            n_head_kv,
            head_dim,
            ty: kv.ty,
            row_bytes: kv.row_bytes,
            head_bytes: kv.head_bytes,
            sinks: None,
            window: None,
        }
    }

    /// The same shape with a layer's sinks and window.
    pub fn with(self, sinks: Option<&'a [f32]>, window: Option<usize>) -> AttnShape<'a> {
        AttnShape {
            sinks,
            window,
            ..self
        }
    }

    /// The first key position that position `p` (of n = p + 1 visible) sees.
    pub fn first_key(&self, n: usize) -> usize {
        self.window.map_or(0, |w| n.saturating_sub(w))
    }
}

/// `q · k` for one head: q already converted to the key type's dot type.
/// Little-endian f16 bytes `src` ([n·2]) widened to f32 `dst` ([n]); exact (SIMD where the
/// CPU has it, through `half`).
pub fn widen_f16(src: &[u8], dst: &mut [f32]) {
    // SAFETY: every bit pattern is a valid f16; align_to only reinterprets the aligned middle.
    let (pre, mid, post) = unsafe { src.align_to::<f16>() };
    if pre.is_empty() && post.is_empty() && cfg!(target_endian = "little") {
        mid.convert_to_f32_slice(dst);
    } else {
        for (i, o) in dst.iter_mut().enumerate() {
            *o = f16_at(src, 2 * i);
        }
    }
}

/// q·k over one head: `qf` is the f16-rounded query widened to f32 (F16 cache) and unused
/// otherwise; `q` is the query in the cache's dot type. The F16 sum follows ggml's order
/// for `t` query rows (`vec_dot_t` of the widened values: `ggml_vec_dot_f16` for one row,
/// tinyBLAS for several; widening is exact, so the products are the f16 ones).
#[inline]
fn dot_qk(ty: KvType, d: usize, k: &[u8], q: &[u8], qf: &[f32], rowf: &mut [f32], t: usize) -> f32 {
    match ty {
        KvType::F16 => {
            widen_f16(k, rowf);
            vec_dot_t(
                GgmlType::F32,
                d,
                f32_bytes(&rowf[..d]),
                f32_bytes(&qf[..d]),
                t,
                0,
            )
        }
        KvType::F32 | KvType::Q8_0 | KvType::Q4_0 => vec_dot(ty.ggml(), d, k, q),
    }
}

/// The bytes of an f32 slice (little-endian, as the F32 dot kernels read them).
pub(super) fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: any f32 is 4 plain bytes; u8 has no alignment requirement.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, std::mem::size_of_val(x)) }
}

/// `out[i] = Σ_j p[j]·v_j[i]` over an f16 V (rows `v_row(j)`, widened into `rowf`), p rounded
/// to f16 (in place), in ggml's order for the probabilities-times-V^T matmul: with one query
/// row `ggml_vec_dot_f16` over j (lane j % 32 of four 8-lane FMA accumulators, `reduce_4x8`),
/// with several tinyBLAS (lane j % 8 of one accumulator, `reduce8`). Positions past n are
/// ggml's padding with p = 0, which leaves every lane unchanged. `acc` is scratch of [32·D].
#[allow(clippy::too_many_arguments)]
fn pv_f16(
    p: &mut [f32],
    v: &[u8],
    s: &AttnShape,
    kvo: usize,
    many: bool,
    acc: &mut [f32],
    rowf: &mut [f32],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has FMA (checked above).
        unsafe { pv_f16_fma(p, v, s, kvo, many, acc, rowf, out) };
        return;
    }
    pv_f16_body(p, v, s, kvo, many, acc, rowf, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_f16_fma(
    p: &mut [f32],
    v: &[u8],
    s: &AttnShape,
    kvo: usize,
    many: bool,
    acc: &mut [f32],
    rowf: &mut [f32],
    out: &mut [f32],
) {
    pv_f16_body(p, v, s, kvo, many, acc, rowf, out)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn pv_f16_body(
    p: &mut [f32],
    v: &[u8],
    s: &AttnShape,
    kvo: usize,
    many: bool,
    acc: &mut [f32],
    rowf: &mut [f32],
    out: &mut [f32],
) {
    let d = s.head_dim;
    if !many && d.is_multiple_of(16) && attn_avx2::available_x2() {
        // SAFETY: the CPU runs the kernel (checked); it bound-checks its rows.
        unsafe { attn_avx2::pv_row_x2(p, v, s.row_bytes, kvo, &mut out[..d]) };
        return;
    }
    let lanes = if many { 8 } else { 32 };
    let acc = &mut acc[..lanes * d]; // [lanes, D]
    acc.fill(0.0);
    if attn_avx2::available() && d.is_multiple_of(8) {
        // SAFETY: the CPU runs the kernels (checked); they bound-check their rows.
        unsafe { attn_avx2::pv_lanes(p, v, s.row_bytes, kvo, d, lanes, acc) };
    } else {
        pv_widened(p, v, s, kvo, lanes, acc, rowf);
    }
    reduce_pv(acc, d, many, out);
}

/// The P·V lanes of `pv_f16_body` through widened rows.
#[inline(always)]
fn pv_widened(
    p: &[f32],
    v: &[u8],
    s: &AttnShape,
    kvo: usize,
    lanes: usize,
    acc: &mut [f32],
    rowf: &mut [f32],
) {
    let d = s.head_dim;
    for (j, &pj) in p.iter().enumerate() {
        let pj = f16::from_f32(pj).to_f32();
        let o = j * s.row_bytes + kvo;
        widen_f16(&v[o..o + s.head_bytes], &mut rowf[..d]);
        let a = &mut acc[(j % lanes) * d..(j % lanes + 1) * d];
        for (x, &vi) in a.iter_mut().zip(&rowf[..d]) {
            *x = vi.mul_add(pj, *x);
        }
    }
}

/// The P·V output from its lanes: `reduce8` over 8 lanes or `reduce_4x8` over 32.
fn reduce_pv(acc: &[f32], d: usize, many: bool, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate().take(d) {
        *o = if many {
            let r: [f32; 8] = std::array::from_fn(|k| acc[k * d + i]);
            common_reduce8(&r)
        } else {
            let r: [[f32; 8]; 4] =
                std::array::from_fn(|a| std::array::from_fn(|k| acc[(8 * a + k) * d + i]));
            reduce_4x8(&r)
        };
    }
}

/// One head's view of a layer's cache for `attend_online`: keys/values [0, n) at head byte
/// offset `kvo`, the score scale, the head's sink.
struct OnlineHead<'a> {
    s: &'a AttnShape<'a>,
    k_cache: &'a [u8],
    v_cache: &'a [u8],
    n: usize,
    kvo: usize,
    scale: f32,
    sink: Option<f32>,
}

/// One head over a quantized cache in ggml's CPU flash-attention order (llama.cpp runs its
/// quantized caches through flash attention, which its quantized V needs): key by key, the
/// running maximum M rescales the f32 accumulator and the sum S by exp(M_old − M) when a
/// score passes it, else the value row (dequantized to f32, x = d·q as ggml's `to_float`) is
/// added with weight exp(s − M) by fused multiply-adds (`ggml_vec_mad_f32`); a sink (Some)
/// is one more score with no value; the accumulator is multiplied by 1/S at the end.
fn attend_online(h: &OnlineHead, q_act: &[u8], oh: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has FMA (checked above).
        unsafe { attend_online_fma(h, q_act, oh) };
        return;
    }
    attend_online_body(h, q_act, oh)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn attend_online_fma(h: &OnlineHead, q_act: &[u8], oh: &mut [f32]) {
    attend_online_body(h, q_act, oh)
}

#[inline(always)]
fn attend_online_body(h: &OnlineHead, q_act: &[u8], oh: &mut [f32]) {
    let OnlineHead {
        s,
        k_cache,
        v_cache,
        n,
        kvo,
        scale,
        sink,
    } = *h;
    let d = s.head_dim;
    let (mut sum, mut max) = (0.0f32, f32::NEG_INFINITY);
    oh.fill(0.0);
    for j in 0..n {
        let o = j * s.row_bytes + kvo;
        let sc = vec_dot(s.ty.ggml(), d, &k_cache[o..o + s.head_bytes], q_act) * scale;
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if sc > max {
            ms = (max - sc).exp();
            max = sc;
            oh.iter_mut().for_each(|x| *x *= ms);
        } else {
            vs = (sc - max).exp();
        }
        mad_row(s.ty, &v_cache[o..o + s.head_bytes], vs, oh);
        sum = sum * ms + vs;
    }
    if let Some(sk) = sink {
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if sk > max {
            ms = (max - sk).exp();
            oh.iter_mut().for_each(|x| *x *= ms);
        } else {
            vs = (sk - max).exp();
        }
        sum = sum * ms + vs;
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    oh.iter_mut().for_each(|x| *x *= inv);
}

/// `acc[i] = fma(x[i], w, acc[i])` over one head's row of a quantized cache, x[i] = d·q[i]
/// rounded to f32 first (ggml's `to_float`, then `ggml_vec_mad_f32`).
#[inline(always)]
fn mad_row(ty: KvType, row: &[u8], w: f32, acc: &mut [f32]) {
    match ty {
        KvType::Q8_0 => {
            for (ab, b) in acc.chunks_exact_mut(32).zip(row.chunks_exact(34)) {
                let d = f16_at(b, 0);
                for (a, &q) in ab.iter_mut().zip(&b[2..34]) {
                    *a = ((q as i8) as f32 * d).mul_add(w, *a);
                }
            }
        }
        KvType::Q4_0 => {
            for (ab, b) in acc.chunks_exact_mut(32).zip(row.chunks_exact(18)) {
                let d = f16_at(b, 0);
                let (lo, hi) = ab.split_at_mut(16);
                for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&b[2..18]) {
                    *l = (((q & 0x0F) as i32 - 8) as f32 * d).mul_add(w, *l);
                    *h = (((q >> 4) as i32 - 8) as f32 * d).mul_add(w, *h);
                }
            }
        }
        KvType::F16 | KvType::F32 => unreachable!("mad_row: a quantized cache only"),
    }
}

fn convert_q(ty: KvType, q: &[f32], out: &mut [u8]) -> crate::Result<()> {
    match ty {
        KvType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(q) {
                o.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
            }
            Ok(())
        }
        KvType::F32 | KvType::Q8_0 | KvType::Q4_0 => quantize_act(ty.ggml().vec_dot_type(), q, out),
    }
}

/// Attention of one position over keys/values [0, n) of one layer, as one of `t` query rows
/// of a chunk (ggml's float order depends on whether t > 1).
#[allow(clippy::too_many_arguments)]
pub fn attend(
    s: &AttnShape,
    k_cache: &[u8],
    v_cache: &[u8],
    n: usize,
    q: &[f32],
    out: &mut [f32],
    scratch: &mut AttnScratch,
    t: usize,
) -> crate::Result<()> {
    let d = s.head_dim;
    for (h, (qh, oh)) in q.chunks_exact(d).zip(out.chunks_exact_mut(d)).enumerate() {
        attend_head(s, k_cache, v_cache, n, h, qh, oh, scratch, t)?;
    }
    Ok(())
}

/// `attend` for query head `h` alone: `qh` and `oh` are that head's [D] query and output.
#[allow(clippy::too_many_arguments)]
pub fn attend_head(
    s: &AttnShape,
    k_cache: &[u8],
    v_cache: &[u8],
    n: usize,
    h: usize,
    qh: &[f32],
    oh: &mut [f32],
    scratch: &mut AttnScratch,
    t: usize,
) -> crate::Result<()> {
    let d = s.head_dim;
    let group = s.n_head / s.n_head_kv;
    let scale = 1.0 / (d as f32).sqrt();
    let scores = &mut scratch.scores[..n];
    let kvo = (h / group) * s.head_bytes;
    if matches!(s.ty, KvType::Q8_0 | KvType::Q4_0) {
        // a rotated cache (`kv::rot_sizes`): the query rotated as the keys were, the output
        // back as the values were
        let rot = rot_sizes(s.ty, d);
        match rot {
            Some((nk, _)) => {
                let qr = &mut scratch.qf[..d];
                qr.copy_from_slice(qh);
                fwht(qr, nk);
                convert_q(s.ty, qr, &mut scratch.q_act)?;
            }
            None => convert_q(s.ty, qh, &mut scratch.q_act)?,
        }
        let sink = s.sinks.map(|sk| sk[h]);
        let head = OnlineHead {
            s,
            k_cache,
            v_cache,
            n,
            kvo,
            scale,
            sink,
        };
        attend_online(&head, &scratch.q_act, oh);
        if let Some((_, nv)) = rot {
            fwht(oh, nv);
        }
        return Ok(());
    }
    convert_q(s.ty, qh, &mut scratch.q_act)?;
    if s.ty == KvType::F16 {
        widen_f16(&scratch.q_act[..2 * d], &mut scratch.qf[..d]);
    }
    if s.ty == KvType::F16 && attn_avx2::available() && d.is_multiple_of(32) {
        // SAFETY: the CPU runs the kernels (checked); they bound-check their rows.
        let qf = &scratch.qf[..d];
        if t == 1 && attn_avx2::available_x2() {
            unsafe { attn_avx2::scores_row_x2(k_cache, s.row_bytes, kvo, qf, scale, scores) };
        } else {
            unsafe { attn_avx2::scores(k_cache, s.row_bytes, kvo, qf, t > 1, scale, scores) };
        }
    } else {
        for (j, sc) in scores.iter_mut().enumerate() {
            let o = j * s.row_bytes + kvo;
            let k = &k_cache[o..o + s.head_bytes];
            let (qa, qf) = (&scratch.q_act, &scratch.qf);
            *sc = dot_qk(s.ty, d, k, qa, qf, &mut scratch.rowf, t) * scale;
        }
    }
    match s.sinks {
        Some(sk) => softmax_sink(scores, sk[h]),
        None => softmax(scores, true),
    }
    if s.ty == KvType::F16 {
        let (pv, rowf) = (&mut scratch.pv, &mut scratch.rowf);
        pv_f16(scores, v_cache, s, kvo, t > 1, pv, rowf, oh);
        return Ok(());
    }
    oh.fill(0.0);
    for (j, &p) in scores.iter().enumerate() {
        let o = j * s.row_bytes + kvo;
        axpy_row(s.ty, p, &v_cache[o..o + s.head_bytes], oh);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kv::KvCache;

    /// f32 cache: equals softmax(q·kᵀ/√D)·v computed directly, with GQA head mapping.
    #[test]
    fn f32_attention_matches_naive_gqa() {
        let (nh, nkv, d, n) = (4, 2, 32, 5);
        let mut kv = KvCache::new(KvType::F32, 1, 8, nkv, d, 1).unwrap();
        let val = |i: usize| ((i * 7919) % 97) as f32 / 97.0 - 0.5;
        let ks: Vec<Vec<f32>> = (0..n)
            .map(|p| (0..nkv * d).map(|i| val(i + 31 * p)).collect())
            .collect();
        let vs: Vec<Vec<f32>> = (0..n)
            .map(|p| (0..nkv * d).map(|i| val(i * 3 + 17 * p)).collect())
            .collect();
        for p in 0..n {
            kv.write(0, 0, p, &ks[p], &vs[p]).unwrap();
        }
        let q: Vec<f32> = (0..nh * d).map(|i| val(i * 5 + 1)).collect();
        let shape = AttnShape::of(&kv, nh, nkv, d);
        let mut out = vec![0f32; nh * d];
        let mut s = AttnScratch::new(8, KvType::F32, d);
        let (kc, vc) = kv.layer(0, 0, n);
        attend(&shape, kc, vc, n, &q, &mut out, &mut s, 1).unwrap();
        for h in 0..nh {
            let g = h / (nh / nkv);
            let sc: Vec<f64> = (0..n)
                .map(|p| {
                    (0..d)
                        .map(|i| (q[h * d + i] * ks[p][g * d + i]) as f64)
                        .sum::<f64>()
                        / (d as f64).sqrt()
                })
                .collect();
            let m = sc.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = sc.iter().map(|x| (x - m).exp()).sum();
            for i in 0..d {
                let want: f64 = (0..n)
                    .map(|p| (sc[p] - m).exp() / z * vs[p][g * d + i] as f64)
                    .sum();
                assert!(
                    (out[h * d + i] as f64 - want).abs() < 1e-5,
                    "head {h} dim {i}"
                );
            }
        }
    }

    /// The F16 path equals, bit for bit, ggml's orders written out element by element. One
    /// query row: scores Σ_i k[i]·q[i] with element i in lane i % 32 of FMA accumulators,
    /// ggml's softmax, then o[i] = Σ_j f16(p_j)·v_j[i] with position j in lane j % 32. Several
    /// rows (tinyBLAS): lane i % 8 and j % 8 of one 8-lane accumulator.
    #[test]
    fn f16_attention_bitwise_equals_per_element_reference() {
        for n in [1usize, 4, 5, 37, 64, 70] {
            f16_attention_reference_case(n);
        }
    }

    fn f16_attention_reference_case(n: usize) {
        let (nh, nkv, d) = (8, 2, 128);
        let mut kv = KvCache::new(KvType::F16, 1, 80, nkv, d, 1).unwrap();
        let val = |i: usize| ((i * 7919 + 13) % 1013) as f32 / 253.0 - 2.0;
        for p in 0..n {
            let k: Vec<f32> = (0..nkv * d).map(|i| val(i + 31 * p)).collect();
            let v: Vec<f32> = (0..nkv * d).map(|i| val(i * 3 + 17 * p + 5)).collect();
            kv.write(0, 0, p, &k, &v).unwrap();
        }
        let q: Vec<f32> = (0..nh * d).map(|i| val(i * 5 + 1) * 0.3).collect();
        let shape = AttnShape::of(&kv, nh, nkv, d);
        let (kc, vc) = kv.layer(0, 0, n);
        for t in [1usize, 5] {
            let mut out = vec![0f32; nh * d];
            let mut s = AttnScratch::new(80, KvType::F16, d);
            attend(&shape, kc, vc, n, &q, &mut out, &mut s, t).unwrap();
            let lanes = |terms: &mut dyn Iterator<Item = (usize, f32, f32)>| {
                let mut acc = [[0f32; 8]; 4];
                for (j, a, b) in terms {
                    let l = if t > 1 { j % 8 } else { j % 32 };
                    acc[l / 8][l % 8] = a.mul_add(b, acc[l / 8][l % 8]);
                }
                if t > 1 {
                    common_reduce8(&acc[0])
                } else {
                    reduce_4x8(&acc)
                }
            };
            let scale = 1.0 / (d as f32).sqrt();
            for h in 0..nh {
                let kvo = (h / (nh / nkv)) * kv.head_bytes;
                let qh: Vec<f32> = q[h * d..(h + 1) * d]
                    .iter()
                    .map(|x| f16::from_f32(*x).to_f32())
                    .collect();
                let mut sc: Vec<f32> = (0..n)
                    .map(|j| {
                        let o = j * kv.row_bytes + kvo;
                        let mut it = (0..d).map(|i| (i, f16_at(&kc[o..], 2 * i), qh[i]));
                        lanes(&mut it) * scale
                    })
                    .collect();
                softmax(&mut sc, true);
                for i in 0..d {
                    let mut it = (0..n).map(|j| {
                        let o = j * kv.row_bytes + kvo;
                        (j, f16_at(&vc[o..], 2 * i), f16::from_f32(sc[j]).to_f32())
                    });
                    let want = lanes(&mut it);
                    let got = out[h * d + i].to_bits();
                    assert_eq!(got, want.to_bits(), "n={n} t={t} head {h} dim {i}");
                }
            }
        }
    }

    /// The AVX-512 one-row kernels equal the AVX2 ones bit for bit: q·k scores and P·V
    /// (lanes + reduction) over position counts around their 4-position and 16/32-lane steps,
    /// head dims 32 to 256, with values spanning signs and magnitudes.
    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx512"]
    fn row_x2_kernels_equal_avx2_bitwise() {
        crate::quant::dot::require_isa(
            crate::quant::dot::Isa::Avx512,
            "row_x2_kernels_equal_avx2_bitwise",
        );
        let val = |i: usize| ((i * 7919 + 13) % 1013) as f32 / 97.0 - 5.0;
        for d in [32usize, 64, 128, 256] {
            let (nkv, ctx) = (2, 200);
            let mut kv = KvCache::new(KvType::F16, 1, ctx, nkv, d, 1).unwrap();
            for p in 0..ctx {
                let k: Vec<f32> = (0..nkv * d).map(|i| val(i + 31 * p)).collect();
                let v: Vec<f32> = (0..nkv * d).map(|i| val(i * 3 + 17 * p + 5)).collect();
                kv.write(0, 0, p, &k, &v).unwrap();
            }
            let qf: Vec<f32> = (0..d)
                .map(|i| f16::from_f32(val(i * 5 + 1) * 0.3).to_f32())
                .collect();
            for n in [
                1usize, 2, 3, 4, 5, 8, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 100, 200,
            ] {
                let (kc, vc) = kv.layer(0, 0, n);
                let kvo = (n % nkv) * kv.head_bytes;
                let (mut want, mut got) = (vec![0f32; n], vec![f32::NAN; n]);
                // SAFETY: require_isa checked AVX-512F (and with it AVX2, FMA, F16C).
                unsafe {
                    attn_avx2::scores(kc, kv.row_bytes, kvo, &qf, false, 0.125, &mut want);
                    attn_avx2::scores_row_x2(kc, kv.row_bytes, kvo, &qf, 0.125, &mut got);
                }
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "scores d={d} n={n}");
                softmax(&mut want, true);
                let (mut pa, mut pb) = (want.clone(), want);
                let mut acc = vec![0f32; 32 * d];
                let (mut o_want, mut o_got) = (vec![0f32; d], vec![f32::NAN; d]);
                // SAFETY: as above.
                unsafe {
                    attn_avx2::pv_lanes(&mut pa, vc, kv.row_bytes, kvo, d, 32, &mut acc);
                    attn_avx2::pv_row_x2(&mut pb, vc, kv.row_bytes, kvo, &mut o_got);
                }
                reduce_pv(&acc, d, false, &mut o_want);
                assert_eq!(bits(&pb), bits(&pa), "rounded p d={d} n={n}");
                assert_eq!(bits(&o_got), bits(&o_want), "P·V d={d} n={n}");
            }
        }
    }

    #[test]
    fn kv_slots_truncate_and_free() {
        let mut kv = KvCache::new(KvType::F16, 2, 4, 1, 32, 2).unwrap();
        kv.set_len(1, 3);
        assert_eq!(kv.len(1).unwrap(), 3);
        assert!(kv.truncate(1, 4).is_err());
        kv.truncate(1, 2).unwrap();
        assert_eq!(kv.len(1).unwrap(), 2);
        kv.free(1).unwrap();
        assert_eq!(kv.len(1).unwrap(), 0);
        assert!(kv.len(2).is_err());
        assert!(KvCache::new(KvType::Q8_0, 1, 4, 1, 48, 1).is_err()); // 48 is not whole Q8_0 blocks
    }
}
