//! The forward pass (docs/FORMATS.md §4, "Forward pass") of every family `arch` names, over a
//! multi-slot KV cache.
//!
//! Legend: T = tokens in the chunk (≤ max_chunk), H = hidden, Nh / Nkv = query / KV heads,
//! D = head dim, E = experts, K = experts used, V = vocab, C = n_ctx, Fs = shared expert
//! width.
//! Prefill runs T tokens at once through every matmul; decode is the T = 1 case. All scratch
//! is allocated at load for the largest chunk: the per-token path allocates nothing, except
//! with a RAM tier that has an arena (`resident`/`budget` modes): then each call builds the
//! [3][E] per-expert slab tables the pool reads (a few small vectors per call). In `mmap`
//! mode the tier only counts uses and the pool reads the model's own map directly.

use super::arch::Experts;
use super::attn_par::AttnPar;
use super::batch::Entry;
use super::compute::Compute;
use super::compute::ExpertLayer;
use super::deltanet::Recurrent;
use super::dense_r16::DenseR16;
use super::head::RepackedHead;
use super::hparams::HParams;
use super::kv::{zeroed_vec, KvCache, KvType};
use super::kv_blob;
use super::moe_oai::OaiScratch;
use super::mtp::Mtp;
use super::ops::Rope;
use super::readahead::Readahead;
use super::step::StepScratch;
use super::weights::Weights;
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::tier::{PrefetchStats, Residency, RoutingCounters};
use std::path::Path;
use std::sync::Arc;

/// Which logits a forward call returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (prefill only): `out` is empty.
    None,
    /// The last token's: `out` is [V].
    Last,
    /// Every token's: `out` is [T, V].
    All,
    /// Every token's, each row computed in the one-row (decode) order of attention and of
    /// every matmul, so that row i is bitwise the logits of a one-token step at its position
    /// (a speculative window's verification on the CPU path); `out` is [T, V]. Elsewhere as
    /// `All`.
    Window,
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub n_ctx: usize,
    pub n_slots: usize,
    pub kv_type: KvType,
    /// Largest prefill chunk (tokens through the matmuls at once).
    pub max_chunk: usize,
    /// Repack a Q6_K output head at load for a faster CPU decode (`head::RepackedHead`: a
    /// copy of the head in RAM, same logits bitwise).
    pub cpu_repack: bool,
}

pub(super) struct Scratch {
    pub(super) x: Vec<f32>,      // [T, H] residual stream
    pub(super) h: Vec<f32>,      // [T, H] normed block input
    pub(super) q: Vec<f32>,      // [T, Nh·D]
    pub(super) k: Vec<f32>,      // [T, Nkv·D]
    pub(super) v: Vec<f32>,      // [T, Nkv·D]
    pub(super) att: Vec<f32>,    // [T, Nh·D] attention output, heads concatenated
    pub(super) o: Vec<f32>,      // [T, H] block output added to x
    pub(super) router: Vec<f32>, // [T, E] router logits, then probabilities
    pub(super) ids: Vec<u32>,    // [T, K] chosen experts, by descending probability
    pub(super) wts: Vec<f32>,    // [T, K] their weights (`arch::Routing`)
    pub(super) sh_g: Vec<f32>,   // [T, Fs or Fd] shared expert / dense FFN gate
    pub(super) sh_u: Vec<f32>,   // [T, Fs or Fd] up
    pub(super) sh_a: Vec<f32>,   // [T, Fs or Fd] silu(gate)·up
    pub(super) sh_o: Vec<f32>,   // [T, H] shared expert output
    pub(super) sh_w: Vec<f32>,   // [T] shared expert gate logit
    pub(super) cos: Vec<f32>,    // [T, n_rot/2]
    pub(super) sin: Vec<f32>,    // [T, n_rot/2]
    pub(super) attn: AttnPar,    // per-task attention scratch
    pub(super) seen: Vec<bool>,  // [E] experts already counted in this layer (tier use counting)
    pub(super) oai: OaiScratch,  // the biased experts' (`arch::Experts::OaiBiased`)
}

