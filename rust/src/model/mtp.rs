//! The NextN / MTP draft layer: the block a qwen35moe, qwen3next or glm4moe file stores after
//! its trunk (`blk.{n_layer}.*`, `nextn_predict_layers` = 1), run on the CPU path as a
//! drafter, as llama.cpp's `DECODER_MTP` graphs (src/models/qwen35moe.cpp, glm4-moe.cpp) and
//! its `draft-mtp` driver (common/speculative.cpp) run it.
//!
//! At position p the layer takes the pair (x_p, h_{p-1}): x_p's embedding and h_{p-1}, the
//! trunk's hidden state at p - 1 after the output norm (h_{-1} = 0):
//! `y = eh_proj · [enorm(embed(x_p)) ; hnorm(h_{p-1})]`, then one decoder block of the family
//! (its full attention over this layer's own KV, its MoE FFN and shared expert), then the
//! head norm (`nextn.shared_head_norm`, else `output_norm`) giving h'_p, and the head
//! (`nextn.shared_head_head`, else `output`): the logits of x_{p+2}. A draft chain feeds its
//! own h'_p as the hidden state of the next step.
//!
//! State per slot (`Mtp`): the layer's KV; `base`, the positions run on the target's own hidden
//! states (the target's forward calls catch the layer up: `catch_up`), kept equal to the
//! target's length through truncation; `pending` = h_{base-1}; the target's last `KEEP` hidden
//! states, from which a truncation (a rejected speculative window) takes the new `pending`
//! (one further back, e.g. to a prefix-cache point far behind, pairs with 0 instead, as a
//! sequence's start does: only the drafts' quality changes).
//! Draft steps write KV after `base` and are dropped at the next draft or catch-up. A slot
//! whose `base` fell behind the target (a KV import, positions run while the layer was off)
//! drafts nothing until it starts over (truncate to 0). Memory per slot: the layer's KV
//! (one attention layer of n_ctx positions) and KEEP + 2 hidden states.
//!
//! Legend: T = rows (≤ max_chunk), H = hidden, Nh / Nkv = query / KV heads, D = head dim,
//! E = experts, K = experts used, V = vocab, Fs = shared expert width.

use super::arch::Family;
use super::attention::AttnShape;
use super::attn_par::{attend_chunk_units, AttnPar, ATT_TASKS};
use super::blocks::{add_bias_rows, shared_expert, FfnScratch};
use super::compute::{Compute, ExpertLayer, MoeInput};
use super::deltanet::{apply_gate, split_q_gate};
use super::hparams::HParams;
use super::kv::{KvCache, KvType};
use super::ops::{rms_norm, Rope};
use super::rows_par;
use super::weights::{load_layer, matrix, vector, LayerWeights, Weights};
use crate::error::{Error, Result};
use crate::gguf::{Gguf, TensorInfo};
use crate::quant;

/// The NextN / MTP layer's weights.
pub struct MtpWeights {
    /// One decoder block of the family (attention, never DeltaNet; MoE FFN + shared expert).
    pub layer: LayerWeights,
    pub eh_proj: TensorInfo, // (H, 2H) over [enorm(e) ; hnorm(h)]
    pub enorm: Vec<f32>,     // [H]
    pub hnorm: Vec<f32>,     // [H]
    /// `nextn.shared_head_norm` [H]; None: the model's `output_norm`.
    pub head_norm: Option<Vec<f32>>,
    /// `nextn.shared_head_head` (V, H); None: the model's output head.
    pub head: Option<TensorInfo>,
    /// `nextn.embed_tokens` (V, H); None: the model's `token_embd`.
    pub embed: Option<TensorInfo>,
}

/// The families whose NextN / MTP layer Strata runs (llama.cpp's graphs with one).
const FAMILIES: [Family; 3] = [Family::Qwen35Moe, Family::Qwen3Next, Family::Glm4Moe];

