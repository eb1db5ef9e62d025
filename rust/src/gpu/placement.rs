//! Where a layer's routed experts run: the MoE placement interface of the GPU forward pass
//! and its all-in-VRAM implementation (`VramExperts`); the hybrid one (experts in the VRAM
//! tier's slots, the misses on the CPU pool or over PCIe) is `hybrid.rs`.
//!
//! Per layer of a chunk, after the router (`step.rs`) left the normed FFN input in `b.h`
//! f32 [T, H] and the routing in `b.ids` i32 / `b.wts` f32 [T, K], the placement adds
//! Σ_j w_j · down_j(silu(gate_j·h) ⊙ up_j·h) into `b.x` f32 [T, H]:
//!   `pre`       launches after the router (captured with the attention block)
//!   `moe`       the layer's experts: `resident`'s launches (or their captured graph) and,
//!               for a placement that works on the host between layers, that work
//! A placement without host work per layer (`host_per_layer` false) has its whole one-token
//! step captured as one graph; the others get per-layer graphs [attention + `pre`,
//! `resident`] with `moe`'s host work between them.

use super::hybrid_cfg::HybridInfo;
use super::launch::Launcher;
use crate::cuda::ops::quant;
use crate::cuda::ops::quant_oai::{self, OaiGlu};
use crate::cuda::ops::view::Dv;
use crate::cuda::{Graph, Stream};
use crate::error::{Error, Result};
use crate::model::arch::Experts;
use crate::tier::vram::{GapTicket, HybridCounters};
use crate::tier::RoutingCounters;
use std::sync::Arc;

pub(super) trait MoePlacement: Send {
    /// Whether `moe` waits on the host between layers (then the one-token step is captured
    /// per layer, not as one graph).
    fn host_per_layer(&self) -> bool {
        false
    }

    /// Chunks of at least this many tokens are split into chunks of the placement's streamed
    /// length (None: the model's chunking).
    fn stream_min(&self) -> Option<usize> {
        None
    }

    /// Before a chunk's kernels are queued on `s` (its `params` already are); `rows` is the
    /// step's (KV slot, rows) per piece in row order (whose sequence each row's pairs are).
    fn before_step(&mut self, _s: &Stream, _rows: &[(usize, usize)]) -> Result<()> {
        Ok(())
    }

    /// Launches only, right after layer `l`'s router for `t` tokens (when the router did not
    /// write `host_out`'s buffers itself).
    fn pre(&mut self, _cx: &Launcher, _l: usize, _t: usize) -> Result<()> {
        Ok(())
    }

    /// Buffers the layers' FFN norm and router write a second copy of their output into, for
    /// a chunk of `t` tokens: [ids i32 [T, K], wts f32 [T, K], h f32 [T, H]] (the hybrid
    /// placement's mapped host buffers: no copy kernel on the layer's chain), or None.
    fn host_out(&self, _t: usize) -> Option<[Dv; 3]> {
        None
    }

    /// f32 [T, H] that layer `l`'s attention norm adds into `b.x` before it normalizes, for a
    /// chunk of `t` tokens: the previous layer's part the placement left there instead of
    /// launching an add of its own (the hybrid placement's CPU misses; −0.0 where it has
    /// none: x + (−0.0) is x, bitwise), or None. The same for every step of `t` tokens (the
    /// graphs capture it).
    fn handoff_y(&self, _cx: &Launcher, _l: usize, _t: usize) -> Option<Dv> {
        None
    }

    /// Launches only: layer `l`'s shared expert (`Launcher::shared_expert`), then its routed
    /// experts that the GPU holds, for `t` tokens.
    fn resident(&self, cx: &Launcher, l: usize, t: usize) -> Result<()>;

    /// Layer `l`'s routed experts for `t` tokens, added into `b.x`: `resident`'s launches
    /// (or `graph`, their capture) and the placement's own work.
    fn moe(&mut self, cx: &Launcher, l: usize, t: usize, graph: Option<&Graph>) -> Result<()> {
        match graph {
            Some(g) => g.launch(&cx.stream),
            None => self.resident(cx, l, t),
        }
    }

    /// After the stage's last layer of a chunk is queued (before the final norm or the hop
    /// to the next stage): a placement that defers work lands it in `b.x`.
    fn layers_done(&mut self, _cx: &Launcher) -> Result<()> {
        Ok(())
    }

