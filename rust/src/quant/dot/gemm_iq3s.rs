//! IQ3_S multi-token kernel (AVX2): one weight row against every token of the call (up to
//! `MAX_T`), 8 tokens at a time in registers. Decoding a group of 32 weights (8 scalar grid
//! lookups, the sign mask, the scale) costs several tokens' work, so it is done once per
//! call: the first chunk of 8 tokens decodes each group as it goes (the lookups overlap the
//! token math) and keeps it in a small L1 buffer (`Decoded`, 768 bytes) that the call's
//! other chunks read (calls of up to 4 tokens keep it in registers, `small`). Per token and
//! group: one activation load, `(a ^ m) − m`,
//! `vpmaddubsw`, `vpmaddwd`, an add. On the tiles' access pattern (a ~96 KiB row block,
//! groups of 32 tokens) this is ~1.4× the previous kernel, which decoded per 4 tokens
//! (`bench::iq3s_multi_throughput`). The multiply port bounds it: on Zen 1 `vpmaddubsw`
//! and `vpmaddwd` (ymm) each take 2 cycles of the one pipe that multiplies, so ≥ 4 cycles
//! per token and group; measured ~5.2.
//!
//! Bitwise contract (as `gemm_avx2.rs`): per token exactly the integer lanes of the
//! single-token `avx2_k::iq3_s_ints`, then the float combine of the order: `Order::Single`
//! ggml's `Fma8` (`fma(d·d_a, f32(lanes), acc)` per block, `hsum8`), `Order::Many` the tiled
//! order (`acc + (f32(Σ lanes)·d)·d_a`; for 8 tokens the same IEEE operations lane-wise on a
//! vector of their sums). `gemm::tests` checks it against the single-token kernels.

use super::super::super::avx2::{bits_to_bytes, h2f, hsum8, hsum_i32, load};
use super::super::super::common::u32_at;
use super::super::MAX_T;
use crate::quant::tables::IQ3S_GRID;
use std::arch::x86_64::*;

use super::super::super::common::Q8K_BYTES as AB;
/// IQ3_S block bytes.
const WB: usize = 110;

/// One decoded block: per group g of 32 weights the grid magnitudes (u8), the sign mask
/// (0 or −1 per byte) and the scale 2·s+1 in every i16 lane.
#[repr(C)]
struct Decoded {
    grid: [__m256i; 8],
    mask: [__m256i; 8],
    scale: [__m256i; 8],
}

/// Group `g` of block `wb` (110 bytes): (grid bytes, sign mask, scale).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn decode_group(wb: &[u8], g: usize) -> (__m256i, __m256i, __m256i) {
    let qh = wb[66 + g] as usize;
    let qs = &wb[2 + 8 * g..10 + 8 * g];
    // SAFETY of the unchecked lookup: a byte plus one bit above it is < 512.
    let gi = |m: usize| *IQ3S_GRID.get_unchecked(qs[m] as usize | ((qh >> m) & 1) << 8) as i32;
    let gv = _mm256_set_epi32(gi(7), gi(6), gi(5), gi(4), gi(3), gi(2), gi(1), gi(0));
    let m = bits_to_bytes(u32_at(wb, 74 + 4 * g));
    let ls = 1 + 2 * ((wb[106 + g / 2] >> (4 * (g % 2))) & 15) as i16;
    (gv, m, _mm256_set1_epi16(ls))
}

/// The integer lanes of `N` tokens' Q8_K blocks (`a[t]` points at a block's `d`) against
/// block `wb`: exactly `iq3_s_ints`'s eight lanes (`Order::Single` needs each lane).
/// `FIRST`: decode the block group by group (the scalar lookups then overlap the token
/// math) and keep it in `dec`; else read it from `dec`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn lanes<const N: usize, const FIRST: bool>(
    wb: &[u8],
    dec: &mut Decoded,
    a: [*const u8; N],
) -> [__m256i; N] {
    let mut sumv = [_mm256_setzero_si256(); N];
    for g in 0..8 {
        let (gv, m, lsv) = if FIRST {
            let v = decode_group(wb, g);
            (dec.grid[g], dec.mask[g], dec.scale[g]) = v;
            v
        } else {
            (dec.grid[g], dec.mask[g], dec.scale[g])
        };
        for t in 0..N {
            sumv[t] = mac(sumv[t], a[t].add(4 + 32 * g), gv, m, lsv);
        }
    }
    sumv
}

