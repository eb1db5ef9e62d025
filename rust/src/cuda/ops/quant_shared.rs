//! Several matrix products over one activation (a layer's Q, K and V of its normed input):
//! for decode the activation is quantized to q8_1 once for all the quantized matrices, then
//! each product runs as `quant::matmul` would run it. Also the one-token kernel choice.

use super::quant::{
    check_matmul, matmul, moe_gate_up_x, to_u32, type_info, QuantOps, TypeKernels, MMVQ_MAX_TOKENS,
    MMVQ_ROWS, MMVQ_THREADS, MMVQ_TOKENS,
};
use crate::cuda::{Arg, Stream};
use crate::error::Result;
use crate::quant::GgmlType;

/// `matmul` of several matrices (type, w, rows, y) over one x f32 [n_tok, k] (a layer's Q, K
/// and V): for decode, x is quantized to q8_1 once for all the quantized ones, or not at all
/// with `x_q8`, where the scratch already holds it (`norm::rms_to`).
#[allow(clippy::too_many_arguments)]
pub fn matmul_shared_x(
    q: &QuantOps,
    s: &Stream,
    mats: &[(GgmlType, u64, usize, u64)],
    k: usize,
    x: u64,
    n_tok: usize,
    scratch: u64,
    x_q8: bool,
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
    if !x_q8 {
        q.quantize_q8_1(s, x, n_tok, k, scratch)?;
    }
    for &(ty, w, rows, y) in mats {
        let xa = if float(ty) { x } else { scratch };
        q.mmvq(s, q.of(ty)?.0, w, rows, k, xa, y, n_tok)?;
    }
    Ok(())
}

/// Routed experts, gate and up: for each token t and slot j with e = ids[t, j],
/// act[t, j, r] = silu(Wg[e][r]·x[t])·(Wu[e][r]·x[t]) (zeros when gate_ptrs[e] or up_ptrs[e]
/// is 0). gate_ptrs/up_ptrs: device u64 [n_expert] addresses of each expert's [ff, h] matrix;
/// ids: device i32 [n_tok, top_k] (trusted to be < n_expert; negative = absent);
/// x f32 [n_tok, h]; act f32 [n_tok, top_k, ff]. One launch (two when the types differ).
#[allow(clippy::too_many_arguments)]
pub fn moe_gate_up(
    q: &QuantOps,
    s: &Stream,
    ty_gate: GgmlType,
    ty_up: GgmlType,
    gate_ptrs: u64,
    up_ptrs: u64,
    ff: usize,
    h: usize,
    ids: u64,
    top_k: usize,
    x: u64,
    n_tok: usize,
    act: u64,
    scratch: u64,
) -> Result<()> {
    moe_gate_up_x(
        q, s, ty_gate, ty_up, gate_ptrs, up_ptrs, ff, h, ids, top_k, x, n_tok, act, scratch, false,
    )
}

impl QuantOps {
    /// One-token products of fewer rows than `rows` run one row per block (default 2·SMs·4;
    /// 0 never, usize::MAX always): for timing both kernels on a shape.
    pub fn set_row_per_block_below(&mut self, rows: usize) {
        self.r1_below = rows;
    }

    /// y = W·x for n_tok ≤ 8 on x in the kernels' form (f32 for float weights, else q8_1).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mmvq(
        &self,
        s: &Stream,
        kern: &TypeKernels,
        w: u64,
        rows: usize,
        k: usize,
        xa: u64,
        y: u64,
        n_tok: usize,
    ) -> Result<()> {
        let args = [
            Arg::Ptr(w),
            Arg::I32(rows as i32),
            Arg::I32((k / 32) as i32),
            Arg::Ptr(xa),
            Arg::Ptr(y),
            Arg::I32(n_tok as i32),
        ];
        let gx = to_u32(rows.div_ceil(MMVQ_ROWS), "rows")?;
        let block = (MMVQ_THREADS, 1, 1);
        if n_tok == 1 && rows < self.r1_below {
            let g = (to_u32(rows, "rows")?, 1, 1);
            kern.mmvq_r1.launch(s, g, block, 0, &args)
        } else if n_tok == 1 {
            kern.mmvq1.launch(s, (gx, 1, 1), block, 0, &args)
        } else {
            let gz = n_tok.div_ceil(MMVQ_TOKENS) as u32;
            kern.mmvq8.launch(s, (gx, 1, gz), block, 0, &args)
        }
    }
}
