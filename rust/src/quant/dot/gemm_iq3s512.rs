//! IQ3_S multi-token kernel (AVX-512BW): one weight row against every token of the call (up to
//! `MAX_T`), 8 tokens per pass in registers, each block decoded once per call and held in
//! registers while every pass runs over it (`Decoded`: per 64 weights one 512-bit register of
//! grid magnitudes, one 64-bit sign mask, one register of scales).
//!
//! Per token and 64 weights: one activation load, the activation negated where the weight's
//! sign bit is set (a masked subtract from zero, the sign bits used as the mask as stored),
//! `vpmaddubsw` (grid × activation, pairs), `vpmaddwd` (× the group's scale 2·s+1, pairs) and
//! an add: half the instructions of the AVX2 kernel (`gemm_iq3s.rs`) per weight.
//!
//! Bitwise contract (as `gemm_avx2.rs`): i32 lane j of a 64-weight chunk c holds
//! ls·Σ grid·a over weights 4j..4j+3 of the chunk, i.e. lane m = j mod 8 of group 2c + j/8;
//! folding the upper eight lanes onto the lower gives exactly the eight lanes of the
//! single-token `iq3_s_ints` (exact integers, any grouping). Then the float combine of the
//! order, operation for operation: `Order::Single` ggml's `Fma8` (`fma(d·d_a, f32(lanes),
//! acc)` per block, `hsum8`), `Order::Many` the tiled order (`acc + (f32(Σ lanes)·d)·d_a`).
//! `gemm::tests` checks every (row, token) against the scalar single-token kernels.

use super::super::super::avx2::{h2f, hsum8, hsum_i32};
use super::super::MAX_T;
use crate::quant::tables::IQ3S_GRID;
use std::arch::x86_64::*;

/// Q8_K block bytes.
const AB: usize = 292;
/// IQ3_S block bytes: d (f16) · qs[64] · qh[8] · signs[32] · scales[4].
const WB: usize = 110;

/// One decoded 256-weight block, per chunk c of 64 weights (groups 2c and 2c+1): the grid
/// magnitudes [u8; 64], the sign bits (bit e set: weight e is negative) and the scales 2·s+1
/// as i16 (lanes 0–15 group 2c, lanes 16–31 group 2c+1, as `vpmaddwd` pairs them).
struct Decoded {
    grid: [__m512i; 4],
    sign: [u64; 4],
    scale: [__m512i; 4],
}

/// Chunk c (64 weights: groups 2c, 2c+1) of block `wb` (110 bytes): the grid magnitudes
/// (u8, weight order), the sign bits (bit e: weight e negative) and the two groups' scales
/// 2·s + 1.
#[target_feature(enable = "avx2,avx512f,avx512bw")]
#[inline]
unsafe fn chunk(wb: &[u8], c: usize) -> (__m512i, u64, (i16, i16)) {
    let (g, sign) = grid_chunk(wb, c);
    let sb = wb[106 + c];
    let ls = (1 + 2 * (sb & 15) as i16, 1 + 2 * (sb >> 4) as i16);
    (g, sign, ls)
}

/// Chunk c's grid magnitudes and sign bits (`chunk` without the scales; the AMX tiles' A
/// operands make the scale parts themselves). The 16 grid entries come in one `vpgatherdd`
/// (index j: `qs[16c + j]`, plus 256 where bit j of the chunk's two `qh` bytes is set): 16
/// scalar lookups and inserts had kept the one-token dot compute-bound on the AVX-512 host
/// (57% of its RAM bound, 12-04).
#[target_feature(enable = "avx2,avx512f,avx512bw")]
#[inline]
pub(in super::super) unsafe fn grid_chunk(wb: &[u8], c: usize) -> (__m512i, u64) {
    debug_assert!(wb.len() >= WB);
    let qs = _mm_loadu_si128(wb.as_ptr().add(2 + 16 * c) as *const __m128i);
    let qh = u16::from_le_bytes([wb[66 + 2 * c], wb[67 + 2 * c]]);
    let lo = _mm512_cvtepu8_epi32(qs);
    let idx = _mm512_mask_or_epi32(lo, qh, lo, _mm512_set1_epi32(256));
    // SAFETY of the gather: every index is a byte plus one bit above it, < 512 entries.
    let g = _mm512_i32gather_epi32::<4>(idx, IQ3S_GRID.as_ptr() as *const _);
    let sign = u64::from_le_bytes(wb[74 + 8 * c..82 + 8 * c].try_into().unwrap());
    (g, sign)
}

/// A 512-bit register whose low 256 bits hold `x` and high ones `y` in every i16 lane.
#[target_feature(enable = "avx2,avx512f")]
#[inline]
pub(in super::super) fn halves(x: i16, y: i16) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi16(x)),
        _mm256_set1_epi16(y),
    )
}

/// Decode block `wb` (110 bytes).
#[target_feature(enable = "avx2,avx512f,avx512bw")]
#[inline]
unsafe fn decode(wb: &[u8]) -> Decoded {
    let mut grid = [_mm512_setzero_si512(); 4];
    let mut sign = [0u64; 4];
    let mut scale = [_mm512_setzero_si512(); 4];
    for c in 0..4 {
        let (g, s, (lo, hi)) = chunk(wb, c);
        (grid[c], sign[c], scale[c]) = (g, s, halves(lo, hi));
    }
    Decoded { grid, sign, scale }
}

