//! AVX2 kernels of the 256-element K, IQ and TQ types. Each computes a block's exact
//! integer sums with SIMD and combines them with the float scales through the same
//! `common` functions as the scalar kernels, so results are bitwise equal.
//! Safety: as in `avx2.rs` (callers have checked the feature and the slice lengths).

use super::super::common::{f32_at, i16_at, iq1_add, k4_scales, k_add, k_add_min, u16_at, u32_at};
use super::super::scalar_iq::iq1_m_d;
use super::{bits_to_bytes, h2f, hsum8, hsum_i32, load, load128, nibbles, pf, table16};
use crate::quant::tables::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_IQ4NL,
};
use std::arch::x86_64::*;

/// i16 lanes 0..8 = `lo`, lanes 8..16 = `hi`: per-16-element scales of a 32-element chunk
/// after `maddubs` (i16 lane i holds elements 2i, 2i+1).
#[target_feature(enable = "avx2")]
#[inline]
fn pair16(lo: i32, hi: i32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
}

/// Shuffle masks for `pair_of`: mask p puts i16 lane 2p of a 128-bit half in lanes 0..8
/// and lane 2p+1 in lanes 8..16.
#[target_feature(enable = "avx2")]
#[inline]
fn pair_masks() -> [__m256i; 4] {
    std::array::from_fn(|p| {
        let m: [u8; 32] = std::array::from_fn(|i| (4 * p + 2 * (i / 16) + i % 2) as u8);
        unsafe { _mm256_loadu_si256(m.as_ptr() as *const __m256i) }
    })
}

/// Shuffle masks for broadcasting i16 lane k of a 128-bit half to all 16 lanes.
#[target_feature(enable = "avx2")]
#[inline]
fn bcast_masks() -> [__m256i; 8] {
    std::array::from_fn(|k| _mm256_set1_epi16((0x0100 + 0x0202 * k) as i16))
}

/// Eight i16 scales (8 bytes at `p`, sign- or zero-extended) in both 128-bit halves.
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

/// `acc + madd(maddubs(u, s), scales)`.
#[target_feature(enable = "avx2")]
#[inline]
fn mac(acc: __m256i, u: __m256i, s: __m256i, scales: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scales))
}

/// Drive a block kernel: `$ints(wb, ab) -> (sumi, summ)`, then the shared float combine.
macro_rules! k_kernel {
    ($name:ident, $ints:ident, $bs:expr, |$wb:ident, $ab:ident, $da:ident, $acc:ident, $si:ident, $sm:ident| $comb:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(in super::super) unsafe fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let mut $acc = 0f32;
            let dist = pf::distance();
            for b in 0..n / 256 {
                pf::ahead(w, $bs * b, dist, $bs);
                let $wb = &w[$bs * b..$bs * b + $bs];
                let $ab = &a[292 * b..292 * b + 292];
                let ($si, $sm) = $ints($wb, $ab);
                let $da = f32_at($ab, 0);
                $acc = $comb;
            }
            $acc
        }
    };
}

#[inline(always)]
unsafe fn q2_k_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    let masks = pair_masks();
    let (qp, ap) = (wb.as_ptr().add(16), ab.as_ptr().add(4));
    let sc = load128(wb.as_ptr());
    let m3 = _mm256_set1_epi8(3);
    let mut sumv = _mm256_setzero_si256();
    for h in 0..2 {
        let mut qv = load(qp.add(32 * h));
        let sc8 = _mm256_and_si256(
            scales8(wb.as_ptr().add(8 * h), false),
            _mm256_set1_epi16(15),
        );
        for j in 0..4 {
            let scv = _mm256_shuffle_epi8(sc8, masks[j]);
            let q = _mm256_and_si256(qv, m3);
            sumv = mac(sumv, q, load(ap.add(128 * h + 32 * j)), scv);
            qv = _mm256_srli_epi16(qv, 2);
        }
    }
    let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(15)));
    let summ = _mm256_madd_epi16(mins, load(ab.as_ptr().add(260)));
    (hsum_i32(sumv), hsum_i32(summ))
}
k_kernel!(q2_k, q2_k_ints, 84, |wb, ab, da, acc, si, sm| k_add_min(
    acc,
    da * h2f(wb, 80),
    si,
    da * h2f(wb, 82),
    sm
));

