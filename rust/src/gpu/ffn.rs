//! The dense SwiGLU FFNs of the GPU graph beside the routed experts (the CPU path's
//! `model::blocks`): a shared expert every token takes (qwen2moe: scaled by
//! silu(g)/g of its gate logit g; glm4moe: unscaled) and, for families with them, a leading
//! dense layer's FFN. Each runs through the grouped expert kernels as a stack of one expert
//! (a pointer table of one entry, every row's id 0), so
//!   x [T, H] += s[t] · down(silu(gate·h[t]) ⊙ up·h[t])
//! is two launches (plus the gate logit and its scale where the FFN has a gate).
//! Shapes: H = hidden, F = the FFN's width, T = rows of the step.

//! The FFN's weights and scale (`weights::GpuFfn`, `weights::FfnScale`) load with the other
//! tensors; this module launches it.

use super::launch::Launcher;
use super::weights::GpuFfn;
use crate::cuda::ops::view::Dv;
use crate::cuda::ops::{quant, router};
use crate::error::Result;

impl Launcher {
    /// x [T, H] += s · down(silu(gate·h) ⊙ up·h) for the T rows of `b.h` f32 [T, H].
    pub(super) fn dense_ffn(&self, f: &GpuFfn, t: usize) -> Result<()> {
        let (q, s, b) = (&self.q, &self.stream, &self.b);
        let (hd, fw) = (self.hp.n_embd, f.width());
        let scr = b.scratch.ptr();
        let wts = match (f.scale.mode(), &f.gate_inp) {
            (Some(mode), Some(g)) => {
                let logit = Dv::of(&b.ffn_logit); // f32 [T]
                quant::matmul(q, s, g.ty, g.ptr(), 1, g.cols, b.h.ptr(), logit.ptr, t, scr)?;
                router::ffn_gate(&self.gpu, s, logit, Dv::of(&b.ffn_wts), t, mode)?;
                b.ffn_wts.ptr()
            }
            _ => b.ffn_ones.ptr(),
        };
        let (tab, ids) = (f.tab.ptr(), b.ffn_ids.ptr());
        let act = b.ffn_act.ptr(); // f32 [T, F]
        let (g, u, d) = (&f.gate, &f.up, &f.down);
        quant::moe_gate_up(
            q,
            s,
            g.ty,
            u.ty,
            tab,
            tab + 8,
            fw,
            hd,
            ids,
            1,
            b.h.ptr(),
            t,
            act,
            scr,
        )?;
        quant::moe_down(
            q,
            s,
            d.ty,
            tab + 16,
            hd,
            fw,
            ids,
            wts,
            1,
            act,
            t,
            b.x.ptr(),
            scr,
        )
    }
}