pub struct Model {
    pub hp: HParams,
    pub weights: Weights,
    pub kv: KvCache,
    pub cfg: ModelConfig,
    pub(super) rope: Rope,
    pub(super) scratch: Scratch,
    pub(super) compute: Arc<dyn Compute>,
    /// Router picks per (layer, expert) since load, undecayed (profiles read these).
    pub routing: Arc<RoutingCounters>,
    /// The same picks with exponential decay (half-life `ROUTING_HALF_LIFE` steps): what the
    /// model is asked now (status, the adaptive tier).
    pub routing_hot: Arc<RoutingCounters>,
    /// The RAM tier: when set, routed experts are read from wherever its residency table says
    /// (arena or map) and every use is counted per tier.
    pub(super) tier: Option<Arc<Residency>>,
    /// Read-ahead of the next layer's likely experts (`set_readahead`).
    pub(super) readahead: Option<Readahead>,
    /// The repacked output head (`cpu_repack` with a Q6_K head).
    pub(super) head: Option<RepackedHead>,
    /// The repacked attention projections (`cpu_repack`, Q4_K ones where the dot kernels run
    /// AVX2 or AVX-512).
    pub(super) dense_r16: Option<DenseR16>,
    /// Names this model in KV exports (`kv_blob::fingerprint`).
    fingerprint: u64,
    /// The batched step's per-call bookkeeping.
    pub(super) steps: StepScratch,
    /// A hybrid family's per-slot recurrent state and DeltaNet scratch (`deltanet`).
    pub(super) rec: Option<Recurrent>,
    /// The NextN / MTP layer's per-slot state while it drafts (`set_mtp`).
    pub(super) mtp: Option<Mtp>,
}

/// Half-life of the decayed routing counters, in forward calls.
pub const ROUTING_HALF_LIFE: f64 = 1024.0;

impl Model {
    pub fn open(
        path: impl AsRef<Path>,
        cfg: ModelConfig,
        compute: Arc<dyn Compute>,
    ) -> Result<Model> {
        let gguf = Arc::new(Gguf::open(path)?);
        let mut hp = HParams::from_gguf(&gguf)?;
        let weights = Weights::load(gguf, &mut hp)?;
        Self::new(hp, weights, cfg, compute)
    }

    pub fn new(
        hp: HParams,
        weights: Weights,
        cfg: ModelConfig,
        compute: Arc<dyn Compute>,
    ) -> Result<Model> {
        if cfg.max_chunk == 0 {
            return Err(Error::Config(
                "prefill chunk must be at least 1 token".into(),
            ));
        }
        let kv = KvCache::new(
            cfg.kv_type,
            hp.n_attn_layer(), // a hybrid's recurrent layers keep no KV
            cfg.n_ctx,
            hp.n_head_kv,
            hp.head_dim,
            cfg.n_slots,
        )?;
        let t = cfg.max_chunk.min(cfg.n_ctx);
        // the chunk's buffers: refused (not an abort) where the machine cannot hold them
        let refuse = |n: usize| {
            Error::Config(format!(
                "the prefill chunk's buffers ({t} tokens × {n}) do not fit in memory: lower \
                 prefill_chunk"
            ))
        };
        let z = |n: usize| {
            t.checked_mul(n)
                .and_then(zeroed_vec::<f32>)
                .ok_or_else(|| refuse(n))
        };
        let ffn = hp.n_ff_shexp.max(hp.n_ff_dense); // the dense FFNs' widest
        let scratch = Scratch {
            x: z(hp.n_embd)?,
            h: z(hp.n_embd)?,
            q: z(hp.q_dim())?,
            k: z(hp.kv_dim())?,
            v: z(hp.kv_dim())?,
            att: z(hp.q_dim())?,
            o: z(hp.n_embd)?,
            router: z(hp.n_expert)?,
            ids: t
                .checked_mul(hp.n_expert_used)
                .and_then(zeroed_vec::<u32>)
                .ok_or_else(|| refuse(hp.n_expert_used))?,
            wts: z(hp.n_expert_used)?,
            sh_g: z(ffn)?,
            sh_u: z(ffn)?,
            sh_a: z(ffn)?,
            sh_o: z(if hp.n_ff_shexp > 0 { hp.n_embd } else { 0 })?,
            sh_w: z(usize::from(hp.n_ff_shexp > 0))?,
            cos: z(hp.n_rot / 2)?,
            sin: z(hp.n_rot / 2)?,
            attn: AttnPar::new(cfg.n_ctx, cfg.kv_type, hp.head_dim, compute.threads()),
            seen: vec![false; hp.n_expert],
            oai: match hp.graph.experts {
                Experts::OaiBiased { .. } => {
                    OaiScratch::new(t, hp.n_embd, hp.n_ff_exp, hp.n_expert_used)
                }
                Experts::Swiglu => OaiScratch::default(),
            },
        };
        let head = match cfg.cpu_repack {
            true => RepackedHead::new(&weights.mat(&weights.output), t, compute.as_ref())?,
            false => None,
        };
        let dense_r16 = match cfg.cpu_repack {
            true => {
                let mats = |l: usize| {
                    let lw = &weights.layers[l];
                    let m = |t| (lw.deltanet.is_none()).then(|| weights.mat(t));
                    [m(&lw.wq), m(&lw.wk), m(&lw.wv), m(&lw.wo)]
                };
                Some(DenseR16::new(weights.layers.len(), mats, compute.as_ref())?)
            }
            false => None,
        };
        let fingerprint = kv_blob::fingerprint(&hp, &weights);
        let rec = match (hp.graph.hybrid, &hp.ssm) {
            (Some(hy), Some(sp)) => {
                Some(Recurrent::new(sp.clone(), hy, cfg.n_slots, t, hp.q_dim()))
            }
            _ => None,
        };
        Ok(Model {
            mtp: None,
            rec,
            steps: StepScratch::new(cfg.n_slots, t),
            fingerprint,
            head,
            dense_r16,
            routing: Arc::new(RoutingCounters::new(hp.n_layer, hp.n_expert, 0.0)),
            routing_hot: Arc::new(RoutingCounters::new(
                hp.n_layer,
                hp.n_expert,
                ROUTING_HALF_LIFE,
            )),
            tier: None,
            readahead: None,
            rope: Rope::new(&hp),
            hp,
            weights,
            kv,
            cfg,
            scratch,
            compute,
        })
    }