#[inline(always)]
unsafe fn q3_k_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    let sc = q3k_scales_packed(wb);
    let masks = pair_masks();
    let sc8 = [
        scales8(sc.as_ptr() as *const u8, true),
        scales8(sc.as_ptr().add(8) as *const u8, true),
    ];
    let ap = ab.as_ptr().add(4);
    let (m3, one) = (_mm256_set1_epi8(3), _mm256_set1_epi8(1));
    let mut hm = load(wb.as_ptr());
    let mut sumv = _mm256_setzero_si256();
    for h in 0..2 {
        let mut qv = load(wb.as_ptr().add(32 + 32 * h));
        for j in 0..4 {
            // u = q2 + 4·hbit = q + 4; the 4·Σa is taken off below.
            let hb = _mm256_slli_epi16(_mm256_and_si256(hm, one), 2);
            let u = _mm256_or_si256(_mm256_and_si256(qv, m3), hb);
            let scv = _mm256_shuffle_epi8(sc8[h], masks[j]);
            sumv = mac(sumv, u, load(ap.add(128 * h + 32 * j)), scv);
            qv = _mm256_srli_epi16(qv, 2);
            hm = _mm256_srli_epi16(hm, 1);
        }
    }
    let scv = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
    let msum = _mm256_madd_epi16(scv, load(ab.as_ptr().add(260)));
    (
        hsum_i32(_mm256_sub_epi32(sumv, _mm256_slli_epi32(msum, 2))),
        0,
    )
}

/// The 16 signed Q3_K scales (`common::q3k_scales`) from word operations: the low 4 bits
/// are the low nibbles of bytes 96..104 (scales 0..8) and their high nibbles (8..16); the
/// top 2 bits of scale i are bits 2·(i/4)..+2 of byte 104 + i%4.
#[inline(always)]
pub(in super::super) fn q3k_scales_packed(wb: &[u8]) -> [i8; 16] {
    let lo = u64::from_le_bytes(wb[96..104].try_into().unwrap());
    let aux = u32_at(wb, 104) as u64;
    let (m4, m2) = (0x0f0f_0f0f_0f0f_0f0fu64, 0x0303_0303u64);
    let h01 = (aux & m2) | ((aux >> 2) & m2) << 32;
    let h23 = ((aux >> 4) & m2) | ((aux >> 6) & m2) << 32;
    let a = ((lo & m4) | h01 << 4).to_le_bytes();
    let b = (((lo >> 4) & m4) | h23 << 4).to_le_bytes();
    std::array::from_fn(|i| (if i < 8 { a[i] } else { b[i - 8] }) as i8 - 32)
}

k_kernel!(q3_k, q3_k_ints, 110, |wb, ab, da, acc, si, _sm| k_add(
    acc,
    da * h2f(wb, 108),
    si
));

