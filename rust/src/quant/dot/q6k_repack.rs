//! Q6_K repacked at load for the single-token dot ("Q6_K-R"): the same 210 bytes per
//! 256-element block, laid out so that the AVX2 kernel decodes the 6-bit quants with few
//! shifts and applies the 16 scales with half of ggml's `madd`s, while producing exactly
//! ggml's eight int32 lane sums per block (so every float order of `Order` is kept and the
//! result is bitwise `vec_dot`'s on the original block).
//!
//! ggml's AVX2 lane L (0..8) of a block is
//!   `Σ_c sc[2c + L/4] · Σ_{t<4} q[32c + 4L + t]·a[32c + 4L + t]  −  32·(sc[2L]·bsum[2L] +
//!   sc[2L+1]·bsum[2L+1])`
//! over the eight 32-element chunks c (q = the 6-bit quant 0..63, a = the Q8_K activation,
//! bsum = its 16-element sums). The 64 inner sums S(c, L) of four products each fit in i16
//! (|S| ≤ 4·63·128), so the kernel builds them as the i16 sum of two `maddubs` results and
//! scales two of them per i32 lane with one `madd`: 8 `maddubs` + 4 `madd` per block instead
//! of 8 + 8.
//!
//! Layout. The kernel reads eight 32-byte vectors v = 0..8 of quants; byte p of vector v holds
//! element `elem(v, p)`: with m = v/2 (the `madd` it feeds), s = v%2, k = p/2 (its i16 lane),
//! `c = 2m + k%2`, `L = k/2`: element `32c + 4L + 2s + p%2`. The activation's 256 quants are
//! permuted the same way once per token (`permute_act`); its d and bsums stay.
//! Block bytes: for g in 0..2, vectors 4g..4g+4 are packed into 96 bytes A, B, C at 96g:
//! vectors 4g, 4g+1, 4g+2 are the low 6 bits of A, B, C; vector 4g+3's bits 0-1, 2-3, 4-5 are
//! the top two bits of A, B, C. Bytes 192..208: the signed scales reordered as sc[0], sc[2],
//! .., sc[14], sc[1], sc[3], .., sc[15] (the low 128-bit half of every `madd` scales lanes
//! 0..4, which take even scales). Bytes 208..210: d (f16), unchanged.

use super::common::{f16_at, f32_at, i16_at, Fma8, Q8K_BSUMS, Q8K_QS};
use super::{cpu, Order};
use crate::error::{Error, Result};
use crate::quant::GgmlType;

#[cfg_attr(target_arch = "x86_64", path = "q6k_repack_avx2.rs")]
#[cfg_attr(not(target_arch = "x86_64"), path = "q6k_repack_stub.rs")]
mod simd;

/// Bytes per block (as Q6_K).
pub const BLOCK_BYTES: usize = 210;
use super::common::Q8K_BYTES as ACT_BLOCK;

/// The block element held by byte `p` (0..32) of quant vector `v` (0..8).
pub const fn elem(v: usize, p: usize) -> usize {
    let (m, s, k) = (v / 2, v % 2, p / 2);
    32 * (2 * m + k % 2) + 4 * (k / 2) + 2 * s + p % 2
}

/// `PERM[32v + p] = elem(v, p)`.
const PERM: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = elem(i / 32, i % 32) as u8;
        i += 1;
    }
    t
};

