//! Building blocks the families' graphs share beyond norms and RoPE (`ops`): projection
//! biases, the dense SwiGLU FFN and the shared expert. Legend: R' = rows of the step,
//! H = hidden, F = the FFN's width.

use super::compute::Compute;
use super::weights::{SharedExpert, Weights};
use crate::error::Result;
use crate::gguf::TensorInfo;
use crate::quant::vexp::silu_mul_rows;

/// Adds `bias` [N] to every N-wide row of `x` [R', N] (ggml_add after the projection).
pub fn add_bias_rows(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, &b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// Scratch of a dense SwiGLU FFN for R' rows.
pub struct FfnScratch<'a> {
    pub g: &'a mut [f32], // [R', F] gate projection
    pub u: &'a mut [f32], // [R', F] up projection
    pub a: &'a mut [f32], // [R', F] silu(g)·u
    pub o: &'a mut [f32], // [R', H] down projection (the shared expert's output)
    pub w: &'a mut [f32], // [R'] the shared expert's gate logit
}

/// `out = down(silu(gate·h) ⊙ up·h)` for every row of `h` [R', H] (segments `segs` as
/// `Compute::matmul_segs`); `out` is [R', H]. gate/up are (F, H), down (H, F) (a stack of one
/// expert reads as its matrix).
#[allow(clippy::too_many_arguments)]
pub fn swiglu(
    compute: &dyn Compute,
    w: &Weights,
    (gate, up, down): (&TensorInfo, &TensorInfo, &TensorInfo),
    h: &[f32],
    segs: &[usize],
    g: &mut [f32],
    u: &mut [f32],
    a: &mut [f32],
    out: &mut [f32],
) -> Result<()> {
    compute.matmul_segs(&w.mat(gate), h, segs, g)?; // [R', F]
    compute.matmul_segs(&w.mat(up), h, segs, u)?; // [R', F]
    silu_mul_rows(g, u, a);
    compute.matmul_segs(&w.mat(down), a, segs, out) // [R', H]
}

/// `out[r] += s(h[r]) · down(silu(gate·h[r]) ⊙ up·h[r])` for every row of `h` [R', H], added to
/// the routed experts' output `out` [R', H] in llama.cpp's order: s = 1 without a gate
/// (glm4moe.cpp), else `silu(x)/x` of x = gate_inp·h[r] with the gated output rounded first
/// (qwen2moe.cpp), or σ(x) where the graph says (`Shared::Sigmoid`: qwen3next.cpp).
pub fn shared_expert(
    compute: &dyn Compute,
    w: &Weights,
    sh: &SharedExpert,
    h: &[f32],
    segs: &[usize],
    s: FfnScratch<'_>,
    out: &mut [f32],
) -> Result<()> {
    let mats = (&sh.gate, &sh.up, &sh.down);
    swiglu(compute, w, mats, h, segs, s.g, s.u, s.a, s.o)?;
    let Some(gate_inp) = &sh.gate_inp else {
        for (o, &v) in out.iter_mut().zip(s.o.iter()) {
            *o += v;
        }
        return Ok(());
    };
    compute.matmul_segs(&w.mat(gate_inp), h, segs, s.w)?; // [R', 1]
    let hd = out.len() / s.w.len().max(1);
    for (r, &x) in s.w.iter().enumerate() {
        let gate = match x {
            _ if sh.sigmoid => 1.0 / (1.0 + (-x).exp()), // ggml_sigmoid
            // ggml_silu on one element (its scalar tail, libm expf), divided by x.
            0.0 => 0.5,
            _ => (x / (1.0 + (-x).exp())) / x,
        };
        let rows = r * hd..(r + 1) * hd;
        for (o, &v) in out[rows.clone()].iter_mut().zip(&s.o[rows]) {
            *o += v * gate;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::add_bias_rows;

    #[test]
    fn bias_is_added_to_every_row() {
        let mut x = [1.0f32, 2.0, 3.0, 4.0];
        add_bias_rows(&mut x, &[10.0, 20.0]);
        assert_eq!(x, [11.0, 22.0, 13.0, 24.0]);
    }
}