    /// Right after a step's kernels are queued on the stage; `ticket` is the fence of the
    /// step's part there (done at the stage's next gap: `pipeline.rs`).
    fn step_launched(&mut self, _cx: &Launcher, _ticket: &GapTicket) -> Result<()> {
        Ok(())
    }

    /// At a gap of the stage after a step completed there (its stream idle).
    fn after_step(&mut self, _cx: &Launcher) -> Result<()> {
        Ok(())
    }

    /// The hybrid placement's plan and state (None: another placement).
    fn hybrid_info(&self) -> Option<HybridInfo> {
        None
    }

    /// The hybrid placement's counters (None: another placement).
    fn hybrid_counters(&self) -> Option<Arc<HybridCounters>> {
        None
    }

    /// The routing counters, undecayed since load or decayed ("hot"); None: the placement
    /// does not see the routing on the host.
    fn routing(&self, _decayed: bool) -> Option<Arc<RoutingCounters>> {
        None
    }
}

/// Every expert in VRAM: the grouped kernels over the stacked tensors' address tables.
pub(super) struct VramExperts;

impl MoePlacement for VramExperts {
    fn resident(&self, cx: &Launcher, l: usize, t: usize) -> Result<()> {
        cx.shared_expert(l, t)?;
        let lw = cx.w.layer(l);
        let (Some(g), Some(u), Some(d)) = (&lw.gate.stacked, &lw.up.stacked, &lw.down.stacked)
        else {
            return Err(Error::Config(
                "the expert tensors are not in VRAM (hybrid mode without its tier)".into(),
            ));
        };
        experts_through(cx, l, t, [g.ptrs.ptr(), u.ptrs.ptr(), d.ptrs.ptr()])
    }
}

/// The grouped expert kernels of layer `l` over pointer tables `tab` = [gate, up, down]
/// (device addresses of [n_expert] weight pointers; a 0 entry adds nothing): for the T tokens
/// of `b.h` [T, H] routed by `b.ids`/`b.wts` [T, K], `b.x` [T, H] += Σ_k w·down(silu(gate)·up)
/// (gpt-oss: Σ_k w·(down(swiglu_oai(gate + bg, up + bu)) + bd), `quant_oai`).
pub(super) fn experts_through(cx: &Launcher, l: usize, t: usize, tab: [u64; 3]) -> Result<()> {
    let (q, s, b, hp) = (&cx.q, &cx.stream, &cx.b, &cx.hp);
    let lw = cx.w.layer(l);
    let (hd, k, f) = (hp.n_embd, hp.n_expert_used, hp.n_ff_exp);
    let (scr, act) = (b.scratch.ptr(), b.act.ptr());
    let (gate, up, down) = (&lw.gate, &lw.up, &lw.down);
    let ids = b.ids.ptr();
    let h = b.h.ptr();
    let oai = match (hp.graph.experts, &lw.exp_bias) {
        (Experts::OaiBiased { alpha, limit }, Some([bg, bu, bd])) => {
            let glu = OaiGlu {
                gate_bias: bg.ptr(),
                up_bias: bu.ptr(),
                alpha,
                limit,
            };
            let (tys, ptrs) = ((gate.ty, up.ty), (tab[0], tab[1]));
            quant_oai::moe_gate_up_oai(q, s, tys, ptrs, f, hd, ids, k, h, t, act, scr, glu)?;
            Some(bd.ptr())
        }
        (Experts::OaiBiased { .. }, None) => {
            return Err(Error::Model(format!(
                "layer {l}: gpt-oss experts without their biases"
            )))
        }
        _ => {
            quant::moe_gate_up(
                q, s, gate.ty, up.ty, tab[0], tab[1], f, hd, ids, k, h, t, act, scr,
            )?;
            None
        }
    };
    if let Some(bd) = oai {
        let (wts, x) = (b.wts.ptr(), b.x.ptr());
        quant_oai::moe_down_bias(q, s, down.ty, tab[2], ids, wts, bd, k, hd, x, t)?;
    }
    quant::moe_down(
        q,
        s,
        down.ty,
        tab[2],
        hd,
        f,
        ids,
        b.wts.ptr(),
        k,
        act,
        t,
        b.x.ptr(),
        scr,
    )
}
