//! Scalar dequantization, one function per block format.

use super::types::GgmlType;
use crate::error::{Error, Result};
use half::{bf16, f16};

#[inline]
pub fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// `src` holds exactly the blocks for `dst` (checked by the caller).
pub fn dequantize_blocks(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    use GgmlType::*;
    match ty {
        F32 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        F16 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        BF16 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        Q8_0 => {
            for (o, b) in dst.chunks_exact_mut(32).zip(src.chunks_exact(34)) {
                let d = f16_at(b, 0);
                for (j, v) in o.iter_mut().enumerate() {
                    *v = d * (b[2 + j] as i8) as f32;
                }
            }
        }
        other => {
            return Err(Error::Quant(format!(
                "dequantization of {} is not implemented",
                other.name()
            )))
        }
    }
    Ok(())
}
