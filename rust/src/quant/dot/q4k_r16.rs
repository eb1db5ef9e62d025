//! Q4_K rows repacked sixteen at a time for the decode step's dense projections (a few
//! one-token rows against every weight row): 16-lane registers hold one row each, so every
//! block's integer sums land in their row's lane with no horizontal reduction, and the float
//! combine runs for 16 rows at once in the one-row order (`Order::Single`, ggml's `k_add_min`
//! per block: `acc + ((d_a·d)·sumi − (d_a·dmin)·summ)`), bitwise `scalar_k::q4_k`.
//!
//! Layout of a group of 16 rows, per 256-element block (`GROUP_BLOCK` bytes):
//! - d [16] f32, dmin [16] f32 (the rows' f16 values, widened: exact);
//! - scales [8 sub-blocks][16 rows] u8;
//! - mins as i16 pairs [4 pairs of sub-blocks][16 rows][2] (for `vpdpwssd` against the
//!   activation's sub-block sums);
//! - quants [4 chunks c][8 groups j][16 rows][4 bytes]: row r's original bytes qs[32c + 4j..+4]
//!   (low nibbles: elements 64c + 4j.. of sub-block 2c, high: 64c + 32 + 4j.. of 2c + 1).
//!
//! Integer sums are exact whatever their grouping, so each lane's sumi and summ are the scalar
//! kernel's; the float ops are the scalar kernel's, lane-wise.

use super::common::{f16_at, f32_at, k4_scales, Q8K_BSUMS, Q8K_BYTES, Q8K_QS};

/// Rows per group.
pub const GROUP: usize = 16;

/// Bytes of one block of a group: d, dmin, scales, mins, quants.
pub const GROUP_BLOCK: usize = 64 + 64 + 128 + 256 + 2048;

/// Group blocks ahead that `rows_single` prefetches: one block (16 rows × 256 elements) takes
/// ~45 ns of one core at its L2-resident rate, shorter than a fetch from RAM.
const AHEAD: usize = 3;

/// Q4_K bytes per row block.
const BLOCK: usize = 144;

/// Repacks 16 Q4_K rows of `nb` blocks (`rows`: [16, nb·144]) into `out` ([nb·GROUP_BLOCK]).
/// Panics on wrong lengths.
pub fn repack_group(rows: &[u8], nb: usize, out: &mut [u8]) {
    assert!(rows.len() == GROUP * nb * BLOCK && out.len() == nb * GROUP_BLOCK);
    let rb = nb * BLOCK;
    for b in 0..nb {
        let o = &mut out[b * GROUP_BLOCK..(b + 1) * GROUP_BLOCK];
        for r in 0..GROUP {
            let wb = &rows[r * rb + b * BLOCK..r * rb + (b + 1) * BLOCK];
            o[4 * r..4 * r + 4].copy_from_slice(&f16_at(wb, 0).to_le_bytes());
            o[64 + 4 * r..64 + 4 * r + 4].copy_from_slice(&f16_at(wb, 2).to_le_bytes());
            let (sc, mn) = k4_scales(wb);
            for s in 0..8 {
                o[128 + 16 * s + r] = sc[s];
                let m = 256 + 64 * (s / 2) + 4 * r + 2 * (s % 2);
                o[m..m + 2].copy_from_slice(&i16::from(mn[s]).to_le_bytes());
            }
            for c in 0..4 {
                for j in 0..8 {
                    let q = 512 + 64 * (8 * c + j) + 4 * r;
                    o[q..q + 4].copy_from_slice(&wb[16 + 32 * c + 4 * j..16 + 32 * c + 4 * j + 4]);
                }
            }
        }
    }
}

/// Which kernel runs a group's rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `rows_single`: 16-lane registers, `vpdpbusd` (AVX-512 F/BW with VNNI).
    Vnni,
    /// `rows_single_avx2`: the group as two halves of eight rows in 8-lane registers.
    Avx2,
}

