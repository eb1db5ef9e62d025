//! The CPU batched step (`Model::forward_batch`; `Model::forward` is its one-entry case).
//!
//! A call's entries are cut into pieces of at most `max_chunk` tokens (where `forward` would
//! cut a long call into chunks). Each step runs the next piece of as many entries as fit in
//! the R rows of scratch (R = max_chunk), as one forward: the dense projections over all R'
//! rows of the step at once, attention per piece over its own slot's cache, and per MoE layer
//! the (token, expert) pairs of the whole step grouped by expert, so the pool reads each
//! expert once per step. The matmuls get the pieces as segments (`Compute::matmul_segs`):
//! every row's float order is the one its piece alone would get, so each entry's logits are
//! bitwise those of its calls run alone, whatever shares the step. A window's rows are
//! segments of one row each (and its attention runs in the one-row order), so that each is
//! bitwise the one-token step at its position.
//!
//! Every family runs this one layer loop; the blocks a layer has (biases, q/k norms, sinks
//! and windows, the routing strategy, biased experts, a shared expert) are those its graph
//! names (`arch::Graph`), chosen at load into the layer's weights and `hp.graph`.
//!
//! Legend: R' = rows of the step (Σ piece lengths ≤ R), H = hidden, Nh / Nkv = query / KV
//! heads, D = head dim, E = experts, K = experts used, V = vocab, Fs = shared expert width.

use super::arch::Experts;
use super::attention::AttnShape;
use super::attn_par::attend_chunk_units;
use super::batch::{check_batch, Entry, Plan};
use super::blocks::{add_bias_rows, shared_expert, swiglu, FfnScratch};
use super::compute::{ExpertLayer, MoeInput, QExperts};
use super::deltanet::{apply_gate, split_q_gate};
use super::dense_r16::{DenseR16, Proj};
use super::forward::{tier_tables, Logits, Model};
use super::moe_oai::moe_oai;
use super::ops::rms_norm;
use super::rows_par;
use crate::error::Result;

/// Per-call bookkeeping, sized for `n_slots` entries and R rows at load (a call allocates
/// nothing).
#[derive(Default)]
pub(super) struct StepScratch {
    plan: Plan,            // the call cut into steps (`batch::Plan`)
    segs: Vec<usize>,      // [≤ R] the matmuls' segments: rows per piece, a window's one by one
    head_segs: Vec<usize>, // [≤ R] logit rows per piece of one head call (a window's one by one)
}

impl StepScratch {
    pub(super) fn new(n_slots: usize, rows: usize) -> StepScratch {
        let n = n_slots.max(rows);
        StepScratch {
            plan: Plan::new(n_slots),
            segs: Vec::with_capacity(n),
            head_segs: Vec::with_capacity(n),
        }
    }
}

/// Appends a piece's `rows` rows as matmul segments to `segs`: one segment, or one per row
/// for a window (`Logits::Window`), so that each of its rows takes the one-row float order of
/// every matmul (F32 weights' tinyBLAS order, Q4_K's repacked gemm and the tiled Q6_K / IQ3_S
/// orders differ from `vec_dot`'s) and is bitwise a one-token step's.
fn push_segs(segs: &mut Vec<usize>, want: Logits, rows: usize) {
    match want {
        Logits::Window => segs.extend(std::iter::repeat_n(1, rows)),
        _ => segs.push(rows),
    }
}

