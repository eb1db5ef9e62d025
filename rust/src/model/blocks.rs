//! Building blocks the families' graphs share beyond norms and RoPE (`ops`): projection
//! biases and the shared expert. Legend: R' = rows of the step, H = hidden, Fs = shared
//! expert FFN width.

use super::compute::Compute;
use super::weights::{SharedExpert, Weights};
use crate::error::Result;
use crate::quant::vexp::silu_mul_rows;

/// Adds `bias` [N] to every N-wide row of `x` [R', N] (ggml_add after the projection).
pub fn add_bias_rows(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, &b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// Scratch of the shared expert for R' rows.
pub struct SharedScratch<'a> {
    pub g: &'a mut [f32], // [R', Fs] gate projection
    pub u: &'a mut [f32], // [R', Fs] up projection
    pub a: &'a mut [f32], // [R', Fs] silu(g)·u
    pub o: &'a mut [f32], // [R', H] down projection
    pub w: &'a mut [f32], // [R'] gate logit
}

/// `out[r] += sigmoid(gate_inp·h[r]) · down(silu(gate·h[r]) ⊙ up·h[r])` for every row of
/// `h` [R', H] (segments `segs` as `Compute::matmul_segs`), in llama.cpp's order
/// (qwen2moe.cpp): the gate is `silu(x)/x`, the gated output is rounded, then added to the
/// routed experts' output `out` [R', H].
pub fn shared_expert(
    compute: &dyn Compute,
    w: &Weights,
    sh: &SharedExpert,
    h: &[f32],
    segs: &[usize],
    s: SharedScratch<'_>,
    out: &mut [f32],
) -> Result<()> {
    compute.matmul_segs(&w.mat(&sh.gate), h, segs, s.g)?; // [R', Fs]
    compute.matmul_segs(&w.mat(&sh.up), h, segs, s.u)?; // [R', Fs]
    silu_mul_rows(s.g, s.u, s.a);
    compute.matmul_segs(&w.mat(&sh.down), s.a, segs, s.o)?; // [R', H]
    compute.matmul_segs(&w.mat(&sh.gate_inp), h, segs, s.w)?; // [R', 1]
    let hd = out.len() / s.w.len().max(1);
    for (r, &x) in s.w.iter().enumerate() {
        // ggml_silu on one element (its scalar tail, libm expf), divided by x.
        let gate = match x {
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
