//! Scalar reference kernels for the IQ types against Q8_K activations. Each block's sums
//! are exact integers (the half-integer IQ2/IQ3 scales are doubled and the power of two put
//! into the float factor), combined with the float scales in block order.

use super::common::{f16_at, f32_at, iq1_add, k_add, q8k_bsum, u16_at, u32_at, Fma8, Q8K_QS};
use crate::quant::tables::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_IQ4NL,
};

#[inline(always)]
fn qa(a: &[u8], e: usize) -> i32 {
    a[Q8K_QS + e] as i8 as i32
}

/// Σ_k grid_k·(±1)·a_k over 8 elements from `e0`: `grid` holds the 8 magnitudes as bytes
/// (byte k is element k), bit k of `signs` negates element k.
#[inline(always)]
fn grid8(grid: u64, signs: u8, ab: &[u8], e0: usize) -> i32 {
    let mut t = 0i32;
    for k in 0..8 {
        let g = ((grid >> (8 * k)) & 0xff) as i32;
        let s = if signs >> k & 1 != 0 { -g } else { g };
        t += s * qa(ab, e0 + k);
    }
    t
}

/// Blocks whose ints are one sum (weights scaled by `unit`·d in float).
#[inline(always)]
fn iq_loop(
    n: usize,
    w: &[u8],
    a: &[u8],
    bs: usize,
    unit: f32,
    ints: impl Fn(&[u8], &[u8]) -> i32,
) -> f32 {
    let mut acc = 0f32;
    for (wb, ab) in w.chunks_exact(bs).zip(a.chunks_exact(292)).take(n / 256) {
        let dd = f32_at(ab, 0) * f16_at(wb, 0) * unit;
        acc = k_add(acc, dd, ints(wb, ab));
    }
    acc
}

/// IQ2_XXS (66): d; qs u16[32]. Group g: words a0, a1; scale (2·(a1 >> 28) + 1)/8.
pub fn iq2_xxs_ints(wb: &[u8], ab: &[u8]) -> i32 {
    let mut sumi = 0i32;
    for g in 0..8 {
        let (a0, a1) = (u32_at(wb, 2 + 8 * g), u32_at(wb, 6 + 8 * g));
        let mut t = 0i32;
        for l in 0..4 {
            let grid = IQ2XXS_GRID[((a0 >> (8 * l)) & 255) as usize];
            let signs = KSIGNS_IQ2XS[((a1 >> (7 * l)) & 127) as usize];
            t += grid8(grid, signs, ab, 32 * g + 8 * l);
        }
        sumi += (2 * (a1 >> 28) as i32 + 1) * t;
    }
    sumi
}

pub fn iq2_xxs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    iq_loop(n, w, a, 66, 0.125, iq2_xxs_ints)
}

/// IQ2_XS (74): d; qs u16[32] (9-bit grid index, 7-bit sign index); scales[8].
pub fn iq2_xs_ints(wb: &[u8], ab: &[u8]) -> i32 {
    let mut sumi = 0i32;
    for g in 0..8 {
        let sc = wb[66 + g];
        for l in 0..4 {
            let v = u16_at(wb, 2 + 2 * (4 * g + l));
            let grid = IQ2XS_GRID[(v & 511) as usize];
            let signs = KSIGNS_IQ2XS[(v >> 9) as usize];
            let ls = 2 * ((sc >> (4 * (l / 2))) & 15) as i32 + 1;
            sumi += ls * grid8(grid, signs, ab, 32 * g + 8 * l);
        }
    }
    sumi
}

pub fn iq2_xs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    iq_loop(n, w, a, 74, 0.125, iq2_xs_ints)
}

