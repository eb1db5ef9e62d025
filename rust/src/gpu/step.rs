//! The kernel sequence of one step (launches only: no host copies or syncs, so a decode step
//! can be captured as a graph). A step is T rows from S pieces (`Seg`: consecutive rows of
//! one sequence); the dense projections and the routed experts run over all T rows at once,
//! RoPE, the KV writes and attention per piece over its own slot's cache. Per layer
//! (docs/FORMATS.md §4 "Forward pass"):
//!
//!   h = RMSNorm(x)·attn_norm (and h quantized for Q/K/V)   norm::rms_act | norm::rms
//!   q, k, v = h·Wqᵀ, h·Wkᵀ, h·Wvᵀ                          quant_shared::matmul_shared_x
//!   q, k, v += biases; q, k = RoPE(RMSNorm_D(q|k)·q|k_norm); K/V → cache   rope::qkv
//!   att = softmax(q·kᵀ/√D [, sinks])·v (causal [windowed], GQA)   attention::decode | prefill
//!     (decode: att also quantized for Wo by the same kernel, `act::ActOut`)
//!   o = att·Woᵀ [+ bo];  x += o;  h = RMSNorm(x)·ffn_norm   quant_shared, norm::add_rms
//!   ids, w = the routing strategy over h·Wrᵀ [+ br]       quant::matmul, router
//!   (the placement, `placement.rs`, from here: the routing may go to the host first)
//!   x += s·shared(h)  (a shared expert, `ffn.rs`)         quant::moe_gate_up, moe_down
//!   x += Σ_j w_j · down_j(silu(gate_j·h) ⊙ up_j·h)         quant::moe_gate_up, moe_down
//!     (gpt-oss: biased experts and the clamped SwiGLU,    quant_oai, `placement.rs`)
//! The blocks a layer has (biases, q/k norms, NEOX or NORM pairs, sinks, windows, the routing,
//! a shared expert) are the family's graph (`model::arch::Graph`), as on the CPU path.

use super::launch::{Launcher, Seg, DECODE_MAX_TOKENS};
use super::placement::MoePlacement;
use crate::cuda::ops::act::ActOut;
use crate::cuda::ops::quant_kernels::MMVQ_MAX_TOKENS;
use crate::cuda::ops::view::Dv;
use crate::cuda::ops::{attention, deltanet, elementwise, norm, quant, quant_shared, rope, router};
use crate::error::{Error, Result};
use crate::model::arch::{RopeMode, Routing};
use crate::quant::GgmlType;

impl Launcher {
    /// x [T, H] = the residual stream after the stage's layers for the T tokens in `params`
    /// (the pieces `segs`, T = Σ t), the routed experts placed by `moe` (`placement.rs`); the
    /// first stage embeds the tokens, a later one starts from the x its hop brought.
    pub(super) fn layers(&self, segs: &[Seg], moe: &mut dyn MoePlacement) -> Result<()> {
        let t = rows(segs);
        if self.first() {
            self.embed(t, segs.len())?;
        }
        let host = moe.host_out(t);
        for l in self.layers.clone() {
            self.layer_attn(l, segs, host, moe)?;
            self.layer_moe(l, t, moe)?;
        }
        moe.layers_done(self)
    }

    /// Layer `l`'s first part (launches only): its attention block and router, then the
    /// placement's `pre` where the router did not write the host's copies itself (`host`:
    /// `MoePlacement::host_out`).
    pub(super) fn layer_attn(
        &self,
        l: usize,
        segs: &[Seg],
        host: Option<[Dv; 3]>,
        moe: &mut dyn MoePlacement,
    ) -> Result<()> {
        let t = rows(segs);
        let copied = self.attn_router(l, segs, host, moe.handoff_y(self, l, t))?;
        if self.w.layer(l).routed() && !copied {
            moe.pre(self, l, t)?;
        }
        Ok(())
    }

    /// Layer `l`'s routed experts for `t` rows, as the placement runs them (the hybrid tier's
    /// host waits for the routing here and computes the CPU misses).
    pub(super) fn layer_moe(&self, l: usize, t: usize, moe: &mut dyn MoePlacement) -> Result<()> {
        match self.w.layer(l).routed() {
            true => moe.moe(self, l, t, None),
            false => Ok(()),
        }
    }

