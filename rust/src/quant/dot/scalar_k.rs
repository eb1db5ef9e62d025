//! Scalar reference kernels for the 256-element K and TQ types against Q8_K activations.
//! Each block's sums are exact integers (`*_ints`, shared with the tests), combined with the
//! float scales by `k_add`/`k_add_min` in block order.

use super::common::i16_at;
use super::common::{
    f16_at, f32_at, k_add, k_add_min, q3k_scales, q8k_bsum, scale_min_k4, Fma8, Q8K_BSUMS, Q8K_QS,
};

#[inline(always)]
fn qa(a: &[u8], e: usize) -> i32 {
    a[Q8K_QS + e] as i8 as i32
}

/// Drive `ints(wb, ab) -> (sumi, summ)` over the blocks; `dd(wb)`/`dm(wb)` give the weight
/// scale and min scale (multiplied by the activation's d here).
#[inline(always)]
fn k_loop(
    n: usize,
    w: &[u8],
    a: &[u8],
    bs: usize,
    d_off: usize,
    dmin_off: Option<usize>,
    ints: impl Fn(&[u8], &[u8]) -> (i32, i32),
) -> f32 {
    let mut acc = 0f32;
    for (wb, ab) in w.chunks_exact(bs).zip(a.chunks_exact(292)).take(n / 256) {
        let da = f32_at(ab, 0);
        let (sumi, summ) = ints(wb, ab);
        acc = match dmin_off {
            Some(mo) => k_add_min(acc, da * f16_at(wb, d_off), sumi, da * f16_at(wb, mo), summ),
            None => k_add(acc, da * f16_at(wb, d_off), sumi),
        };
    }
    acc
}

/// Q2_K (84): scales[16]; qs[64]; d; dmin. sumi = Σ_s (sc_s & 15)·Σ q·a,
/// summ = Σ_s (sc_s >> 4)·bsum_s.
pub fn q2_k_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    let (sc, qs) = (&wb[0..16], &wb[16..80]);
    let (mut sumi, mut summ) = (0i32, 0i32);
    for s in 0..16 {
        let (h, j, l0) = (s / 8, (s % 8) / 2, (s % 2) * 16);
        let mut t = 0i32;
        for l in l0..l0 + 16 {
            let q = ((qs[32 * h + l] >> (2 * j)) & 3) as i32;
            t += q * qa(ab, 128 * h + 32 * j + l);
        }
        sumi += (sc[s] & 15) as i32 * t;
        summ += (sc[s] >> 4) as i32 * i16_at(ab, Q8K_BSUMS + 2 * s);
    }
    (sumi, summ)
}

pub fn q2_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    k_loop(n, w, a, 84, 80, Some(82), q2_k_ints)
}

/// Q3_K (110): hmask[32]; qs[64]; scales[12]; d. q = q2 − 4·(1 − hbit).
pub fn q3_k_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    let (hm, qs) = (&wb[0..32], &wb[32..96]);
    let sc = q3k_scales(&wb[96..108]);
    let mut sumi = 0i32;
    for (s, &scale) in sc.iter().enumerate() {
        let (h, j, l0) = (s / 8, (s % 8) / 2, (s % 2) * 16);
        let mut t = 0i32;
        for l in l0..l0 + 16 {
            let q2 = ((qs[32 * h + l] >> (2 * j)) & 3) as i32;
            let hb = ((hm[l] >> (4 * h + j)) & 1) as i32;
            t += (q2 - 4 * (1 - hb)) * qa(ab, 128 * h + 32 * j + l);
        }
        sumi += scale * t;
    }
    (sumi, 0)
}

pub fn q3_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    k_loop(n, w, a, 110, 108, None, q3_k_ints)
}

