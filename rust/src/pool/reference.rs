//! The serial reference: the MoE and dense products computed row by row on one thread, written
//! straight from the definition and sharing no code with the tiled executor (only the quant
//! kernels `quantize_act`/`vec_dot`). The pool must match it bitwise.
//!
//! The arithmetic contract both sides follow (docs/POOL.md):
//! - `x[t]` is quantized to `gate.ty.vec_dot_type()` (and `up.ty.vec_dot_type()`) once;
//! - `h[i] = (g / (1 + exp(-g))) * u` with `g`, `u` the full-row dots of gate/up row `i`;
//! - `h` is quantized to `down.ty.vec_dot_type()`; `d[r]` is the full-row dot of down row `r`;
//! - `y[t][r] = w[t,0]·d_0[r] + w[t,1]·d_1[r] + …` summed left to right in slot order.

use super::{ExpertLayer, MoeInput, QExperts, QMatrix, SKIP};
use crate::error::Result;
use crate::quant::dot::{quantize_act, vec_dot_id, vec_dot_t};

/// ggml's SwiGLU for one element (`vexp::silu_mul`).
use crate::quant::vexp::silu_mul_one as silu_mul;

fn quantized(ty: crate::quant::GgmlType, x: &[f32]) -> Result<Vec<u8>> {
    let act = ty.vec_dot_type();
    let mut out = vec![0u8; act.row_bytes(x.len()).unwrap_or(0)];
    quantize_act(act, x, &mut out)?;
    Ok(out)
}

fn expert_row<'a>(m: &QExperts<'a>, e: usize, r: usize) -> &'a [u8] {
    let rb = m.ty.row_bytes(m.cols).unwrap_or(0);
    let start = r * rb;
    &m.expert_data(e, m.rows * rb)[start..start + rb]
}

/// `y[T,H] = Σ_j w[t,j]·down_e(silu(gate_e·x_t) ⊙ up_e·x_t)`, one token and one slot at a time.
/// Slots whose id is `SKIP` (masked calls) are passed over. The caller validates shapes (`Pool::moe` does; the parity tool calls through it).
pub fn moe_serial(layer: &ExpertLayer<'_>, a: &MoeInput<'_>, y: &mut [f32]) -> Result<()> {
    let MoeInput { x, ids, weights, k } = *a;
    let hidden = layer.gate.cols;
    let inter = layer.gate.rows;
    let tokens = y.len() / hidden.max(1);
    // rows routed to each expert in this call (ggml's order depends on it: `vec_dot_id`)
    let routed = |e: usize| {
        ids[..tokens * k]
            .iter()
            .filter(|&&i| i as usize == e)
            .count()
    };
    for t in 0..tokens {
        let xt = &x[t * hidden..(t + 1) * hidden];
        let xg = quantized(layer.gate.ty, xt)?;
        let xu = quantized(layer.up.ty, xt)?;
        let yt = &mut y[t * hidden..(t + 1) * hidden];
        yt.fill(0.0);
        let mut first = true;
        for j in 0..k {
            if ids[t * k + j] == SKIP {
                continue;
            }
            let e = ids[t * k + j] as usize;
            let w = weights[t * k + j];
            let rows = routed(e);
            let mut h = vec![0f32; inter];
            for (i, hi) in h.iter_mut().enumerate() {
                let g = vec_dot_id(
                    layer.gate.ty,
                    hidden,
                    expert_row(&layer.gate, e, i),
                    &xg,
                    rows,
                );
                let u = vec_dot_id(layer.up.ty, hidden, expert_row(&layer.up, e, i), &xu, rows);
                *hi = silu_mul(g, u);
            }
            let hq = quantized(layer.down.ty, &h)?;
            for (r, yr) in yt.iter_mut().enumerate() {
                let d = vec_dot_id(
                    layer.down.ty,
                    inter,
                    expert_row(&layer.down, e, r),
                    &hq,
                    rows,
                );
                // First slot assigns (so -0.0 survives exactly as in the pool), later slots add.
                *yr = if first { w * d } else { *yr + w * d };
            }
            first = false;
        }
    }
    Ok(())
}

/// `y[T,rows] = x[T,cols]·Wᵀ`, one token and one row at a time.
pub fn matmul_serial(w: &QMatrix<'_>, x: &[f32], t: usize, y: &mut [f32]) -> Result<()> {
    let rb = w.ty.row_bytes(w.cols).unwrap_or(0);
    for tok in 0..t {
        let xq = quantized(w.ty, &x[tok * w.cols..(tok + 1) * w.cols])?;
        for r in 0..w.rows {
            let row = &w.data[r * rb..(r + 1) * rb];
            y[tok * w.rows + r] = vec_dot_t(w.ty, w.cols, row, &xq, t, tok);
        }
    }
    Ok(())
}
