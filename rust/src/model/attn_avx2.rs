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

/// Whether the AVX-512 one-row kernels (`scores_row_x2`, `pv_row_x2`) run: the CPU has
/// AVX-512F besides `available()`'s features and the active ISA is AVX-512 (`STRATA_ISA`).
pub fn available_x2() -> bool {
    available()
        && std::arch::is_x86_feature_detected!("avx512f")
        && crate::quant::dot::active_isa() == crate::quant::dot::Isa::Avx512
}

/// `scores(.., many: false, ..)` on 16-lane registers, four positions at a time: the one-row
/// order's four 8-lane accumulators are two 16-lane registers (dims i..i+16 and i+16..i+32 of
/// each 32-element step), so every lane's FMA chain is the AVX2 kernel's, and `reduce_4x8`'s
/// sums run in its order (`reduce_row`): bitwise `scores`. Four positions keep eight FMA
/// chains in flight where one position had two. Needs `d % 32 == 0`.
///
/// # Safety
/// `available_x2()` holds.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub unsafe fn scores_row_x2(
    k: &[u8],
    row_bytes: usize,
    kvo: usize,
    qf: &[f32],
    scale: f32,
    scores: &mut [f32],
) {
    let d = qf.len();
    assert!(d.is_multiple_of(32), "head dim {d} is not a multiple of 32");
    let n = scores.len();
    if let Some(last) = n.checked_sub(1) {
        assert!(
            last * row_bytes + kvo + 2 * d <= k.len(),
            "K rows out of range"
        );
    }
    let (q, kb) = (qf.as_ptr(), k.as_ptr().add(kvo));
    // dims i..i+16 of row j, widened
    let ld = |j: usize, i: usize| {
        _mm512_cvtph_ps(_mm256_loadu_si256(
            kb.add(j * row_bytes + 2 * i) as *const __m256i
        ))
    };
    let mut j = 0;
    while j + 4 <= n {
        let mut acc = [[_mm512_setzero_ps(); 2]; 4];
        for i in (0..d).step_by(32) {
            let (q0, q1) = (_mm512_loadu_ps(q.add(i)), _mm512_loadu_ps(q.add(i + 16)));
            for (r, a) in acc.iter_mut().enumerate() {
                a[0] = _mm512_fmadd_ps(ld(j + r, i), q0, a[0]);
                a[1] = _mm512_fmadd_ps(ld(j + r, i + 16), q1, a[1]);
            }
        }
        for (r, a) in acc.iter().enumerate() {
            *scores.get_unchecked_mut(j + r) = reduce_row(a[0], a[1]) * scale;
        }
        j += 4;
    }
    for (jj, sc) in scores.iter_mut().enumerate().skip(j) {
        let mut a = [_mm512_setzero_ps(); 2];
        for i in (0..d).step_by(32) {
            a[0] = _mm512_fmadd_ps(ld(jj, i), _mm512_loadu_ps(q.add(i)), a[0]);
            a[1] = _mm512_fmadd_ps(ld(jj, i + 16), _mm512_loadu_ps(q.add(i + 16)), a[1]);
        }
        *sc = reduce_row(a[0], a[1]) * scale;
    }
}

/// `reduce_4x8` of the accumulators s0..s3 held as z01 = [s0 | s1], z23 = [s2 | s3]:
/// t = (s0 + s2) + (s1 + s3), h = t[0..4] + t[4..8], (h0 + h1) + (h2 + h3).
#[inline(always)]
unsafe fn reduce_row(z01: __m512, z23: __m512) -> f32 {
    let u = _mm512_add_ps(z01, z23); // [s0 + s2 | s1 + s3]
    let t = _mm256_add_ps(
        _mm512_castps512_ps256(u),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(u))),
    );
    let h = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t));
    let x = _mm_hadd_ps(h, h); // [h0 + h1, h2 + h3, ..]
    _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)))
}

/// `pv_lanes(.., lanes: 32, ..)` followed by the one-row `reduce_4x8` of its lanes, on 16-lane
/// registers: per 16 dimensions the 32 lane accumulators stay in registers (16 at a time,
/// positions j ≡ l mod 32 into lane l in increasing j, each `fma(v_j, p_j, lane)`), then
/// out[i] = (h0 + h1) + (h2 + h3) with t_k = (L_k + L_16+k) + (L_8+k + L_24+k) and
/// h_m = t_m + t_m+4: bitwise the AVX2 lanes and `reduce_pv`. `p` is rounded to f16 in place
/// as `pv_lanes` rounds it. Needs `out.len() % 16 == 0`.
///
/// # Safety
/// `available_x2()` holds.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub unsafe fn pv_row_x2(p: &mut [f32], v: &[u8], row_bytes: usize, kvo: usize, out: &mut [f32]) {
    let d = out.len();
    assert!(
        d.is_multiple_of(16),
        "P·V: head dim {d} is not a multiple of 16"
    );
    let n = p.len();
    if let Some(last) = n.checked_sub(1) {
        assert!(
            last * row_bytes + kvo + 2 * d <= v.len(),
            "V rows out of range"
        );
    }
    for x in p.iter_mut() {
        *x = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph::<0>(_mm_set_ss(*x))));
    }
    let (vb, pp) = (v.as_ptr().add(kvo), p.as_ptr());
    for c in (0..d).step_by(16) {
        // dims c..c+16 of row j, widened
        let row = |j: usize| {
            _mm512_cvtph_ps(_mm256_loadu_si256(
                vb.add(j * row_bytes + 2 * c) as *const __m256i
            ))
        };
        // lanes 0..16 (half 0) and 16..32 (half 1)
        let half = |h: usize| {
            let mut a = [_mm512_setzero_ps(); 16];
            let mut j0 = 16 * h;
            while j0 < n {
                let m = (n - j0).min(16);
                for (l, al) in a.iter_mut().enumerate() {
                    if l < m {
                        let pj = _mm512_set1_ps(*pp.add(j0 + l));
                        *al = _mm512_fmadd_ps(row(j0 + l), pj, *al);
                    }
                }
                j0 += 32;
            }
            a
        };
        let (lo, hi) = (half(0), half(1));
        // t_k = (L_k + L_16+k) + (L_8+k + L_24+k)
        let t: [__m512; 8] = std::array::from_fn(|k| {
            _mm512_add_ps(
                _mm512_add_ps(lo[k], hi[k]),
                _mm512_add_ps(lo[8 + k], hi[8 + k]),
            )
        });
        let h: [__m512; 4] = std::array::from_fn(|m| _mm512_add_ps(t[m], t[m + 4]));
        let o = _mm512_add_ps(_mm512_add_ps(h[0], h[1]), _mm512_add_ps(h[2], h[3]));
        _mm512_storeu_ps(out.as_mut_ptr().add(c), o);
    }
}