/// Q4_K (144) and Q5_K (176): d; dmin; scales[12]; [qh[32];] qs[128].
/// sumi = Σ_k sc_k·Σ q·a over sub-block k (32), summ = Σ_k m_k·(bsum_2k + bsum_2k+1).
#[inline(always)]
fn q45_k_ints(wb: &[u8], ab: &[u8], qh: Option<&[u8]>, qs: &[u8]) -> (i32, i32) {
    let (mut sumi, mut summ) = (0i32, 0i32);
    for k in 0..8 {
        let (sc, m) = scale_min_k4(k, &wb[4..16]);
        let (c, hi) = (k / 2, k % 2);
        let mut t = 0i32;
        for l in 0..32 {
            let mut q = ((qs[32 * c + l] >> (4 * hi)) & 15) as i32;
            if let Some(qh) = qh {
                q |= (((qh[l] >> k) & 1) as i32) << 4;
            }
            t += q * qa(ab, 32 * k + l);
        }
        sumi += sc * t;
        summ += m * q8k_bsum(ab, 2 * k, 2 * k + 2);
    }
    (sumi, summ)
}

pub fn q4_k_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    q45_k_ints(wb, ab, None, &wb[16..144])
}

pub fn q5_k_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    q45_k_ints(wb, ab, Some(&wb[16..48]), &wb[48..176])
}

pub fn q4_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    k_loop(n, w, a, 144, 0, Some(2), q4_k_ints)
}

pub fn q5_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    k_loop(n, w, a, 176, 0, Some(2), q5_k_ints)
}

/// The eight lane integers of ggml's AVX2 Q6_K kernel for one block: lane k sums
/// sc·q·a over elements 32c + 4k..32c + 4k + 4 of every 32-element chunk c, with q the
/// unsigned 6-bit value (0..63), minus 32·(sc[2k]·bsum[2k] + sc[2k+1]·bsum[2k+1]).
pub fn q6_k_lanes(wb: &[u8], ab: &[u8]) -> [i32; 8] {
    let (ql, qh, sc) = (&wb[0..128], &wb[128..192], &wb[192..208]);
    let mut p = [0i32; 8];
    for h in 0..2 {
        let (ql, qh) = (&ql[64 * h..], &qh[32 * h..]);
        for l in 0..32 {
            let q = [
                (ql[l] & 15) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            ];
            for (j, &qv) in q.iter().enumerate() {
                let e = 128 * h + 32 * j + l;
                p[l / 4] += (sc[e / 16] as i8 as i32) * (qv as i32) * qa(ab, e);
            }
        }
    }
    for (k, pk) in p.iter_mut().enumerate() {
        let m = (sc[2 * k] as i8 as i32) * i16_at(ab, Q8K_BSUMS + 4 * k)
            + (sc[2 * k + 1] as i8 as i32) * i16_at(ab, Q8K_BSUMS + 4 * k + 2);
        *pk -= 32 * m;
    }
    p
}

/// ggml's tiled matmul order (taken for K/IQ weights when the activation has ≥ 8 rows):
/// per block `acc + (f32(sumi)·d_w)·d_a`, sumi the block's exact integer dot.
#[inline(always)]
pub fn tiled_dot(
    n: usize,
    w: &[u8],
    a: &[u8],
    bs: usize,
    d_off: usize,
    lanes: impl Fn(&[u8], &[u8]) -> [i32; 8],
) -> f32 {
    let mut acc = 0f32;
    for (wb, ab) in w.chunks_exact(bs).zip(a.chunks_exact(292)).take(n / 256) {
        let s: i32 = lanes(wb, ab).iter().sum();
        acc += (s as f32 * f16_at(wb, d_off)) * f32_at(ab, 0);
    }
    acc
}

