//! AVX2 multi-token kernels: one weight row against up to 4 tokens' Q8_K activations at a
//! time (IQ3_S: every token of the call, `gemm_iq3s.rs`). Each weight block is decoded once
//! (nibbles, scales, grid lookups, sign masks) and dotted against every token's activation
//! block while it is in registers.
//!
//! Bitwise contract: per token the kernel forms exactly the integer lanes of the single-token
//! kernel of `avx2_k.rs` (integer sums are exact, so any grouping of them is the same) and
//! then performs the float combine of the order asked for, operation for operation:
//! - `Order::Single` (`vec_dot`): Q4_K/Q5_K `k_add_min` per block; Q6_K/IQ3_S ggml's `Fma8`
//!   (`fma(d_a·d, f32(lanes), acc)` per block, then `hsum8`);
//! - `Order::Many` (`kernel_many`): Q4_K the repacked gemm order (per pair of sub-blocks
//!   `fma(f32(si), d·d_a, acc)` and `fma(f32(sm), dmin·d_a, accm)`, then `acc − accm`);
//!   Q6_K/IQ3_S the tiled order (`acc + (f32(Σ lanes)·d_w)·d_a`).
//! - Q8_0 (one order): `Fma8` per 32-element block, as `avx2::q8_0`.
//!
//! `gemm::tests` checks every (row, token) result against `vec_dot` / `kernel_many` bitwise.
//! Safety: callers (`gemm.rs`) have checked the CPU features and that `w` holds `n / 256`
//! blocks and every activation `n / 256` Q8_K blocks.

use super::super::avx2::k::q6_k_half;
use super::super::avx2::{f32_dot_many, h2f, hsum8, hsum_i32, load};
use super::super::common::{k4_scales, k_add_min};
use super::super::Order;
use std::arch::x86_64::*;

#[path = "gemm_avx2_il.rs"]
mod il;
#[path = "gemm_iq3s.rs"]
mod iq3s;
#[path = "gemm_avx2_rows.rs"]
mod rows;
#[cfg(test)]
pub(in super::super) use rows::q4_k_rows_il;
pub use rows::rows_kernel_t;

/// A rows × tokens kernel: `(n, rows, nr, acts, out)`, `out[r·nt + t]` (`rows_kernel_t`).
pub type RowsFn = unsafe fn(usize, &[u8], usize, &[&[u8]], &mut [f32]);

use super::super::common::Q8K_BYTES as AB;

#[target_feature(enable = "avx2")]
#[inline]
fn mac(acc: __m256i, u: __m256i, s: __m256i, scales: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scales))
}

#[target_feature(enable = "avx2")]
#[inline]
unsafe fn scales8(p: *const u8, signed: bool) -> __m256i {
    let b = _mm_loadl_epi64(p as *const __m128i);
    let v = if signed {
        _mm_cvtepi8_epi16(b)
    } else {
        _mm_cvtepu8_epi16(b)
    };
    _mm256_broadcastsi128_si256(v)
}

#[target_feature(enable = "avx2")]
#[inline]
fn pair_masks() -> [__m256i; 4] {
    std::array::from_fn(|p| {
        let m: [u8; 32] = std::array::from_fn(|i| (4 * p + 2 * (i / 16) + i % 2) as u8);
        unsafe { _mm256_loadu_si256(m.as_ptr() as *const __m256i) }
    })
}

#[target_feature(enable = "avx2")]
#[inline]
fn bcast_masks() -> [__m256i; 8] {
    std::array::from_fn(|k| _mm256_set1_epi16((0x0100 + 0x0202 * k) as i16))
}

/// The activation scale d of a Q8_K block (f32 at byte 0).
#[inline(always)]
pub(super) unsafe fn da_at(ab: *const u8) -> f32 {
    f32::from_le_bytes(*(ab as *const [u8; 4]))
}

/// Per pair of sub-blocks c (0..4) the mins term `m_2c·pair_2c + m_2c+1·pair_2c+1` of one
/// token's Q8_K block (pair_k = bsum_2k + bsum_2k+1), as four i32 lanes.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn k4_summ4(mv: __m128i, ab: *const u8) -> __m128i {
    let bs = load(ab.add(260));
    let pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    _mm_madd_epi16(mv, pairs)
}