/// `sum` plus one token's group (32 activations at `ap`) against a decoded group, as
/// `iq3_s_ints`: the activation negated where the sign bit is set, `(a ^ m) − m`, then
/// `madd(maddubs(grid, a), ls)`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn mac(sum: __m256i, ap: *const u8, gv: __m256i, m: __m256i, lsv: __m256i) -> __m256i {
    let av = _mm256_sub_epi8(_mm256_xor_si256(load(ap), m), m);
    _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(gv, av), lsv))
}

/// One token's per-block float combine: `Many` as tiled_kernel!, `acc + (f32(Σ lanes)·d_w)·d_a`;
/// `Single` as fma8_kernel!, `fma(d_w·d_a, f32(lanes), accv)`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn combine<const MANY: bool>(lanes: __m256i, d: f32, da: f32, accv: &mut __m256, acc: &mut f32) {
    if MANY {
        *acc += (hsum_i32(lanes) as f32 * d) * da;
    } else {
        *accv = _mm256_fmadd_ps(_mm256_set1_ps(d * da), _mm256_cvtepi32_ps(lanes), *accv);
    }
}

/// Up to 4 tokens: each group decoded in registers and used at once, no buffer (at such
/// counts the buffer's stores and the 8-token bookkeeping cost more than they save).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn small<const N: usize, const MANY: bool>(
    n: usize,
    w: &[u8],
    a: [*const u8; N],
) -> [f32; N] {
    let (mut accv, mut acc) = ([_mm256_setzero_ps(); N], [0f32; N]);
    for b in 0..n / 256 {
        let wb = &w[WB * b..WB * b + WB];
        let mut sumv = [_mm256_setzero_si256(); N];
        for g in 0..8 {
            let (gv, m, lsv) = decode_group(wb, g);
            for t in 0..N {
                sumv[t] = mac(sumv[t], a[t].add(AB * b + 4 + 32 * g), gv, m, lsv);
            }
        }
        let d = h2f(wb, 0);
        for t in 0..N {
            let da = f32::from_le_bytes(*(a[t].add(AB * b) as *const [u8; 4]));
            combine::<MANY>(sumv[t], d, da, &mut accv[t], &mut acc[t]);
        }
    }
    std::array::from_fn(|t| if MANY { acc[t] } else { hsum8(accv[t]) })
}

/// Tokens `acts[t0..t0 + N]` against block `b`: their lanes combined into `accv`
/// (`Single`) or `acc` (`Many`), indexed by token.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn run<const N: usize, const MANY: bool, const FIRST: bool>(
    wb: &[u8],
    dec: &mut Decoded,
    acts: &[&[u8]],
    t0: usize,
    b: usize,
    d: f32,
    accv: &mut [__m256; MAX_T],
    acc: &mut [f32; MAX_T],
) {
    let a: [*const u8; N] = std::array::from_fn(|j| acts[t0 + j].as_ptr().add(AB * b));
    let sumv = lanes::<N, FIRST>(wb, dec, a);
    if MANY && N == 8 {
        // the eight tokens' Σ lanes at once (exact integer sums in any grouping), then the
        // same IEEE operations as below, lane by lane
        let h = |x: __m256i, y: __m256i| _mm256_hadd_epi32(x, y);
        let s4 = h(h(sumv[0], sumv[1]), h(sumv[2], sumv[3]));
        let s8 = h(h(sumv[4], sumv[5]), h(sumv[6], sumv[7]));
        // s4 = (t0 t1 t2 t3 | t0 t1 t2 t3) halves; s8 likewise for t4..t7
        let lo = _mm256_permute2x128_si256(s4, s8, 0x20);
        let hi = _mm256_permute2x128_si256(s4, s8, 0x31);
        let tot = _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi));
        let da: [f32; 8] = std::array::from_fn(|j| f32::from_le_bytes(*(a[j] as *const [u8; 4])));
        let f = _mm256_mul_ps(
            _mm256_mul_ps(tot, _mm256_set1_ps(d)),
            _mm256_loadu_ps(da.as_ptr()),
        );
        let p = acc.as_mut_ptr().add(t0);
        _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), f));
        return;
    }
    for j in 0..N {
        let da = f32::from_le_bytes(*(a[j] as *const [u8; 4]));
        combine::<MANY>(sumv[j], d, da, &mut accv[t0 + j], &mut acc[t0 + j]);
    }
}

