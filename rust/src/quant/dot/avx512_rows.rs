//! AVX-512 BW grouped one-token Q4_K and Q6_K kernels: `avx2_rows::q4_k_rows4` with two
//! 32-element chunks of a row per 64-byte vector, `q6_k_rows4` with both halves of a block per
//! vector (below, at the kernel).
//!
//! Why: the hybrid decode's CPU leg (missed experts, one token) is compute-bound on the GPU
//! machine's Xeon host — 16 threads read a layer's experts at ~114 GB/s from cache and ~81 GB/s
//! cold, a core computing ~7–12 GB/s of Q4_K rows where a Zen 4 core computes ~19. Intel's
//! server cores issue 512-bit `vpmaddubsw` / `vpmaddwd` on two ports, so a zmm form does twice
//! the work per multiply µop; on every AVX-512 core the scales' byte shuffles halve (4 per row
//! and block instead of 8) and so do the loads and nibble masks. On a Zen 4 core (512-bit
//! integer ops split over its 256-bit pipes) the Q4_K form still runs 4–11% faster than the
//! AVX2 groups on L2-resident rows (`zmm_rows_speed`; a four-sequence decode step +2.8%), the
//! Q6_K form ~22%.
//!
//! Q4_K layout per block: quant vector P (0, 1) is the row's bytes `qs[64P .. 64P + 64]`, chunks
//! 2P and 2P + 1 (low nibbles: sub-blocks 4P and 4P + 2; high: 4P + 1 and 4P + 3); the
//! activation's matching 32-byte runs are joined once per block for the four rows; each
//! 256-bit half then takes the scale the AVX2 kernel gives that chunk.
//!
//! Bitwise: the products and pair sums are the AVX2 kernel's (no saturation: 2·15·128 fits in
//! i16), the per-row integer total is exact in any grouping, and the tail (mins, the float
//! combine) is the AVX2 kernel's own (`q4_k_tail4`). The Q6_K form: at its kernel.

use super::super::avx2::k;
use super::super::avx2::rows::{
    ahead_group, by_groups, q4_k_tail4, q6_k_block_done, q6_scale_masks, q6_values, q8k_block,
    Q4Heads, R,
};
use super::super::avx2::{hsum8, load, load128, pf};
use super::super::common::Q8K_BYTES as AB;
use crate::quant::GgmlType;
use std::arch::x86_64::*;