    /// Runs `tokens` after the slot's cached positions, appends their keys and values to the
    /// slot, and writes the requested logits to `out` ([V] for Last, [T, V] for All): the
    /// one-entry case of `forward_batch` (`step`).
    pub fn forward(
        &mut self,
        slot: usize,
        tokens: &[u32],
        want: Logits,
        out: &mut [f32],
    ) -> Result<()> {
        self.forward_batch(&[Entry { slot, tokens, want }], out)
    }

    /// Reads experts through `tier` from now on (its layout must match this model's).
    pub fn set_tier(&mut self, tier: Arc<Residency>) -> Result<()> {
        let lay = tier.layout();
        if lay.n_layer() != self.hp.n_layer || lay.n_expert != self.hp.n_expert {
            return Err(Error::Config(format!(
                "the tier holds {} layers × {} experts, the model {} × {}",
                lay.n_layer(),
                lay.n_expert,
                self.hp.n_layer,
                self.hp.n_expert
            )));
        }
        self.readahead = None;
        self.tier = Some(tier);
        Ok(())
    }

    /// Read ahead the next layer's likely experts on `threads` prefetch threads while each
    /// layer runs (0: off): per token the K the guess ranks first plus `extra`. Needs a tier
    /// (`set_tier`); resident experts are never read ahead.
    pub fn set_readahead(&mut self, threads: usize, extra: usize) -> Result<()> {
        self.readahead = None; // stops the old threads
        if threads == 0 {
            return Ok(());
        }
        if threads > 64 || extra > self.hp.n_expert {
            return Err(Error::Config(format!(
                "read-ahead threads must be in 0..=64 and extra experts in 0..={} (got {threads}, \
                 {extra})",
                self.hp.n_expert
            )));
        }
        let Some(res) = &self.tier else {
            return Err(Error::Config(
                "read-ahead needs the RAM tier: set_tier first".into(),
            ));
        };
        let max_t = self.scratch.x.len() / self.hp.n_embd;
        let ra = Readahead::start(
            res.clone(),
            threads,
            extra,
            max_t,
            self.hp.n_embd,
            self.hp.n_expert,
            self.hp.n_expert_used,
        )
        .map_err(|e| Error::Io {
            path: "prefetch thread".into(),
            source: e,
        })?;
        self.readahead = Some(ra);
        Ok(())
    }

    /// The read-ahead's counts (`None` when it is off).
    pub fn readahead_stats(&self) -> Option<PrefetchStats> {
        self.readahead.as_ref().map(Readahead::stats)
    }

    /// RAM of the load-time repacked copies (`cpu_repack`); 0 when nothing was repacked.
    pub fn repack_bytes(&self) -> usize {
        self.head.as_ref().map_or(0, RepackedHead::bytes) + self.repack_proj_bytes()
    }