/// Q4_K / Q5_K block: `qh` is the Q5_K high-bit array (None for Q4_K).
#[inline(always)]
unsafe fn q45_k_ints(wb: &[u8], ab: &[u8], qs: *const u8, qh: Option<*const u8>) -> (i32, i32) {
    let (sc, mins) = k4_scales(wb);
    let (sc8, bm) = (scales8(sc.as_ptr(), false), bcast_masks());
    let ap = ab.as_ptr().add(4);
    let (m4, one) = (_mm256_set1_epi8(15), _mm256_set1_epi8(1));
    let mut hv = match qh {
        Some(p) => load(p),
        None => _mm256_setzero_si256(),
    };
    let mut sumv = _mm256_setzero_si256();
    for c in 0..4 {
        let q = load(qs.add(32 * c));
        let mut lo = _mm256_and_si256(q, m4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if qh.is_some() {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hv, one), 4));
            hv = _mm256_srli_epi16(hv, 1);
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(hv, one), 4));
            hv = _mm256_srli_epi16(hv, 1);
        }
        let s0 = _mm256_shuffle_epi8(sc8, bm[2 * c]);
        let s1 = _mm256_shuffle_epi8(sc8, bm[2 * c + 1]);
        sumv = mac(sumv, lo, load(ap.add(64 * c)), s0);
        sumv = mac(sumv, hi, load(ap.add(64 * c + 32)), s1);
    }
    // Σ_k m_k·(bsum_2k + bsum_2k+1): pair sums of the 16 bsums, then a madd with the mins.
    let bs = load(ab.as_ptr().add(260));
    let pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    let mv = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(u64::from_le_bytes(mins) as i64));
    let summ = _mm_madd_epi16(mv, pairs);
    let summ = _mm_add_epi32(summ, _mm_unpackhi_epi64(summ, summ));
    let summ = _mm_add_epi32(summ, _mm_shuffle_epi32(summ, 1));
    (hsum_i32(sumv), _mm_cvtsi128_si32(summ))
}

/// ggml's repacked Q4_K gemm order (`scalar_k::q4_k_gemm`): per pair of sub-blocks, FMAs
/// into a sum and a mins accumulator.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn q4_k_gemm(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    let m4 = _mm256_set1_epi8(15);
    let bm = bcast_masks();
    for b in 0..n / 256 {
        let wb = &w[144 * b..144 * b + 144];
        let ab = &a[292 * b..292 * b + 292];
        let da = f32_at(ab, 0);
        let (dd, dm) = (h2f(wb, 0) * da, h2f(wb, 2) * da);
        let (sc, mins) = k4_scales(wb);
        let sc8 = scales8(sc.as_ptr(), false);
        let (qs, ap) = (wb.as_ptr().add(16), ab.as_ptr().add(4));
        for c in 0..4 {
            let q = load(qs.add(32 * c));
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            let s0 = _mm256_shuffle_epi8(sc8, bm[2 * c]);
            let s1 = _mm256_shuffle_epi8(sc8, bm[2 * c + 1]);
            let v = mac(_mm256_setzero_si256(), lo, load(ap.add(64 * c)), s0);
            let si = hsum_i32(mac(v, hi, load(ap.add(64 * c + 32)), s1));
            let bs = |k: usize| i16_at(ab, 260 + 2 * k);
            let sm = mins[2 * c] as i32 * (bs(4 * c) + bs(4 * c + 1))
                + mins[2 * c + 1] as i32 * (bs(4 * c + 2) + bs(4 * c + 3));
            acc = (si as f32).mul_add(dd, acc);
            accm = (sm as f32).mul_add(dm, accm);
        }
    }
    acc - accm
}

#[inline(always)]
unsafe fn q4_k_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    q45_k_ints(wb, ab, wb.as_ptr().add(16), None)
}

#[inline(always)]
unsafe fn q5_k_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    q45_k_ints(wb, ab, wb.as_ptr().add(48), Some(wb.as_ptr().add(16)))
}

k_kernel!(q4_k, q4_k_ints, 144, |wb, ab, da, acc, si, sm| k_add_min(
    acc,
    da * h2f(wb, 0),
    si,
    da * h2f(wb, 2),
    sm
));
k_kernel!(q5_k, q5_k_ints, 176, |wb, ab, da, acc, si, sm| k_add_min(
    acc,
    da * h2f(wb, 0),
    si,
    da * h2f(wb, 2),
    sm
));