/// Whether `rows_single` runs here (AVX-512 F/BW with VNNI).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::cpu::has_vnni()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The kernel for the dot kernels' active ISA (`dot::active_isa`, which `STRATA_ISA` caps):
/// VNNI where AVX-512 with VNNI is active, the AVX2 one where AVX2 is; None elsewhere.
pub fn kernel() -> Option<Kernel> {
    match super::active_isa() {
        super::Isa::Avx512 if available() => Some(Kernel::Vnni),
        super::Isa::Avx512 | super::Isa::Avx2 if super::cpu::has_avx2() => Some(Kernel::Avx2),
        _ => None,
    }
}

/// The kernels' argument checks: N ≤ 4 activations of `nb` blocks, a group of `nb` blocks.
#[cfg(target_arch = "x86_64")]
fn check_args<const N: usize>(nb: usize, group: &[u8], acts: &[&[u8]; N]) {
    assert!(N <= 4 && group.len() >= nb * GROUP_BLOCK);
    assert!(acts.iter().all(|a| a.len() >= nb * Q8K_BYTES));
}

/// An activation block's sub-block sums as i16 pairs for the mins term: pair p packs (the sum
/// of sub-block 2p, of 2p + 1), a sub-block's sum that of its two 16-element sums (|·| ≤ 4,096).
///
/// # Safety
/// `ab` points at a whole Q8_K block.
#[cfg(target_arch = "x86_64")]
unsafe fn bsum_pairs(ab: *const u8) -> [i32; 4] {
    let bs = |s: usize| {
        let e = ab.add(Q8K_BSUMS + 4 * s);
        i32::from((e as *const i16).read_unaligned())
            + i32::from((e.add(2) as *const i16).read_unaligned())
    };
    std::array::from_fn(|p| (bs(2 * p) & 0xffff) | (bs(2 * p + 1) << 16))
}

