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
//!
//! Grid lookups (`Grid`): one `vpgatherdd` per 16 entries (`Gather`), or, where the CPU has
//! AVX-512 VBMI, all 64 entries of a block at once from the grid held in 16 registers as two
//! nibble planes (`Permute`: `vpermi2b`, the entries' 9th index bit as a mask): the same
//! bytes either way (`tests::permute_equals_gather`). On a Zen 4 core the gathers kept the
//! one-token dot at 3.8 GB/s (a block's four gathers ~25-45 ns, the permutes ~8.6).

use super::super::super::avx2::{h2f, hsum8, hsum_i32};
use super::super::MAX_T;
use crate::quant::tables::IQ3S_GRID;
use std::arch::x86_64::*;

use super::super::super::common::Q8K_BYTES as AB;

#[path = "gemm_iq3s512_rows.rs"]
mod rows;
pub(in crate::quant::dot) use rows::{iq3_s_rows_perm, iq3_s_rows_tokens, ROWS_T};
/// IQ3_S block bytes: d (f16) · qs[64] · qh[8] · signs[32] · scales[4].
const WB: usize = 110;

/// One decoded 256-weight block, per chunk c of 64 weights (groups 2c and 2c+1): the grid
/// magnitudes [u8; 64], the sign bits (bit e set: weight e is negative) and the scales 2·s+1
/// as i16 (lanes 0–15 group 2c, lanes 16–31 group 2c+1, as `vpmaddwd` pairs them).
pub(in super::super) struct Decoded {
    pub(in super::super) grid: [__m512i; 4],
    pub(in super::super) sign: [u64; 4],
    scale: [__m512i; 4],
}

/// Chunk c's (64 weights) sign bits (bit e set: weight 64c + e is negative), as stored.
#[inline(always)]
fn chunk_sign(wb: &[u8], c: usize) -> u64 {
    u64::from_le_bytes(wb[74 + 8 * c..82 + 8 * c].try_into().unwrap())
}

/// Chunk c's two group scales 2·s + 1 as i16: lanes 0–15 group 2c, lanes 16–31 group 2c+1.
#[target_feature(enable = "avx2,avx512f")]
#[inline]
fn chunk_scale(wb: &[u8], c: usize) -> __m512i {
    let sb = wb[106 + c];
    halves(1 + 2 * (sb & 15) as i16, 1 + 2 * (sb >> 4) as i16)
}

/// Chunk c's grid magnitudes and sign bits (the AMX tiles' A operands make the scale parts
/// themselves). The 16 grid entries come in one `vpgatherdd`
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
    (g, chunk_sign(wb, c))
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

/// Decode block `wb` (110 bytes), its grid entries gathered.
#[target_feature(enable = "avx2,avx512f,avx512bw")]
#[inline]
unsafe fn decode(wb: &[u8]) -> Decoded {
    let mut grid = [_mm512_setzero_si512(); 4];
    let mut sign = [0u64; 4];
    let mut scale = [_mm512_setzero_si512(); 4];
    for c in 0..4 {
        let (g, s) = grid_chunk(wb, c);
        (grid[c], sign[c], scale[c]) = (g, s, chunk_scale(wb, c));
    }
    Decoded { grid, sign, scale }
}

/// How a block's 64 grid entries are looked up (`decode` of the block, bitwise the same
/// `Decoded` whichever).
pub(in super::super) trait Grid {
    /// # Safety
    /// The CPU runs the strategy's instructions; `wb` holds one block (110 bytes).
    unsafe fn decode(&self, wb: &[u8]) -> Decoded;
}

/// One `vpgatherdd` per 16 entries (AVX-512F).
pub(in super::super) struct Gather;

impl Grid for Gather {
    #[inline(always)]
    unsafe fn decode(&self, wb: &[u8]) -> Decoded {
        decode(wb)
    }
}

/// The grid as two nibble planes, `NIB[p][e]` = byte 2p of entry e | byte 2p+1 << 4 (every
/// grid byte is odd, 1..15), 512 bytes each: four 128-entry quarters of two registers.
static NIB: [[u8; 512]; 2] = {
    let mut t = [[0u8; 512]; 2];
    let mut e = 0;
    while e < 512 {
        let b = IQ3S_GRID[e].to_le_bytes();
        t[0][e] = b[0] | b[1] << 4;
        t[1][e] = b[2] | b[3] << 4;
        e += 1;
    }
    t
};

/// All 64 entries at once (AVX-512 VBMI): per plane, the low 7 index bits pick a byte of
/// each quarter (`vpermi2b` over two registers), the index's bit 7 and its `qh` bit pick the
/// quarter; the planes' nibbles are interleaved into entries and the entries transposed into
/// the chunks' weight order.
pub(in super::super) struct Permute {
    /// `[plane][register]`: plane bytes 64k..64k+64 in register k.
    t: [[__m512i; 8]; 2],
}