/// The 128 weights of Q6_K half block `h` (`qlp`: the block's 128 low-nibble bytes, `qhp`: its
/// 64 high-pair bytes) as unsigned 6-bit bytes, in four groups of 32 (ggml's AVX2 unpacking;
/// the one-token dot and the GEMM tile share it).
#[inline(always)]
pub(in super::super) unsafe fn q6_k_half(qlp: *const u8, qhp: *const u8, h: usize) -> [__m256i; 4] {
    let (m4, m3) = (_mm256_set1_epi8(15), _mm256_set1_epi8(3));
    let ql0 = load(qlp.add(64 * h));
    let ql1 = load(qlp.add(64 * h + 32));
    let qh = load(qhp.add(32 * h));
    let hb = |x: __m256i| _mm256_slli_epi16(_mm256_and_si256(x, m3), 4);
    [
        _mm256_or_si256(_mm256_and_si256(ql0, m4), hb(qh)),
        _mm256_or_si256(_mm256_and_si256(ql1, m4), hb(_mm256_srli_epi16(qh, 2))),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
            hb(_mm256_srli_epi16(qh, 4)),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
            hb(_mm256_srli_epi16(qh, 6)),
        ),
    ]
}

#[inline(always)]
unsafe fn q6_k_ints(wb: &[u8], ab: &[u8]) -> __m256i {
    let masks = pair_masks();
    let (qlp, qhp, ap) = (wb.as_ptr(), wb.as_ptr().add(128), ab.as_ptr().add(4));
    let mut sumv = _mm256_setzero_si256();
    for h in 0..2 {
        let q = q6_k_half(qlp, qhp, h);
        let sc8 = scales8(wb.as_ptr().add(192 + 8 * h), true);
        for (j, &qj) in q.iter().enumerate() {
            let scv = _mm256_shuffle_epi8(sc8, masks[j]);
            sumv = mac(sumv, qj, load(ap.add(128 * h + 32 * j)), scv);
        }
    }
    let scv = _mm256_cvtepi8_epi16(load128(wb.as_ptr().add(192)));
    let msum = _mm256_madd_epi16(scv, load(ab.as_ptr().add(260)));
    _mm256_sub_epi32(sumv, _mm256_slli_epi32(msum, 5))
}

/// Blocks of `bs` bytes whose `$lanes(wb, ab)` are ggml's eight lane integers, combined in
/// ggml's AVX2 order (`common::Fma8`): `fma(d(wb, d_a), lanes, acc)`, then `hsum8`.
macro_rules! fma8_kernel {
    ($name:ident, $lanes:ident, $bs:expr, |$wb:ident, $da:ident| $d:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(in super::super) unsafe fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let mut acc = _mm256_setzero_ps();
            let dist = pf::distance();
            for b in 0..n / 256 {
                pf::ahead(w, $bs * b, dist, $bs);
                let $wb = &w[$bs * b..$bs * b + $bs];
                let ab = &a[292 * b..292 * b + 292];
                let $da = f32_at(ab, 0);
                let p = _mm256_cvtepi32_ps($lanes($wb, ab));
                acc = _mm256_fmadd_ps(_mm256_set1_ps($d), p, acc);
            }
            hsum8(acc)
        }
    };
}

fma8_kernel!(q6_k, q6_k_ints, 210, |wb, da| da * h2f(wb, 208));

/// ggml's tiled multi-row order (`scalar_k::tiled_dot`): per block
/// `acc + (f32(Σ lanes)·d_w)·d_a`.
macro_rules! tiled_kernel {
    ($name:ident, $lanes:ident, $bs:expr, $doff:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(in super::super) unsafe fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let mut acc = 0f32;
            for b in 0..n / 256 {
                let wb = &w[$bs * b..$bs * b + $bs];
                let ab = &a[292 * b..292 * b + 292];
                let s = hsum_i32($lanes(wb, ab)) as f32;
                acc += (s * h2f(wb, $doff)) * f32_at(ab, 0);
            }
            acc
        }
    };
}