/// `rows_single` without AVX-512: each half of the group (rows 8h..8h+8, bytes 32h.. of
/// every 64-byte row-interleaved vector) in 8-lane registers. Per chunk c and token, the
/// eight `maddubs` of a sub-block's four-byte groups j are summed in i16 — a lane holds 16
/// products of a 4-bit quant (≤ 15) and an i8 activation, |sum| ≤ 16·15·128 = 30,720 — and
/// one `madd` against the row's scale (in both i16 halves of its lane) makes the row's i32:
/// the same integer sumi and summ per (row, block) as the scalar kernel, then its float ops
/// lane-wise, so every (row, token) is bitwise `scalar_k::q4_k`.
///
/// # Safety
/// The CPU runs AVX2/FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn rows_single_avx2<const N: usize>(
    nb: usize,
    group: &[u8],
    acts: [&[u8]; N],
    out: &mut [[f32; GROUP]; N],
) {
    use std::arch::x86_64::*;
    check_args(nb, group, &acts);
    let m4 = _mm256_set1_epi8(15);
    let mut acc = [[_mm256_setzero_ps(); N]; 2]; // [half][token]: rows 8h..8h+8
    for b in 0..nb {
        let g = group.as_ptr().add(b * GROUP_BLOCK);
        let ahead = g.wrapping_add(AHEAD * GROUP_BLOCK);
        let ab: [*const u8; N] = std::array::from_fn(|t| acts[t].as_ptr().add(b * Q8K_BYTES));
        let pairs: [[i32; 4]; N] = std::array::from_fn(|t| bsum_pairs(ab[t])); // both halves'
        for h in 0..2 {
            let mut si = [_mm256_setzero_si256(); N];
            for c in 0..4 {
                if h == 0 {
                    for l in 10 * c..10 * c + 10 {
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l) as *const i8);
                    }
                }
                let mut s0 = [_mm256_setzero_si256(); N];
                let mut s1 = [_mm256_setzero_si256(); N];
                for j in 0..8 {
                    let v = g.add(512 + 64 * (8 * c + j) + 32 * h);
                    let raw = _mm256_loadu_si256(v as *const __m256i);
                    let lo = _mm256_and_si256(raw, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
                    for t in 0..N {
                        let q = ab[t].add(Q8K_QS + 64 * c + 4 * j);
                        let a0 = _mm256_set1_epi32((q as *const i32).read_unaligned());
                        let a1 = _mm256_set1_epi32((q.add(32) as *const i32).read_unaligned());
                        s0[t] = _mm256_add_epi16(s0[t], _mm256_maddubs_epi16(lo, a0));
                        s1[t] = _mm256_add_epi16(s1[t], _mm256_maddubs_epi16(hi, a1));
                    }
                }
                // the rows' scales of sub-blocks 2c and 2c + 1, each in both i16 halves
                let sc = |s: usize| {
                    let v = _mm_loadl_epi64(g.add(128 + 16 * s + 8 * h) as *const __m128i);
                    let w = _mm256_cvtepu8_epi32(v);
                    _mm256_or_si256(w, _mm256_slli_epi32::<16>(w))
                };
                let (c0, c1) = (sc(2 * c), sc(2 * c + 1));
                for t in 0..N {
                    let p = _mm256_add_epi32(
                        _mm256_madd_epi16(s0[t], c0),
                        _mm256_madd_epi16(s1[t], c1),
                    );
                    si[t] = _mm256_add_epi32(si[t], p);
                }
            }
            let d = _mm256_loadu_ps(g.add(32 * h) as *const f32);
            let dmin = _mm256_loadu_ps(g.add(64 + 32 * h) as *const f32);
            for t in 0..N {
                let mut sm = _mm256_setzero_si256();
                for (p, &pair) in pairs[t].iter().enumerate() {
                    let mins = _mm256_loadu_si256(g.add(256 + 64 * p + 32 * h) as *const __m256i);
                    sm = _mm256_add_epi32(sm, _mm256_madd_epi16(mins, _mm256_set1_epi32(pair)));
                }
                let da = _mm256_set1_ps(f32_at(acts[t], b * Q8K_BYTES));
                let (dd, dm) = (_mm256_mul_ps(da, d), _mm256_mul_ps(da, dmin));
                let x = _mm256_sub_ps(
                    _mm256_mul_ps(dd, _mm256_cvtepi32_ps(si[t])),
                    _mm256_mul_ps(dm, _mm256_cvtepi32_ps(sm)),
                );
                acc[h][t] = _mm256_add_ps(acc[h][t], x);
            }
        }
    }
    for t in 0..N {
        _mm256_storeu_ps(out[t].as_mut_ptr(), acc[0][t]);
        _mm256_storeu_ps(out[t].as_mut_ptr().add(8), acc[1][t]);
    }
}