impl MtpWeights {
    /// The first NextN layer where the file has one (`nextn_predict_layers` ≥ 1 and its
    /// `nextn.eh_proj`); None otherwise (a trunk-only file, a family without one).
    pub fn load(g: &Gguf, hp: &HParams) -> Result<Option<MtpWeights>> {
        let n = hp.n_layer;
        let name = |s: &str| format!("blk.{n}.nextn.{s}.weight");
        if hp.n_layer_nextn == 0
            || !FAMILIES.contains(&hp.family)
            || g.tensor(&name("eh_proj")).is_none()
        {
            return Ok(None);
        }
        let (h, v) = (hp.n_embd, hp.n_vocab);
        let opt_mat = |s: &str| match g.tensor(&name(s)) {
            Some(_) => matrix(g, &name(s), v, h).map(Some),
            None => Ok(None),
        };
        Ok(Some(MtpWeights {
            layer: load_layer(g, hp, n)?,
            eh_proj: matrix(g, &name("eh_proj"), h, 2 * h)?,
            enorm: vector(g, &name("enorm"), h)?,
            hnorm: vector(g, &name("hnorm"), h)?,
            head_norm: match g.tensor(&name("shared_head_norm")) {
                Some(_) => Some(vector(g, &name("shared_head_norm"), h)?),
                None => None,
            },
            head: opt_mat("shared_head_head")?,
            embed: opt_mat("embed_tokens")?,
        }))
    }
}

/// Scratch for T rows.
struct MtpScratch {
    hin: Vec<f32>,    // [T, H] the hidden states paired with the tokens
    cat: Vec<f32>,    // [T, 2H] [enorm(e) ; hnorm(h)]
    x: Vec<f32>,      // [T, H] residual stream
    h: Vec<f32>,      // [T, H] normed block input
    q: Vec<f32>,      // [T, Nh·D]
    qg: Vec<f32>,     // [T, Nh·2D] a hybrid's q with its output gate
    gate: Vec<f32>,   // [T, Nh·D]
    k: Vec<f32>,      // [T, Nkv·D]
    v: Vec<f32>,      // [T, Nkv·D]
    att: Vec<f32>,    // [T, Nh·D]
    o: Vec<f32>,      // [T, H]
    router: Vec<f32>, // [T, E]
    ids: Vec<u32>,    // [T, K]
    wts: Vec<f32>,    // [T, K]
    sh_g: Vec<f32>,   // [T, Fs]
    sh_u: Vec<f32>,   // [T, Fs]
    sh_a: Vec<f32>,   // [T, Fs]
    sh_o: Vec<f32>,   // [T, H]
    sh_w: Vec<f32>,   // [T]
    cos: Vec<f32>,    // [T, n_rot/2]
    sin: Vec<f32>,    // [T, n_rot/2]
    attn: AttnPar,
}

/// Hidden states of the target kept per slot for a truncation's new `pending`: positions
/// from the last `KEEP` (a window's, a recent prompt chunk's).
const KEEP: usize = 256;

/// The target's normed hidden states h_p of positions p0.. ([rows, H]), contiguous.
#[derive(Default)]
struct Hist {
    p0: usize,
    rows: Vec<f32>,
}

/// The MTP layer's per-slot state (see the module doc).
pub struct Mtp {
    kv: KvCache,
    base: Vec<usize>,  // [slots]
    pending: Vec<f32>, // [slots, H] h_{base-1} (0 when unknown)
    hist: Vec<Hist>,   // [slots] the target's recent hidden states
    draft_h: Vec<f32>, // [slots, H] what the next draft step pairs with
    s: MtpScratch,
    rows: usize, // T
    /// Draft steps run since load (each one token of one slot).
    pub steps: u64,
}

/// What one run of the block reads besides the MTP state.
pub(super) struct Ctx<'a> {
    pub hp: &'a HParams,
    pub w: &'a Weights,
    pub rope: &'a Rope,
    pub compute: &'a dyn Compute,
}