tiled_kernel!(q6_k_tiled, q6_k_ints, 210, 208);

#[inline(always)]
unsafe fn iq4_xs_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    let kv = table16(&KVALUES_IQ4NL);
    let sh = u16_at(wb, 2);
    let ap = ab.as_ptr().add(4);
    let mut sumv = _mm256_setzero_si256();
    for g in 0..8 {
        let lo = (wb[4 + g / 2] >> (4 * (g % 2))) & 15;
        let ls = (lo as u32 | ((sh >> (2 * g)) & 3) << 4) as i32 - 32;
        let q = _mm256_shuffle_epi8(kv, nibbles(load128(wb.as_ptr().add(8 + 16 * g))));
        let av = load(ap.add(32 * g));
        let u = _mm256_abs_epi8(q);
        sumv = mac(
            sumv,
            u,
            _mm256_sign_epi8(av, q),
            _mm256_set1_epi16(ls as i16),
        );
    }
    (hsum_i32(sumv), 0)
}
k_kernel!(iq4_xs, iq4_xs_ints, 136, |wb, ab, da, acc, si, _sm| k_add(
    acc,
    da * h2f(wb, 0),
    si
));

/// Negate the activation bytes whose sign bit is set in `signs` (bit e → element e).
#[target_feature(enable = "avx2")]
#[inline]
fn apply_signs(av: __m256i, signs: u32) -> __m256i {
    let m = bits_to_bytes(signs);
    _mm256_sub_epi8(_mm256_xor_si256(av, m), m)
}

/// Four KSIGNS bytes from the 7-bit fields of `w` (bits 0, 7, 14, 21).
#[inline(always)]
fn ksigns4(w: u32) -> u32 {
    (0..4).fold(0u32, |s, l| {
        s | (KSIGNS_IQ2XS[((w >> (7 * l)) & 127) as usize] as u32) << (8 * l)
    })
}

#[inline(always)]
unsafe fn iq3_s_ints(wb: &[u8], ab: &[u8]) -> __m256i {
    let ap = ab.as_ptr().add(4);
    let mut sumv = _mm256_setzero_si256();
    for g in 0..8 {
        let qh = wb[66 + g] as usize;
        let ls = 1 + 2 * ((wb[106 + g / 2] >> (4 * (g % 2))) & 15) as i16;
        let qs = &wb[2 + 8 * g..10 + 8 * g];
        // SAFETY of the unchecked lookup: a byte plus one bit above it is < 512.
        let gi = |m: usize| *IQ3S_GRID.get_unchecked(qs[m] as usize | ((qh >> m) & 1) << 8) as i32;
        let gv = _mm256_set_epi32(gi(7), gi(6), gi(5), gi(4), gi(3), gi(2), gi(1), gi(0));
        let av = apply_signs(load(ap.add(32 * g)), u32_at(wb, 74 + 4 * g));
        sumv = mac(sumv, gv, av, _mm256_set1_epi16(ls));
    }
    sumv
}
fma8_kernel!(iq3_s, iq3_s_ints, 110, |wb, da| h2f(wb, 0) * da);
tiled_kernel!(iq3_s_tiled, iq3_s_ints, 110, 0);

#[inline(always)]
unsafe fn iq3_xxs_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    let ap = ab.as_ptr().add(4);
    let mut sumv = _mm256_setzero_si256();
    for g in 0..8 {
        let wd = u32_at(wb, 66 + 4 * g);
        let ls = 2 * (wd >> 28) as i16 + 1;
        let qs = &wb[2 + 8 * g..10 + 8 * g];
        let gi = |m: usize| IQ3XXS_GRID[qs[m] as usize] as i32;
        let gv = _mm256_set_epi32(gi(7), gi(6), gi(5), gi(4), gi(3), gi(2), gi(1), gi(0));
        let av = apply_signs(load(ap.add(32 * g)), ksigns4(wd));
        sumv = mac(sumv, gv, av, _mm256_set1_epi16(ls));
    }
    (hsum_i32(sumv), 0)
}
k_kernel!(iq3_xxs, iq3_xxs_ints, 98, |wb, ab, da, acc, si, _sm| k_add(
    acc,
    da * h2f(wb, 0) * 0.25,
    si
));

