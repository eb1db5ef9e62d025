//! Scalar dequantization, one function per block format (docs/FORMATS.md §2).
//!
//! This is the reference every SIMD path is tested against. It matches gguf-py 0.19
//! (`gguf/quants.py`) bit for bit, including non-finite scales: every product and sum is
//! evaluated in the order gguf-py evaluates it (e.g. `(d * sc) * q - (dmin * m)`), f16 is widened
//! without touching NaN payloads, and the few spots where Rust's operator semantics differ
//! from an x86 multiply on NaN (negation, two-NaN sums) are handled explicitly.

mod iquants;
mod kquants;
mod legacy;
mod misc;
#[cfg(test)]
mod tests;

use super::types::GgmlType;
use crate::error::{Error, Result};

/// IEEE binary16 bits widened to f32, exactly as numpy's `astype(np.float32)` does it:
/// subnormals are normalised, and NaNs keep their sign and payload (a signalling NaN stays
/// signalling; it is quieted by the first arithmetic operation, as in numpy).
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = (h >> 10) & 0x1f;
    let man = (h & 0x3ff) as u32;
    match exp {
        0x1f => f32::from_bits(sign | 0x7f80_0000 | (man << 13)),
        // Subnormal (or zero): man · 2^-24 is exact in f32.
        0 => f32::from_bits(sign | (man as f32 * f32::from_bits(0x3380_0000)).to_bits()),
        _ => f32::from_bits(sign | ((exp as u32 + 112) << 23) | (man << 13)),
    }
}

/// The little-endian f16 at byte `i`, widened.
#[inline]
pub fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16_at(b, i))
}

#[inline]
pub(crate) fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

#[inline]
pub(crate) fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// `x` with a signalling NaN quieted (what any x86 arithmetic on it returns).
#[inline]
pub(crate) fn quiet_nan(x: f32) -> f32 {
    if x.is_nan() {
        f32::from_bits(x.to_bits() | 0x0040_0000)
    } else {
        x
    }
}

/// `a + b` where, when both are NaN, `a`'s NaN wins, as in numpy/x86 (`addss a, b`).
/// LLVM treats `fadd` as commutative, so the operand order of `a + b` alone is not kept.
#[inline]
pub(crate) fn add_nan_first(a: f32, b: f32) -> f32 {
    if a.is_nan() {
        a
    } else {
        a + b
    }
}

/// `a - b` where, when both are NaN, `a`'s NaN wins (`subss a, b`).
#[inline]
pub(crate) fn sub_nan_first(a: f32, b: f32) -> f32 {
    if a.is_nan() {
        a
    } else {
        a - b
    }
}

/// Apply `f` to each (block of `BS` bytes, `EL` outputs) pair. Lengths are checked by
/// `dequantize_blocks`; fixed-size arrays let the compiler drop bounds checks.
#[inline]
pub(crate) fn for_blocks<const BS: usize, const EL: usize>(
    src: &[u8],
    dst: &mut [f32],
    f: impl Fn(&[u8; BS], &mut [f32; EL]),
) {
    let (blocks, _) = src.as_chunks::<BS>();
    let (outs, _) = dst.as_chunks_mut::<EL>();
    for (b, y) in blocks.iter().zip(outs.iter_mut()) {
        f(b, y);
    }
}

/// Dequantize whole blocks: `src` must hold exactly the blocks of `dst.len()` elements.
pub fn dequantize_blocks(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    use GgmlType::*;
    let (bs, ts) = ty.block();
    if !dst.len().is_multiple_of(bs) || Some(src.len()) != (dst.len() / bs).checked_mul(ts) {
        return Err(Error::Quant(format!(
            "{}: {} bytes do not hold exactly {} elements",
            ty.name(),
            src.len(),
            dst.len()
        )));
    }
    match ty {
        F32 => misc::f32(src, dst),
        F16 => misc::f16(src, dst),
        BF16 => misc::bf16(src, dst),
        Q4_0 => legacy::q4_0(src, dst),
        Q4_1 => legacy::q4_1(src, dst),
        Q5_0 => legacy::q5_0(src, dst),
        Q5_1 => legacy::q5_1(src, dst),
        Q8_0 => legacy::q8_0(src, dst),
        IQ4NL => legacy::iq4_nl(src, dst),
        Q2K => kquants::q2_k(src, dst),
        Q3K => kquants::q3_k(src, dst),
        Q4K => kquants::q4_k(src, dst),
        Q5K => kquants::q5_k(src, dst),
        Q6K => kquants::q6_k(src, dst),
        IQ2XXS => iquants::iq2_xxs(src, dst),
        IQ2XS => iquants::iq2_xs(src, dst),
        IQ2S => iquants::iq2_s(src, dst),
        IQ3XXS => iquants::iq3_xxs(src, dst),
        IQ3S => iquants::iq3_s(src, dst),
        IQ1S => iquants::iq1_s(src, dst),
        IQ1M => iquants::iq1_m(src, dst),
        IQ4XS => iquants::iq4_xs(src, dst),
        TQ1_0 => misc::tq1_0(src, dst),
        TQ2_0 => misc::tq2_0(src, dst),
        MXFP4 => misc::mxfp4(src, dst),
        NVFP4 => misc::nvfp4(src, dst),
        Q1_0 => misc::q1_0(src, dst),
        Q2_0 => misc::q2_0(src, dst),
        Q8_1 | Q8K => {
            return Err(Error::Quant(format!(
                "{} is an activation-only intermediate type; it is never dequantized as a weight",
                ty.name()
            )))
        }
        I8 | I16 | I32 | I64 | F64 => {
            return Err(Error::Quant(format!(
                "{} is a plain integer/f64 tensor type, not a float weight format",
                ty.name()
            )))
        }
    }
    Ok(())
}