impl Mtp {
    pub fn new(
        hp: &HParams,
        kv_type: KvType,
        n_ctx: usize,
        n_slots: usize,
        rows: usize,
    ) -> Result<Mtp> {
        let kv = KvCache::new(kv_type, 1, n_ctx, hp.n_head_kv, hp.head_dim, n_slots)?;
        let (t, hd, qd, kvd) = (rows, hp.n_embd, hp.q_dim(), hp.kv_dim());
        let z = |n: usize| vec![0f32; t * n];
        let fs = hp.n_ff_shexp;
        Ok(Mtp {
            kv,
            base: vec![0; n_slots],
            pending: vec![0.0; n_slots * hd],
            hist: (0..n_slots).map(|_| Hist::default()).collect(),
            draft_h: vec![0.0; n_slots * hd],
            s: MtpScratch {
                hin: z(hd),
                cat: z(2 * hd),
                x: z(hd),
                h: z(hd),
                q: z(qd),
                qg: z(2 * qd),
                gate: z(qd),
                k: z(kvd),
                v: z(kvd),
                att: z(qd),
                o: z(hd),
                router: z(hp.n_expert),
                ids: vec![0; t * hp.n_expert_used],
                wts: z(hp.n_expert_used),
                sh_g: z(fs),
                sh_u: z(fs),
                sh_a: z(fs),
                sh_o: z(hd),
                sh_w: z(1),
                cos: z(hp.n_rot / 2),
                sin: z(hp.n_rot / 2),
                attn: AttnPar::new(n_ctx, kv_type, hp.head_dim, ATT_TASKS),
            },
            rows,
            steps: 0,
        })
    }

    /// Whether the slot's layer is in step with a target of length `len` (it can draft).
    pub fn ready(&self, slot: usize, len: usize) -> bool {
        self.base.get(slot) == Some(&len)
    }

    /// Bytes of the layer's KV (all slots).
    pub fn bytes(&self) -> usize {
        self.kv.bytes()
    }

    /// The target ran `tokens` of `slot` at positions p0.. and `x` [t, H] is its final
    /// residual stream there: the layer runs the pairs (x_p, h_{p-1}) of these positions.
    pub(super) fn catch_up(
        &mut self,
        c: &Ctx<'_>,
        slot: usize,
        p0: usize,
        tokens: &[u32],
        x: &[f32],
    ) -> Result<()> {
        let (hd, t) = (c.hp.n_embd, tokens.len());
        let norm = &c.w.output_norm;
        let hist = &mut self.hist[slot];
        if hist.p0 + hist.rows.len() / hd != p0 {
            hist.p0 = p0; // not contiguous with what it holds: start over here
            hist.rows.clear();
        }
        let old = hist.rows.len();
        hist.rows.resize(old + t * hd, 0.0);
        for (xr, hr) in x
            .chunks_exact(hd)
            .zip(hist.rows[old..].chunks_exact_mut(hd))
        {
            rms_norm(xr, norm, c.hp.rms_eps, hr); // h_p [H]
        }
        let ps = slot * hd..(slot + 1) * hd;
        let run = self.base[slot] == p0;
        if run {
            // [h_{p0-1}, h_p0 .. h_{p0+t-2}]
            self.s.hin[..hd].copy_from_slice(&self.pending[ps.clone()]);
            self.s.hin[hd..t * hd].copy_from_slice(&hist.rows[old..old + (t - 1) * hd]);
            self.pending[ps].copy_from_slice(&hist.rows[old + (t - 1) * hd..]);
        }
        let extra = (hist.rows.len() / hd).saturating_sub(KEEP);
        if extra > 0 {
            hist.rows.drain(..extra * hd);
            hist.p0 += extra;
        }
        if !run {
            return Ok(()); // behind the target: waits for the slot to start over
        }
        self.block(c, slot, p0, tokens, None)?;
        self.base[slot] = p0 + t;
        Ok(())
    }

    /// The target keeps its first `n` positions.
    pub fn truncate(&mut self, slot: usize, n: usize, hd: usize) {
        let hist = &mut self.hist[slot];
        if n < self.base[slot] {
            self.base[slot] = n;
            let ps = &mut self.pending[slot * hd..(slot + 1) * hd];
            let end = hist.p0 + hist.rows.len() / hd;
            match n.checked_sub(1) {
                Some(p) if p >= hist.p0 && p < end => {
                    let i = p - hist.p0;
                    ps.copy_from_slice(&hist.rows[i * hd..(i + 1) * hd]);
                }
                _ => ps.fill(0.0), // unknown (or n = 0): as a sequence's start
            }
        }
        // rows after n are the target's no more
        let keep = n.saturating_sub(hist.p0).min(hist.rows.len() / hd);
        hist.rows.truncate(keep * hd);
        self.kv.set_len(slot, self.base[slot]);
    }