/// The 256 quants (0..63) of a Q6_K block in element order.
fn q6k_quants(wb: &[u8]) -> [u8; 256] {
    let (ql, qh) = (&wb[0..128], &wb[128..192]);
    let mut q = [0u8; 256];
    for h in 0..2 {
        let (ql, qh) = (&ql[64 * h..], &qh[32 * h..]);
        for l in 0..32 {
            let e = 128 * h + l;
            q[e] = (ql[l] & 15) | ((qh[l] & 3) << 4);
            q[e + 32] = (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4);
            q[e + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            q[e + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    q
}

/// Repack one Q6_K block (`src`, 210 bytes) into `dst` (210 bytes).
pub fn repack_block(src: &[u8], dst: &mut [u8]) {
    let q = q6k_quants(src);
    dst[..192].fill(0);
    for v in 0..8 {
        let (g, i) = (v / 4, v % 4);
        for p in 0..32 {
            let x = q[elem(v, p)];
            let at = 96 * g + p;
            if i < 3 {
                dst[at + 32 * i] |= x;
            } else {
                dst[at] |= (x & 3) << 6;
                dst[at + 32] |= ((x >> 2) & 3) << 6;
                dst[at + 64] |= (x >> 4) << 6;
            }
        }
    }
    for j in 0..8 {
        dst[192 + j] = src[192 + 2 * j];
        dst[200 + j] = src[192 + 2 * j + 1];
    }
    dst[208..210].copy_from_slice(&src[208..210]);
}

/// Repack a Q6_K matrix of whole blocks (any number of rows, back to back); an error when
/// `src` is not whole Q6_K blocks.
pub fn repack(src: &[u8]) -> Result<Vec<u8>> {
    if !src.len().is_multiple_of(BLOCK_BYTES) {
        return Err(Error::Quant(format!(
            "{} bytes are not whole Q6_K blocks",
            src.len()
        )));
    }
    let mut out = vec![0u8; src.len()];
    for (s, d) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK_BYTES))
    {
        repack_block(s, d);
    }
    Ok(out)
}

/// Permute a Q8_K activation row (whole 292-byte blocks) for the repacked dot: quant
/// `32v + p` of each block becomes the activation of `elem(v, p)`; d and bsums are copied.
pub fn permute_act(act: &[u8], out: &mut [u8]) -> Result<()> {
    if !act.len().is_multiple_of(ACT_BLOCK) || out.len() != act.len() {
        return Err(Error::Quant(format!(
            "activation of {} bytes (buffer {}) is not whole Q8_K blocks",
            act.len(),
            out.len()
        )));
    }
    for (a, o) in act
        .chunks_exact(ACT_BLOCK)
        .zip(out.chunks_exact_mut(ACT_BLOCK))
    {
        o[..Q8K_QS].copy_from_slice(&a[..Q8K_QS]);
        for (i, &e) in PERM.iter().enumerate() {
            o[Q8K_QS + i] = a[Q8K_QS + e as usize];
        }
        o[Q8K_BSUMS..].copy_from_slice(&a[Q8K_BSUMS..]);
    }
    Ok(())
}

/// The reference: ggml's eight lane integers of a repacked block and a permuted activation.
pub fn lanes(wb: &[u8], ab: &[u8]) -> [i32; 8] {
    let sc = |i: usize| {
        (if i.is_multiple_of(2) {
            wb[192 + i / 2]
        } else {
            wb[200 + i / 2]
        }) as i8 as i32
    };
    let mut p = [0i32; 8];
    for v in 0..8 {
        let (g, i) = (v / 4, v % 4);
        for pos in 0..32 {
            let at = 96 * g + pos;
            let q = if i < 3 {
                wb[at + 32 * i] & 63
            } else {
                (wb[at] >> 6) | ((wb[at + 32] >> 6) << 2) | ((wb[at + 64] >> 6) << 4)
            };
            let e = elem(v, pos);
            let lane = (e % 32) / 4;
            let a = ab[Q8K_QS + 32 * v + pos] as i8 as i32;
            p[lane] += sc(e / 16) * q as i32 * a;
        }
    }
    for (k, pk) in p.iter_mut().enumerate() {
        let m = sc(2 * k) * i16_at(ab, Q8K_BSUMS + 4 * k)
            + sc(2 * k + 1) * i16_at(ab, Q8K_BSUMS + 4 * k + 2);
        *pk -= 32 * m;
    }
    p
}

/// Scalar `vec_dot` order (`scalar_k::q6_k`) on repacked blocks.
fn dot_single_scalar(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = Fma8::new();
    for (wb, ab) in w
        .chunks_exact(BLOCK_BYTES)
        .zip(a.chunks_exact(ACT_BLOCK))
        .take(n / 256)
    {
        acc.add_ints(f32_at(ab, 0) * f16_at(wb, 208), &lanes(wb, ab));
    }
    acc.reduce()
}

/// Scalar tiled order (`scalar_k::q6_k_tiled`) on repacked blocks.
fn dot_tiled_scalar(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (wb, ab) in w
        .chunks_exact(BLOCK_BYTES)
        .zip(a.chunks_exact(ACT_BLOCK))
        .take(n / 256)
    {
        let s: i32 = lanes(wb, ab).iter().sum();
        acc += (s as f32 * f16_at(wb, 208)) * f32_at(ab, 0);
    }
    acc
}

/// `vec_dot_order(Q6_K, n, original row, act, order)` from the repacked row and the
/// permuted activation, bitwise. `simd` picks the AVX2 kernel where the CPU runs it. Panics
/// when the slices are not the row and activation of `n` elements.
#[inline]
pub fn dot(n: usize, w_row: &[u8], act: &[u8], order: Order, simd: bool) -> f32 {
    assert!(
        n.is_multiple_of(256)
            && w_row.len() == n / 256 * BLOCK_BYTES
            && act.len() == n / 256 * ACT_BLOCK,
        "Q6_K-R dot: n = {n}, row {} bytes, activation {} bytes",
        w_row.len(),
        act.len()
    );
    if simd && cpu::has_avx2() {
        // SAFETY: the CPU runs AVX2/FMA/F16C (checked) and the slice lengths are asserted.
        unsafe {
            match order {
                Order::Single => simd::dot_single(n, w_row, act),
                Order::Many => simd::dot_tiled(n, w_row, act),
            }
        }
    } else {
        match order {
            Order::Single => dot_single_scalar(n, w_row, act),
            Order::Many => dot_tiled_scalar(n, w_row, act),
        }
    }
}

/// `dot(n, row r, acts[k], Order::Single, simd)` for every row `r` in `rows` of the
/// repacked matrix `w` (rows of `n` elements, back to back) and `N` activations at once:
/// `put(r, y)`, each `y[k]` bitwise its own `dot`. The AVX2 kernel decodes each block once for
/// the N (the head of a batched step). Panics when `w` or an activation is too short.
#[inline]
pub fn rows_single<const N: usize>(
    n: usize,
    w: &[u8],
    rows: std::ops::Range<usize>,
    acts: [&[u8]; N],
    simd: bool,
    mut put: impl FnMut(usize, [f32; N]),
) {
    let rb = n / 256 * BLOCK_BYTES;
    assert!(
        n.is_multiple_of(256)
            && w.len() >= rows.end * rb
            && acts.iter().all(|a| a.len() == n / 256 * ACT_BLOCK),
        "Q6_K-R rows: n = {n}, rows to {} in {} bytes, activations of {:?} bytes",
        rows.end,
        w.len(),
        acts.map(<[u8]>::len)
    );
    if simd && cpu::has_vnni() && super::active_isa() == super::Isa::Avx512 {
        // SAFETY: the CPU runs AVX-512 F/VL/VNNI and AVX2/FMA/F16C (checked); lengths asserted.
        unsafe { simd::rows_single_n_vnni(n, w, rows, acts, put) }
    } else if simd && cpu::has_avx2() {
        // SAFETY: the CPU runs AVX2/FMA/F16C (checked) and the slice lengths are asserted.
        unsafe { simd::rows_single_n(n, w, rows, acts, put) }
    } else {
        for r in rows {
            let row = &w[r * rb..(r + 1) * rb];
            put(r, acts.map(|a| dot_single_scalar(n, row, a)));
        }
    }
}

/// Whether a matrix of type `ty` can be repacked.
pub fn repackable(ty: GgmlType) -> bool {
    ty == GgmlType::Q6K
}

#[cfg(test)]
mod tests {
    use super::super::tests::{random_act, random_row, Rng};
    use super::super::{vec_dot_isa, vec_dot_order, Isa};
    use super::*;

    #[test]
    fn elem_is_a_permutation() {
        let mut seen = [false; 256];
        for &e in PERM.iter() {
            assert!(!seen[e as usize]);
            seen[e as usize] = true;
        }
    }

    /// Extreme blocks too: every quant 63 (or 0) against activations of ±127 / −128, where
    /// the i16 sums S(c, L) are largest.
    fn extreme_block(q: u8, scale: i8) -> Vec<u8> {
        let mut b = vec![0u8; 210];
        let lo = q & 15;
        b[..128].fill(lo | (lo << 4));
        let h = (q >> 4) & 3;
        b[128..192].fill(h | (h << 2) | (h << 4) | (h << 6));
        b[192..208].fill(scale as u8);
        b[208..210].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        b
    }

    fn act_of(vals: &[i8], d: f32) -> Vec<u8> {
        let mut a = vec![0u8; 292];
        a[..4].copy_from_slice(&d.to_le_bytes());
        for (i, &v) in vals.iter().enumerate() {
            a[4 + i] = v as u8;
        }
        for k in 0..16 {
            let s: i32 = vals[16 * k..16 * k + 16].iter().map(|&v| v as i32).sum();
            a[260 + 2 * k..262 + 2 * k].copy_from_slice(&(s as i16).to_le_bytes());
        }
        a
    }

    fn check(n: usize, row: &[u8], act: &[u8], what: &str) {
        let rp = repack(row).unwrap();
        let mut pa = vec![0u8; act.len()];
        permute_act(act, &mut pa).unwrap();
        for order in [Order::Single, Order::Many] {
            let want = vec_dot_order(GgmlType::Q6K, n, row, act, order);
            for simd in [false, true] {
                let got = dot(n, &rp, &pa, order, simd);
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{what} n={n} {order:?} simd={simd}: {got} vs {want}"
                );
            }
        }
        // The scalar Q6_K kernel (the reference of every ISA) agrees too.
        let s = vec_dot_isa(Isa::Scalar, GgmlType::Q6K, n, row, act).unwrap();
        assert_eq!(
            dot(n, &rp, &pa, Order::Single, false).to_bits(),
            s.to_bits()
        );
    }

    /// The repacked dot is bitwise the Q6_K dot (both orders, scalar and AVX2) on random
    /// blocks and activations.
    #[test]
    fn repacked_dot_equals_q6k_dot_bitwise() {
        let mut rng = Rng::new(606);
        for nb in [1usize, 2, 8, 9] {
            let n = 256 * nb;
            for _ in 0..40 {
                let row = random_row(GgmlType::Q6K, n, &mut rng);
                let act = random_act(GgmlType::Q6K, n, &mut rng);
                check(n, &row, &act, "random");
            }
        }
    }

    #[test]
    fn repacked_dot_equals_q6k_dot_at_the_extremes() {
        for q in [0u8, 1, 62, 63] {
            for sc in [-128i8, -1, 1, 127] {
                for a in [127i8, -127, -128] {
                    let row = extreme_block(q, sc);
                    let vals: Vec<i8> = (0..256)
                        .map(|i| if i % 3 == 0 { a } else { a.saturating_neg() })
                        .collect();
                    check(256, &row, &act_of(&vals, 0.75), "extreme");
                    check(256, &row, &act_of(&[a; 256], 0.75), "extreme, uniform");
                }
            }
        }
    }

    #[test]
    fn lanes_equal_q6k_lanes() {
        let mut rng = Rng::new(7);
        for _ in 0..50 {
            let row = random_row(GgmlType::Q6K, 256, &mut rng);
            let act = random_act(GgmlType::Q6K, 256, &mut rng);
            let mut pa = vec![0u8; 292];
            permute_act(&act, &mut pa).unwrap();
            let want = super::super::scalar_k::q6_k_lanes(&row, &act);
            assert_eq!(lanes(&repack(&row).unwrap(), &pa), want);
        }
    }

    /// The AVX-512 VNNI rows kernel (`vpdpwssd`) is bitwise the scalar dot for one and four
    /// activations: random rows of 1 and 8 blocks, and the extremes (every quant 0 or 63,
    /// scales ±128/±1, activations ±127 and −128, where the i16 sums and the bsum term peak).
    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks vnni"]
    fn rows_vnni_equal_scalar_bitwise() {
        assert!(cpu::has_vnni(), "this test needs AVX-512 VNNI");
        let permuted = |a: &[u8]| {
            let mut pa = vec![0u8; a.len()];
            permute_act(a, &mut pa).unwrap();
            pa
        };
        let mut cases: Vec<(usize, Vec<u8>, Vec<Vec<u8>>)> = Vec::new();
        let mut rng = Rng::new(0x6b);
        for nb in [1usize, 8] {
            let n = 256 * nb;
            for _ in 0..10 {
                let rows: Vec<u8> = (0..3)
                    .flat_map(|_| random_row(GgmlType::Q6K, n, &mut rng))
                    .collect();
                let acts = (0..4)
                    .map(|_| random_act(GgmlType::Q6K, n, &mut rng))
                    .collect();
                cases.push((n, rows, acts));
            }
        }
        for q in [0u8, 63] {
            for sc in [-128i8, -1, 1, 127] {
                let acts = [127i8, -127, -128, 1].map(|a| act_of(&[a; 256], 0.75));
                cases.push((256, extreme_block(q, sc), acts.to_vec()));
            }
        }
        for (n, rows, acts) in cases {
            let rp = repack(&rows).unwrap();
            let pa: Vec<Vec<u8>> = acts.iter().map(|a| permuted(a)).collect();
            let nr = rows.len() / (n / 256 * BLOCK_BYTES);
            let rb = n / 256 * BLOCK_BYTES;
            let want = |r: usize, k: usize| dot_single_scalar(n, &rp[r * rb..(r + 1) * rb], &pa[k]);
            let four: [&[u8]; 4] = std::array::from_fn(|k| &pa[k][..]);
            // SAFETY: the CPU runs AVX-512 F/VL/VNNI (asserted, and AVX2/FMA/F16C with it);
            // `rp` holds `nr` rows and each activation n / 256 blocks.
            unsafe {
                simd::rows_single_n_vnni(n, &rp, 0..nr, four, |r, v| {
                    for (k, v) in v.iter().enumerate() {
                        assert_eq!(v.to_bits(), want(r, k).to_bits(), "n={n} row {r} act {k}");
                    }
                });
                simd::rows_single_n_vnni(n, &rp, 0..nr, [four[3]], |r, v| {
                    assert_eq!(
                        v[0].to_bits(),
                        want(r, 3).to_bits(),
                        "n={n} row {r}, one act"
                    );
                });
            }
        }
    }

    /// `rows_single` of one row against four activations.
    fn four(n: usize, row: &[u8], acts: [&[u8]; 4], simd: bool) -> [f32; 4] {
        let mut y = [f32::NAN; 4];
        rows_single(n, row, 0..1, acts, simd, |_, v| y = v);
        y
    }

    /// Four activations through one decode of the row: each result bitwise its own
    /// single-order dot (scalar and AVX2), extremes included.
    #[test]
    fn four_at_once_equal_one_at_a_time() {
        let mut rng = Rng::new(11);
        for n in [256, 2048] {
            for _ in 0..20 {
                let rp = repack(&random_row(GgmlType::Q6K, n, &mut rng)).unwrap();
                let acts: Vec<Vec<u8>> = (0..4)
                    .map(|_| {
                        let a = random_act(GgmlType::Q6K, n, &mut rng);
                        let mut pa = vec![0u8; a.len()];
                        permute_act(&a, &mut pa).unwrap();
                        pa
                    })
                    .collect();
                let refs: [&[u8]; 4] = std::array::from_fn(|t| &acts[t][..]);
                for simd in [false, true] {
                    let got = four(n, &rp, refs, simd);
                    for t in 0..4 {
                        let want = dot(n, &rp, refs[t], Order::Single, simd);
                        assert_eq!(got[t].to_bits(), want.to_bits(), "n={n} t={t} simd={simd}");
                    }
                }
            }
        }
        let row = repack(&extreme_block(63, -128)).unwrap();
        let acts = [127i8, -127, -128, 1].map(|a| {
            let raw = act_of(&[a; 256], 0.75);
            let mut pa = vec![0u8; 292];
            permute_act(&raw, &mut pa).unwrap();
            pa
        });
        let refs: [&[u8]; 4] = std::array::from_fn(|t| &acts[t][..]);
        let got = four(256, &row, refs, true);
        for t in 0..4 {
            assert_eq!(
                got[t].to_bits(),
                dot(256, &row, refs[t], Order::Single, true).to_bits()
            );
        }
    }

    /// The head kernel's prefetch hints change no value: 8 consecutive rows (the hints run
    /// into the next rows and past the matrix) at several distances, bitwise the scalar rows.
    #[test]
    fn head_prefetch_keeps_results_bitwise() {
        let mut rng = Rng::new(13);
        let n = 2048;
        let m: Vec<u8> = (0..8)
            .flat_map(|_| repack(&random_row(GgmlType::Q6K, n, &mut rng)).unwrap())
            .collect();
        let a = random_act(GgmlType::Q6K, n, &mut rng);
        let mut pa = vec![0u8; a.len()];
        permute_act(&a, &mut pa).unwrap();
        let rows = |simd: bool| {
            let mut y = [0f32; 8];
            rows_single(n, &m, 0..8, [&pa[..]], simd, |r, v| y[r] = v[0]);
            y.map(f32::to_bits)
        };
        let want = rows(false);
        let old = crate::quant::dot::set_head_prefetch_distance(0);
        for d in [0, 64, 256, 4096] {
            crate::quant::dot::set_head_prefetch_distance(d);
            assert_eq!(rows(true), want, "prefetch {d}");
        }
        crate::quant::dot::set_head_prefetch_distance(old);
    }

    #[test]
    fn bad_sizes_are_errors() {
        assert!(repack(&[0u8; 211]).is_err());
        let mut out = vec![0u8; 292];
        assert!(permute_act(&[0u8; 291], &mut out[..291]).is_err());
        assert!(permute_act(&[0u8; 292], &mut out[..100]).is_err());
    }
}

/// Speed of the original and the repacked kernels on a head-sized matrix (vocab 151936 ×
/// 2048, 255 MB each), one thread: per chunk of rows, the least thread CPU time of 5
/// interleaved passes (robust to a loaded machine), and the same for 128 rows that stay in L2;
/// the four-activation kernel's time is per activation (what a batched step's head pays):
/// `cargo test --no-default-features --release q6k_head_throughput -- --ignored --nocapture`.
#[cfg(test)]
mod bench {
    use super::super::tests::{random_act, thread_cpu_ns, Rng};
    use super::super::vec_dot;
    use super::*;

    #[test]
    #[ignore]
    fn q6k_head_throughput() {
        let (rows, n, chunk) = (151_936usize, 2048usize, 2048usize);
        let rb = n / 256 * BLOCK_BYTES;
        let mut rng = Rng::new(3);
        let mut w = vec![0u8; rows * rb];
        for (i, b) in w.chunks_exact_mut(BLOCK_BYTES).enumerate() {
            for (j, x) in b.iter_mut().enumerate() {
                *x = (rng.next() >> (j % 7)) as u8;
            }
            b[208..210].copy_from_slice(&half::f16::from_f32(0.01 + i as f32 * 1e-9).to_le_bytes());
        }
        let rp = repack(&w).unwrap();
        let act = random_act(GgmlType::Q6K, n, &mut rng);
        let mut pa = vec![0u8; act.len()];
        permute_act(&act, &mut pa).unwrap();
        type K<'a> = Box<dyn Fn(usize) -> f32 + 'a>;
        let kernels: Vec<(&str, K)> = vec![
            (
                "q6_k",
                Box::new(|r| vec_dot(GgmlType::Q6K, n, &w[r * rb..(r + 1) * rb], &act)),
            ),
            (
                "q6_k-r",
                Box::new(|r| dot(n, &rp[r * rb..(r + 1) * rb], &pa, Order::Single, true)),
            ),
            (
                "q6_k-r, 4 activations per decode (time per activation)",
                Box::new(|r| {
                    let acts = [&pa[..], &pa[..], &pa[..], &pa[..]];
                    let mut x = 0f32;
                    rows_single(n, &rp, r..r + 1, acts, true, |_, v| x = v.iter().sum());
                    x
                }),
            ),
        ];
        let per = [1.0, 1.0, 4.0]; // activations per call
        let chunks = rows.div_ceil(chunk);
        let mut best = vec![vec![u64::MAX; chunks]; kernels.len()];
        let mut hot = vec![u64::MAX; kernels.len()];
        let mut x = 0f32;
        for _ in 0..5 {
            for c in 0..chunks {
                let (r0, r1) = (c * chunk, ((c + 1) * chunk).min(rows));
                for (k, (_, f)) in kernels.iter().enumerate() {
                    let t0 = thread_cpu_ns();
                    for r in r0..r1 {
                        x += f(r);
                    }
                    best[k][c] = best[k][c].min(thread_cpu_ns() - t0);
                }
            }
            // L2-resident: the same 128 rows (215 KB) 20 times.
            for (k, (_, f)) in kernels.iter().enumerate() {
                let t0 = thread_cpu_ns();
                for _ in 0..20 {
                    for r in 0..128 {
                        x += f(r);
                    }
                }
                hot[k] = hot[k].min(thread_cpu_ns() - t0);
            }
        }
        std::hint::black_box(x);
        let (gb, blocks) = ((rows * rb) as f64, (rows * n / 256) as f64);
        for (k, (name, _)) in kernels.iter().enumerate() {
            let t = best[k].iter().sum::<u64>() as f64 / per[k];
            println!(
                "1 thread, head {:.0} MB, {name}: {:.1} ms ({:.2} GB/s, {:.1} ns/block); \
                 L2-resident {:.1} ns/block",
                gb / 1e6,
                t / 1e6,
                gb / t,
                t / blocks,
                hot[k] as f64 / per[k] / (20.0 * 128.0 * (n / 256) as f64)
            );
        }
    }
}