/// `out[t][r] = vec_dot(row r, acts[t])` in `Order::Single` for the group's 16 rows
/// (`group`: `nb` blocks of `GROUP_BLOCK` bytes) and N ≤ 4 Q8_K activations of `nb` blocks.
///
/// # Safety
/// `available()` holds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn rows_single<const N: usize>(
    nb: usize,
    group: &[u8],
    acts: [&[u8]; N],
    out: &mut [[f32; GROUP]; N],
) {
    use std::arch::x86_64::*;
    check_args(nb, group, &acts);
    let m4 = _mm512_set1_epi8(15);
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..nb {
        let g = group.as_ptr().add(b * GROUP_BLOCK);
        // `AHEAD` blocks on (rows stream once; a hint never faults past the matrix), ten lines
        // per chunk so the hints spread over the block's work
        let ahead = g.wrapping_add(AHEAD * GROUP_BLOCK);
        let ab: [*const u8; N] = std::array::from_fn(|t| acts[t].as_ptr().add(b * Q8K_BYTES));
        let mut si = [_mm512_setzero_si512(); N];
        for c in 0..4 {
            for l in 10 * c..10 * c + 10 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l) as *const i8);
            }
            let mut s0 = [_mm512_setzero_si512(); N];
            let mut s1 = [_mm512_setzero_si512(); N];
            for j in 0..8 {
                let raw = _mm512_loadu_si512(g.add(512 + 64 * (8 * c + j)) as *const __m512i);
                let lo = _mm512_and_si512(raw, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), m4);
                for t in 0..N {
                    let q = ab[t].add(Q8K_QS + 64 * c + 4 * j);
                    let a0 = _mm512_set1_epi32((q as *const i32).read_unaligned());
                    let a1 = _mm512_set1_epi32((q.add(32) as *const i32).read_unaligned());
                    s0[t] = _mm512_dpbusd_epi32(s0[t], lo, a0);
                    s1[t] = _mm512_dpbusd_epi32(s1[t], hi, a1);
                }
            }
            let sc = |s: usize| {
                _mm512_cvtepu8_epi32(_mm_loadu_si128(g.add(128 + 16 * s) as *const __m128i))
            };
            let (c0, c1) = (sc(2 * c), sc(2 * c + 1));
            for t in 0..N {
                let p =
                    _mm512_add_epi32(_mm512_mullo_epi32(s0[t], c0), _mm512_mullo_epi32(s1[t], c1));
                si[t] = _mm512_add_epi32(si[t], p);
            }
        }
        let d = _mm512_loadu_ps(g as *const f32);
        let dmin = _mm512_loadu_ps(g.add(64) as *const f32);
        for t in 0..N {
            // summ = Σ pairs (min_2p, min_2p+1)·(bsum_2p, bsum_2p+1), a sub-block's bsum the
            // sum of its two 16-element sums
            let mut sm = _mm512_setzero_si512();
            for (p, pair) in bsum_pairs(ab[t]).into_iter().enumerate() {
                let mins = _mm512_loadu_si512(g.add(256 + 64 * p) as *const __m512i);
                sm = _mm512_dpwssd_epi32(sm, mins, _mm512_set1_epi32(pair));
            }
            let da = _mm512_set1_ps(f32_at(acts[t], b * Q8K_BYTES));
            let (dd, dm) = (_mm512_mul_ps(da, d), _mm512_mul_ps(da, dmin));
            let x = _mm512_sub_ps(
                _mm512_mul_ps(dd, _mm512_cvtepi32_ps(si[t])),
                _mm512_mul_ps(dm, _mm512_cvtepi32_ps(sm)),
            );
            acc[t] = _mm512_add_ps(acc[t], x);
        }
    }
    for t in 0..N {
        _mm512_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::super::scalar_k::q4_k;
    use super::super::tests::{random_act, random_row, Rng};
    use super::*;
    use crate::quant::GgmlType;

    /// Every (row, token) of the AVX2 kernel equals the scalar one-row kernel bit for bit, one
    /// to four tokens, one and eight blocks, random and extreme quants (every 4-bit quant 15
    /// against activations of ±127 / −128: the i16 sums' largest magnitudes).
    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx2"]
    fn r16_avx2_rows_equal_scalar_bitwise() {
        crate::quant::dot::require_isa(crate::quant::dot::Isa::Avx2, "r16 avx2");
        let mut rng = Rng::new(6);
        for nb in [1usize, 8] {
            let n = 256 * nb;
            for extreme in [false, true] {
                let mut rows: Vec<u8> = (0..GROUP)
                    .flat_map(|_| random_row(GgmlType::Q4K, n, &mut rng))
                    .collect();
                let mut acts: Vec<Vec<u8>> = (0..4)
                    .map(|_| random_act(GgmlType::Q4K, n, &mut rng))
                    .collect();
                if extreme {
                    for (i, blk) in rows.chunks_exact_mut(BLOCK).enumerate() {
                        blk[16..].fill(if i % 2 == 0 { 0xff } else { 0x0f });
                    }
                    for (t, a) in acts.iter_mut().enumerate() {
                        let v = [127u8, 0x81, 0x80, 127][t];
                        for blk in a.chunks_exact_mut(Q8K_BYTES) {
                            blk[Q8K_QS..Q8K_QS + 256].fill(v);
                            let s = (v as i8 as i16) * 16;
                            for k in 0..16 {
                                let o = Q8K_BSUMS + 2 * k;
                                blk[o..o + 2].copy_from_slice(&s.to_le_bytes());
                            }
                        }
                    }
                }
                let mut g = vec![0u8; nb * GROUP_BLOCK];
                repack_group(&rows, nb, &mut g);
                let rb = nb * BLOCK;
                let want =
                    |t: usize, r: usize| q4_k(n, &rows[r * rb..(r + 1) * rb], &acts[t]).to_bits();
                let mut o4 = [[0f32; GROUP]; 4];
                let mut o2 = [[0f32; GROUP]; 2];
                let mut o1 = [[0f32; GROUP]; 1];
                // SAFETY: AVX2 (required above; the dot kernels' AVX2 implies FMA here).
                unsafe {
                    rows_single_avx2::<4>(
                        nb,
                        &g,
                        [&acts[0], &acts[1], &acts[2], &acts[3]],
                        &mut o4,
                    );
                    rows_single_avx2::<2>(nb, &g, [&acts[3], &acts[1]], &mut o2);
                    rows_single_avx2::<1>(nb, &g, [&acts[2]], &mut o1);
                }
                for r in 0..GROUP {
                    for t in 0..4 {
                        let what = format!("nb {nb} extreme {extreme} row {r} token {t}");
                        assert_eq!(o4[t][r].to_bits(), want(t, r), "{what}");
                    }
                    assert_eq!(
                        o2[0][r].to_bits(),
                        want(3, r),
                        "nb {nb} row {r}, two tokens"
                    );
                    assert_eq!(
                        o2[1][r].to_bits(),
                        want(1, r),
                        "nb {nb} row {r}, two tokens"
                    );
                    assert_eq!(o1[0][r].to_bits(), want(2, r), "nb {nb} row {r}, one token");
                }
            }
        }
    }

    /// Every (row, token) of the repacked kernel equals the scalar one-row kernel bit for bit,
    /// one to four tokens, one and eight blocks.
    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks vnni"]
    fn r16_rows_equal_scalar_bitwise() {
        crate::quant::dot::require_isa(crate::quant::dot::Isa::Avx512, "r16");
        assert!(available(), "AVX-512 VNNI");
        let mut rng = Rng::new(5);
        for nb in [1usize, 8] {
            let n = 256 * nb;
            let rows: Vec<u8> = (0..GROUP)
                .flat_map(|_| random_row(GgmlType::Q4K, n, &mut rng))
                .collect();
            let acts: Vec<Vec<u8>> = (0..4)
                .map(|_| random_act(GgmlType::Q4K, n, &mut rng))
                .collect();
            let mut g = vec![0u8; nb * GROUP_BLOCK];
            repack_group(&rows, nb, &mut g);
            let rb = nb * BLOCK;
            let want =
                |t: usize, r: usize| q4_k(n, &rows[r * rb..(r + 1) * rb], &acts[t]).to_bits();
            let mut o4 = [[0f32; GROUP]; 4];
            let mut o1 = [[0f32; GROUP]; 1];
            // SAFETY: `available()` (asserted).
            unsafe {
                rows_single::<4>(nb, &g, [&acts[0], &acts[1], &acts[2], &acts[3]], &mut o4);
                rows_single::<1>(nb, &g, [&acts[2]], &mut o1);
            }
            for r in 0..GROUP {
                for t in 0..4 {
                    assert_eq!(o4[t][r].to_bits(), want(t, r), "nb {nb} row {r} token {t}");
                }
                assert_eq!(o1[0][r].to_bits(), want(2, r), "nb {nb} row {r}, one token");
            }
        }
    }
}