/// `out[t] = dot(w, acts[t])` in the order `MANY` selects, for any number of tokens (the row
/// is decoded once per `MAX_T`; up to 4 tokens take `small`).
///
/// # Safety
/// AVX2, FMA and F16C are available; `w` holds `n / 256` IQ3_S blocks, every activation
/// `n / 256` Q8_K blocks, `out.len() == acts.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn iq3_s_multi<const MANY: bool>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    assert_eq!(out.len(), acts.len());
    let p = |i: usize| acts[i].as_ptr();
    match acts.len() {
        1 => out[0] = small::<1, MANY>(n, w, [p(0)])[0],
        2 => out.copy_from_slice(&small::<2, MANY>(n, w, [p(0), p(1)])),
        3 => out.copy_from_slice(&small::<3, MANY>(n, w, [p(0), p(1), p(2)])),
        4 => out.copy_from_slice(&small::<4, MANY>(n, w, [p(0), p(1), p(2), p(3)])),
        _ => {
            for (a, o) in acts.chunks(MAX_T).zip(out.chunks_mut(MAX_T)) {
                up_to_max::<MANY>(n, w, a, o);
            }
        }
    }
}

/// `iq3_s_multi` for at most `MAX_T` tokens.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn up_to_max<const MANY: bool>(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
    let nt = acts.len();
    let mut accv = [_mm256_setzero_ps(); MAX_T];
    let mut acc = [0f32; MAX_T];
    let mut dec = Decoded {
        grid: [_mm256_setzero_si256(); 8],
        mask: [_mm256_setzero_si256(); 8],
        scale: [_mm256_setzero_si256(); 8],
    };
    for b in 0..n / 256 {
        let wb = &w[WB * b..WB * b + WB];
        let d = h2f(wb, 0);
        let mut t = 0;
        while t < nt {
            let left = nt - t;
            let (de, va, aa) = (&mut dec, &mut accv, &mut acc);
            macro_rules! go {
                ($n:literal) => {
                    if t == 0 {
                        run::<$n, MANY, true>(wb, de, acts, t, b, d, va, aa)
                    } else {
                        run::<$n, MANY, false>(wb, de, acts, t, b, d, va, aa)
                    }
                };
            }
            match left {
                1 => go!(1),
                2 => go!(2),
                3 => go!(3),
                4 => go!(4),
                5 => go!(5),
                6 => go!(6),
                7 => go!(7),
                _ => go!(8),
            }
            t += left.min(8);
        }
    }
    for (t, o) in out.iter_mut().enumerate() {
        *o = if MANY { acc[t] } else { hsum8(accv[t]) };
    }
}

/// A/B timing against the previous kernel (4 tokens per decoded block, 8 per call), in the
/// tiles' access pattern (a ~96 KiB row block, token groups outer, rows inner), thread CPU
/// time, best of 7 interleaved passes:
/// `cargo test --no-default-features --release iq3s_multi_throughput -- --ignored --nocapture`.
#[cfg(test)]
mod bench {
    use super::super::super::super::tests::{random_act, random_row, thread_cpu_ns, Rng};
    use super::*;
    use crate::quant::GgmlType;