#[inline(always)]
unsafe fn iq2_xxs_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    let ap = ab.as_ptr().add(4);
    let mut sumv = _mm256_setzero_si256();
    for g in 0..8 {
        let (a0, a1) = (u32_at(wb, 2 + 8 * g), u32_at(wb, 6 + 8 * g));
        let gi = |l: u32| IQ2XXS_GRID[((a0 >> (8 * l)) & 255) as usize] as i64;
        let gv = _mm256_set_epi64x(gi(3), gi(2), gi(1), gi(0));
        let av = apply_signs(load(ap.add(32 * g)), ksigns4(a1));
        let ls = 2 * (a1 >> 28) as i16 + 1;
        sumv = mac(sumv, gv, av, _mm256_set1_epi16(ls));
    }
    (hsum_i32(sumv), 0)
}
k_kernel!(iq2_xxs, iq2_xxs_ints, 66, |wb, ab, da, acc, si, _sm| k_add(
    acc,
    da * h2f(wb, 0) * 0.125,
    si
));

#[inline(always)]
unsafe fn iq2_xs_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    let ap = ab.as_ptr().add(4);
    let mut sumv = _mm256_setzero_si256();
    for g in 0..8 {
        let v = |l: usize| u16_at(wb, 2 + 2 * (4 * g + l));
        let gi = |l: usize| IQ2XS_GRID[(v(l) & 511) as usize] as i64;
        let gv = _mm256_set_epi64x(gi(3), gi(2), gi(1), gi(0));
        let signs = (0..4).fold(0u32, |s, l| {
            s | (KSIGNS_IQ2XS[(v(l) >> 9) as usize] as u32) << (8 * l)
        });
        let av = apply_signs(load(ap.add(32 * g)), signs);
        let sc = wb[66 + g];
        let scv = pair16(2 * (sc & 15) as i32 + 1, 2 * (sc >> 4) as i32 + 1);
        sumv = mac(sumv, gv, av, scv);
    }
    (hsum_i32(sumv), 0)
}
k_kernel!(iq2_xs, iq2_xs_ints, 74, |wb, ab, da, acc, si, _sm| k_add(
    acc,
    da * h2f(wb, 0) * 0.125,
    si
));

#[inline(always)]
unsafe fn iq2_s_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    let ap = ab.as_ptr().add(4);
    let mut sumv = _mm256_setzero_si256();
    for g in 0..8 {
        let qh = wb[66 + g] as usize;
        let gi = |l: usize| IQ2S_GRID[wb[2 + 4 * g + l] as usize | ((qh >> (2 * l)) & 3) << 8];
        let gv = _mm256_set_epi64x(gi(3) as i64, gi(2) as i64, gi(1) as i64, gi(0) as i64);
        let av = apply_signs(load(ap.add(32 * g)), u32_at(wb, 34 + 4 * g));
        let sc = wb[74 + g];
        let scv = pair16(2 * (sc & 15) as i32 + 1, 2 * (sc >> 4) as i32 + 1);
        sumv = mac(sumv, gv, av, scv);
    }
    (hsum_i32(sumv), 0)
}
k_kernel!(iq2_s, iq2_s_ints, 82, |wb, ab, da, acc, si, _sm| k_add(
    acc,
    da * h2f(wb, 0) * 0.125,
    si
));

