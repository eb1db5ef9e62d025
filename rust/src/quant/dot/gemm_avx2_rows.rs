//! AVX2 rows × tokens kernel (decode batches, short verify windows): four consecutive Q4_K
//! rows against 2–4 tokens' (from `IL_MIN_T` tokens: `gemm_avx2_il.rs`) Q8_K activations, `Order::Single`: `out[r·nt + t] =
//! vec_dot(row r, a[t])` bitwise.
//!
//! Why: the multi-token kernel (`q45_k`) pays each (row, token) block's tail alone — two
//! horizontal integer sums (sumi over 8 lanes, summ over 4) and a scalar float combine —
//! which at 4 tokens is about a third of its µops. Here each row's block is decoded once for
//! the tokens, and the tails of four (row, token) slots run as one in-lane transpose
//! (`avx2_rows::transpose_sum4`), one pair of `madd`s for their mins terms and 4-wide float
//! ops, as the one-token grouped kernel (`q4_k_rows4`) does for four rows.
//!
//! Bitwise contract, per (row, token): the integer sums are exact (grouping changes nothing)
//! and the float combine is `k_add_min`'s, `acc + (d_a·d·sumi − d_a·dmin·summ)`, separate
//! multiplies and adds, never fused. Slots are `s = r·N + t`, reduced in groups of four.
//!
//! Safety: callers (`MultiDot::rows_plain` through `rows_kernel`) have checked AVX2/FMA/F16C
//! and that `rows` holds `nr` rows of `n` elements and every activation `n / 256` blocks.

use super::super::super::avx2::rows::{ahead_group, scales8, sum4_halves, transpose_sum4, R};
use super::super::super::avx2::{h2f, load, pf};
use super::super::super::common::k4_scales_packed;
use super::super::super::Order;
use super::{bcast_masks, da_at, mac, q45_k, RowsFn, AB};
use std::arch::x86_64::*;

/// Q4_K block bytes.
const BS: usize = 144;

/// The four floats `f(0..4)`.
#[inline(always)]
fn f4(f: impl Fn(usize) -> f32) -> __m128 {
    // SAFETY: SSE, part of x86_64's baseline.
    unsafe { _mm_setr_ps(f(0), f(1), f(2), f(3)) }
}

/// Four rows (row r at byte `r·rb` of `w`) × `N` tokens: `out[r][t]`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_rows4_t<const N: usize>(
    n: usize,
    w: &[u8],
    rb: usize,
    a: [*const u8; N],
) -> [[f32; N]; R] {
    let m4 = _mm256_set1_epi8(15);
    let bm = bcast_masks();
    let dist = pf::distance();
    // one accumulator per group of four slots: R·N / 4 = N groups
    let mut acc = [_mm_setzero_ps(); N];
    for b in 0..n / 256 {
        ahead_group(w, b, BS, rb, dist);
        let mut sv = [[_mm256_setzero_si256(); N]; R]; // [row][token] i32 × 8 partial sums
        let mut mins = [0u64; R];
        let (mut d, mut dmin) = ([0f32; R], [0f32; R]);
        for r in 0..R {
            let wb = &w[r * rb + BS * b..r * rb + BS * b + BS];
            let (sc, mn) = k4_scales_packed(wb);
            let sc8 = scales8(sc, false);
            mins[r] = mn;
            (d[r], dmin[r]) = (h2f(wb, 0), h2f(wb, 2));
            let qp = wb.as_ptr().add(16);
            for c in 0..4 {
                let q = load(qp.add(32 * c));
                let lo = _mm256_and_si256(q, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                let s0 = _mm256_shuffle_epi8(sc8, bm[2 * c]);
                let s1 = _mm256_shuffle_epi8(sc8, bm[2 * c + 1]);
                for (s, &at) in sv[r].iter_mut().zip(&a) {
                    let ap = at.add(AB * b + 4 + 64 * c);
                    *s = mac(mac(*s, lo, load(ap), s0), hi, load(ap.add(32)), s1);
                }
            }
        }
        // per token: the bsum pairs (bsum_2k + bsum_2k+1, k < 8, i16) and d_a
        let pairs: [__m128i; N] = std::array::from_fn(|t| {
            let bs = load(a[t].add(AB * b + 260));
            _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1))
        });
        let da: [f32; N] = std::array::from_fn(|t| da_at(a[t].add(AB * b)));
        for (g, acc) in acc.iter_mut().enumerate() {
            let (row, tok) = (|k: usize| (4 * g + k) / N, |k: usize| (4 * g + k) % N);
            // sumi of the group's four slots: lanes [s0, s1, s2, s3]
            let t4 = transpose_sum4(std::array::from_fn(|k| sv[row(k)][tok(k)]));
            let si = _mm_add_epi32(_mm256_castsi256_si128(t4), _mm256_extracti128_si256(t4, 1));
            // summ = Σ_k min_k·pair_k per slot: slots 0|1 and 2|3 in the halves of a madd
            let mv = |k: usize| _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mins[row(k)] as i64));
            let half = |k: usize| {
                _mm256_madd_epi16(
                    _mm256_set_m128i(mv(k + 1), mv(k)),
                    _mm256_set_m128i(pairs[tok(k + 1)], pairs[tok(k)]),
                )
            };
            let sm = sum4_halves(half(0), half(2)); // halves [s0 ×4 | s1 ×4], [s2 ×4 | s3 ×4]
            let dav = f4(|k| da[tok(k)]);
            let dd = _mm_mul_ps(dav, f4(|k| d[row(k)]));
            let dm = _mm_mul_ps(dav, f4(|k| dmin[row(k)]));
            // as common::k_add_min, per slot
            let v = _mm_sub_ps(
                _mm_mul_ps(dd, _mm_cvtepi32_ps(si)),
                _mm_mul_ps(dm, _mm_cvtepi32_ps(sm)),
            );
            *acc = _mm_add_ps(*acc, v);
        }
    }
    let mut flat = [0f32; 16];
    for (g, acc) in acc.iter().enumerate() {
        _mm_storeu_ps(flat.as_mut_ptr().add(4 * g), *acc);
    }
    std::array::from_fn(|r| std::array::from_fn(|t| flat[r * N + t]))
}