    /// One draft step of `slot`: `first` starts a chain at the target's length (paired with
    /// h_{base-1}), later steps continue it (paired with the previous step's h'). `out` [V]
    /// gets the logits of the token after the next one.
    pub(super) fn draft(
        &mut self,
        c: &Ctx<'_>,
        slot: usize,
        token: u32,
        first: bool,
        out: &mut [f32],
    ) -> Result<()> {
        let hd = c.hp.n_embd;
        let ps = slot * hd..(slot + 1) * hd;
        if first {
            self.draft_h[ps.clone()].copy_from_slice(&self.pending[ps.clone()]);
            self.kv.set_len(slot, self.base[slot]);
        }
        let pos = self.kv.len(slot)?;
        if pos >= self.kv.n_ctx {
            return Err(Error::Input(format!(
                "MTP draft of slot {slot} at position {pos}: past n_ctx = {}",
                self.kv.n_ctx
            )));
        }
        self.s.hin[..hd].copy_from_slice(&self.draft_h[ps.clone()]);
        let mut hn = vec![0f32; hd];
        self.block(c, slot, pos, &[token], Some((&mut hn, out)))?;
        self.draft_h[ps].copy_from_slice(&hn);
        self.steps += 1;
        Ok(())
    }

    /// The layer over `tokens` of `slot` at positions p0.. paired with `s.hin` [t, H]; its
    /// keys and values go to the slot's KV (length p0 + t after). `head`: the last row's h'
    /// [H] and logits [V].
    fn block(
        &mut self,
        c: &Ctx<'_>,
        slot: usize,
        p0: usize,
        tokens: &[u32],
        head: Option<(&mut [f32], &mut [f32])>,
    ) -> Result<()> {
        let Some(mw) = &c.w.mtp else {
            return Err(Error::Model("this model has no MTP layer".into()));
        };
        let (hp, w, compute) = (c.hp, c.w, c.compute);
        let lw = &mw.layer;
        let t = tokens.len();
        if t == 0 || t > self.rows {
            return Err(Error::Input(format!(
                "MTP layer: {t} rows (1..={})",
                self.rows
            )));
        }
        let (hd, d, qd, kvd, eps) = (hp.n_embd, hp.head_dim, hp.q_dim(), hp.kv_dim(), hp.rms_eps);
        let (e, k, fs, half) = (hp.n_expert, hp.n_expert_used, hp.n_ff_shexp, hp.n_rot / 2);
        let s = &mut self.s;
        let segs = [t];
        // [enorm(embed(x_p)) ; hnorm(h_{p-1})]  [T, 2H]
        let et = mw.embed.as_ref().unwrap_or(&w.token_embd);
        let mut row = vec![0f32; hd];
        for (i, &id) in tokens.iter().enumerate() {
            embed_row(w, et, id as usize, &mut row)?;
            let cat = &mut s.cat[i * 2 * hd..(i + 1) * 2 * hd];
            rms_norm(&row, &mw.enorm, eps, &mut cat[..hd]);
            rms_norm(&s.hin[i * hd..(i + 1) * hd], &mw.hnorm, eps, &mut cat[hd..]);
            c.rope.table(
                p0 + i,
                &mut s.cos[i * half..(i + 1) * half],
                &mut s.sin[i * half..(i + 1) * half],
            );
        }
        let x = &mut s.x[..t * hd];
        compute.matmul_segs(&w.mat(&mw.eh_proj), &s.cat[..t * 2 * hd], &segs, x)?; // [T, H]
                                                                                   // ---- attention (gated in a hybrid family) ----
        rows_par::norm_rows(compute, x, &lw.attn_norm, eps, &mut s.h[..t * hd])?;
        let h = &s.h[..t * hd];
        let (q, gate) = (&mut s.q[..t * qd], &mut s.gate[..t * qd]);
        let gated = hp.graph.hybrid.is_some();
        if gated {
            compute.matmul_segs(&w.mat(&lw.wq), h, &segs, &mut s.qg[..t * 2 * qd])?; // [T, Nh·2D]
            split_q_gate(&s.qg[..t * 2 * qd], d, q, gate);
        } else {
            compute.matmul_segs(&w.mat(&lw.wq), h, &segs, q)?; // [T, Nh·D]
        }
        let (kk, vv) = (&mut s.k[..t * kvd], &mut s.v[..t * kvd]);
        compute.matmul_segs(&w.mat(&lw.wk), h, &segs, kk)?; // [T, Nkv·D]
        compute.matmul_segs(&w.mat(&lw.wv), h, &segs, vv)?;
        if let Some([bq, bk, bv]) = &lw.qkv_bias {
            add_bias_rows(q, bq);
            add_bias_rows(kk, bk);
            add_bias_rows(vv, bv);
        }
        // per row: q/k norms (per head [D]) where the layer has them, then RoPE
        let qk_norm = match (&lw.q_norm, &lw.k_norm) {
            (Some(qn), Some(kn)) => Some((&qn[..], &kn[..])),
            _ => None,
        };
        let cs = (&s.cos[..t * half], &s.sin[..t * half]);
        rows_par::qk_norm_rope(compute, c.rope, (q, kk), d, qk_norm, eps, cs, t)?;
        let (ty, kc, vc) = self.kv.rows_mut(slot, 0, p0, t)?;
        rows_par::store_kv_rows(compute, ty, (kk, vv), (kvd, d), (kc, vc))?;
        let shape = AttnShape::of(&self.kv, hp.n_head, hp.n_head_kv, d);
        let (kc, vc) = self.kv.layer(slot, 0, p0 + t);
        let att = &mut s.att[..t * qd];
        attend_chunk_units(&shape, kc, vc, p0, t, q, att, &s.attn, compute, true, t)?;
        if gated {
            apply_gate(att, gate);
        }
        let o = &mut s.o[..t * hd];
        compute.matmul_segs(&w.mat(&lw.wo), att, &segs, o)?; // [T, H]
        if let Some(bo) = &lw.o_bias {
            add_bias_rows(o, bo);
        }
        rows_par::add_rows(compute, x, o, hd)?;
        // ---- FFN: routed experts + shared expert ----
        rows_par::norm_rows(compute, x, &lw.ffn_norm, eps, &mut s.h[..t * hd])?;
        let h = &s.h[..t * hd];
        let router = &mut s.router[..t * e];
        compute.matmul_segs(&w.mat(&lw.router), h, &segs, router)?; // [T, E]
        if let Some(br) = &lw.router_bias {
            add_bias_rows(router, br);
        }
        let picks = (&mut s.ids[..t * k], &mut s.wts[..t * k]);
        let bias = lw.exp_probs_b.as_deref();
        rows_par::route_rows(compute, hp.graph.routing, bias, router, picks, e)?;
        let layer = ExpertLayer {
            gate: w.exps(&lw.gate),
            up: w.exps(&lw.up),
            down: w.exps(&lw.down),
        };
        let pairs = MoeInput::new(h, &s.ids[..t * k], &s.wts[..t * k], k);
        compute.moe_segs(&layer, &pairs, &segs, o)?; // [T, H]
        if let Some(sh) = &lw.shared {
            let sc = FfnScratch {
                g: &mut s.sh_g[..t * fs],
                u: &mut s.sh_u[..t * fs],
                a: &mut s.sh_a[..t * fs],
                o: &mut s.sh_o[..t * hd],
                w: &mut s.sh_w[..t],
            };
            shared_expert(compute, w, sh, h, &segs, sc, o)?;
        }
        rows_par::add_rows(compute, x, o, hd)?;
        self.kv.set_len(slot, p0 + t);
        // ---- head: the last row's h' and logits ----
        if let Some((hn, logits)) = head {
            let norm = mw.head_norm.as_ref().unwrap_or(&w.output_norm);
            rms_norm(&x[(t - 1) * hd..], norm, eps, hn);
            let out = mw.head.as_ref().unwrap_or(&w.output);
            compute.matmul_segs(&w.mat(out), hn, &[1], logits)?; // [V]
        }
        Ok(())
    }
}

