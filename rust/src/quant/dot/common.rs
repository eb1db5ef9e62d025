//! Pieces shared by the scalar and SIMD kernels: field readers, scale unpacking, and the
//! fixed-order float reductions that make SIMD results bitwise equal to scalar ones.
//!
//! The float part of every kernel follows one of two fixed schemes:
//! - 256-element (K, IQ, TQ) blocks: each block's integer sums are exact, then combined with
//!   the block's float scales and added to one f32 accumulator, block by block, in order.
//! - 32-element blocks (Q4_0…Q8_0, IQ4_NL, MXFP4) and float rows: 16 f32 lanes. Lane
//!   `(b % 2) * 8 + k` accumulates, for block `b`, the exact integer sum over elements
//!   `4k..4k+4` times the block scale (a multiply then an add, never fused). The lanes are
//!   reduced by [`reduce16`]. One AVX2 register pair or one AVX-512 register holds the lanes.

use half::{bf16, f16};

/// The `N` bytes of `b` at `i`: one bounds check and one load (byte by byte, each index
/// checked apart, LLVM kept N loads and N checks in the decode kernels' block loops).
#[inline(always)]
pub fn bytes<const N: usize>(b: &[u8], i: usize) -> [u8; N] {
    match b[i..i + N].try_into() {
        Ok(a) => a,
        Err(_) => unreachable!("a range of N bytes"),
    }
}

#[inline(always)]
pub fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes(bytes(b, i))).to_f32()
}

#[inline(always)]
pub fn bf16_at(b: &[u8], i: usize) -> f32 {
    bf16::from_bits(u16::from_le_bytes(bytes(b, i))).to_f32()
}

#[inline(always)]
pub fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes(bytes(b, i))
}

#[inline(always)]
pub fn i16_at(b: &[u8], i: usize) -> i32 {
    i16::from_le_bytes(bytes(b, i)) as i32
}

#[inline(always)]
pub fn u16_at(b: &[u8], i: usize) -> u32 {
    u16::from_le_bytes(bytes(b, i)) as u32
}

#[inline(always)]
pub fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(bytes(b, i))
}

/// Q8_K block (292 bytes): d f32 at 0, qs i8[256] at 4, bsums i16[16] at 260.
pub const Q8K_BYTES: usize = 292;
pub const Q8K_QS: usize = 4;
pub const Q8K_BSUMS: usize = 260;

/// Sum of the Q8_K block's bsums `k0..k1` (each covers 16 activations).
#[inline(always)]
pub fn q8k_bsum(a: &[u8], k0: usize, k1: usize) -> i32 {
    (k0..k1).map(|k| i16_at(a, Q8K_BSUMS + 2 * k)).sum()
}

/// E8M0 exponent byte to the f32 `2^(e-128)` (the half scale ggml uses with doubled FP4
/// values); `e < 2` gives the subnormals 2^-128 and 2^-127.
#[inline(always)]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        ((e as u32) - 1) << 23
    };
    f32::from_bits(bits)
}

/// Q4_K / Q5_K 6-bit (scale, min) of sub-block `j` (0..8) from the 12 packed bytes.
#[inline(always)]
pub fn scale_min_k4(j: usize, s: &[u8]) -> (i32, i32) {
    if j < 4 {
        ((s[j] & 63) as i32, (s[j + 4] & 63) as i32)
    } else {
        (
            ((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4)) as i32,
            ((s[j + 4] >> 4) | ((s[j] >> 6) << 4)) as i32,
        )
    }
}

/// Q4_K/Q5_K block scales and mins (the 12 bytes at `wb[4..16]`, as `scale_min_k4` for
/// j = 0..8), packed one byte each: (scales, mins) with sub-block j in byte j.
#[inline(always)]
pub fn k4_scales_packed(wb: &[u8]) -> (u64, u64) {
    let (w0, w1, w2) = (u32_at(wb, 4), u32_at(wb, 8), u32_at(wb, 12));
    let (m6, m4, m2) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
    let sc_hi = (w2 & m4) | ((w0 >> 6) & m2) << 4;
    let mn_hi = ((w2 >> 4) & m4) | ((w1 >> 6) & m2) << 4;
    let sc = (w0 & m6) as u64 | (sc_hi as u64) << 32;
    let mn = (w1 & m6) as u64 | (mn_hi as u64) << 32;
    (sc, mn)
}