/// Sum of the four i32 lanes (the single-token kernel's `summ`).
#[target_feature(enable = "avx2")]
#[inline]
fn hsum4(v: __m128i) -> i32 {
    let s = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    _mm_cvtsi128_si32(s)
}

/// Q4_K (`Q5` false, 144-byte blocks) and Q5_K (176), `Order::Single`:
/// `out[t] = vec_dot(w, a[t])`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q45_k<const N: usize, const Q5: bool>(n: usize, w: &[u8], a: [*const u8; N]) -> [f32; N] {
    let bs = if Q5 { 176 } else { 144 };
    let bm = bcast_masks();
    let (m4, one) = (_mm256_set1_epi8(15), _mm256_set1_epi8(1));
    let mut acc = [0f32; N];
    for b in 0..n / 256 {
        let wb = &w[bs * b..bs * b + bs];
        let (sc, mins) = k4_scales(wb);
        let sc8 = scales8(sc.as_ptr(), false);
        let qs = wb.as_ptr().add(if Q5 { 48 } else { 16 });
        let mut hv = if Q5 {
            load(wb.as_ptr().add(16))
        } else {
            _mm256_setzero_si256()
        };
        let mut sumv = [_mm256_setzero_si256(); N];
        for c in 0..4 {
            let q = load(qs.add(32 * c));
            let mut lo = _mm256_and_si256(q, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if Q5 {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hv, one), 4));
                hv = _mm256_srli_epi16(hv, 1);
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(hv, one), 4));
                hv = _mm256_srli_epi16(hv, 1);
            }
            let s0 = _mm256_shuffle_epi8(sc8, bm[2 * c]);
            let s1 = _mm256_shuffle_epi8(sc8, bm[2 * c + 1]);
            for t in 0..N {
                let ap = a[t].add(AB * b + 4 + 64 * c);
                sumv[t] = mac(sumv[t], lo, load(ap), s0);
                sumv[t] = mac(sumv[t], hi, load(ap.add(32)), s1);
            }
        }
        let mv = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(u64::from_le_bytes(mins) as i64));
        let (d, dmin) = (h2f(wb, 0), h2f(wb, 2));
        for t in 0..N {
            let ab = a[t].add(AB * b);
            let sm = hsum4(k4_summ4(mv, ab));
            let da = da_at(ab);
            // as k_kernel!(q4_k / q5_k, ..) in avx2_k.rs
            acc[t] = k_add_min(acc[t], da * d, hsum_i32(sumv[t]), da * dmin, sm);
        }
    }
    acc
}

/// Q4_K, `Order::Many` (ggml's repacked gemm order, `avx2_k::q4_k_gemm`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_gemm<const N: usize>(n: usize, w: &[u8], a: [*const u8; N]) -> [f32; N] {
    let bm = bcast_masks();
    let m4 = _mm256_set1_epi8(15);
    let (mut acc, mut accm) = ([0f32; N], [0f32; N]);
    for b in 0..n / 256 {
        let wb = &w[144 * b..144 * b + 144];
        let (sc, mins) = k4_scales(wb);
        let sc8 = scales8(sc.as_ptr(), false);
        let qs = wb.as_ptr().add(16);
        // Per token the four pair sums si_c, gathered by horizontal adds (exact integers).
        let mut half = [[_mm256_setzero_si256(); N]; 2];
        for p in 0..2 {
            let mut v0 = [_mm256_setzero_si256(); N];
            for c in [2 * p, 2 * p + 1] {
                let q = load(qs.add(32 * c));
                let lo = _mm256_and_si256(q, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                let s0 = _mm256_shuffle_epi8(sc8, bm[2 * c]);
                let s1 = _mm256_shuffle_epi8(sc8, bm[2 * c + 1]);
                for t in 0..N {
                    let ap = a[t].add(AB * b + 4 + 64 * c);
                    let v = mac(_mm256_setzero_si256(), lo, load(ap), s0);
                    let v = mac(v, hi, load(ap.add(32)), s1);
                    if c % 2 == 0 {
                        v0[t] = v;
                    } else {
                        half[p][t] = _mm256_hadd_epi32(v0[t], v);
                    }
                }
            }
        }
        let mv = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(u64::from_le_bytes(mins) as i64));
        let (d, dmin) = (h2f(wb, 0), h2f(wb, 2));
        for t in 0..N {
            let ab = a[t].add(AB * b);
            let y = _mm256_hadd_epi32(half[0][t], half[1][t]);
            let si4 = _mm_add_epi32(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
            let (mut si, mut sm) = ([0f32; 4], [0f32; 4]);
            _mm_storeu_ps(si.as_mut_ptr(), _mm_cvtepi32_ps(si4));
            _mm_storeu_ps(sm.as_mut_ptr(), _mm_cvtepi32_ps(k4_summ4(mv, ab)));
            let da = da_at(ab);
            let (dd, dm) = (d * da, dmin * da);
            for c in 0..4 {
                acc[t] = si[c].mul_add(dd, acc[t]);
                accm[t] = sm[c].mul_add(dm, accm[t]);
            }
        }
    }
    std::array::from_fn(|t| acc[t] - accm[t])
}