/// Token `id`'s row of the embedding matrix `t` (V, H) into `out` [H].
fn embed_row(w: &Weights, t: &TensorInfo, id: usize, out: &mut [f32]) -> Result<()> {
    let rb = t.ty.row_bytes(out.len()).unwrap_or(0);
    let data = w.gguf.data(t);
    quant::dequantize(t.ty, &data[id * rb..(id + 1) * rb], out)
}

impl super::forward::Model {
    /// Whether the file has a NextN / MTP layer Strata runs.
    pub fn has_mtp(&self) -> bool {
        self.weights.mtp.is_some()
    }

    /// Starts (or stops) the MTP layer: while on, every forward call catches it up on the
    /// target's hidden states (one more layer per token). Slots that hold positions when it
    /// starts draft nothing until they start over. A `Model` error without an MTP layer.
    pub fn set_mtp(&mut self, on: bool) -> Result<()> {
        if !on {
            self.mtp = None;
            return Ok(());
        }
        if !self.has_mtp() {
            return Err(Error::Model(format!(
                "{}: this file carries no MTP / NextN layer Strata runs (nextn_predict_layers \
                 = {}; Strata runs the MTP layer of {})",
                self.hp.arch,
                self.hp.n_layer_nextn,
                FAMILIES.map(Family::name).join(", ")
            )));
        }
        if self.mtp.is_none() {
            let rows = self.scratch.x.len() / self.hp.n_embd;
            let (ty, n_ctx, n_slots) = (self.cfg.kv_type, self.cfg.n_ctx, self.cfg.n_slots);
            self.mtp = Some(Mtp::new(&self.hp, ty, n_ctx, n_slots, rows)?);
        }
        Ok(())
    }

