//! Several matrix products over one activation (a layer's Q, K and V of its normed input):
//! for decode, when the quantized matrices share one activation type (ggml vec_dot type), the
//! activation is quantized once for all of them, then each product runs as `quant::matmul`
//! would run it. Also the one-token kernel choice.

use super::quant::{
    check_matmul, matmul, to_u32, type_info, QuantOps, TypeKernels, MMVQ_MAX_TOKENS, MMVQ_ROWS,
    MMVQ_THREADS, MMVQ_TOKENS,
};
use crate::cuda::{Arg, Stream};
use crate::error::Result;
use crate::quant::GgmlType;

/// `matmul` of several matrices (type, w, rows, y) over one x f32 [n_tok, k] (a layer's Q, K
/// and V): for decode, x is quantized once for all the quantized ones when they share one
/// activation type (`GgmlType::vec_dot_type`); otherwise each product quantizes x itself.
#[allow(clippy::too_many_arguments)]
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
    let Some(ty_act) =
        shared_act_type(mats.iter().map(|m| m.0)).filter(|_| n_tok <= MMVQ_MAX_TOKENS)
    else {
        // prefill, all float, or activation types that differ: each product on its own
        return mats
            .iter()
            .try_for_each(|&(ty, w, rows, y)| matmul(q, s, ty, w, rows, k, x, y, n_tok, scratch));
    };
    q.quantize_act(s, ty_act, x, n_tok, k, scratch)?;
    for &(ty, w, rows, y) in mats {
        let xa = if float(ty) { x } else { scratch };
        q.mmvq(s, q.of(ty)?.0, w, rows, k, xa, y, n_tok)?;
    }
    Ok(())
}

/// The type whose activations serve every quantized type of `types` (the first quantized one),
/// when they all have one activation type (`GgmlType::vec_dot_type`); None when there is no
/// quantized type or their activation types differ. Float types take f32 x and do not count.
fn shared_act_type(types: impl IntoIterator<Item = GgmlType>) -> Option<GgmlType> {
    let mut quantized = types
        .into_iter()
        .filter(|&ty| !type_info(ty).is_some_and(|i| i.float));
    let first = quantized.next()?;
    quantized
        .all(|ty| ty.vec_dot_type() == first.vec_dot_type())
        .then_some(first)
}

impl QuantOps {
    /// One-token products of fewer rows than `rows` run one row per block (default 4·SMs·4;
    /// 0 never, usize::MAX always): for timing both kernels on a shape.
    pub fn set_row_per_block_below(&mut self, rows: usize) {
        self.r1_below = rows;
    }

    /// One-token products of at least `rows` rows stage x in shared memory (`_st`; default
    /// 16·SMs·4, the output head; 0 always, usize::MAX never): for timing both kernels.
    pub fn set_stage_from(&mut self, rows: usize) {
        self.st_from = rows;
    }

    /// y = W·x for n_tok ≤ 8 on x in the kernels' form (f32 for float weights, else int8 blocks from
    /// `quantize_act`).
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
        } else if n_tok == 1 && rows >= self.st_from {
            kern.mmvq_st.launch(s, (gx, 1, 1), block, 0, &args)
        } else if n_tok == 1 {
            kern.mmvq1.launch(s, (gx, 1, 1), block, 0, &args)
        } else {
            let gz = n_tok.div_ceil(MMVQ_TOKENS) as u32;
            kern.mmvq8.launch(s, (gx, 1, gz), block, 0, &args)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::shared_act_type;
    use crate::quant::GgmlType::*;

    #[test]
    fn one_quantization_only_for_one_activation_type() {
        // Q4_K and Q6_K both dot with q8_K activations; a float V takes f32 x
        assert_eq!(shared_act_type([Q4K, Q4K, Q6K]), Some(Q4K));
        assert_eq!(shared_act_type([F32, Q6K, F16]), Some(Q6K));
        assert_eq!(shared_act_type([Q8_0, Q4_0, IQ4NL]), Some(Q8_0));
        // q8_K for Q4_K, q8_0 for Q8_0: each product quantizes x itself
        assert_eq!(shared_act_type([Q4K, Q4K, Q8_0]), None);
        assert_eq!(shared_act_type([F32, F32, BF16]), None);
    }
}