impl Permute {
    /// # Safety
    /// AVX-512F is available.
    #[inline(always)]
    pub(in super::super) unsafe fn load() -> Permute {
        Permute {
            t: std::array::from_fn(|p| {
                std::array::from_fn(|k| _mm512_loadu_si512(NIB[p][64 * k..].as_ptr() as *const _))
            }),
        }
    }

    /// Plane `p`'s byte of each of the 64 entries `idx` (low 8 bits; `hi`: the 9th).
    #[inline(always)]
    unsafe fn plane(&self, p: usize, idx: __m512i, b7: __mmask64, hi: __mmask64) -> __m512i {
        let t = &self.t[p];
        let q = |k: usize| _mm512_permutex2var_epi8(t[2 * k], idx, t[2 * k + 1]);
        let lo = _mm512_mask_blend_epi8(b7, q(0), q(1));
        let up = _mm512_mask_blend_epi8(b7, q(2), q(3));
        _mm512_mask_blend_epi8(hi, lo, up)
    }
}

impl Grid for Permute {
    #[inline(always)]
    unsafe fn decode(&self, wb: &[u8]) -> Decoded {
        debug_assert!(wb.len() >= WB);
        // qs: entry e's low 8 index bits at byte e; qh: its 9th at bit e
        let idx = _mm512_loadu_si512(wb.as_ptr().add(2) as *const _);
        let hi = u64::from_le_bytes(wb[66..74].try_into().unwrap());
        let b7 = _mm512_movepi8_mask(idx);
        let (p01, p23) = (self.plane(0, idx, b7, hi), self.plane(1, idx, b7, hi));
        let m4 = _mm512_set1_epi8(15);
        let nib = |v: __m512i| {
            (
                _mm512_and_si512(v, m4),
                _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4),
            )
        };
        let ((b0, b1), (b2, b3)) = (nib(p01), nib(p23));
        // per 128-bit lane L: bytes (b0, b1) and (b2, b3) of entries 16L.., then whole entries
        let (x, y) = (_mm512_unpacklo_epi8(b0, b1), _mm512_unpacklo_epi8(b2, b3));
        let (u, v) = (_mm512_unpackhi_epi8(b0, b1), _mm512_unpackhi_epi8(b2, b3));
        // r[k], lane L: entries 16L + 4k .. 16L + 4k + 4 (weight order)
        let r = [
            _mm512_unpacklo_epi16(x, y),
            _mm512_unpackhi_epi16(x, y),
            _mm512_unpacklo_epi16(u, v),
            _mm512_unpackhi_epi16(u, v),
        ];
        // transpose the 4 × 4 lanes: chunk c = lane c of r[0..4]
        let t0 = _mm512_shuffle_i64x2::<0x44>(r[0], r[1]);
        let t1 = _mm512_shuffle_i64x2::<0xEE>(r[0], r[1]);
        let t2 = _mm512_shuffle_i64x2::<0x44>(r[2], r[3]);
        let t3 = _mm512_shuffle_i64x2::<0xEE>(r[2], r[3]);
        let grid = [
            _mm512_shuffle_i64x2::<0x88>(t0, t2),
            _mm512_shuffle_i64x2::<0xDD>(t0, t2),
            _mm512_shuffle_i64x2::<0x88>(t1, t3),
            _mm512_shuffle_i64x2::<0xDD>(t1, t3),
        ];
        Decoded {
            grid,
            sign: std::array::from_fn(|c| chunk_sign(wb, c)),
            scale: std::array::from_fn(|c| chunk_scale(wb, c)),
        }
    }
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
    dot_with(&Gather, n, w, a)
}

/// `iq3_s_dot` with the grid's entries permuted out of registers (`Permute`).
///
/// # Safety
/// As `iq3_s_dot`, and AVX-512 VBMI is available.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vbmi")]
pub(in crate::quant::dot) unsafe fn iq3_s_dot_vbmi(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_with(&Permute::load(), n, w, a)
}