/// Two 256-bit halves as one zmm.
#[target_feature(enable = "avx512f")]
#[inline]
fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// Q4_K: `out[r] = dot(row r, a)` for the four rows of `w` (row r at byte `r·rb`), bitwise
/// `avx2_rows::q4_k_rows4`.
/// Safety: AVX2/FMA/F16C and AVX-512 F/BW; `w` holds four rows of `rb` bytes of `n`
/// elements and `a` the Q8_K activation of `n`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
pub(in super::super) unsafe fn q4_k_rows4(n: usize, w: &[u8], rb: usize, a: &[u8]) -> [f32; R] {
    let mut acc = _mm_setzero_ps();
    let m4 = _mm512_set1_epi8(15);
    // i16 lane k of every 128-bit lane: bytes 2k, 2k + 1
    let bm = |k: i16| _mm256_set1_epi16(0x0100 + 0x0202 * k);
    // vector P: the low nibbles of chunk 2P (scale 4P) | chunk 2P + 1 (scale 4P + 2), the
    // high ones 4P + 1 | 4P + 3
    let mlo = [join(bm(0), bm(2)), join(bm(4), bm(6))];
    let mhi = [join(bm(1), bm(3)), join(bm(5), bm(7))];
    let dist = pf::distance();
    for b in 0..n / 256 {
        ahead_group(w, b, 144, rb, dist);
        let ab = &a[AB * b..AB * b + AB];
        let ap = ab.as_ptr().add(4);
        // the activation runs of chunks 2P | 2P + 1: low halves, high halves
        let alo = [0, 1].map(|p| join(load(ap.add(128 * p)), load(ap.add(128 * p + 64))));
        let ahi = [0, 1].map(|p| join(load(ap.add(128 * p + 32)), load(ap.add(128 * p + 96))));
        let mut heads = Q4Heads::default();
        let mut sumv = [_mm256_setzero_si256(); R];
        for r in 0..R {
            let wb = &w[r * rb + 144 * b..r * rb + 144 * b + 144];
            let sc = heads.take(r, wb);
            // the eight u8 scales as i16 in every 128-bit lane
            let scz = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
            let qp = wb.as_ptr().add(16);
            let mut s = _mm512_setzero_si512();
            for p in 0..2 {
                let q = _mm512_loadu_si512(qp.add(64 * p) as *const __m512i);
                let lo = _mm512_and_si512(q, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                let plo = _mm512_maddubs_epi16(lo, alo[p]);
                let phi = _mm512_maddubs_epi16(hi, ahi[p]);
                let v = _mm512_add_epi32(
                    _mm512_madd_epi16(plo, _mm512_shuffle_epi8(scz, mlo[p])),
                    _mm512_madd_epi16(phi, _mm512_shuffle_epi8(scz, mhi[p])),
                );
                s = _mm512_add_epi32(s, v);
            }
            sumv[r] = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
        }
        acc = _mm_add_ps(acc, q4_k_tail4(ab, sumv, &heads));
    }
    let mut out = [0f32; R];
    _mm_storeu_ps(out.as_mut_ptr(), acc);
    out
}

/// Q6_K: `out[r] = dot(row r, a)` for the four rows of `w`, bitwise
/// `avx2_rows::q6_k_rows4`: both 128-element halves of a block in one zmm (half h in the
/// 256-bit half h), so every quant, scale and product op runs once per block instead of twice;
/// the halves' i32 lanes are added (exact) into the AVX2 kernel's eight, then its tail.
/// Safety: as `q4_k_rows4`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
pub(in super::super) unsafe fn q6_k_rows4(n: usize, w: &[u8], rb: usize, a: &[u8]) -> [f32; R] {
    let mut acc = [_mm256_setzero_ps(); R];
    let (m4, m30) = (_mm512_set1_epi8(15), _mm512_set1_epi8(0x30));
    // i16 scale pairs of quant vector j, the same in every 128-bit lane (the AVX2 masks)
    let masks = q6_scale_masks().map(|m| _mm512_broadcast_i64x4(m));
    let dist = pf::distance();
    let wp = w.as_ptr();
    for b in 0..n / 256 {
        ahead_group(w, b, 210, rb, dist);
        let (ap, bsums, da) = q8k_block(a, b);
        // the activation of quant vector j: half 0's 32 bytes | half 1's
        let act: [__m512i; 4] =
            std::array::from_fn(|j| join(load(ap.add(32 * j)), load(ap.add(128 + 32 * j))));
        for r in 0..R {
            let wb = &w[r * rb + 210 * b..r * rb + 210 * b + 210];
            let base = wp.add(r * rb + 210 * b);
            // ql [128]: half h's two 32-byte vectors at 64h; qh [64]: half h's at 128 + 32h
            let z0 = _mm512_loadu_si512(base as *const __m512i);
            let z1 = _mm512_loadu_si512(base.add(64) as *const __m512i);
            let ql0 = _mm512_shuffle_i64x2(z0, z1, 0x44); // [ql0 of half 0 | of half 1]
            let ql1 = _mm512_shuffle_i64x2(z0, z1, 0xee);
            let qh = _mm512_loadu_si512(base.add(128) as *const __m512i);
            let q = q6_values!(ql0, ql1, qh, m4, m30, 512);
            // the signed scales as i16: half 0's eight in 128-bit lanes 0, 1, half 1's in 2, 3
            let sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(load128(base.add(192))));
            let sc = _mm512_shuffle_i64x2(sc, sc, 0x50);
            let mut sumz = _mm512_setzero_si512();
            for (j, &qj) in q.iter().enumerate() {
                let p = _mm512_maddubs_epi16(qj, act[j]);
                let scv = _mm512_shuffle_epi8(sc, masks[j]);
                sumz = _mm512_add_epi32(sumz, _mm512_madd_epi16(p, scv));
            }
            let sumv = _mm256_add_epi32(
                _mm512_castsi512_si256(sumz),
                _mm512_extracti64x4_epi64(sumz, 1),
            );
            acc[r] = q6_k_block_done(wb, sumv, bsums, da, acc[r]);
        }
    }
    std::array::from_fn(|r| hsum8(acc[r]))
}

/// `vec_dot_rows` for Q6_K through the zmm groups (the AVX2 one-row kernel for a tail).
pub(super) fn q6_k_rows(n: usize, rows: &[u8], act: &[u8], out: &mut [f32]) {
    // SAFETY (by_groups' contract): handed out only where AVX-512 F/BW hold with AVX2/FMA/F16C
    by_groups(GgmlType::Q6K, n, rows, act, out, q6_k_rows4, k::q6_k);
}

/// `vec_dot_rows` for Q4_K through the zmm groups (the AVX2 one-row kernel for a tail).
pub(super) fn q4_k_rows(n: usize, rows: &[u8], act: &[u8], out: &mut [f32]) {
    // SAFETY (by_groups' contract): handed out only where AVX-512 F/BW hold with AVX2/FMA/F16C
    by_groups(GgmlType::Q4K, n, rows, act, out, q4_k_rows4, k::q4_k);
}

