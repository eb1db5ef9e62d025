//! Several matrix products over one activation (a layer's Q, K and V of its normed input):
//! when the quantized matrices share one activation type (ggml vec_dot type), the activation
//! is quantized once for all of them (decode and prefill alike), then each product runs as
//! `quant::matmul` would run it. Also the one-token kernel choice.

use super::quant::{check_matmul, matmul};
use super::quant_kernels::{
    to_u32, type_info, QuantOps, TypeKernels, MMVQ_MAX_TOKENS, MMVQ_ROWS, MMVQ_THREADS, MMVQ_TOKENS,
};
use crate::cuda::{Arg, Event, Gpu, Stream};
use crate::error::Result;
use crate::quant::GgmlType;

/// Side streams a launcher keeps for `Branches`: a layer's K and V (two) or a DeltaNet layer's
/// three projections beside its first.
pub const SIDE_STREAMS: usize = 3;

/// Side streams on which the one-token products after the first of a `matmul_shared_x` run
/// beside it: forked from the compute stream after x is quantized and joined back before
/// the call returns, so a graph captured over them holds parallel branches (a layer's K and
/// V projections run while its Q one does, not after it: each is a few µs of launch latency
/// on a mostly idle GPU). Eager launches order the same way through the events.
pub struct Branches {
    side: Vec<Stream>,
    fork: Event,
    join: Vec<Event>,
}

impl Branches {
    /// `n` side streams (products beyond n + 1 run on the compute stream after the first).
    pub fn new(gpu: &Gpu, n: usize) -> Result<Branches> {
        Ok(Branches {
            side: (0..n).map(|_| gpu.stream()).collect::<Result<_>>()?,
            fork: gpu.event_no_timing()?,
            join: (0..n)
                .map(|_| gpu.event_no_timing())
                .collect::<Result<_>>()?,
        })
    }

    /// Side streams 0 .. n wait for the work queued so far on `s`.
    fn fork(&self, s: &Stream, n: usize) -> Result<()> {
        self.fork.record(s)?;
        self.side[..n].iter().try_for_each(|b| b.wait(&self.fork))
    }

    /// `s` waits for the work queued on side streams 0 .. n.
    fn join(&self, s: &Stream, n: usize) -> Result<()> {
        for (b, ev) in self.side[..n].iter().zip(&self.join) {
            ev.record(b)?;
            s.wait(ev)?;
        }
        Ok(())
    }
}

/// `matmul` of several matrices (type, w, rows, y) over one x f32 [n_tok, k] (a layer's Q, K
/// and V): x is quantized once for each run of quantized matrices that share an activation
/// type (`GgmlType::vec_dot_type`; once in all for real models), into `scratch`; float
/// matrices run first, on their own (prefill writes their row scales into `scratch`). With
/// `br`, one-token products that share one quantization of x run as parallel branches
/// (`Branches`); the results are the same (each product is its own kernel either way).
/// `held`: the activation type x is already quantized to in `scratch` (by the kernel that
/// produced x: `act::ActOut`), which the products of that type read without quantizing.
#[allow(clippy::too_many_arguments)]
pub fn matmul_shared_x(
    q: &QuantOps,
    s: &Stream,
    mats: &[(GgmlType, u64, usize, u64)],
    k: usize,
    x: u64,
    n_tok: usize,
    scratch: u64,
    br: Option<&Branches>,
    held: Option<GgmlType>,
) -> Result<()> {
    for &(ty, w, rows, y) in mats {
        check_matmul(ty, w, rows, k, x, y, n_tok, scratch)?;
    }
    let order = launch_order(mats.iter().map(|m| m.0), held);
    // branches only where x is quantized at most once, first, for every product (real models)
    let one_x =
        order.iter().all(|o| o.1.is_some()) && order.iter().skip(1).all(|o| o.1 == Some(false));
    if let Some(br) = br.filter(|_| one_x && n_tok <= MMVQ_MAX_TOKENS && mats.len() > 1) {
        let (i0, quantize) = order[0];
        if quantize == Some(true) {
            q.quantize_act(s, mats[i0].0, x, n_tok, k, scratch)?;
        }
        let n = (order.len() - 1).min(br.side.len());
        br.fork(s, n)?;
        for (j, &(i, _)) in order.iter().enumerate() {
            let (ty, w, rows, y) = mats[i];
            let on = if (1..=n).contains(&j) {
                &br.side[j - 1]
            } else {
                s
            };
            q.mmvq(on, q.of(ty)?.0, w, rows, k, scratch, y, n_tok)?;
        }
        return br.join(s, n);
    }
    for (i, quantize) in order {
        let (ty, w, rows, y) = mats[i];
        let Some(quantize) = quantize else {
            matmul(q, s, ty, w, rows, k, x, y, n_tok, scratch)?;
            continue;
        };
        if quantize {
            q.quantize_act(s, ty, x, n_tok, k, scratch)?;
        }
        let kern = q.of(ty)?.0;
        if n_tok <= MMVQ_MAX_TOKENS {
            q.mmvq(s, kern, w, rows, k, scratch, y, n_tok)?;
        } else {
            q.mmq(s, kern, w, rows, k, scratch, scratch, y, n_tok)?;
        }
    }
    Ok(())
}