/// The per-block float combine of the Q6_K / IQ3_S orders for one token: `Single` keeps
/// ggml's eight FMA lanes in `accv`, `Many` (tiled) one scalar in `acc`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn combine8<const MANY: bool>(
    lanes: __m256i,
    d: f32,
    da: f32,
    accv: &mut __m256,
    acc: &mut f32,
    single_d: f32,
) {
    if MANY {
        // as tiled_kernel!: acc + (f32(Σ lanes)·d_w)·d_a
        *acc += (hsum_i32(lanes) as f32 * d) * da;
    } else {
        // as fma8_kernel!: fma(d, f32(lanes), acc)
        *accv = _mm256_fmadd_ps(_mm256_set1_ps(single_d), _mm256_cvtepi32_ps(lanes), *accv);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn finish8<const N: usize, const MANY: bool>(accv: &[__m256; N], acc: &[f32; N]) -> [f32; N] {
    std::array::from_fn(|t| if MANY { acc[t] } else { hsum8(accv[t]) })
}

/// Q6_K (210-byte blocks), either order.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k<const N: usize, const MANY: bool>(
    n: usize,
    w: &[u8],
    a: [*const u8; N],
) -> [f32; N] {
    let masks = pair_masks();
    let (mut accv, mut acc) = ([_mm256_setzero_ps(); N], [0f32; N]);
    for b in 0..n / 256 {
        let wb = &w[210 * b..210 * b + 210];
        let (qlp, qhp) = (wb.as_ptr(), wb.as_ptr().add(128));
        let mut sumv = [_mm256_setzero_si256(); N];
        for h in 0..2 {
            let q = q6_k_half(qlp, qhp, h);
            let sc8 = scales8(wb.as_ptr().add(192 + 8 * h), true);
            let scv: [__m256i; 4] = std::array::from_fn(|j| _mm256_shuffle_epi8(sc8, masks[j]));
            for t in 0..N {
                let ap = a[t].add(AB * b + 4 + 128 * h);
                for j in 0..4 {
                    sumv[t] = mac(sumv[t], q[j], load(ap.add(32 * j)), scv[j]);
                }
            }
        }
        let scv = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.as_ptr().add(192) as *const __m128i));
        let d = h2f(wb, 208);
        for t in 0..N {
            let ab = a[t].add(AB * b);
            let msum = _mm256_madd_epi16(scv, load(ab.add(260)));
            let lanes = _mm256_sub_epi32(sumv[t], _mm256_slli_epi32(msum, 5));
            let da = da_at(ab);
            combine8::<MANY>(lanes, d, da, &mut accv[t], &mut acc[t], da * d);
        }
    }
    finish8::<N, MANY>(&accv, &acc)
}

/// Q8_0 (34-byte blocks, one order: ggml's `Fma8`, as `avx2::q8_0`): the weight block's
/// absolute values and its scale are shared by the tokens; per token
/// `fma(d·d_a, f32(lanes), acc)` per block, then `hsum8`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0<const N: usize>(n: usize, w: &[u8], a: [*const u8; N]) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let ones = _mm256_set1_epi16(1);
    for b in 0..n / 32 {
        let q = load(w.as_ptr().add(34 * b + 2));
        let absq = _mm256_abs_epi8(q);
        let d = h2f(w, 34 * b);
        for t in 0..N {
            let ab = a[t].add(34 * b);
            // as avx2::dot_ss: |q| · (a with q's sign)
            let s = _mm256_sign_epi8(load(ab.add(2)), q);
            let lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(absq, s), ones);
            let da = h2f(std::slice::from_raw_parts(ab, 2), 0);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * da), _mm256_cvtepi32_ps(lanes), acc[t]);
        }
    }
    std::array::from_fn(|t| hsum8(acc[t]))
}