#[cfg(test)]
mod exact {
    use super::super::super::avx2::pf::{knob::DIST, DISTANCE};
    use super::super::super::tests::{
        flat_q8k_act, random_act, random_row, set_extreme_k_rows, Rng,
    };
    use super::super::super::{rows_kernel_for, Isa, RowsFn};
    use crate::quant::GgmlType;

    /// The zmm groups of `w` (Q4_K or Q6_K).
    fn zmm(w: GgmlType) -> RowsFn {
        match w {
            GgmlType::Q4K => super::q4_k_rows,
            _ => super::q6_k_rows,
        }
    }

    /// The zmm groups against the AVX2 grouped kernel (itself bitwise `vec_dot`, tested in
    /// `avx2_rows`): every row bitwise.
    fn check(w: GgmlType, n: usize, m: &[u8], act: &[u8], what: &str) {
        let rows = m.len() / w.row_bytes(n).unwrap();
        let (mut z, mut y) = (vec![f32::NAN; rows], vec![f32::NAN; rows]);
        zmm(w)(n, m, act, &mut z);
        rows_kernel_for(Isa::Avx2, w).unwrap()(n, m, act, &mut y);
        for r in 0..rows {
            let (a, b) = (z[r].to_bits(), y[r].to_bits());
            assert_eq!(a, b, "{} {what} n={n} row {r}/{rows}", w.name());
        }
    }

    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx512"]
    fn zmm_rows_equal_avx2_rows_bitwise() {
        crate::quant::dot::require_isa(Isa::Avx512, "zmm_rows_equal_avx2_rows_bitwise");
        for w in [GgmlType::Q4K, GgmlType::Q6K] {
            let mut rng = Rng::new(29 + w.id() as u64);
            for n in [256, 768, 2048] {
                let act = random_act(w, n, &mut rng);
                let m: Vec<u8> = (0..13).flat_map(|_| random_row(w, n, &mut rng)).collect();
                let rb = m.len() / 13;
                for d in [0, DISTANCE] {
                    DIST.set(d);
                    for rows in [1usize, 3, 4, 5, 8, 9, 13] {
                        check(w, n, &m[..rows * rb], &act, &format!("random pf {d}"));
                    }
                }
                DIST.set(DISTANCE);
                // every quant bit set (Q4_K nibbles 15, Q6_K values 63; Q6_K scales at
                // 127, -128, -1, 1 by row) against activations of ±127 and 1 (d = 1, bsums
                // 16·v): the largest products and pair sums the i16 lanes hold
                let mut x = m.clone();
                set_extreme_k_rows(w, &mut x, rb);
                for v in [127i8, -127, 1] {
                    check(w, n, &x, &flat_q8k_act(n, v), &format!("extreme act {v}"));
                }
            }
        }
    }

    /// One core's GB/s of the zmm groups against the AVX2 ones on L2-resident rows (384 KB,
    /// best of 5 interleaved passes): `cargo test --release --lib zmm_rows_speed --
    /// --ignored --nocapture`.
    #[test]
    #[ignore = "a benchmark: run by hand on an AVX-512 CPU (the command above)"]
    fn zmm_rows_speed() {
        if !Isa::Avx512.available() {
            println!("zmm_rows_speed: this CPU lacks AVX-512");
            return;
        }
        for (w, n) in [
            (GgmlType::Q4K, 2048),
            (GgmlType::Q4K, 768),
            (GgmlType::Q6K, 2048),
            (GgmlType::Q6K, 768),
        ] {
            let avx2 = rows_kernel_for(Isa::Avx2, w).unwrap();
            let mut rng = Rng::new(5);
            let rb = w.row_bytes(n).unwrap();
            let rows = 384 * 1024 / rb / 64 * 64;
            let m: Vec<u8> = (0..rows).flat_map(|_| random_row(w, n, &mut rng)).collect();
            let act = random_act(w, n, &mut rng);
            let mut out = vec![0f32; 64];
            let mut best = [f64::MAX; 2];
            for _ in 0..5 {
                for (k, best) in best.iter_mut().enumerate() {
                    let f = if k == 0 { zmm(w) } else { avx2 };
                    let t0 = std::time::Instant::now();
                    for _ in 0..200 {
                        for g in m.chunks(64 * rb) {
                            f(n, g, &act, &mut out);
                            std::hint::black_box(&out);
                        }
                    }
                    *best = best.min(t0.elapsed().as_secs_f64());
                }
            }
            let gb = |t: f64| (m.len() * 200) as f64 / t / 1e9;
            let (z, y) = (gb(best[0]), gb(best[1]));
            println!("{} n={n}: zmm {z:.2} GB/s, AVX2 {y:.2} GB/s", w.name());
        }
    }
}