/// `k4_scales_packed` as byte arrays: (scales, mins), sub-block j at index j.
#[inline(always)]
pub fn k4_scales(wb: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (sc, mn) = k4_scales_packed(wb);
    (sc.to_le_bytes(), mn.to_le_bytes())
}

/// Q3_K signed 6-bit scales of the 16 sub-blocks from the 12 packed bytes.
#[inline(always)]
pub fn q3k_scales(s: &[u8]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low4 = if i < 8 { s[i] & 15 } else { s[i - 8] >> 4 };
        let hi2 = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = ((low4 | (hi2 << 4)) as i32) - 32;
    }
    out
}

/// Reduce 8 lanes in the order AVX (128-bit halves, then movehl, then lane 1) does.
#[inline(always)]
pub fn reduce8(r: &[f32; 8]) -> f32 {
    let h = [r[0] + r[4], r[1] + r[5], r[2] + r[6], r[3] + r[7]];
    let q = [h[0] + h[2], h[1] + h[3]];
    q[0] + q[1]
}

/// Reduce 16 lanes: lanes k and k+8 first, then [`reduce8`].
#[inline(always)]
pub fn reduce16(acc: &[f32; 16]) -> f32 {
    let mut r = [0f32; 8];
    for k in 0..8 {
        r[k] = acc[k] + acc[k + 8];
    }
    reduce8(&r)
}

/// The 16-lane accumulator of the 32-element-block scheme.
pub struct Lanes(pub [f32; 16]);

impl Lanes {
    pub fn new() -> Self {
        Lanes([0f32; 16])
    }

    /// Add block `b`'s eight exact partial sums (elements 4k..4k+4) scaled by `d`.
    #[inline(always)]
    pub fn add_block(&mut self, b: usize, p: &[i32; 8], d: f32) {
        let o = (b & 1) * 8;
        for k in 0..8 {
            self.0[o + k] += p[k] as f32 * d;
        }
    }

    pub fn reduce(&self) -> f32 {
        reduce16(&self.0)
    }
}

/// ggml's AVX2 float accumulator for Q8_0, Q6_K and IQ3_S (`ggml_vec_dot_*` on an AVX2+FMA
/// build): eight f32 lanes, each updated per block as `fma(d, lane integer, acc)`, reduced by
/// [`reduce8`] (ggml's `hsum_float_8`).
pub struct Fma8(pub [f32; 8]);

impl Fma8 {
    pub fn new() -> Self {
        Fma8([0f32; 8])
    }

    /// Add one block: `lane k = fma(d, p[k], lane k)` with p the exact lane integers.
    #[inline(always)]
    pub fn add_ints(&mut self, d: f32, p: &[i32; 8]) {
        for k in 0..8 {
            self.0[k] = d.mul_add(p[k] as f32, self.0[k]);
        }
    }

    pub fn reduce(&self) -> f32 {
        reduce8(&self.0)
    }
}

/// ggml's reduction of four 8-lane accumulators (`GGML_F32x8_REDUCE` on AVX: x0+x2 and
/// x1+x3, then their sum, then 128-bit halves, then two horizontal adds).
#[inline(always)]
pub fn reduce_4x8(s: &[[f32; 8]; 4]) -> f32 {
    let mut t = [0f32; 8];
    for k in 0..8 {
        t[k] = (s[0][k] + s[2][k]) + (s[1][k] + s[3][k]);
    }
    let h = [t[0] + t[4], t[1] + t[5], t[2] + t[6], t[3] + t[7]];
    (h[0] + h[1]) + (h[2] + h[3])
}

/// One 256-element block's contribution: `acc + (d_a·d)·sumi`.
#[inline(always)]
pub fn k_add(acc: f32, dd: f32, sumi: i32) -> f32 {
    acc + dd * sumi as f32
}

/// One block with mins: `acc + ((d_a·d)·sumi − (d_a·dmin)·summ)`.
#[inline(always)]
pub fn k_add_min(acc: f32, dd: f32, sumi: i32, dm: f32, summ: i32) -> f32 {
    acc + (dd * sumi as f32 - dm * summ as f32)
}

/// IQ1_S / IQ1_M block: `acc + (d_a·d)·(sumi + 0.125·sumd)`, where sumd is the scaled
/// sum of the ±1 delta signs times the activation sums.
#[inline(always)]
pub fn iq1_add(acc: f32, dd: f32, sumi: i32, sumd: i32) -> f32 {
    acc + dd * (sumi as f32 + 0.125 * sumd as f32)
}