/// A multi-token kernel: `out[t] = dot(w, acts[t])` for `t < acts.len()` (any count).
pub type MultiFn = unsafe fn(usize, &[u8], &[&[u8]], &mut [f32]);

/// Runs kernel `$k` over `acts` in groups of at most 4 tokens (const-generic widths).
macro_rules! grouped {
    ($k:ident $(, $extra:tt)?) => {{
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn run(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
            let mut t = 0;
            while t < acts.len() {
                let left = acts.len() - t;
                let p = |i: usize| acts[t + i].as_ptr();
                match left {
                    1 => out[t] = $k::<1 $(, $extra)?>(n, w, [p(0)])[0],
                    2 => out[t..t + 2].copy_from_slice(&$k::<2 $(, $extra)?>(n, w, [p(0), p(1)])),
                    3 => out[t..t + 3]
                        .copy_from_slice(&$k::<3 $(, $extra)?>(n, w, [p(0), p(1), p(2)])),
                    _ => out[t..t + 4]
                        .copy_from_slice(&$k::<4 $(, $extra)?>(n, w, [p(0), p(1), p(2), p(3)])),
                }
                t += left.min(4);
            }
        }
        run as MultiFn
    }};
}

/// The AVX2 multi-token kernel for `w` in `order`, if there is one.
pub fn kernel(w: crate::quant::GgmlType, order: Order) -> Option<MultiFn> {
    use crate::quant::GgmlType::*;
    Some(match (w, order) {
        (Q4K, Order::Single) => grouped!(q45_k, false),
        (Q4K, Order::Many) => grouped!(q4_k_gemm),
        (Q5K, Order::Single) => grouped!(q45_k, true),
        (Q6K, Order::Single) => grouped!(q6_k, false),
        (Q6K, Order::Many) => grouped!(q6_k, true),
        (Q8_0, _) => grouped!(q8_0),
        (F32, Order::Many) => f32_many_run as MultiFn,
        (IQ3S, Order::Single) => iq3s::iq3_s_multi::<false> as MultiFn,
        (IQ3S, Order::Many) => iq3s::iq3_s_multi::<true> as MultiFn,
        _ => return None,
    })
}

/// F32 in the multi-row order (`avx2::f32_dot_many`: one 8-lane accumulator per dot over
/// 8-element steps, then `hsum8`) for up to 8 tokens at once: their independent chains
/// interleaved, each dot's operations as alone (one dot at a time waited on its FMA's latency
/// at every step: the router's logits took ~4% of an IQ3_S pp512).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_many_run(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    if !n.is_multiple_of(8) {
        for (o, a) in out.iter_mut().zip(acts) {
            *o = f32_dot_many(n, w, a);
        }
        return;
    }
    for (a, o) in acts.chunks(8).zip(out.chunks_mut(8)) {
        match a.len() {
            8 => o.copy_from_slice(&f32_many::<8>(n, w, a)),
            4..=7 => {
                o[..4].copy_from_slice(&f32_many::<4>(n, w, &a[..4]));
                for (oo, aa) in o[4..].iter_mut().zip(&a[4..]) {
                    *oo = f32_many::<1>(n, w, std::slice::from_ref(aa))[0];
                }
            }
            _ => {
                for (oo, aa) in o.iter_mut().zip(a) {
                    *oo = f32_many::<1>(n, w, std::slice::from_ref(aa))[0];
                }
            }
        }
    }
}

/// T dots of the F32 row `w` (n a multiple of 8) in `f32_dot_many`'s order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn f32_many<const T: usize>(n: usize, w: &[u8], a: &[&[u8]]) -> [f32; T] {
    let wp = w.as_ptr() as *const f32;
    let ap: [*const f32; T] = std::array::from_fn(|t| a[t].as_ptr() as *const f32);
    let mut acc = [_mm256_setzero_ps(); T];
    let mut i = 0;
    while i < n {
        let wv = _mm256_loadu_ps(wp.add(i));
        for t in 0..T {
            acc[t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(ap[t].add(i)), acc[t]);
        }
        i += 8;
    }
    acc.map(|v| hsum8(v))
}