impl Model {
    /// Runs a batched step (`batch`): every entry continues its slot; the requested logits
    /// go to `out` back to back in entry order. A refused or failed call changes no slot.
    pub fn forward_batch(&mut self, entries: &[Entry<'_>], out: &mut [f32]) -> Result<()> {
        let (vocab, n_ctx) = (self.hp.n_vocab, self.cfg.n_ctx);
        check_batch(entries, |s| self.kv.len(s), out.len(), vocab, n_ctx)?;
        let mut ss = std::mem::take(&mut self.steps);
        let res = self.run_batch(entries, out, &mut ss);
        if res.is_err() {
            // A failed call leaves every slot as it was; a slot with a recurrent state (a
            // hybrid family) starts over instead, as its state may have advanced.
            for (e, &start) in entries.iter().zip(&ss.plan.starts) {
                match &mut self.rec {
                    Some(rec) => {
                        rec.reset(e.slot);
                        self.kv.set_len(e.slot, 0);
                    }
                    None => self.kv.set_len(e.slot, start),
                }
                if let Some(m) = &mut self.mtp {
                    let len = self.kv.len(e.slot).unwrap_or(0);
                    m.truncate(e.slot, len, self.hp.n_embd);
                }
            }
        }
        self.steps = ss;
        if entries.iter().any(|e| !e.tokens.is_empty()) {
            self.routing.end_step();
            self.routing_hot.end_step();
        }
        res
    }

    fn run_batch(
        &mut self,
        entries: &[Entry<'_>],
        out: &mut [f32],
        ss: &mut StepScratch,
    ) -> Result<()> {
        let vocab = self.hp.n_vocab;
        let cap = self.scratch.x.len() / self.hp.n_embd; // R
        ss.plan.begin(entries, |slot| self.kv.len(slot), vocab)?;
        while ss.plan.next_step(entries, cap, vocab) {
            let res = self.step(entries, ss, out);
            if let Some(ra) = &self.readahead {
                // Whatever is still queued was for this step's layers.
                ra.end_step();
            }
            res?;
            // the MTP layer, while it drafts, on the step's final hidden states
            self.mtp_catch_up(entries, &ss.plan.pieces)?;
            for p in &ss.plan.pieces {
                ss.plan.done[p.entry] += p.t;
                self.kv.set_len(p.slot, p.p0 + p.t);
            }
        }
        Ok(())
    }

    /// One step over `ss.plan.pieces` (R' rows); each piece's logit rows go to its `dst` in `out`.
    fn step(&mut self, entries: &[Entry<'_>], ss: &mut StepScratch, out: &mut [f32]) -> Result<()> {
        let Model {
            hp,
            weights: w,
            kv,
            rope,
            scratch: s,
            compute,
            routing,
            routing_hot,
            tier,
            readahead,
            head,
            dense_r16,
            rec,
            ..
        } = self;
        let tier = tier.as_deref();
        // [3][E] per-expert slabs (gate, up, down) when a tier is attached.
        let mut tables: [Vec<&[u8]>; 3] = Default::default();
        let (hd, d, qd, kvd) = (hp.n_embd, hp.head_dim, hp.q_dim(), hp.kv_dim());
        let (e, k) = (hp.n_expert, hp.n_expert_used);
        let half = hp.n_rot / 2;
        let (eps, strategy, fs) = (hp.rms_eps, hp.graph.routing, hp.n_ff_shexp);
        ss.segs.clear();
        for p in &ss.plan.pieces {
            push_segs(&mut ss.segs, entries[p.entry].want, p.t);
        }
        let segs = &ss.segs[..];
        let t: usize = segs.iter().sum(); // R'
                                          // x = token_embd[ids]  [R', H]; cos/sin of each row's position  [R', n_rot/2]
        for p in &ss.plan.pieces {
            let toks = &entries[p.entry].tokens[p.tok0..p.tok0 + p.t];
            let (x, c) = (
                p.r0 * hd..(p.r0 + p.t) * hd,
                p.r0 * half..(p.r0 + p.t) * half,
            );
            let cs = (&mut s.cos[c.clone()], &mut s.sin[c]);
            rows_par::embed_rows(&**compute, (w, rope), toks, p.p0, &mut s.x[x], cs)?;
        }
        if let Some(rec) = rec.as_mut() {
            // A window checkpoints its slot's state after each of its tokens.
            rec.windows.clear();
            for p in &ss.plan.pieces {
                let window = entries[p.entry].want == Logits::Window;
                rec.windows.push(window);
                if window {
                    rec.ck.begin(p.slot, p.p0, p.t);
                }
            }
        }
        let mut kv_l = 0; // the attention layer's place in the KV cache
        for (l, lw) in w.layers.iter().enumerate() {
            // ---- attention, or a hybrid's DeltaNet mixer ----
            rows_par::norm_rows(
                &**compute,
                &s.x[..t * hd],
                &lw.attn_norm,
                eps,
                &mut s.h[..t * hd],
            )?;
            let h = &s.h[..t * hd];
            if let (Some(dw), Some(rec)) = (&lw.deltanet, rec.as_mut()) {
                let (pieces, o) = (&ss.plan.pieces[..], &mut s.o[..t * hd]);
                rec.mix(&**compute, w, dw, eps, h, segs, pieces, o)?; // [R', H]
            } else {
                // the layer's sinks and window, where the graph has them
                let shape = AttnShape::of(kv, hp.n_head, hp.n_head_kv, d)
                    .with(lw.sinks.as_deref(), hp.graph.window(l));
                // layer l's projection `m` (its repacked copy where one serves the call)
                let mut proj = |p: Proj, m, x: &[f32], y: &mut [f32]| {
                    let (r16, c) = (dense_r16.as_mut(), &**compute);
                    DenseR16::matmul_segs(r16, c, l, p, &w.mat(m), x, segs, y)
                };
                if let Some(rec) = rec.as_mut() {
                    // gated attention: [R', Nh·2D] → q [R', Nh·D] and the output gate
                    proj(Proj::Q, &lw.wq, h, &mut rec.qg[..t * 2 * qd])?;
                    split_q_gate(
                        &rec.qg[..t * 2 * qd],
                        d,
                        &mut s.q[..t * qd],
                        &mut rec.gate[..t * qd],
                    );
                } else {
                    proj(Proj::Q, &lw.wq, h, &mut s.q[..t * qd])?; // [R', Nh·D]
                }
                proj(Proj::K, &lw.wk, h, &mut s.k[..t * kvd])?; // [R', Nkv·D]
                proj(Proj::V, &lw.wv, h, &mut s.v[..t * kvd])?; // [R', Nkv·D]
                if let Some([bq, bk, bv]) = &lw.qkv_bias {
                    add_bias_rows(&mut s.q[..t * qd], bq);
                    add_bias_rows(&mut s.k[..t * kvd], bk);
                    add_bias_rows(&mut s.v[..t * kvd], bv);
                }
                // per row: q/k norms (per head [D]) where the graph has them, then RoPE
                let qk_norm = match (&lw.q_norm, &lw.k_norm) {
                    (Some(qn), Some(kn)) => Some((&qn[..], &kn[..])),
                    _ => None,
                };
                let qk = (&mut s.q[..t * qd], &mut s.k[..t * kvd]);
                let cs = (&s.cos[..t * half], &s.sin[..t * half]);
                rows_par::qk_norm_rope(&**compute, rope, qk, d, qk_norm, eps, cs, t)?;
                for p in &ss.plan.pieces {
                    let (ty, kc, vc) = kv.rows_mut(p.slot, kv_l, p.p0, p.t)?;
                    let kr = p.r0 * kvd..(p.r0 + p.t) * kvd;
                    let rows = (&s.k[kr.clone()], &s.v[kr]);
                    rows_par::store_kv_rows(&**compute, ty, rows, (kvd, d), (kc, vc))?;
                }
                // per piece over its own slot: [T_p, Nh·D] on the compute's threads
                // (a window's rows in the one-row order: each bitwise a one-token step's)
                for p in &ss.plan.pieces {
                    let (kc, vc) = kv.layer(p.slot, kv_l, p.p0 + p.t);
                    let rq = p.r0 * qd..(p.r0 + p.t) * qd;
                    let one_row = entries[p.entry].want == Logits::Window;
                    attend_chunk_units(
                        &shape,
                        kc,
                        vc,
                        p.p0,
                        p.t,
                        &s.q[rq.clone()],
                        &mut s.att[rq],
                        &s.attn,
                        compute.as_ref(),
                        !one_row,
                        if one_row { 1 } else { p.t },
                    )?;
                }
                if let Some(rec) = rec.as_ref() {
                    apply_gate(&mut s.att[..t * qd], &rec.gate[..t * qd]);
                }
                let (att, o) = (&s.att[..t * qd], &mut s.o[..t * hd]); // [R', H]
                proj(Proj::O, &lw.wo, att, o)?;
                if let Some(bo) = &lw.o_bias {
                    add_bias_rows(&mut s.o[..t * hd], bo);
                }
                kv_l += 1;
            }
            rows_par::add_rows(&**compute, &mut s.x[..t * hd], &s.o[..t * hd], hd)?;
            // ---- FFN: routed experts (+ shared expert), or a leading dense layer ----
            rows_par::norm_rows(
                &**compute,
                &s.x[..t * hd],
                &lw.ffn_norm,
                eps,
                &mut s.h[..t * hd],
            )?;
            let h = &s.h[..t * hd];
            if lw.dense_ffn {
                let fd = hp.n_ff_dense;
                let (g, u, a) = (
                    &mut s.sh_g[..t * fd],
                    &mut s.sh_u[..t * fd],
                    &mut s.sh_a[..t * fd],
                );
                let mats = (&lw.gate, &lw.up, &lw.down);
                swiglu(&**compute, w, mats, h, segs, g, u, a, &mut s.o[..t * hd])?;
            // [R', H]
            } else {
                compute.matmul_segs(&w.mat(&lw.router), h, segs, &mut s.router[..t * e])?; // [R', E]
                if let Some(br) = &lw.router_bias {
                    add_bias_rows(&mut s.router[..t * e], br);
                }
                let picks = (&mut s.ids[..t * k], &mut s.wts[..t * k]);
                let bias = lw.exp_probs_b.as_deref();
                rows_par::route_rows(&**compute, strategy, bias, &mut s.router[..t * e], picks, e)?;
                routing.observe(l, &s.ids[..t * k]);
                routing_hot.observe(l, &s.ids[..t * k]);
                let base = w.expert_layer(l);
                let slabbed;
                let slabs = match tier {
                    Some(res) => {
                        let ra = readahead.as_ref();
                        tier_tables(res, ra, l, &s.ids[..t * k], &base, &mut tables, &mut s.seen)?
                    }
                    None => false,
                };
                // While this layer's experts run, the prefetch threads read the next layer's
                // likely ones (guessed from x before this layer's experts).
                if let Some(ra) = readahead.as_mut() {
                    ra.guess(&**compute, w, l + 1, &s.x[..t * hd], t, k, eps)?;
                }
                let layer = if slabs {
                    let [g, u, dn] = &tables;
                    slabbed = ExpertLayer {
                        gate: QExperts {
                            slabs: Some(g),
                            ..base.gate
                        },
                        up: QExperts {
                            slabs: Some(u),
                            ..base.up
                        },
                        down: QExperts {
                            slabs: Some(dn),
                            ..base.down
                        },
                    };
                    &slabbed
                } else {
                    &base
                };
                // [R', H]: every pair of the step grouped by expert
                let pairs = MoeInput::new(h, &s.ids[..t * k], &s.wts[..t * k], k);
                match (hp.graph.experts, &lw.exp_bias) {
                    (Experts::OaiBiased { alpha, limit }, Some(b)) => {
                        let o = &mut s.o[..t * hd];
                        moe_oai(
                            &**compute,
                            layer,
                            b,
                            (alpha, limit),
                            &pairs,
                            segs,
                            &mut s.oai,
                            o,
                        )?
                    }
                    _ => compute.moe_segs(layer, &pairs, segs, &mut s.o[..t * hd])?,
                }
                if let Some(sh) = &lw.shared {
                    let sc = FfnScratch {
                        g: &mut s.sh_g[..t * fs],
                        u: &mut s.sh_u[..t * fs],
                        a: &mut s.sh_a[..t * fs],
                        o: &mut s.sh_o[..t * hd],
                        w: &mut s.sh_w[..t],
                    };
                    shared_expert(&**compute, w, sh, h, segs, sc, &mut s.o[..t * hd])?;
                }
            }
            rows_par::add_rows(&**compute, &mut s.x[..t * hd], &s.o[..t * hd], hd)?;
        }
        // ---- head: each piece's logit rows, normed into h back to back [Σ logit rows, H];
        // one head call per run of pieces whose logits are contiguous in `out` ----
        let mut hr = 0; // rows of h filled
        let mut run = (0usize, 0usize); // the run's first h row and first float in `out`
        ss.head_segs.clear();
        let vocab = hp.n_vocab;
        for (j, p) in ss.plan.pieces.iter().enumerate() {
            if p.logit_rows == 0 {
                continue;
            }
            if ss.head_segs.is_empty() {
                run = (hr, p.dst);
            }
            for i in p.t - p.logit_rows..p.t {
                let (r, o) = ((p.r0 + i) * hd, hr * hd);
                rms_norm(&s.x[r..r + hd], &w.output_norm, eps, &mut s.h[o..o + hd]);
                hr += 1;
            }
            push_segs(&mut ss.head_segs, entries[p.entry].want, p.logit_rows);
            let end = p.dst + p.logit_rows * vocab;
            let next = ss.plan.pieces[j + 1..].iter().find(|q| q.logit_rows > 0);
            if !matches!(next, Some(q) if q.dst == end) {
                let x = &s.h[run.0 * hd..hr * hd];
                head_call(head, w, &**compute, x, &ss.head_segs, &mut out[run.1..end])?;
                ss.head_segs.clear();
            }
        }
        Ok(())
    }
}

/// The output head over rows `x` [Σ segs, H] → `dst` [Σ segs, V], per-segment orders.
fn head_call(
    head: &mut Option<super::head::RepackedHead>,
    w: &super::weights::Weights,
    compute: &dyn super::compute::Compute,
    x: &[f32],
    segs: &[usize],
    dst: &mut [f32],
) -> Result<()> {
    match head {
        Some(rh) => rh.matmul_segs(compute, x, segs, dst),
        None => compute.matmul_segs(&w.mat(&w.output), x, segs, dst),
    }
}
