//! AVX2 kernels of the f16-cache attention: q·k scores and the P·V lanes read the f16 K/V
//! rows directly (F16C widening is exact) instead of widening each row into a buffer first.
//! They keep the float orders of `attention.rs`'s widen-then-dot path, so results are bitwise
//! equal (`attention::tests`): q·k in ggml's multi-row order (tinyBLAS: one 8-lane FMA
//! accumulator, `reduce8`) or its one-row order (`ggml_vec_dot_f32`: four accumulators over
//! 32-element steps, `reduce_4x8`), P·V as `fma(v, p, lane)` per position.

use crate::quant::dot::{common_reduce8, reduce_4x8};
use std::arch::x86_64::*;

/// Whether the kernels can run (AVX2 + FMA + F16C).
pub fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// `scores[j] = dot(k_j, qf) · scale` for j < scores.len(), K row j being the `d` f16 values at
/// `k[j·row_bytes + kvo..]`; `many` picks the multi-row order. Needs `d % 32 == 0`.
///
/// # Safety
/// `available()` holds.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scores(
    k: &[u8],
    row_bytes: usize,
    kvo: usize,
    qf: &[f32],
    many: bool,
    scale: f32,
    scores: &mut [f32],
) {
    let d = qf.len();
    assert!(d.is_multiple_of(32), "head dim {d} is not a multiple of 32");
    if let Some(last) = scores.len().checked_sub(1) {
        assert!(
            last * row_bytes + kvo + 2 * d <= k.len(),
            "K rows out of range"
        );
    }
    let q = qf.as_ptr();
    for (j, sc) in scores.iter_mut().enumerate() {
        let kp = k.as_ptr().add(j * row_bytes + kvo);
        let ld = |i: usize| _mm256_cvtph_ps(_mm_loadu_si128(kp.add(2 * i) as *const __m128i));
        let dot = if many {
            let mut acc = _mm256_setzero_ps();
            for i in (0..d).step_by(8) {
                acc = _mm256_fmadd_ps(ld(i), _mm256_loadu_ps(q.add(i)), acc);
            }
            let mut r = [0f32; 8];
            _mm256_storeu_ps(r.as_mut_ptr(), acc);
            common_reduce8(&r)
        } else {
            let mut acc = [_mm256_setzero_ps(); 4];
            for i in (0..d).step_by(32) {
                for (a, s) in acc.iter_mut().enumerate() {
                    let o = i + 8 * a;
                    *s = _mm256_fmadd_ps(ld(o), _mm256_loadu_ps(q.add(o)), *s);
                }
            }
            let mut r = [[0f32; 8]; 4];
            for (a, s) in acc.iter().enumerate() {
                _mm256_storeu_ps(r[a].as_mut_ptr(), *s);
            }
            // `ggml_vec_dot_f32` sums in f64 after the lanes (no tail here: d % 32 == 0).
            reduce_4x8(&r) as f64 as f32
        };
        *sc = dot * scale;
    }
}

/// `acc[(j % lanes)·d + i] = fma(v_j[i], p_j, acc[..])` over positions j < p.len() in
/// increasing j, V row j being the `d` f16 values at `v[j·row_bytes + kvo..]` and `p_j` the
/// probability rounded to f16 (to nearest even, as `half::f16::from_f32`; `p` is rounded in
/// place). `acc` holds `lanes·d` zeros on entry. Needs `d % 8 == 0`. With 8 lanes each group
/// of 8 dimensions keeps its 8 lane accumulators in registers over all positions.
///
/// # Safety
/// `available()` holds.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn pv_lanes(
    p: &mut [f32],
    v: &[u8],
    row_bytes: usize,
    kvo: usize,
    d: usize,
    lanes: usize,
    acc: &mut [f32],
) {
    assert!(d.is_multiple_of(8) && acc.len() >= lanes * d, "P·V lanes");
    if let Some(last) = p.len().checked_sub(1) {
        assert!(
            last * row_bytes + kvo + 2 * d <= v.len(),
            "V rows out of range"
        );
    }
    for x in p.iter_mut() {
        *x = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph::<0>(_mm_set_ss(*x))));
    }
    let row = |j: usize, i: usize| {
        let vp = v.as_ptr().add(j * row_bytes + kvo + 2 * i);
        _mm256_cvtph_ps(_mm_loadu_si128(vp as *const __m128i))
    };
    if lanes == 8 {
        let full = p.len() / 8 * 8;
        for i in (0..d).step_by(8) {
            let mut a = [_mm256_setzero_ps(); 8];
            for j0 in (0..full).step_by(8) {
                for (l, al) in a.iter_mut().enumerate() {
                    let pj = _mm256_set1_ps(*p.get_unchecked(j0 + l));
                    *al = _mm256_fmadd_ps(row(j0 + l, i), pj, *al);
                }
            }
            for (l, al) in a.iter_mut().enumerate().take(p.len() - full) {
                let pj = _mm256_set1_ps(p[full + l]);
                *al = _mm256_fmadd_ps(row(full + l, i), pj, *al);
            }
            for (l, al) in a.iter().enumerate() {
                _mm256_storeu_ps(acc.as_mut_ptr().add(l * d + i), *al);
            }
        }
        return;
    }
    for (j, &pj) in p.iter().enumerate() {
        let a = acc.as_mut_ptr().add((j % lanes) * d);
        let pv = _mm256_set1_ps(pj);
        for i in (0..d).step_by(8) {
            let s = _mm256_fmadd_ps(row(j, i), pv, _mm256_loadu_ps(a.add(i)));
            _mm256_storeu_ps(a.add(i), s);
        }
    }
}
