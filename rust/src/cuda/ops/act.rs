//! A matmul's quantized activations written by the kernel that produces them (cuda/actq.cuh):
//! the attention norm for Q/K/V, the decode attention for the output projection. The blocks
//! are the ones `QuantOps::quantize_act` would write for the weight type (its vec_dot type's
//! q8_0 or q8_K), so the product that reads them runs as after the separate kernel, one launch
//! fewer on the decode chain.

use super::quant_kernels::type_info;
use super::view::{bytes, prod, Dv};
use crate::cuda::Arg;
use crate::error::{Error, Result};
use crate::quant::GgmlType;

/// Bytes of one activation block (block_q8a: f32 d, 32 × int8).
const BLOCK_BYTES: usize = 36;

/// Where and how a producer quantizes its output rows f32 [rows, n].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActOut {
    /// block_q8a [rows, n / 32]: the products' activation buffer (the launcher's scratch).
    pub out: Dv,
    /// The activation type written (`GgmlType::vec_dot_type` of the weights that read it).
    pub act: GgmlType,
}

impl ActOut {
    /// The quantized activations of weight type `ty`'s products into `out`; None for a float
    /// type (its products read f32) or a type without a GPU kernel.
    pub fn for_weights(ty: GgmlType, out: Dv) -> Option<ActOut> {
        type_info(ty).filter(|i| !i.float).map(|_| ActOut {
            out,
            act: ty.vec_dot_type(),
        })
    }

    /// The same for rows [r0, r0 + n_rows) of rows of `n` values (a piece of the step).
    pub fn rows(self, r0: usize, n_rows: usize, n: usize) -> Result<ActOut> {
        let row = bytes(n / 32, BLOCK_BYTES)?;
        let out = self.out.sub(bytes(r0, row)?, bytes(n_rows, row)?)?;
        Ok(ActOut { out, ..self })
    }

    /// Values one quantization item covers: a q8_K super-block or a q8_0 block.
    fn item(self) -> usize {
        match self.act {
            GgmlType::Q8K => 256,
            _ => 32,
        }
    }

    /// Whether pieces of `piece` values (a whole row, or the decode attention's heads of one
    /// block) hold whole items.
    pub fn fits(self, piece: usize) -> bool {
        piece.is_multiple_of(self.item())
    }

    /// The kernels' trailing (qout, kind) arguments for rows f32 [rows, n] quantized in
    /// pieces of `piece` values, checked; for None (null, ACT_NONE).
    pub fn args(
        a: Option<ActOut>,
        rows: usize,
        n: usize,
        piece: usize,
        what: &str,
    ) -> Result<[Arg; 2]> {
        let Some(a) = a else {
            return Ok([Arg::Ptr(0), Arg::I32(-1)]);
        };
        if !(a.fits(piece) && n.is_multiple_of(piece)) {
            return Err(Error::Shape(format!(
                "{what}: rows of {n} values in pieces of {piece} are not whole blocks of {}",
                a.item()
            )));
        }
        a.out
            .need(what, bytes(prod(&[rows, n / 32])?, BLOCK_BYTES)?)?;
        let kind = if a.act == GgmlType::Q8K { 1 } else { 0 }; // ACT_Q8_K / ACT_Q8_0
        Ok([a.out.arg(), Arg::I32(kind)])
    }
}