/// IQ2_S (82): d; qs[32] grid low bytes; signs[32]; qh[8]; scales[8].
pub fn iq2_s_ints(wb: &[u8], ab: &[u8]) -> i32 {
    let mut sumi = 0i32;
    for g in 0..8 {
        let (qh, sc) = (wb[66 + g], wb[74 + g]);
        for l in 0..4 {
            let idx = wb[2 + 4 * g + l] as usize | (((qh >> (2 * l)) & 3) as usize) << 8;
            let signs = wb[34 + 4 * g + l];
            let ls = 2 * ((sc >> (4 * (l / 2))) & 15) as i32 + 1;
            sumi += ls * grid8(IQ2S_GRID[idx], signs, ab, 32 * g + 8 * l);
        }
    }
    sumi
}

pub fn iq2_s(n: usize, w: &[u8], a: &[u8]) -> f32 {
    iq_loop(n, w, a, 82, 0.125, iq2_s_ints)
}

/// IQ3_XXS (98): d; qs[64] grid indices; 8 u32 words (7-bit sign indices, 4-bit scale).
pub fn iq3_xxs_ints(wb: &[u8], ab: &[u8]) -> i32 {
    let mut sumi = 0i32;
    for g in 0..8 {
        let wd = u32_at(wb, 66 + 4 * g);
        let mut t = 0i32;
        for l in 0..4 {
            let g1 = IQ3XXS_GRID[wb[2 + 8 * g + 2 * l] as usize] as u64;
            let g2 = IQ3XXS_GRID[wb[2 + 8 * g + 2 * l + 1] as usize] as u64;
            let signs = KSIGNS_IQ2XS[((wd >> (7 * l)) & 127) as usize];
            t += grid8(g1 | g2 << 32, signs, ab, 32 * g + 8 * l);
        }
        sumi += (2 * (wd >> 28) as i32 + 1) * t;
    }
    sumi
}

pub fn iq3_xxs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    iq_loop(n, w, a, 98, 0.25, iq3_xxs_ints)
}

/// The eight lane integers of ggml's AVX2 IQ3_S kernel for one block: lane k sums
/// ls·(±grid)·a over elements 32g + 4k..32g + 4k + 4 of every group g.
pub fn iq3_s_lanes(wb: &[u8], ab: &[u8]) -> [i32; 8] {
    let mut p = [0i32; 8];
    for g in 0..8 {
        let qh = wb[66 + g] as usize;
        let ls = 1 + 2 * ((wb[106 + g / 2] >> (4 * (g % 2))) & 15) as i32;
        for m in 0..8 {
            let gi = IQ3S_GRID[wb[2 + 8 * g + m] as usize | ((qh >> m) & 1) << 8];
            let signs = wb[74 + 4 * g + m / 2];
            for k in 0..4 {
                let e = 4 * m + k; // element within the group
                let v = ((gi >> (8 * k)) & 0xff) as i32;
                let v = if signs >> (e % 8) & 1 != 0 { -v } else { v };
                p[m] += ls * v * qa(ab, 32 * g + e);
            }
        }
    }
    p
}

/// IQ3_S in ggml's AVX2 order: per block `fma(d·d_a, lanes, acc)` (`Fma8`).
pub fn iq3_s(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = Fma8::new();
    for (wb, ab) in w.chunks_exact(110).zip(a.chunks_exact(292)).take(n / 256) {
        acc.add_ints(f16_at(wb, 0) * f32_at(ab, 0), &iq3_s_lanes(wb, ab));
    }
    acc.reduce()
}

/// Σ grid·a over 8 elements of an IQ1 grid entry (int8 values −1, 0, 1).
#[inline(always)]
fn grid8_i8(grid: u64, ab: &[u8], e0: usize) -> i32 {
    (0..8)
        .map(|k| ((grid >> (8 * k)) as u8 as i8 as i32) * qa(ab, e0 + k))
        .sum()
}