/// The order in which `matmul_shared_x` runs products of these types: (index, None) for a
/// float type (first, each on its own), then (index, Some(quantize x first)) for the quantized
/// ones in their order, quantizing when the activation type differs from the one x was last
/// quantized to (`held` at first).
fn launch_order(
    types: impl IntoIterator<Item = GgmlType>,
    held: Option<GgmlType>,
) -> Vec<(usize, Option<bool>)> {
    let float = |ty: GgmlType| type_info(ty).is_some_and(|i| i.float);
    let types: Vec<GgmlType> = types.into_iter().collect();
    let mut out: Vec<(usize, Option<bool>)> = (0..types.len())
        .filter(|&i| float(types[i]))
        .map(|i| (i, None))
        .collect();
    let mut held = held;
    for (i, &ty) in types.iter().enumerate().filter(|(_, &t)| !float(t)) {
        let act = ty.vec_dot_type();
        out.push((i, Some(held != Some(act))));
        held = Some(act);
    }
    out
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
    use super::launch_order;
    use crate::quant::GgmlType::*;

    #[test]
    fn one_quantization_per_activation_type() {
        // Q4_K and Q6_K both dot with q8_K activations: quantized once
        assert_eq!(
            launch_order([Q4K, Q4K, Q6K], None),
            [(0, Some(true)), (1, Some(false)), (2, Some(false))]
        );
        // a float V takes f32 x and runs first (prefill puts its row scales in the scratch)
        assert_eq!(
            launch_order([F32, Q6K, F16], None),
            [(0, None), (2, None), (1, Some(true))]
        );
        assert_eq!(
            launch_order([Q8_0, Q4_0, IQ4NL], None),
            [(0, Some(true)), (1, Some(false)), (2, Some(false))]
        );
        // q8_K for Q4_K, q8_0 for Q8_0: x quantized again when the type changes
        assert_eq!(
            launch_order([Q4K, Q4K, Q8_0], None),
            [(0, Some(true)), (1, Some(false)), (2, Some(true))]
        );
        assert_eq!(
            launch_order([Q8_0, Q4K, Q8_0], None),
            [(0, Some(true)), (1, Some(true)), (2, Some(true))]
        );
        assert_eq!(
            launch_order([F32, F32, BF16], None),
            [(0, None), (1, None), (2, None)]
        );
        // x already quantized by its producer: not again for that type, again for another
        assert_eq!(
            launch_order([Q4K, Q4K, Q6K], Some(Q8K)),
            [(0, Some(false)), (1, Some(false)), (2, Some(false))]
        );
        assert_eq!(
            launch_order([Q8_0, Q4K], Some(Q8K)),
            [(0, Some(true)), (1, Some(true))]
        );
    }
}