    /// Bytes of the attention projections' repacked copies (`dense_r16`).
    pub fn repack_proj_bytes(&self) -> usize {
        self.dense_r16.as_ref().map_or(0, DenseR16::bytes)
    }

    pub fn slot_len(&self, slot: usize) -> Result<usize> {
        self.kv.len(slot)
    }

    /// The slot's first `n` positions (every layer's K and V, in the KV type) as bytes.
    /// Refused for a hybrid family (its recurrent state is not in the export yet).
    pub fn kv_export(&self, slot: usize, n: usize) -> Result<Vec<u8>> {
        self.refuse_recurrent("KV export")?;
        self.kv.export(slot, n, self.fingerprint)
    }

    /// Replaces the slot's KV with an export of this model and KV type; returns its length.
    pub fn kv_import(&mut self, slot: usize, data: &[u8]) -> Result<usize> {
        self.refuse_recurrent("KV import")?;
        let n = self.kv.import(slot, data, self.fingerprint)?;
        if let Some(m) = &mut self.mtp {
            // the MTP layer's KV is of the sequence the slot held: it drafts again only from a
            // fresh start (a restored or moved sequence gets no stale drafts)
            m.truncate(slot, 0, self.hp.n_embd);
        }
        Ok(n)
    }

    /// Keeps the slot's first `n` positions. A hybrid family's recurrent state cannot be cut
    /// back, only restored (`checkpoints`): there `n` must be 0 (start over), the slot's
    /// length (nothing to do) or a checkpointed position (a speculative window's).
    pub fn truncate(&mut self, slot: usize, n: usize) -> Result<()> {
        let len = self.kv.len(slot)?;
        if let Some(rec) = &mut self.rec {
            if n == 0 {
                rec.reset(slot);
            } else if n < len && !rec.restore(slot, n) {
                return Err(Error::Input(format!(
                    "cannot truncate slot {slot} to {n} of its {len} positions: {} keeps a \
                     recurrent state, restorable only to 0 (truncate to 0) or a checkpoint \
                     (the positions of a speculative window: {:?})",
                    self.hp.arch,
                    rec.ck.positions(slot)
                )));
            }
        }
        self.kv.truncate(slot, n)?;
        if let Some(m) = &mut self.mtp {
            m.truncate(slot, n, self.hp.n_embd);
        }
        Ok(())
    }

    pub fn free(&mut self, slot: usize) -> Result<()> {
        self.truncate(slot, 0)
    }

    /// Marks the slot's recurrent state at its current length, so that `truncate` can come
    /// back to it (a prefix-cache point: the engine marks each prompt's end). A `Model` error
    /// for a family without a recurrent state.
    pub fn checkpoint(&mut self, slot: usize) -> Result<()> {
        let len = self.kv.len(slot)?;
        self.refuse_recurrent_absent()?;
        if let Some(rec) = &mut self.rec {
            rec.mark(slot, len);
        }
        Ok(())
    }

    /// The positions `truncate` can restore the slot's recurrent state to, ascending (besides
    /// 0 and its length); empty without a recurrent state.
    pub fn checkpoints(&self, slot: usize) -> Result<Vec<usize>> {
        self.kv.check_slot(slot)?;
        Ok(self
            .rec
            .as_ref()
            .map_or(Vec::new(), |r| r.ck.positions(slot)))
    }

    fn refuse_recurrent_absent(&self) -> Result<()> {
        match self.rec {
            Some(_) => Ok(()),
            None => Err(Error::Model(format!(
                "{} keeps no recurrent state (no DeltaNet layers)",
                self.hp.arch
            ))),
        }
    }

    /// Runs a hybrid family's prefill pieces of at least `min_tokens` tokens (that save no
    /// checkpoints) in the chunked DeltaNet form (`deltanet_chunk`: within float rounding of
    /// the recurrence, not bitwise); 0: the recurrence everywhere (the default). A `Model`
    /// error for a family without a recurrent state.
    pub fn set_deltanet_chunked(&mut self, min_tokens: usize) -> Result<()> {
        self.refuse_recurrent_absent()?;
        if let Some(rec) = &mut self.rec {
            rec.set_chunked(min_tokens);
        }
        Ok(())
    }

    /// Bytes of one slot's recurrent state (0 without one).
    pub fn recurrent_slot_bytes(&self) -> usize {
        self.rec.as_ref().map_or(0, Recurrent::slot_bytes)
    }