/// Fewest tokens that take the interleaved kernel (`gemm_avx2_il.rs`): below it the
/// transpose of four rows' blocks costs more than it saves (`q4k_rows_tokens_ab`).
pub const IL_MIN_T: usize = 5;

/// `IL_MIN_T` for `Order::Many`, whose row-by-row kernel has no narrow rows kernel beside it.
pub const IL_MIN_T_MANY: usize = 4;

/// `out[r·nt + t]` for the `nr` rows of `rows` and nt = 2..=`MAX_T` tokens: from `IL_MIN_T`
/// tokens the interleaved kernel, else groups of four rows through `q4_k_rows4_t`; the rows
/// left over through the multi-token kernel.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_rows(n: usize, rows: &[u8], nr: usize, acts: &[&[u8]], out: &mut [f32]) {
    if acts.len() >= IL_MIN_T {
        q4_k_rows_il::<false>(n, rows, nr, acts, out)
    } else {
        q4_k_rows_narrow(n, rows, nr, acts, out)
    }
}

/// Q4_K at 2..=`MAX_T` tokens through the interleaved kernel in `Order::Single` (`MANY`
/// false) or `Order::Many`; the rows left over (nr mod 4) through the multi-token kernel.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super::super) unsafe fn q4_k_rows_il<const MANY: bool>(
    n: usize,
    rows: &[u8],
    nr: usize,
    acts: &[&[u8]],
    out: &mut [f32],
) {
    let order = if MANY { Order::Many } else { Order::Single };
    let multi = super::kernel(crate::quant::GgmlType::Q4K, order).expect("Q4_K's kernels");
    super::il::q4_k_rows_il::<MANY>(n, rows, nr, acts, out, |row, o| multi(n, row, acts, o))
}

/// Q4_K `Order::Many` at 2..=`MAX_T` tokens: from `IL_MIN_T_MANY` tokens the interleaved
/// kernel, else the multi-token kernel row by row.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_rows_many(n: usize, rows: &[u8], nr: usize, acts: &[&[u8]], out: &mut [f32]) {
    let nt = acts.len();
    if nt >= IL_MIN_T_MANY {
        return q4_k_rows_il::<true>(n, rows, nr, acts, out);
    }
    let multi = super::kernel(crate::quant::GgmlType::Q4K, Order::Many).expect("Q4_K's kernels");
    let rl = BS * (n / 256);
    for (r, o) in out.chunks_exact_mut(nt).take(nr).enumerate() {
        multi(n, &rows[r * rl..(r + 1) * rl], acts, o);
    }
}

/// `q4_k_rows` for 2..=4 tokens without the interleaved kernel.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_rows_narrow(n: usize, rows: &[u8], nr: usize, acts: &[&[u8]], out: &mut [f32]) {
    let nt = acts.len();
    let rl = BS * (n / 256);
    assert!((2..=4).contains(&nt) && out.len() >= nr * nt && rows.len() >= nr * rl);
    macro_rules! go {
        ($N:literal) => {{
            let a: [*const u8; $N] = std::array::from_fn(|t| acts[t].as_ptr());
            let mut r = 0;
            while nr - r >= R {
                let o = q4_k_rows4_t::<$N>(n, &rows[r * rl..nr * rl], rl, a);
                for (k, o) in o.iter().enumerate() {
                    out[(r + k) * $N..(r + k + 1) * $N].copy_from_slice(o);
                }
                r += R;
            }
            for r in r..nr {
                let o = q45_k::<$N, false>(n, &rows[r * rl..(r + 1) * rl], a);
                out[r * $N..(r + 1) * $N].copy_from_slice(&o);
            }
        }};
    }
    match nt {
        2 => go!(2),
        3 => go!(3),
        _ => go!(4),
    }
}

/// The AVX2 rows × tokens kernel of `w` in `order` and the most tokens it takes, where one
/// exists: Q4_K, either order, 2..=`MAX_T` tokens.
pub fn rows_kernel_t(w: crate::quant::GgmlType, order: Order) -> Option<(RowsFn, usize)> {
    let k = match (w, order) {
        (crate::quant::GgmlType::Q4K, Order::Single) => q4_k_rows as RowsFn,
        (crate::quant::GgmlType::Q4K, Order::Many) => q4_k_rows_many as RowsFn,
        _ => return None,
    };
    Some((k, super::super::MAX_T))
}