#[inline(always)]
unsafe fn tq2_0_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    let ap = ab.as_ptr().add(4);
    let (m3, ones) = (_mm256_set1_epi8(3), _mm256_set1_epi16(1));
    let mut sumv = _mm256_setzero_si256();
    for c in 0..2 {
        let mut qv = load(wb.as_ptr().add(32 * c));
        for l in 0..4 {
            sumv = mac(
                sumv,
                _mm256_and_si256(qv, m3),
                load(ap.add(128 * c + 32 * l)),
                ones,
            );
            qv = _mm256_srli_epi16(qv, 2);
        }
    }
    let bs = _mm256_madd_epi16(load(ab.as_ptr().add(260)), ones);
    (hsum_i32(_mm256_sub_epi32(sumv, bs)), 0)
}
k_kernel!(tq2_0, tq2_0_ints, 66, |wb, ab, da, acc, si, _sm| k_add(
    acc,
    da * h2f(wb, 64),
    si
));

/// Signed dot of two i8 vectors scaled per 16 elements: `acc + madd(maddubs(|x|, ±y), sc)`.
#[target_feature(enable = "avx2")]
#[inline]
fn mac_signed(acc: __m256i, x: __m256i, y: __m256i, sc: __m256i) -> __m256i {
    mac(acc, _mm256_abs_epi8(x), _mm256_sign_epi8(y, x), sc)
}

/// IQ1_S: grid values −1/0/1 by the sign trick; the delta part from the bsums.
#[inline(always)]
unsafe fn iq1_s_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    let ap = ab.as_ptr().add(4);
    let mut sumv = _mm256_setzero_si256();
    let mut sumd = 0i32;
    for g in 0..8 {
        let qh = u16_at(wb, 34 + 2 * g) as usize;
        let qs = &wb[2 + 4 * g..6 + 4 * g];
        // SAFETY of the unchecked lookup: a byte plus 3 bits above it is < 2048.
        let gi = |l: usize| *IQ1S_GRID.get_unchecked(qs[l] as usize | ((qh >> (3 * l)) & 7) << 8);
        let gv = _mm256_set_epi64x(gi(3) as i64, gi(2) as i64, gi(1) as i64, gi(0) as i64);
        let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
        sumv = mac_signed(sumv, gv, load(ap.add(32 * g)), _mm256_set1_epi16(ls as i16));
        let bs = i16_at(ab, 260 + 4 * g) + i16_at(ab, 262 + 4 * g);
        sumd += if qh & 0x8000 != 0 { -ls * bs } else { ls * bs };
    }
    (hsum_i32(sumv), sumd)
}
k_kernel!(iq1_s, iq1_s_ints, 50, |wb, ab, da, acc, si, sd| iq1_add(
    acc,
    da * h2f(wb, 0),
    si,
    sd
));

/// IQ1_M: per 8-group grid index high bits and delta sign; scales per 16 elements.
#[inline(always)]
unsafe fn iq1_m_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    let ap = ab.as_ptr().add(4);
    let (mut sumv, mut sumdv) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    for g in 0..8 {
        let sw = u16_at(wb, 48 + 2 * (g / 2));
        let shift = 6 * (g % 2);
        let scv = pair16(
            2 * ((sw >> shift) & 7) as i32 + 1,
            2 * ((sw >> (shift + 3)) & 7) as i32 + 1,
        );
        let qhb = |l: usize| (wb[32 + 2 * g + l / 2] >> (4 * (l % 2))) as usize;
        let qs = &wb[4 * g..4 * g + 4];
        // SAFETY of the unchecked lookup: a byte plus 3 bits above it is < 2048.
        let gi = |l: usize| *IQ1S_GRID.get_unchecked(qs[l] as usize | (qhb(l) & 7) << 8) as i64;
        let gv = _mm256_set_epi64x(gi(3), gi(2), gi(1), gi(0));
        let dl = |l: usize| {
            if qhb(l) & 8 != 0 {
                -1i64
            } else {
                0x0101_0101_0101_0101
            }
        };
        let dv = _mm256_set_epi64x(dl(3), dl(2), dl(1), dl(0));
        let av = load(ap.add(32 * g));
        sumv = mac_signed(sumv, gv, av, scv);
        sumdv = mac_signed(sumdv, dv, av, scv);
    }
    (hsum_i32(sumv), hsum_i32(sumdv))
}
k_kernel!(iq1_m, iq1_m_ints, 56, |wb, ab, da, acc, si, sd| iq1_add(
    acc,
    da * iq1_m_d(wb),
    si,
    sd
));

