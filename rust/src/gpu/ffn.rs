//! The dense SwiGLU FFNs of the GPU graph beside the routed experts (the CPU path's
//! `model::blocks`): a shared expert every token takes (qwen2moe: scaled by
//! silu(g)/g of its gate logit g; glm4moe: unscaled) and, for families with them, a leading
//! dense layer's FFN. Each runs through the grouped expert kernels as a stack of one expert
//! (a pointer table of one entry, every row's id 0), so
//!   x [T, H] += s[t] · down(silu(gate·h[t]) ⊙ up·h[t])
//! is two launches (plus the gate logit and its scale where the FFN has a gate).
//! Shapes: H = hidden, F = the FFN's width, T = rows of the step.

use super::launch::Launcher;
use super::weights::GpuMat;
use crate::cuda::ops::view::Dv;
use crate::cuda::ops::{quant, router};
use crate::cuda::{DevBuf, Gpu};
use crate::error::{Error, Result};
use crate::model::weights::SharedExpert;

/// How a dense FFN's output is scaled per row (the `Shared` strategy of the family's graph).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnScale {
    /// Added as is (glm4moe's shared expert, a leading dense layer).
    One,
    /// × silu(g)/g of g = gate_inp·h (qwen2moe's ggml_silu then ggml_div; g = 0 gives 0.5).
    SiluOverX,
    /// × σ(g) (qwen3next, qwen35moe).
    Sigmoid,
}

impl FfnScale {
    /// The scale of a shared expert as its graph loaded it (`arch::Shared`: no gate row is
    /// `Plain`, a sigmoid one `Sigmoid`, else `Gated`).
    pub fn of(sh: &SharedExpert) -> FfnScale {
        match (&sh.gate_inp, sh.sigmoid) {
            (None, _) => FfnScale::One,
            (Some(_), true) => FfnScale::Sigmoid,
            (Some(_), false) => FfnScale::SiluOverX,
        }
    }

    /// The `router::ffn_gate` mode of a gated scale.
    fn mode(self) -> Option<router::GateMode> {
        match self {
            FfnScale::One => None,
            FfnScale::SiluOverX => Some(router::GateMode::SiluOverX),
            FfnScale::Sigmoid => Some(router::GateMode::Sigmoid),
        }
    }
}

/// One dense SwiGLU FFN in VRAM.
pub struct GpuFfn {
    pub gate: GpuMat, // (F, H)
    pub up: GpuMat,   // (F, H)
    pub down: GpuMat, // (H, F)
    /// (1, H): the gate logit's row, where `scale` is gated.
    pub gate_inp: Option<GpuMat>,
    pub scale: FfnScale,
    /// u64 [3]: the addresses of gate, up and down (each a table of one expert).
    pub tab: DevBuf,
}

impl GpuFfn {
    /// The FFN over uploaded matrices; refuses a misaligned matrix as the expert kernels
    /// would skip it.
    pub fn new(
        gpu: &Gpu,
        [gate, up, down]: [GpuMat; 3],
        gate_inp: Option<GpuMat>,
        scale: FfnScale,
    ) -> Result<GpuFfn> {
        for m in [&gate, &up, &down] {
            let align = quant::weight_align(m.ty).unwrap_or(1).max(1);
            if !m.ptr().is_multiple_of(align) {
                return Err(Error::Model(format!(
                    "tensor {}: not {align}-byte aligned in VRAM as the GPU kernels for {} need",
                    m.name,
                    m.ty.name()
                )));
            }
        }
        if scale != FfnScale::One && gate_inp.is_none() {
            return Err(Error::Model(format!(
                "{}: a gated FFN without its gate row",
                gate.name
            )));
        }
        let tab = gpu.upload_pod(&[gate.ptr(), up.ptr(), down.ptr()])?;
        Ok(GpuFfn {
            gate,
            up,
            down,
            gate_inp,
            scale,
            tab,
        })
    }

    /// F: the FFN's width.
    pub fn width(&self) -> usize {
        self.gate.rows
    }

    pub fn mats(&self) -> impl Iterator<Item = &GpuMat> {
        [&self.gate, &self.up, &self.down]
            .into_iter()
            .chain(self.gate_inp.as_ref())
    }
}

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