    /// x [T, H] = the embeddings of the T tokens in `params` (after its `n_seg` pairs).
    pub(super) fn embed(&self, t: usize, n_seg: usize) -> Result<()> {
        let b = &self.b;
        let tok = Dv::of(&b.params).sub(8 * n_seg, 4 * t)?;
        let te = self.w.embd()?;
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

    /// Layer `l`'s attention block and router for the T rows of the pieces `segs`: x +=
    /// attention; h = the normed FFN input [T, H]; ids i32 / wts f32 [T, k] the routing. A
    /// leading dense layer runs its FFN instead of the router (x += FFN(h); nothing is left
    /// for the placement). The shared expert is the placement's to launch, first among the
    /// layer's experts (`shared_expert`): after the routing is on its way to the host, so a
    /// hybrid step's host does not wait for it before its CPU misses can start. `host`: the
    /// placement's buffers for a second copy of ids, wts and h (`MoePlacement::host_out`);
    /// true when the kernels wrote them (the softmax routing; else the placement's `pre`
    /// copies). `y` f32 [T, H]: the previous layer's part the placement left for this layer's
    /// attention norm to add into x first (`MoePlacement::handoff_y`), or None.
    pub(super) fn attn_router(
        &self,
        l: usize,
        segs: &[Seg],
        host: Option<[Dv; 3]>,
        y: Option<Dv>,
    ) -> Result<bool> {
        let t = rows(segs);
        let (g, s, b, hp, w) = (&*self.gpu, &self.stream, &self.b, &self.hp, &self.w);
        let hd = hp.n_embd;
        let (e, k) = (hp.n_expert, hp.n_expert_used);
        let eps = hp.rms_eps;
        let (x, h, o) = (Dv::of(&b.x), Dv::of(&b.h), Dv::of(&b.o));
        let scr = b.scratch.ptr();
        let lw = w.layer(l);
        let host = host
            .filter(|_| lw.dense.is_none() && matches!(hp.graph.routing, Routing::Softmax { .. }));
        {
            // ---- [x += y], attention, or a hybrid's DeltaNet mixer: o [T, H] ----
            let attn_norm = Dv::of(&lw.attn_norm);
            // the norm also quantizes h for Q/K/V where they read one activation type
            let qkv_act = lw.deltanet.is_none().then(|| self.qkv_act(l)).flatten();
            match (qkv_act, y) {
                (Some(a), _) => norm::rms_act(g, s, x, y, attn_norm, h, a, t, hd, eps)?,
                (None, Some(y)) => norm::add_rms(g, s, x, y, attn_norm, h, None, t, hd, eps)?,
                (None, None) => norm::rms(g, s, x, attn_norm, h, t, hd, eps)?,
            }
            match &lw.deltanet {
                Some(dn) => self.gdn_mix(dn, segs)?,
                None => self.attention(l, segs, qkv_act.map(|a| a.act))?,
            }
            // ---- routed experts, or a leading dense layer's FFN ----
            let h_copy = host.map(|c| c[2]);
            norm::add_rms(g, s, x, o, Dv::of(&lw.ffn_norm), h, h_copy, t, hd, eps)?;
            if let Some(ffn) = &lw.dense {
                return self.dense_ffn(ffn, t).map(|()| false); // x += down(silu(gate·h) ⊙ up·h)
            }
            let r = &lw.router;
            let logits = Dv::of(&b.router);
            let copy = host.map(|c| (c[0], c[1]));
            if let Some(norm) = self.fused_router(l, t) {
                // one token's logits and top-k in one kernel, bitwise the pair below
                let (ids, wts) = (Dv::of(&b.ids), Dv::of(&b.wts));
                let done = Dv::of(&b.router_done);
                let w3 = [Dv::of(&r.buf), h, logits];
                router::f32_topk(g, s, w3, ids, wts, copy, done, hd, e, k, norm)?;
                return Ok(host.is_some());
            }
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
            if let Some(br) = &lw.router_bias {
                elementwise::add_rows(g, s, logits, Dv::of(br), t, e)?; // [T, E] += br
            }
            self.route(l, logits, t, e, k, copy)?;
        }
        Ok(host.is_some())
    }

    /// The softmax routing's `norm` when layer `l`'s router runs fused with its logits for
    /// `t` rows (`router::f32_topk`): one token, F32 weights without a bias, the one-token
    /// product summing one row per block (the order the fused kernel keeps).
    fn fused_router(&self, l: usize, t: usize) -> Option<bool> {
        let lw = self.w.layer(l);
        let r = &lw.router;
        let one = t == 1 && r.ty == GgmlType::F32 && lw.router_bias.is_none();
        match self.hp.graph.routing {
            Routing::Softmax { norm }
                if one
                    && r.rows <= router::MAX_EXPERTS
                    && self.q.one_token_row_per_block(r.rows) =>
            {
                Some(norm)
            }
            _ => None,
        }
    }

    /// The activations layer `l`'s attention norm quantizes for its Q, K and V products
    /// (into the scratch they read): where the three are quantized types of one activation
    /// type whose items tile a row.
    fn qkv_act(&self, l: usize) -> Option<ActOut> {
        if !self.fuse {
            return None;
        }
        let lw = self.w.layer(l);
        let a = ActOut::for_weights(lw.wq.ty, Dv::of(&self.b.scratch))?;
        let one = [&lw.wk, &lw.wv]
            .iter()
            .all(|m| m.ty.vec_dot_type() == a.act);
        let hd = self.hp.n_embd;
        (one && a.fits(hd)).then_some(a)
    }

    /// The activations layer `l`'s decode attention quantizes for its output projection (into
    /// the scratch), for the T rows of `segs`: where every piece takes the decode kernel, the
    /// product the one-token kernel, the attention is not gated (its output is multiplied
    /// after the kernel) and each block's G heads are whole activation items.
    fn o_act(&self, l: usize, segs: &[Seg]) -> Option<ActOut> {
        let (hp, wo) = (&self.hp, &self.w.layer(l).wo);
        let decode = segs.iter().all(|sg| sg.t <= DECODE_MAX_TOKENS);
        if !self.fuse || !decode || rows(segs) > MMVQ_MAX_TOKENS || self.rec.is_some() {
            return None;
        }
        let a = ActOut::for_weights(wo.ty, Dv::of(&self.b.scratch))?;
        let g = hp.n_head / hp.n_head_kv.max(1);
        a.fits(g * hp.head_dim).then_some(a)
    }

    /// Layer `l`'s shared expert beside the routed ones, for the T rows of `b.h`: x +=
    /// s·shared(h) (nothing for a layer without one). Launched by the placements before the
    /// routed experts (the order of the adds into x is the CPU path's).
    pub(super) fn shared_expert(&self, l: usize, t: usize) -> Result<()> {
        match &self.w.layer(l).shared {
            Some(sh) => self.dense_ffn(sh, t),
            None => Ok(()),
        }
    }

    /// Layer `l`'s attention over the pieces `segs`: h [T, H] (normed) → o [T, H]. A hybrid
    /// family's attention is gated: its q projection is [T, Nh·2D] (per head [q D, gate D])
    /// and its output is multiplied by σ(gate) before the output projection. `held`: the
    /// activation type the norm already quantized h to in the scratch (`qkv_act`).
    fn attention(&self, l: usize, segs: &[Seg], held: Option<GgmlType>) -> Result<()> {
        let t = rows(segs);
        let (g, s, b, hp, w) = (&*self.gpu, &self.stream, &self.b, &self.hp, &self.w);
        let (hd, qd, kvd) = (hp.n_embd, hp.q_dim(), hp.kv_dim());
        let scale = 1.0 / (hp.head_dim as f32).sqrt();
        let (h, o) = (Dv::of(&b.h), Dv::of(&b.o));
        let (q, kk, v, att) = (Dv::of(&b.q), Dv::of(&b.k), Dv::of(&b.v), Dv::of(&b.att));
        let (kc, vc) = (Dv::of(&b.kc), Dv::of(&b.vc));
        let (cos, sin) = (Dv::of(&b.cos), Dv::of(&b.sin));
        let scr = b.scratch.ptr();
        let lw = w.layer(l);
        // decode: h [T, hd] is quantized once for the three (when they share an activation type)
        if (lw.wq.cols, lw.wk.cols, lw.wv.cols) != (hd, hd, hd) {
            return Err(Error::Model(format!(
                "layer {l}: Q/K/V widths differ from {hd}"
            )));
        }
        let gated = self.rec.as_ref().map(|r| (Dv::of(&r.qg), Dv::of(&r.gate)));
        let q_out = gated.map_or(q, |(qg, _)| qg); // [T, Nh·D] or [T, Nh·2D]
        let qkv = [(&lw.wq, q_out), (&lw.wk, kk), (&lw.wv, v)]
            .map(|(m, y)| (m.ty, m.ptr(), m.rows, y.ptr));
        let br = Some(&self.br);
        quant_shared::matmul_shared_x(&self.q, s, &qkv, hd, h.ptr, t, scr, br, held)?;
        if let Some((qg, gate)) = gated {
            deltanet::split_q(g, s, qg, q, gate, t * qd, hp.head_dim)?;
        }
        // the decode kernel quantizes att [T, Nh·D] for the output projection, where it can
        let o_act = self.o_act(l, segs);
        // per piece over its own slot: q [T_p, Nh·D] rows r0.., k/v [T_p, Nkv·D]
        for (i, sg) in segs.iter().enumerate() {
            let sp = Dv::of(&b.params).sub(8 * i, 8)?; // (pos0, slot)
            let (qs, ats) = (
                q.f32s(sg.r0 * qd, sg.t * qd)?,
                att.f32s(sg.r0 * qd, sg.t * qd)?,
            );
            let (ks, vs) = (
                kk.f32s(sg.r0 * kvd, sg.t * kvd)?,
                v.f32s(sg.r0 * kvd, sg.t * kvd)?,
            );
            // the piece's rows of the quantized att: block_q8a [T_p, Nh·D / 32]
            let act = o_act.map(|a| a.rows(sg.r0, sg.t, qd)).transpose()?;
            let qkva = [qs, ks, vs, ats];
            self.attend(l, sg.t, qkva, sp, [kc, vc], [cos, sin], scale, act)?;
        }
        if let Some((_, gate)) = gated {
            deltanet::sigmoid_mul(g, s, att, gate, t * qd)?;
        }
        let wo = &lw.wo;
        debug_assert_eq!(
            (wo.rows, wo.cols, lw.wq.rows, lw.wk.rows),
            (hd, qd, qd * (1 + gated.is_some() as usize), kvd)
        );
        let wo_mat = [(wo.ty, wo.ptr(), wo.rows, o.ptr)];
        let held = o_act.map(|a| a.act);
        quant_shared::matmul_shared_x(&self.q, s, &wo_mat, qd, att.ptr, t, scr, None, held)?;
        if let Some(bo) = &lw.o_bias {
            elementwise::add_rows(g, s, o, Dv::of(bo), t, hd)?; // o [T, H] += bo
        }
        Ok(())
    }

    /// ids i32 / wts f32 [T, K] from the router logits [T, E] of layer `l`, by the family's
    /// routing strategy (`arch::Routing`); `copy`: the softmax routing's second (ids, wts).
    fn route(
        &self,
        l: usize,
        logits: Dv,
        t: usize,
        e: usize,
        k: usize,
        copy: Option<(Dv, Dv)>,
    ) -> Result<()> {
        let (ids, wts) = (Dv::of(&self.b.ids), Dv::of(&self.b.wts));
        let (g, s) = (&*self.gpu, &self.stream);
        match (self.hp.graph.routing, &self.w.layer(l).sel_bias) {
            (Routing::Softmax { norm }, _) => {
                router::topk(g, s, logits, ids, wts, copy, t, e, k, norm)
            }
            (Routing::SoftmaxWeight, _) => router::topk_softmax(g, s, logits, ids, wts, t, e, k),
            (Routing::SigmoidBias { norm, scale }, Some(bias)) => {
                let b = Dv::of(bias);
                let gate = router::Gate::Sigmoid;
                router::biased_topk(g, s, logits, b, ids, wts, t, e, k, gate, norm, scale)
            }
            (Routing::SoftmaxBias { scale }, Some(bias)) => {
                let b = Dv::of(bias);
                let gate = router::Gate::Softmax;
                router::biased_topk(g, s, logits, b, ids, wts, t, e, k, gate, true, scale)
            }
            (r, _) => Err(Error::Model(format!(
                "layer {l}: routing {r:?} is not on the GPU path"
            ))),
        }
    }

    /// One piece's RoPE, KV writes and attention in layer `l`: `qkva` = [q f32 [T_p, Nh·D]
    /// (rotated in place), k, v f32 [T_p, Nkv·D], att f32 [T_p, Nh·D] (out)]; `sp` its
    /// (pos0, slot) pair; `cache` = [K, V], `tab` = [cos, sin]; `act`: att's rows quantized
    /// by the decode kernel too (`o_act`).
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        l: usize,
        t: usize,
        qkva: [Dv; 4],
        sp: Dv,
        cache: [Dv; 2],
        tab: [Dv; 2],
        scale: f32,
        act: Option<ActOut>,
    ) -> Result<()> {
        let (g, s, b, hp) = (&*self.gpu, &self.stream, &self.b, &self.hp);
        let lw = self.w.layer(l);
        let [q, kk, v, att] = qkva;
        let [kc, vc] = cache;
        let blk = rope::QkvBlock {
            norm: lw.qk_norm.as_ref().map(|n| n.each_ref().map(Dv::of)),
            bias: lw.qkv_bias.as_ref().map(|b| b.each_ref().map(Dv::of)),
            neox: hp.graph.rope == RopeMode::Neox,
        };
        let [cos, sin] = tab;
        let eps = hp.rms_eps;
        // the layer's place among the attention layers (recurrent layers have none), and in
        // this stage's KV cache
        let l = self.kv_of[l];
        let kl = l - self.kv0;
        rope::qkv(
            g, s, &self.lay, kl, q, kk, v, blk, cos, sin, sp, kc, vc, t, hp.n_head, hp.n_rot, eps,
        )?;
        let mods = attention::Mods {
            sinks: lw.sinks.as_ref().map(Dv::of),
            window: hp.graph.window(l).unwrap_or(0),
        };
        if t <= DECODE_MAX_TOKENS {
            let (po, pml) = (Dv::of(&b.part_o), Dv::of(&b.part_ml));
            attention::decode_mods(
                g,
                s,
                &self.lay,
                kl,
                q,
                kc,
                vc,
                sp,
                po,
                pml,
                att,
                t,
                hp.n_head,
                self.n_split,
                scale,
                mods,
                act,
            )
        } else {
            let (lay, nh) = (&self.lay, hp.n_head);
            attention::prefill_mods(g, s, lay, kl, q, kc, vc, sp, att, t, nh, scale, mods)
        }
    }

    /// h[dst .. dst + n] = RMSNorm(x[src .. src + n])·output_norm (dst ≤ src: the logit
    /// rows of the pieces are packed back to back in h).
    pub(super) fn final_norm(&self, src: usize, dst: usize, n: usize) -> Result<()> {
        let hd = self.hp.n_embd;
        let x = Dv::of(&self.b.x).f32s(src * hd, n * hd)?;
        let h = Dv::of(&self.b.h).f32s(dst * hd, n * hd)?;
        let w = Dv::of(self.w.out_norm()?);
        norm::rms(&self.gpu, &self.stream, x, w, h, n, hd, self.hp.rms_eps)
    }

    /// logits[0 .. n] = output · h[first .. first + n] (f32 [n, V]).
    pub(super) fn head(&self, first: usize, n: usize) -> Result<()> {
        let hd = self.hp.n_embd;
        let h = Dv::of(&self.b.h).f32s(first * hd, n * hd)?;
        let out = self.w.head()?;
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

/// Rows of a step of pieces `segs`.
pub(super) fn rows(segs: &[Seg]) -> usize {
    segs.iter().map(|s| s.t).sum()
}