/// Trits of bytes x (already multiplied by 3ⁿ mod 256): ((x·3) >> 8) = [x ≥ 86] + [x ≥ 171].
#[target_feature(enable = "avx2")]
#[inline]
fn trits(x: __m256i) -> __m256i {
    let ge = |c: i8| _mm256_cmpeq_epi8(_mm256_max_epu8(x, _mm256_set1_epi8(c)), x);
    _mm256_sub_epi8(
        _mm256_sub_epi8(_mm256_setzero_si256(), ge(86)),
        ge(171u8 as i8),
    )
}

/// x·3 mod 256 per byte.
#[target_feature(enable = "avx2")]
#[inline]
fn times3(x: __m256i) -> __m256i {
    _mm256_add_epi8(x, _mm256_add_epi8(x, x))
}

/// TQ1_0: five trits per byte of qs[0..32] (elements 32n + m) and qs[32..48] (160 + 16n + m),
/// four per byte of qh (240 + 4n + m); y = t − 1, so sumi = Σ t·a − Σ a.
#[inline(always)]
unsafe fn tq1_0_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    let ap = ab.as_ptr().add(4);
    let ones = _mm256_set1_epi16(1);
    let mut sumv = _mm256_setzero_si256();
    let mut x = load(wb.as_ptr());
    for n in 0..5 {
        sumv = mac(sumv, trits(x), load(ap.add(32 * n)), ones);
        x = times3(x);
    }
    // qs[32..48]: trits n and n + 1 side by side cover 32 consecutive elements.
    let v = load128(wb.as_ptr().add(32));
    let mut y = _mm256_set_m128i(_mm256_castsi256_si128(times3(_mm256_castsi128_si256(v))), v);
    for p in 0..3 {
        let t = trits(y);
        let av = if p == 2 {
            _mm256_castsi128_si256(load128(ap.add(224)))
        } else {
            load(ap.add(160 + 32 * p))
        };
        let prod = _mm256_maddubs_epi16(t, av);
        // The last step has 16 elements: only the low half is data, zero the high half.
        let prod = if p == 2 {
            _mm256_permute2x128_si256(prod, prod, 0x80)
        } else {
            prod
        };
        sumv = _mm256_add_epi32(sumv, _mm256_madd_epi16(prod, ones));
        y = times3(times3(y));
    }
    // qh: 16 elements 240 + 4n + m from byte m times 3ⁿ.
    let qh = u32_at(wb, 48);
    let mut hx = [0u8; 16];
    for (i, h) in hx.iter_mut().enumerate() {
        *h = ((qh >> (8 * (i % 4))) as u8).wrapping_mul([1u8, 3, 9, 27][i / 4]);
    }
    let hv = _mm256_castsi128_si256(_mm_loadu_si128(hx.as_ptr() as *const __m128i));
    let prod = _mm256_maddubs_epi16(trits(hv), _mm256_castsi128_si256(load128(ap.add(240))));
    let prod = _mm256_permute2x128_si256(prod, prod, 0x80);
    sumv = _mm256_add_epi32(sumv, _mm256_madd_epi16(prod, ones));
    let bs = _mm256_madd_epi16(load(ab.as_ptr().add(260)), ones);
    (hsum_i32(_mm256_sub_epi32(sumv, bs)), 0)
}
k_kernel!(tq1_0, tq1_0_ints, 54, |wb, ab, da, acc, si, _sm| k_add(
    acc,
    da * h2f(wb, 52),
    si
));