    fn refuse_recurrent(&self, what: &str) -> Result<()> {
        match self.rec {
            Some(_) => Err(Error::Model(format!(
                "{what} is not supported for {}: its slots keep a recurrent state",
                self.hp.arch
            ))),
            None => Ok(()),
        }
    }
}

/// Counts one tier use per distinct routed expert of layer `l` and, when the tier has an
/// arena (something can be resident), fills `tables` with per-expert slabs for the pool: each
/// routed expert where `res` keeps it, the others from the model's own map (not read).
/// Returns whether the tables were filled (false: the pool reads the model's map as is).
pub(super) fn tier_tables<'a>(
    res: &'a Residency,
    ra: Option<&Readahead>,
    l: usize,
    ids: &[u32],
    layer: &ExpertLayer<'a>,
    tables: &mut [Vec<&'a [u8]>; 3],
    seen: &mut [bool],
) -> Result<bool> {
    seen.fill(false);
    let slabs = res.arena_bytes() > 0;
    if slabs {
        let ms = [&layer.gate, &layer.up, &layer.down];
        for (tab, m) in tables.iter_mut().zip(ms) {
            let eb = m.rows * m.ty.row_bytes(m.cols).unwrap_or(0);
            tab.clear();
            tab.extend((0..m.n_expert).map(|e| m.expert_data(e, eb)));
        }
    }
    for &id in ids {
        match seen.get_mut(id as usize) {
            Some(s) if !*s => *s = true,
            _ => continue,
        }
        let b = res
            .expert_bytes(l, id as usize)
            .ok_or_else(|| Error::Input(format!("expert {id} of layer {l} is not in the tier")))?;
        if let Some(ra) = ra {
            ra.used(l, id as usize);
        }
        if !slabs {
            continue;
        }
        for (tab, bytes) in tables.iter_mut().zip([b.gate, b.up, b.down]) {
            if tab[id as usize].len() != bytes.len() {
                return Err(Error::Config(format!(
                    "tier slab of expert {id} in layer {l}: {} bytes, the model's {}",
                    bytes.len(),
                    tab[id as usize].len()
                )));
            }
            tab[id as usize] = bytes;
        }
    }
    Ok(slabs)
}

/// The checks every forward pass (CPU or GPU) makes before running `tokens` after the slot's
/// `start` cached positions: the logits buffer's length, the token ids, the context.
/// Ok(false): nothing to run (no tokens and no last logits wanted).
pub fn check_forward_args(
    slot: usize,
    start: usize,
    tokens: &[u32],
    want: Logits,
    out_len: usize,
    n_vocab: usize,
    n_ctx: usize,
) -> Result<bool> {
    let vocab = n_vocab;
    let n = tokens.len();
    let need = match want {
        Logits::None => 0,
        Logits::Last => vocab,
        Logits::All | Logits::Window => n * vocab,
    };
    if out_len != need {
        return Err(Error::Input(format!(
            "logits buffer holds {out_len} floats, expected {need}"
        )));
    }
    if n == 0 {
        return if want == Logits::Last {
            Err(Error::Input(
                "no tokens given, so there are no last logits".into(),
            ))
        } else {
            Ok(false)
        };
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(Error::Input(format!(
            "token id {bad} is outside the vocabulary (n_vocab = {vocab})"
        )));
    }
    if start + n > n_ctx {
        return Err(Error::Input(format!(
            "context overflow: slot {slot} holds {start} positions and {n} more would exceed \
             n_ctx = {n_ctx}"
        )));
    }
    Ok(true)
}

/// Where chunk `ci` (its `len` tokens start at `ci·chunk` of the call's `n`) writes its logits
/// in the call's buffer `out`, and how many rows: every row for `All`, the last row of the last
/// chunk for `Last`, none otherwise. Shared by the CPU and GPU forward passes.
pub fn chunk_logits(
    want: Logits,
    out: &mut [f32],
    ci: usize,
    chunk: usize,
    len: usize,
    n: usize,
    vocab: usize,
) -> (usize, Option<&mut [f32]>) {
    match want {
        Logits::Last if (ci + 1) * chunk >= n => (1, Some(out)),
        Logits::All | Logits::Window => {
            let a = ci * chunk * vocab;
            (len, Some(&mut out[a..a + len * vocab]))
        }
        _ => (0, None),
    }
}