    /// The previous kernel (before the decoded-block buffer), `Order::Many`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn old4<const N: usize>(n: usize, w: &[u8], a: [*const u8; N]) -> [f32; N] {
        let mut acc = [0f32; N];
        for b in 0..n / 256 {
            let wb = &w[110 * b..110 * b + 110];
            let mut sumv = [_mm256_setzero_si256(); N];
            for g in 0..8 {
                let qh = wb[66 + g] as usize;
                let ls = 1 + 2 * ((wb[106 + g / 2] >> (4 * (g % 2))) & 15) as i16;
                let qs = &wb[2 + 8 * g..10 + 8 * g];
                let gi = |m: usize| {
                    *IQ3S_GRID.get_unchecked(qs[m] as usize | ((qh >> m) & 1) << 8) as i32
                };
                let gv = _mm256_set_epi32(gi(7), gi(6), gi(5), gi(4), gi(3), gi(2), gi(1), gi(0));
                let m = bits_to_bytes(u32_at(wb, 74 + 4 * g));
                let lsv = _mm256_set1_epi16(ls);
                for t in 0..N {
                    let av = load(a[t].add(AB * b + 4 + 32 * g));
                    let av = _mm256_sub_epi8(_mm256_xor_si256(av, m), m);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(gv, av), lsv);
                    sumv[t] = _mm256_add_epi32(sumv[t], p);
                }
            }
            let d = h2f(wb, 0);
            for t in 0..N {
                let da = f32::from_le_bytes(*(a[t].add(AB * b) as *const [u8; 4]));
                acc[t] += (hsum_i32(sumv[t]) as f32 * d) * da;
            }
        }
        acc
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn old_call(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
        let mut t = 0;
        while t < acts.len() {
            let p = |i: usize| acts[t + i].as_ptr();
            let k = (acts.len() - t).min(4);
            match k {
                1 => out[t] = old4::<1>(n, w, [p(0)])[0],
                2 => out[t..t + 2].copy_from_slice(&old4::<2>(n, w, [p(0), p(1)])),
                3 => out[t..t + 3].copy_from_slice(&old4::<3>(n, w, [p(0), p(1), p(2)])),
                _ => out[t..t + 4].copy_from_slice(&old4::<4>(n, w, [p(0), p(1), p(2), p(3)])),
            }
            t += k;
        }
    }

    #[test]
    #[ignore]
    fn iq3s_multi_throughput() {
        let w = GgmlType::IQ3S;
        for (n, tokens) in [
            (2048usize, [1usize, 2, 4, 8, 13, 32, 64]),
            (768, [1, 2, 4, 8, 13, 32, 64]),
        ] {
            let mut rng = Rng::new(5 + n as u64);
            let rb = w.row_bytes(n).unwrap();
            let rows = 96 * 1024 / rb;
            let m: Vec<u8> = (0..rows).flat_map(|_| random_row(w, n, &mut rng)).collect();
            let acts: Vec<Vec<u8>> = (0..64).map(|_| random_act(w, n, &mut rng)).collect();
            for nt in tokens {
                let refs: Vec<&[u8]> = acts[..nt].iter().map(|a| &a[..]).collect();
                // (old: groups of 8 as the tiles gave it; new: groups of MAX_T)
                let pass = |k: usize, out: &mut [f32]| {
                    let group = if k > 0 { MAX_T } else { 8 };
                    for (g0, grp) in refs.chunks(group).enumerate() {
                        for row in m.chunks_exact(rb) {
                            let o = &mut out[g0 * group..g0 * group + grp.len()];
                            unsafe {
                                match k {
                                    0 => old_call(n, row, grp, o),
                                    1 => iq3_s_multi::<false>(n, row, grp, o),
                                    _ => iq3_s_multi::<true>(n, row, grp, o),
                                }
                            }
                        }
                    }
                };
                let reps = (2_000_000 / (rows * n / 32 * nt)).max(1);
                let mut best = [u64::MAX; 3];
                let mut outs = [vec![0f32; nt], vec![0f32; nt], vec![0f32; nt]];
                for _ in 0..7 {
                    for (k, out) in outs.iter_mut().enumerate() {
                        let t0 = thread_cpu_ns();
                        for _ in 0..reps {
                            pass(k, out);
                        }
                        best[k] = best[k].min(thread_cpu_ns() - t0);
                    }
                }
                // (old and new Many: the same order, bitwise)
                assert!(outs[0]
                    .iter()
                    .zip(&outs[2])
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
                let per = |k: usize| best[k] as f64 / (reps * rows * n / 32 * nt) as f64;
                let gbs = |k: usize| (reps * rows * rb) as f64 / best[k] as f64;
                println!(
                    "n={n} tokens={nt}: old {:.2} / new Single {:.2} / new Many {:.2} ns per token \
                     per 32 weights (Many {:.2}x); weights {:.2} / {:.2} GB/s per core",
                    per(0),
                    per(1),
                    per(2),
                    per(0) / per(2),
                    gbs(0),
                    gbs(2)
                );
            }
        }
    }
}
