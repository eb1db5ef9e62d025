//! Block formats (docs/FORMATS.md §2): types, dequantization, activation quantization and dot
//! products. The scalar code is the reference every SIMD path is tested against.

pub mod dequant;
pub mod dot;
pub mod tables;
#[cfg(test)]
mod tables_tests;
pub mod types;
pub mod vexp;

pub use types::{GgmlType, QK_K};

use crate::error::{Error, Result};

/// Dequantize `n = dst.len()` elements of type `ty` from `src` (whole blocks).
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let need = ty.row_bytes(dst.len()).ok_or_else(|| {
        Error::Quant(format!(
            "{} elements is not whole {} blocks",
            dst.len(),
            ty.name()
        ))
    })?;
    if src.len() != need {
        return Err(Error::Quant(format!(
            "{}: {} bytes given for {} elements, expected {need}",
            ty.name(),
            src.len(),
            dst.len()
        )));
    }
    dequant::dequantize_blocks(ty, src, dst)
}