#[inline(always)]
unsafe fn dot_with<G: Grid>(grid: &G, n: usize, w: &[u8], a: &[u8]) -> f32 {
    use super::super::super::avx2::pf;
    let dist = pf::distance();
    let mut acc = _mm256_setzero_ps();
    for b in 0..n / 256 {
        pf::ahead(w, WB * b, dist, WB);
        let wb = &w[WB * b..WB * b + WB];
        let ab = &a[AB * b..AB * b + AB];
        let l = lanes(&grid.decode(wb), ab.as_ptr());
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
    multi_with::<MANY, _>(&Gather, n, w, acts, out)
}

/// `iq3_s_multi` with the grid's entries permuted out of registers (`Permute`).
///
/// # Safety
/// As `iq3_s_multi`, and AVX-512 VBMI is available.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vbmi")]
pub unsafe fn iq3_s_multi_vbmi<const MANY: bool>(
    n: usize,
    w: &[u8],
    acts: &[&[u8]],
    out: &mut [f32],
) {
    multi_with::<MANY, _>(&Permute::load(), n, w, acts, out)
}

#[inline(always)]
unsafe fn multi_with<const MANY: bool, G: Grid>(
    grid: &G,
    n: usize,
    w: &[u8],
    acts: &[&[u8]],
    out: &mut [f32],
) {
    assert_eq!(out.len(), acts.len());
    for (a, o) in acts.chunks(MAX_T).zip(out.chunks_mut(MAX_T)) {
        up_to_max::<MANY, G>(grid, n, w, a, o);
    }
}

/// `iq3_s_multi` for at most `MAX_T` tokens.
#[inline(always)]
unsafe fn up_to_max<const MANY: bool, G: Grid>(
    grid: &G,
    n: usize,
    w: &[u8],
    acts: &[&[u8]],
    out: &mut [f32],
) {
    let nt = acts.len();
    let mut accv = [_mm256_setzero_ps(); MAX_T];
    let mut acc = [0f32; MAX_T];
    for b in 0..n / 256 {
        let wb = &w[WB * b..WB * b + WB];
        let dec = grid.decode(wb);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dot::cpu;
    use crate::quant::dot::tests::{random_act, random_row, Rng};
    use crate::quant::GgmlType;

    /// A decoded block's registers as bytes, its sign masks.
    fn bytes(d: &Decoded) -> (Vec<u8>, [u64; 4]) {
        let mut v = vec![0u8; 64 * 8];
        for c in 0..4 {
            // SAFETY: 64-byte stores into the vector.
            unsafe {
                _mm512_storeu_si512(v[64 * c..].as_mut_ptr() as *mut _, d.grid[c]);
                _mm512_storeu_si512(v[256 + 64 * c..].as_mut_ptr() as *mut _, d.scale[c]);
            }
        }
        (v, d.sign)
    }

    /// The permuted lookup decodes as the gathers do: blocks holding every one of the 512
    /// grid indices at every entry position (block k: index (k + 7·e) mod 512 at entry e),
    /// then random blocks; and the dots and multi-token kernels of both lookups agree bitwise
    /// (the VBMI ones are the dispatched kernels here, checked against the scalar kernels by
    /// `avx512_equals_scalar` and `gemm::tests`).
    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks vbmi"]
    fn permute_equals_gather() {
        assert!(cpu::has_vbmi(), "permute_equals_gather needs AVX-512 VBMI");
        let mut rng = Rng::new(0x1a35);
        let mut blocks: Vec<Vec<u8>> = Vec::new();
        for k in 0..512usize {
            let mut wb = random_row(GgmlType::IQ3S, 256, &mut rng);
            wb[66..74].fill(0);
            for e in 0..64 {
                let idx = (k + 7 * e) % 512;
                wb[2 + e] = idx as u8;
                wb[66 + e / 8] |= ((idx >> 8) as u8) << (e % 8);
            }
            blocks.push(wb);
        }
        blocks.extend((0..256).map(|_| random_row(GgmlType::IQ3S, 256, &mut rng)));
        // SAFETY: the test requires VBMI (and so AVX-512F/BW); each block is 110 bytes.
        unsafe {
            let perm = Permute::load();
            for (i, wb) in blocks.iter().enumerate() {
                assert_eq!(
                    bytes(&Gather.decode(wb)),
                    bytes(&perm.decode(wb)),
                    "block {i}"
                );
            }
        }
        for nb in [1usize, 3, 8] {
            let n = 256 * nb;
            let row = random_row(GgmlType::IQ3S, n, &mut rng);
            let acts: Vec<Vec<u8>> = (0..MAX_T + 9)
                .map(|_| random_act(GgmlType::IQ3S, n, &mut rng))
                .collect();
            let refs: Vec<&[u8]> = acts.iter().map(|a| &a[..]).collect();
            // SAFETY: VBMI (and AVX2/FMA/F16C, which every AVX-512 CPU has); whole blocks.
            unsafe {
                for a in &refs {
                    let (g, p) = (iq3_s_dot(n, &row, a), iq3_s_dot_vbmi(n, &row, a));
                    assert_eq!(g.to_bits(), p.to_bits(), "dot n={n}");
                }
                for cnt in [1, 5, 8, 13, MAX_T, MAX_T + 9] {
                    let mut g = vec![f32::NAN; cnt];
                    let mut p = vec![f32::NAN; cnt];
                    iq3_s_multi::<false>(n, &row, &refs[..cnt], &mut g);
                    iq3_s_multi_vbmi::<false>(n, &row, &refs[..cnt], &mut p);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&g), bits(&p), "Single n={n} cnt={cnt}");
                    iq3_s_multi::<true>(n, &row, &refs[..cnt], &mut g);
                    iq3_s_multi_vbmi::<true>(n, &row, &refs[..cnt], &mut p);
                    assert_eq!(bits(&g), bits(&p), "Many n={n} cnt={cnt}");
                }
            }
        }
    }
}