/// IQ1_S (50): d; qs[32]; qh u16[8]. Returns (Σ ls·Σ grid·a, Σ ls·δ·Σ a), δ = ±1.
pub fn iq1_s_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    let (mut sumi, mut sumd) = (0i32, 0i32);
    for g in 0..8 {
        let qh = u16_at(wb, 34 + 2 * g);
        let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
        let mut t = 0i32;
        for l in 0..4 {
            let idx = wb[2 + 4 * g + l] as usize | (((qh >> (3 * l)) & 7) as usize) << 8;
            t += grid8_i8(IQ1S_GRID[idx], ab, 32 * g + 8 * l);
        }
        let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
        sumi += ls * t;
        sumd += ls * delta * q8k_bsum(ab, 2 * g, 2 * g + 2);
    }
    (sumi, sumd)
}

pub fn iq1_s(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (wb, ab) in w.chunks_exact(50).zip(a.chunks_exact(292)).take(n / 256) {
        let (sumi, sumd) = iq1_s_ints(wb, ab);
        acc = iq1_add(acc, f32_at(ab, 0) * f16_at(wb, 0), sumi, sumd);
    }
    acc
}

/// IQ1_M's d: an f16 assembled from the top nibbles of the four scale words.
pub fn iq1_m_d(wb: &[u8]) -> f32 {
    let sc: [u32; 4] = std::array::from_fn(|i| u16_at(wb, 48 + 2 * i));
    let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0xf0) | ((sc[2] >> 4) & 0xf00) | (sc[3] & 0xf000);
    half::f16::from_bits(bits as u16).to_f32()
}

/// IQ1_M (56): qs[32]; qh[16]; scales u16[4] (3-bit scales, d in the top nibbles).
/// Each 8-group has its own grid index high bits and delta sign (qh bits 3 / 7).
pub fn iq1_m_ints(wb: &[u8], ab: &[u8]) -> (i32, i32) {
    let (mut sumi, mut sumd) = (0i32, 0i32);
    for g in 0..8 {
        let sw = u16_at(wb, 48 + 2 * (g / 2));
        for l in 0..4 {
            let qhb = (wb[32 + 2 * g + l / 2] >> (4 * (l % 2))) as usize;
            let idx = wb[4 * g + l] as usize | (qhb & 7) << 8;
            let shift = 6 * (g % 2) + 3 * (l / 2);
            let ls = 2 * ((sw >> shift) & 7) as i32 + 1;
            let e0 = 32 * g + 8 * l;
            let asum: i32 = (0..8).map(|k| qa(ab, e0 + k)).sum();
            let delta = if qhb & 8 != 0 { -1 } else { 1 };
            sumi += ls * grid8_i8(IQ1S_GRID[idx], ab, e0);
            sumd += ls * delta * asum;
        }
    }
    (sumi, sumd)
}

pub fn iq1_m(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (wb, ab) in w.chunks_exact(56).zip(a.chunks_exact(292)).take(n / 256) {
        let (sumi, sumd) = iq1_m_ints(wb, ab);
        acc = iq1_add(acc, f32_at(ab, 0) * iq1_m_d(wb), sumi, sumd);
    }
    acc
}

/// IQ4_XS (136): d; scales_h u16; scales_l[4]; qs[128]. Group scale ls − 32 (6 bits).
pub fn iq4_xs_ints(wb: &[u8], ab: &[u8]) -> i32 {
    let sh = u16_at(wb, 2);
    let mut sumi = 0i32;
    for g in 0..8 {
        let lo = (wb[4 + g / 2] >> (4 * (g % 2))) & 15;
        let ls = (lo as u32 | ((sh >> (2 * g)) & 3) << 4) as i32 - 32;
        let qs = &wb[8 + 16 * g..24 + 16 * g];
        let mut t = 0i32;
        for (j, &q) in qs.iter().enumerate() {
            t += KVALUES_IQ4NL[(q & 15) as usize] as i32 * qa(ab, 32 * g + j);
            t += KVALUES_IQ4NL[(q >> 4) as usize] as i32 * qa(ab, 32 * g + 16 + j);
        }
        sumi += ls * t;
    }
    sumi
}

pub fn iq4_xs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    iq_loop(n, w, a, 136, 1.0, iq4_xs_ints)
}
