//! Several matrix products over one activation (a layer's Q, K and V of its normed input):
//! for decode the activation is quantized to q8_1 once for all the quantized matrices, then
//! each product runs as `quant::matmul` would run it.

use super::quant::{check_matmul, matmul, type_info, QuantOps, MMVQ_MAX_TOKENS};
use crate::cuda::Stream;
use crate::error::Result;
use crate::quant::GgmlType;

/// `matmul` of several matrices (type, w, rows, y) over one x f32 [n_tok, k] (a layer's Q, K
/// and V): for decode, x is quantized to q8_1 once for all the quantized ones.
pub fn matmul_shared_x(
    q: &QuantOps,
    s: &Stream,
    mats: &[(GgmlType, u64, usize, u64)],
    k: usize,
    x: u64,
    n_tok: usize,
    scratch: u64,
) -> Result<()> {
    for &(ty, w, rows, y) in mats {
        check_matmul(ty, w, rows, k, x, y, n_tok, scratch)?;
    }
    let float = |ty| type_info(ty).is_some_and(|i| i.float);
    if n_tok > MMVQ_MAX_TOKENS || mats.iter().all(|m| float(m.0)) {
        return mats
            .iter()
            .try_for_each(|&(ty, w, rows, y)| matmul(q, s, ty, w, rows, k, x, y, n_tok, scratch));
    }
    q.quantize_q8_1(s, x, n_tok, k, scratch)?;
    for &(ty, w, rows, y) in mats {
        let xa = if float(ty) { x } else { scratch };
        q.mmvq(s, q.of(ty)?.0, w, rows, k, xa, y, n_tok)?;
    }
    Ok(())
}