    /// Whether the slot's MTP layer is in step with its target positions (it can draft).
    pub fn mtp_ready(&self, slot: usize) -> Result<bool> {
        let len = self.kv.len(slot)?;
        Ok(self.mtp.as_ref().is_some_and(|m| m.ready(slot, len)))
    }

    /// Bytes of the MTP layer's KV (0 while it is off).
    pub fn mtp_bytes(&self) -> usize {
        self.mtp.as_ref().map_or(0, Mtp::bytes)
    }

    /// Draft steps the MTP layer ran.
    pub fn mtp_steps(&self) -> u64 {
        self.mtp.as_ref().map_or(0, |m| m.steps)
    }

    /// One MTP draft step (`Mtp::draft`): `token` at the slot's next draft position; `out`
    /// [V] the logits of the token after it. Needs `set_mtp(true)` and `mtp_ready(slot)`.
    pub fn mtp_draft(
        &mut self,
        slot: usize,
        token: u32,
        first: bool,
        out: &mut [f32],
    ) -> Result<()> {
        let len = self.kv.len(slot)?;
        let vocab = self.hp.n_vocab;
        if token as usize >= vocab || out.len() != vocab {
            return Err(Error::Input(format!(
                "MTP draft: token {token} (n_vocab = {vocab}), logits buffer {} (expected {vocab})",
                out.len()
            )));
        }
        let ctx = Ctx {
            hp: &self.hp,
            w: &self.weights,
            rope: &self.rope,
            compute: self.compute.as_ref(),
        };
        match &mut self.mtp {
            Some(m) if m.ready(slot, len) => m.draft(&ctx, slot, token, first, out),
            Some(_) => Err(Error::Input(format!(
                "slot {slot}: its MTP layer is not in step with its {len} positions (it drafts \
                 again once the slot starts over)"
            ))),
            None => Err(Error::Config("the MTP layer is off (set_mtp)".into())),
        }
    }

    /// After a step: the MTP layer catches up on each piece's final residual rows.
    pub(super) fn mtp_catch_up(
        &mut self,
        entries: &[super::batch::Entry<'_>],
        pieces: &[super::batch::Piece],
    ) -> Result<()> {
        let Some(m) = &mut self.mtp else {
            return Ok(());
        };
        let ctx = Ctx {
            hp: &self.hp,
            w: &self.weights,
            rope: &self.rope,
            compute: self.compute.as_ref(),
        };
        let hd = self.hp.n_embd;
        for p in pieces {
            let toks = &entries[p.entry].tokens[p.tok0..p.tok0 + p.t];
            let x = &self.scratch.x[p.r0 * hd..(p.r0 + p.t) * hd];
            m.catch_up(&ctx, p.slot, p.p0, toks, x)?;
        }
        Ok(())
    }
}
