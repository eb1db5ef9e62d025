//! The kernel sequence of one chunk (launches only: no host copies or syncs, so the
//! one-token step can be captured as a graph). Per layer (docs/FORMATS.md §4 "Forward pass"):
//!
//!   h = RMSNorm(x)·attn_norm                              norm::rms
//!   q, k, v = h·Wqᵀ, h·Wkᵀ, h·Wvᵀ                          quant_shared::matmul_shared_x
//!   q, k = RoPE(RMSNorm_D(q|k)·q|k_norm); K/V → cache       rope::qkv
//!   att = softmax(q·kᵀ/√D)·v (causal, GQA)                attention::decode | prefill
//!   o = att·Woᵀ;  x += o;  h = RMSNorm(x)·ffn_norm          quant::matmul, norm::add_rms
//!   ids, w = top-k(softmax(h·Wrᵀ)), renormalized          quant::matmul, router::topk
//!   x += Σ_j w_j · down_j(silu(gate_j·h) ⊙ up_j·h)         quant::moe_gate_up, moe_down

use super::launch::{Launcher, DECODE_MAX_TOKENS};
use super::placement::MoePlacement;
use crate::cuda::ops::view::Dv;
use crate::cuda::ops::{attention, norm, quant, quant_shared, rope, router};
use crate::error::{Error, Result};

impl Launcher {
    /// x [T, H] = the residual stream after every layer for the T tokens in `params`, the
    /// routed experts placed by `moe` (`placement.rs`).
    pub(super) fn layers(&self, t: usize, moe: &mut dyn MoePlacement) -> Result<()> {
        self.embed(t)?;
        for l in 0..self.w.layers.len() {
            self.attn_router(l, t)?;
            moe.pre(self, l, t)?;
            moe.moe(self, l, t, None)?;
        }
        Ok(())
    }

    /// x [T, H] = the embeddings of the T tokens in `params`.
    pub(super) fn embed(&self, t: usize) -> Result<()> {
        let b = &self.b;
        let tok = Dv::of(&b.params).sub(8, 4 * t)?;
        let te = &self.w.token_embd;
        quant::get_rows(
            &self.q,
            &self.stream,
            te.ty,
            te.ptr(),
            te.rows,
            te.cols,
            tok.ptr,
            t,
            Dv::of(&b.x).ptr,
        )
    }

    /// Layer `l`'s attention block and router for T tokens: x += attention; h = the normed
    /// FFN input [T, H]; ids i32 / wts f32 [T, k] the routing.
    pub(super) fn attn_router(&self, l: usize, t: usize) -> Result<()> {
        let (g, s, b, hp, w) = (&*self.gpu, &self.stream, &self.b, &self.hp, &self.w);
        let (hd, qd, kvd) = (hp.n_embd, hp.q_dim(), hp.kv_dim());
        let (e, k) = (hp.n_expert, hp.n_expert_used);
        let eps = hp.rms_eps;
        let scale = 1.0 / (hp.head_dim as f32).sqrt();
        let sp = Dv::of(&b.params).sub(0, 8)?;
        let (x, h, o) = (Dv::of(&b.x), Dv::of(&b.h), Dv::of(&b.o));
        let (q, kk, v, att) = (Dv::of(&b.q), Dv::of(&b.k), Dv::of(&b.v), Dv::of(&b.att));
        let (kc, vc) = (Dv::of(&b.kc), Dv::of(&b.vc));
        let (cos, sin) = (Dv::of(&b.cos), Dv::of(&b.sin));
        let scr = b.scratch.ptr();
        let lw = &w.layers[l];
        {
            // ---- attention ----
            norm::rms(g, s, x, Dv::of(&lw.attn_norm), h, t, hd, eps)?;
            // decode: h [T, hd] is quantized once for the three (when they share an activation type)
            if (lw.wq.cols, lw.wk.cols, lw.wv.cols) != (hd, hd, hd) {
                return Err(Error::Model(format!(
                    "layer {l}: Q/K/V widths differ from {hd}"
                )));
            }
            let qkv = [(&lw.wq, q), (&lw.wk, kk), (&lw.wv, v)]
                .map(|(m, y)| (m.ty, m.ptr(), m.rows, y.ptr));
            quant_shared::matmul_shared_x(&self.q, s, &qkv, hd, h.ptr, t, scr)?;
            rope::qkv(
                g,
                s,
                &self.lay,
                l,
                q,
                kk,
                v,
                Dv::of(&lw.q_norm),
                Dv::of(&lw.k_norm),
                cos,
                sin,
                sp,
                kc,
                vc,
                t,
                hp.n_head,
                hp.n_rot,
                eps,
            )?;
            if t <= DECODE_MAX_TOKENS {
                attention::decode(
                    g,
                    s,
                    &self.lay,
                    l,
                    q,
                    kc,
                    vc,
                    sp,
                    Dv::of(&b.part_o),
                    Dv::of(&b.part_ml),
                    att,
                    t,
                    hp.n_head,
                    self.n_split,
                    scale,
                )?;
            } else {
                attention::prefill(g, s, &self.lay, l, q, kc, vc, sp, att, t, hp.n_head, scale)?;
            }
            let wo = &lw.wo;
            quant::matmul(
                &self.q,
                s,
                wo.ty,
                wo.ptr(),
                wo.rows,
                wo.cols,
                att.ptr,
                o.ptr,
                t,
                scr,
            )?;
            debug_assert_eq!(
                (wo.rows, wo.cols, lw.wq.rows, lw.wk.rows),
                (hd, qd, qd, kvd)
            );
            // ---- routed experts ----
            norm::add_rms(g, s, x, o, Dv::of(&lw.ffn_norm), h, t, hd, eps)?;
            let r = &lw.router;
            let logits = Dv::of(&b.router);
            quant::matmul(
                &self.q,
                s,
                r.ty,
                r.ptr(),
                r.rows,
                r.cols,
                h.ptr,
                logits.ptr,
                t,
                scr,
            )?;
            let (ids, wts) = (Dv::of(&b.ids), Dv::of(&b.wts));
            router::topk(g, s, logits, ids, wts, t, e, k, true)?;
        }
        Ok(())
    }

    /// h[first .. first + rows] = RMSNorm(x[..])·output_norm.
    pub(super) fn final_norm(&self, first: usize, rows: usize) -> Result<()> {
        let hd = self.hp.n_embd;
        let x = Dv::of(&self.b.x).f32s(first * hd, rows * hd)?;
        let h = Dv::of(&self.b.h).f32s(first * hd, rows * hd)?;
        let w = Dv::of(&self.w.output_norm);
        norm::rms(&self.gpu, &self.stream, x, w, h, rows, hd, self.hp.rms_eps)
    }

    /// logits[0 .. n] = output · h[first .. first + n] (f32 [n, V]).
    pub(super) fn head(&self, first: usize, n: usize) -> Result<()> {
        let hd = self.hp.n_embd;
        let h = Dv::of(&self.b.h).f32s(first * hd, n * hd)?;
        let out = &self.w.output;
        let logits = Dv::of(&self.b.logits).f32s(0, n * out.rows)?;
        quant::matmul(
            &self.q,
            &self.stream,
            out.ty,
            out.ptr(),
            out.rows,
            out.cols,
            h.ptr,
            logits.ptr,
            n,
            self.b.scratch.ptr(),
        )
    }
}