/// ggml's repacked Q4_K gemm order (`q4_K_8x8`, used for groups of 4 activation rows of a
/// dense matmul): per block and per pair of sub-blocks p,
/// `acc = fma(f32(Σ_s sc_s·Σ q·a), d·d_a, acc)` and `accm = fma(f32(Σ_s m_s·bsum_s), dmin·d_a,
/// accm)` over the pair's two sub-blocks s; the result is `acc − accm`.
pub fn q4_k_gemm(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    for (wb, ab) in w.chunks_exact(144).zip(a.chunks_exact(292)).take(n / 256) {
        let da = f32_at(ab, 0);
        let (dd, dm) = (f16_at(wb, 0) * da, f16_at(wb, 2) * da);
        let (sc, qs) = (&wb[4..16], &wb[16..144]);
        for p in 0..4 {
            let (mut si, mut sm) = (0i32, 0i32);
            for s in [2 * p, 2 * p + 1] {
                let (scale, min) = scale_min_k4(s, sc);
                let chunk = &qs[32 * (s / 2)..32 * (s / 2) + 32];
                let t: i32 = (0..32)
                    .map(|l| {
                        let q = if s % 2 == 0 {
                            chunk[l] & 15
                        } else {
                            chunk[l] >> 4
                        };
                        q as i32 * qa(ab, 32 * s + l)
                    })
                    .sum();
                si += scale * t;
                sm += min * (i16_at(ab, Q8K_BSUMS + 4 * s) + i16_at(ab, Q8K_BSUMS + 4 * s + 2));
            }
            acc = (si as f32).mul_add(dd, acc);
            accm = (sm as f32).mul_add(dm, accm);
        }
    }
    acc - accm
}

pub fn q6_k_tiled(n: usize, w: &[u8], a: &[u8]) -> f32 {
    tiled_dot(n, w, a, 210, 208, q6_k_lanes)
}

pub fn iq3_s_tiled(n: usize, w: &[u8], a: &[u8]) -> f32 {
    tiled_dot(n, w, a, 110, 0, super::scalar_iq::iq3_s_lanes)
}

/// Q6_K in ggml's AVX2 order: per block `fma(d_a·d, lanes, acc)` (`Fma8`).
pub fn q6_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = Fma8::new();
    for (wb, ab) in w.chunks_exact(210).zip(a.chunks_exact(292)).take(n / 256) {
        acc.add_ints(f32_at(ab, 0) * f16_at(wb, 208), &q6_k_lanes(wb, ab));
    }
    acc.reduce()
}

/// Trit n (0..5) of a TQ1_0 byte: ((u8)(b·3ⁿ)·3) >> 8.
#[inline(always)]
pub fn trit(b: u8, n: usize) -> i32 {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    ((b.wrapping_mul(POW3[n]) as u16 * 3) >> 8) as i32
}

/// TQ1_0 (54): qs[48]; qh[4]; d. y = (t − 1)·d; sumi = Σ t·a − Σ a.
pub fn tq1_0_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    let mut t = 0i32;
    for n in 0..5 {
        for m in 0..32 {
            t += trit(wb[m], n) * qa(ab, 32 * n + m);
        }
        for m in 0..16 {
            t += trit(wb[32 + m], n) * qa(ab, 160 + 16 * n + m);
        }
    }
    for n in 0..4 {
        for m in 0..4 {
            t += trit(wb[48 + m], n) * qa(ab, 240 + 4 * n + m);
        }
    }
    (t - q8k_bsum(ab, 0, 16), 0)
}

pub fn tq1_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    k_loop(n, w, a, 54, 52, None, tq1_0_ints)
}

/// TQ2_0 (66): qs[64]; d. Element 128c + 32l + m is (qs[32c + m] >> 2l) & 3, minus 1.
pub fn tq2_0_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    let mut t = 0i32;
    for c in 0..2 {
        for l in 0..4 {
            for m in 0..32 {
                let q = ((wb[32 * c + m] >> (2 * l)) & 3) as i32;
                t += q * qa(ab, 128 * c + 32 * l + m);
            }
        }
    }
    (t - q8k_bsum(ab, 0, 16), 0)
}

pub fn tq2_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    k_loop(n, w, a, 66, 64, None, tq2_0_ints)
}
