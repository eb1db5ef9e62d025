//! Float, ternary and FP4 formats: F32, F16, BF16, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0
//! (docs/FORMATS.md §2).

use super::{f16_at, for_blocks, quiet_nan};
use crate::quant::tables::KVALUES_MXFP4;

pub fn f32(src: &[u8], dst: &mut [f32]) {
    for_blocks::<4, 1>(src, dst, |b, y| y[0] = f32::from_le_bytes(*b));
}

pub fn f16(src: &[u8], dst: &mut [f32]) {
    for_blocks::<2, 1>(src, dst, |b, y| y[0] = f16_at(b, 0));
}

/// The top 16 bits of an f32; NaN payloads are kept as they are.
pub fn bf16(src: &[u8], dst: &mut [f32]) {
    for_blocks::<2, 1>(src, dst, |b, y| {
        y[0] = f32::from_bits((u16::from_le_bytes(*b) as u32) << 16)
    });
}

/// Trit n of byte q (0..=2): ((u8)(q·3ⁿ)·3) >> 8.
#[inline]
fn trit(q: u8, pow3: u8) -> i32 {
    ((q.wrapping_mul(pow3) as u16 * 3) >> 8) as i32
}

/// qs[48] | qh[4] | d f16 (last). Elements: for n in 0..5 qs[0..32]; for n in 0..5
/// qs[32..48]; for n in 0..4 qh[0..4]; y = d·(trit − 1).
pub fn tq1_0(src: &[u8], dst: &mut [f32]) {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    for_blocks::<54, 256>(src, dst, |b, y| {
        let d = f16_at(b, 52);
        let mut e = 0;
        for (range, npow) in [(0..32, 5), (32..48, 5), (48..52, 4)] {
            for &p in &POW3[..npow] {
                for m in range.clone() {
                    y[e] = d * (trit(b[m], p) - 1) as f32;
                    e += 1;
                }
            }
        }
    });
}

/// qs[64] | d f16 (last). Element 128i + 32l + m: q = (qs[32i + m] >> 2l) & 3; y = d·(q − 1).
pub fn tq2_0(src: &[u8], dst: &mut [f32]) {
    for_blocks::<66, 256>(src, dst, |b, y| {
        let d = f16_at(b, 64);
        for i in 0..2 {
            for l in 0..4 {
                for m in 0..32 {
                    let q = (b[32 * i + m] >> (2 * l)) & 3;
                    y[128 * i + 32 * l + m] = d * (q as i32 - 1) as f32;
                }
            }
        }
    });
}

/// E8M0 exponent to f32, halved (ggml's `e8m0_to_fp32_half`): 2^(e − 128), denormal for e < 2.
#[inline]
fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits((e as u32 - 1) << 23)
    }
}

/// e u8 | qs[16] → y = e8m0_half(e)·kvalues_mxfp4[nib] (low nibbles first).
pub fn mxfp4(src: &[u8], dst: &mut [f32]) {
    for_blocks::<17, 32>(src, dst, |b, y| {
        let d = e8m0_half(b[0]);
        for j in 0..16 {
            let q = b[1 + j];
            y[j] = d * KVALUES_MXFP4[(q & 15) as usize] as f32;
            y[j + 16] = d * KVALUES_MXFP4[(q >> 4) as usize] as f32;
        }
    });
}

/// Unsigned E4M3 (bias 7) times 0.5; 0x00 and 0x7F decode to 0. Bit 7 is ignored otherwise.
/// Every value is exact in f32, so the order of the products does not matter.
#[inline]
fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7f {
        return 0.0;
    }
    let exp = ((x >> 3) & 15) as i32;
    let man = (x & 7) as f32;
    let raw = if exp == 0 {
        man * f32::from_bits(0x3b00_0000) // 2^-9
    } else {
        (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    };
    raw * 0.5
}

/// d u8[4] (UE4M3) | qs[32]. Sub-block s (16 elements) uses qs[8s..8s+8], low nibbles first;
/// y = ue4m3_half(d[s])·kvalues_mxfp4[nib].
pub fn nvfp4(src: &[u8], dst: &mut [f32]) {
    for_blocks::<36, 64>(src, dst, |b, y| {
        for s in 0..4 {
            let d = ue4m3_half(b[s]);
            for j in 0..8 {
                let q = b[4 + 8 * s + j];
                y[16 * s + j] = d * KVALUES_MXFP4[(q & 15) as usize] as f32;
                y[16 * s + 8 + j] = d * KVALUES_MXFP4[(q >> 4) as usize] as f32;
            }
        }
    });
}

/// d f16 | qs[16] (128 elements). Element i is bit i%8 of qs[i/8]: y = bit ? d : −d.
/// Layout and formula found by probing ggml's `to_float` (gguf-py 0.19 lacks this type).
/// ggml negates (a NaN d flips sign for 0 bits) and quiets signalling NaNs; so do we.
pub fn q1_0(src: &[u8], dst: &mut [f32]) {
    for_blocks::<18, 128>(src, dst, |b, y| {
        let pos = quiet_nan(f16_at(b, 0)); // as ggml's widening does
        let neg = -pos;
        for (i, o) in y.iter_mut().enumerate() {
            *o = if (b[2 + i / 8] >> (i % 8)) & 1 != 0 {
                pos
            } else {
                neg
            };
        }
    });
}

/// d f16 | qs[16] (64 elements). Element i is 2 bits of qs[i/4] at 2(i%4): y = d·(q − 1).
/// Layout and formula found by probing ggml's `to_float` (not in gguf-py 0.19).
pub fn q2_0(src: &[u8], dst: &mut [f32]) {
    for_blocks::<18, 64>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for (i, o) in y.iter_mut().enumerate() {
            let q = (b[2 + i / 4] >> (2 * (i % 4))) & 3;
            *o = d * (q as i32 - 1) as f32;
        }
    });
}