/// The eight integer lanes of one token's Q8_K block (`ap` points at its `d`) against `dec`.
#[target_feature(enable = "avx2,avx512f,avx512bw")]
#[inline]
unsafe fn lanes(dec: &Decoded, ap: *const u8) -> __m256i {
    let mut s = _mm512_setzero_si512();
    for c in 0..4 {
        let a = _mm512_loadu_si512(ap.add(4 + 64 * c) as *const _);
        let av = _mm512_mask_sub_epi8(a, dec.sign[c], _mm512_setzero_si512(), a);
        let p = _mm512_madd_epi16(_mm512_maddubs_epi16(dec.grid[c], av), dec.scale[c]);
        s = _mm512_add_epi32(s, p);
    }
    _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s))
}

/// Tokens `acts[t0..t0 + N]` against block `b` (decoded in `dec`, scale `d`): their lanes
/// combined into `accv` (`Single`) or `acc` (`Many`), indexed by token.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn pass<const N: usize, const MANY: bool>(
    dec: &Decoded,
    acts: &[&[u8]],
    t0: usize,
    b: usize,
    d: f32,
    accv: &mut [__m256; MAX_T],
    acc: &mut [f32; MAX_T],
) {
    let a: [*const u8; N] = std::array::from_fn(|j| acts[t0 + j].as_ptr().add(AB * b));
    let l: [__m256i; N] = std::array::from_fn(|j| lanes(dec, a[j]));
    for j in 0..N {
        let da = f32::from_le_bytes(*(a[j] as *const [u8; 4]));
        if MANY {
            acc[t0 + j] += (hsum_i32(l[j]) as f32 * d) * da;
        } else {
            accv[t0 + j] = _mm256_fmadd_ps(
                _mm256_set1_ps(d * da),
                _mm256_cvtepi32_ps(l[j]),
                accv[t0 + j],
            );
        }
    }
}

/// The one-token dot in ggml's `vec_dot` order (`Order::Single`): bitwise the AVX2 `iq3_s`
/// (the same eight lane integers per block, `fma(d·d_a, f32(lanes), acc)`, `hsum8`), each
/// chunk's grid entries gathered, the row streamed with the decode kernels' prefetch.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512F and AVX-512BW are available; `w` holds `n / 256` IQ3_S blocks
/// and `a` `n / 256` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
pub(in crate::quant::dot) unsafe fn iq3_s_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    use super::super::super::avx2::pf;
    let dist = pf::distance();
    let mut acc = _mm256_setzero_ps();
    for b in 0..n / 256 {
        pf::ahead(w, WB * b, dist, WB);
        let wb = &w[WB * b..WB * b + WB];
        let ab = &a[AB * b..AB * b + AB];
        let l = lanes(&decode(wb), ab.as_ptr());
        let d = h2f(wb, 0) * f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(l), acc);
    }
    hsum8(acc)
}

/// `out[t] = dot(w, acts[t])` in the order `MANY` selects, for any number of tokens (the row
/// is decoded once per `MAX_T`).
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512F and AVX-512BW are available; `w` holds `n / 256` IQ3_S blocks,
/// every activation `n / 256` Q8_K blocks, `out.len() == acts.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
pub unsafe fn iq3_s_multi<const MANY: bool>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    assert_eq!(out.len(), acts.len());
    for (a, o) in acts.chunks(MAX_T).zip(out.chunks_mut(MAX_T)) {
        up_to_max::<MANY>(n, w, a, o);
    }
}

/// `iq3_s_multi` for at most `MAX_T` tokens.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
unsafe fn up_to_max<const MANY: bool>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    let nt = acts.len();
    let mut accv = [_mm256_setzero_ps(); MAX_T];
    let mut acc = [0f32; MAX_T];
    for b in 0..n / 256 {
        let wb = &w[WB * b..WB * b + WB];
        let dec = decode(wb);
        let d = h2f(wb, 0);
        let mut t = 0;
        while t < nt {
            let left = nt - t;
            let (va, aa) = (&mut accv, &mut acc);
            match left {
                1 => pass::<1, MANY>(&dec, acts, t, b, d, va, aa),
                2 => pass::<2, MANY>(&dec, acts, t, b, d, va, aa),
                3 => pass::<3, MANY>(&dec, acts, t, b, d, va, aa),
                4 => pass::<4, MANY>(&dec, acts, t, b, d, va, aa),
                5 => pass::<5, MANY>(&dec, acts, t, b, d, va, aa),
                6 => pass::<6, MANY>(&dec, acts, t, b, d, va, aa),
                7 => pass::<7, MANY>(&dec, acts, t, b, d, va, aa),
                _ => pass::<8, MANY>(&dec, acts, t, b, d, va, aa),
            }
            t += left.min(8);
        }
    }
    for (t, o) in out.iter_mut().enumerate() {
        *o = if MANY { acc[t] } else { hsum8(accv[t]) };
    }
}
