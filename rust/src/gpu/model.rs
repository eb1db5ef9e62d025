//! `GpuModel`: the public face of the GPU forward pass — the KV slots, the chunking, the
//! decode graphs — over the stages of the layer split (`stage.rs`; one stage: the whole
//! model), each a `Launcher` (the kernels, its layers' weights and buffers; `launch.rs`) and
//! its MoE placement (`placement.rs`: every expert in VRAM, or the hybrid tier), run through
//! the stage protocol (`pipeline.rs`). The batched step (and `forward`, its one-entry case)
//! is `batch.rs`.

use super::batch_scratch::BatchScratch;
use super::flight_state::Flights;
use super::gdn_state::GdnState;
use super::hybrid_cfg::{HybridConfig, HybridInfo, StageInfo};
use super::launch::{params_len, Launcher, LOGIT_ROWS};
use super::pipeline::Pipeline;
use super::placement::MoePlacement;
use super::stage::{SplitConfig, Stage, StageSizes, StepGraph};
use crate::cuda::ops::attention;
use crate::cuda::ops::view::bytes;
use crate::cuda::{Gpu, PinnedBuf};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::model::batch::Entry;
use crate::model::weights::Weights;
use crate::model::{HParams, Logits, ModelConfig};
use std::path::Path;
use std::sync::Arc;

pub struct GpuModel {
    pub hp: HParams,
    pub cfg: ModelConfig,
    /// The stages of the layer split (`stage.rs`; one: the whole model), run in order.
    pub(super) st: Vec<Stage>,
    /// Windows, gaps and hops between the stages (`pipeline.rs`).
    pub(super) pipe: Pipeline,
    chunk: usize,
    /// Tokens per chunk of a hybrid prefill whose chunks stream (`HybridConfig::stream_chunk`;
    /// the buffers hold max(chunk, stream_chunk) tokens).
    stream_chunk: usize,
    pub(super) lens: Vec<usize>,
    /// Names this model in KV exports (`kv_blob::fingerprint`).
    pub(super) fingerprint: u64,
    /// Page-locked staging of `params` and of min(n_slots, LOGIT_ROWS) rows of logits: the
    /// per-step copies go straight to and from them (no staging through pageable memory).
    pub(super) pin_params: PinnedBuf,
    pub(super) pin_logits: PinnedBuf,
    /// The batched step's bookkeeping (`batch.rs`).
    pub(super) steps: BatchScratch,
    /// Pipelined windows in flight (`flight.rs`).
    pub(super) flights: Flights,
    pub(super) use_graph: bool,
    /// Why capturing a decode graph failed (the step then runs kernel by kernel).
    pub(super) graph_error: Option<String>,
    /// Bytes of the routed-expert tensors and of everything else (for `hparams`).
    pub expert_bytes: usize,
    pub non_expert_bytes: usize,
}

impl GpuModel {
    /// `split`: the devices of the stages and the layer split (one stage on GPU 0: the
    /// default); `hybrid`: the VRAM expert tier's settings (None: every weight in VRAM).
    pub fn open(
        path: impl AsRef<Path>,
        cfg: ModelConfig,
        split: &SplitConfig,
        hybrid: Option<HybridConfig>,
    ) -> Result<GpuModel> {
        let gguf = Arc::new(Gguf::open(path)?);
        let mut hp = HParams::from_gguf(&gguf)?;
        let weights = Weights::load(gguf, &mut hp)?;
        Self::new(hp, weights, cfg, split, hybrid)
    }

    /// Uploads the weights (refusing, before any upload, a tensor type the GPU kernels lack),
    /// allocates the KV cache for `n_slots` × `n_ctx` and the buffers for `max_chunk` tokens,
    /// per stage of `split` (each stage its layers' share). With `hybrid` (and, when it is
    /// `only_if_needed`, a model that does not fit whole), the expert tensors stay in RAM
    /// and the VRAM left by the budget holds expert slots.
    pub fn new(
        hp: HParams,
        w: Weights,
        cfg: ModelConfig,
        split: &SplitConfig,
        hybrid: Option<HybridConfig>,
    ) -> Result<GpuModel> {
        hp.family.require_gpu()?;
        if cfg.max_chunk == 0 {
            return Err(Error::Config(
                "prefill chunk must be at least 1 token".into(),
            ));
        }
        let most = attention::max_group(hp.head_dim);
        if hp.n_head / hp.n_head_kv > most {
            return Err(Error::Model(format!(
                "{} query heads per KV head; the GPU attention takes at most {most} at head \
                 dim {}",
                hp.n_head / hp.n_head_kv,
                hp.head_dim
            )));
        }
        super::weights::check_types(&w)?;
        // a hybrid family's recurrent state: every slot's, f32
        let rec_bytes = hp.ssm.as_ref().map_or(0, |sp| {
            let (cs, ss) = sp.state_floats();
            let lr = sp.recurrent.iter().filter(|&&r| r).count();
            4 * lr * (cs + ss) * cfg.n_slots
        });
        let chunk = cfg.max_chunk.min(cfg.n_ctx);
        // streamed hybrid prefill chunks may be longer: the buffers hold the longer of the two
        let stream_chunk = match &hybrid {
            Some(h) if h.stream_min_tokens > 0 && h.stream_chunk > 0 => {
                h.stream_chunk.min(cfg.n_ctx)
            }
            _ => chunk,
        };
        let t = chunk.max(stream_chunk);
        let (expert_bytes, non_expert_bytes) = (w.expert_bytes(), w.non_expert_bytes());
        let fingerprint = crate::model::kv_blob::fingerprint(&hp, &w);
        let sizes = StageSizes { t, rec_bytes };
        let built = super::stage::build(&hp, w, &cfg, split, hybrid, &sizes)?;
        let st = built.stages;
        let hybrid_on = built.shared.is_some();
        let stream_chunk = if hybrid_on { stream_chunk } else { chunk };
        let (g0, gl) = (&st[0].x.gpu, &st[st.len() - 1].x.gpu);
        let pin_params = g0.host_alloc(bytes(params_len(cfg.n_slots, t), 4)?)?;
        let pin_rows = cfg.n_slots.clamp(1, LOGIT_ROWS);
        let pin_logits = gl.host_alloc(bytes(pin_rows * hp.n_vocab, 4)?)?;
        if split.pipeline_windows > 1 && rec_bytes > 0 {
            // a discarded window would have to restore the state from before it, which a
            // plain decode step does not checkpoint
            return Err(Error::Config(format!(
                "pipeline_windows {}: {} keeps a recurrent state; pipelined windows run on \
                 the families with a KV cache only",
                split.pipeline_windows, hp.arch
            )));
        }
        let pipe = Pipeline::new(&st, split.pipeline_windows, split.hop)?;
        Ok(GpuModel {
            st,
            pipe,
            expert_bytes,
            non_expert_bytes,
            lens: vec![0; cfg.n_slots],
            fingerprint,
            pin_params,
            pin_logits,
            steps: BatchScratch::new(cfg.n_slots),
            flights: Flights::default(),
            hp,
            cfg,
            chunk,
            stream_chunk,
            use_graph: true,
            graph_error: None,
        })
    }

    /// Windows at most in flight (`pipeline_windows`).
    pub fn pipeline_windows(&self) -> usize {
        self.pipe.max_windows()
    }

    /// The stages' count.
    pub fn n_stages(&self) -> usize {
        self.st.len()
    }

    /// The first stage (the whole model with one stage).
    pub(super) fn x0(&self) -> &Launcher {
        &self.st[0].x
    }

    /// Waits for every stage's stream.
    pub(super) fn sync_all(&self) -> Result<()> {
        self.st.iter().try_for_each(|s| s.x.stream.sync())
    }

    /// The first stage's device.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.x0().gpu
    }

    pub fn n_slots(&self) -> usize {
        self.lens.len()
    }

    /// Bytes of the K and V caches together (every stage's).
    pub fn kv_bytes(&self) -> usize {
        self.st.iter().map(|s| 2 * s.x.lay.total()).sum()
    }

    /// Per stage: its device, layers, windows, gaps and times (`pipeline.rs`), and its
    /// expert slots (hybrid).
    pub fn stage_info(&self) -> Vec<StageInfo> {
        let mut out = self.pipe.info();
        for (i, s) in out.iter_mut().zip(&self.st) {
            i.layers = (s.x.layers.start, s.x.layers.end);
            if let Some(h) = s.moe.hybrid_info() {
                i.n_slots = h.plan.n_slots;
                i.resident = h.resident;
                i.swaps = h.swaps;
                i.swap_bytes = h.swaps * h.plan.slot_bytes;
            }
        }
        out
    }

    /// The hybrid placement's plan and state (None: every weight in VRAM); with several
    /// stages, the first stage's settings and the sums of their plans.
    pub fn hybrid_info(&self) -> Option<HybridInfo> {
        let mut it = self.st.iter().filter_map(|s| s.moe.hybrid_info());
        let mut i = it.next()?;
        for o in it {
            let (p, q) = (&mut i.plan, &o.plan);
            p.budget_bytes += q.budget_bytes;
            p.fixed_bytes += q.fixed_bytes;
            p.n_slots += q.n_slots;
            p.n_experts += q.n_experts;
            p.expert_bytes_total += q.expert_bytes_total;
            p.slot_bytes = p.slot_bytes.max(q.slot_bytes);
            i.resident += o.resident;
            i.swaps += o.swaps;
        }
        if i.stream_areas > 0 {
            i.stream_chunk = self.stream_chunk;
        }
        i.stages = self.stage_info();
        Some(i)
    }

    /// The hybrid placement's counters (None: every weight in VRAM; the stages share them).
    pub fn hybrid_counters(&self) -> Option<Arc<crate::tier::vram::HybridCounters>> {
        self.x_moe0().hybrid_counters()
    }

    /// The routing counters of the placement (the hybrid one sees the routed ids on the
    /// host): undecayed since load, or decayed ("hot"). None: not counted.
    pub fn routing(&self, decayed: bool) -> Option<Arc<crate::tier::RoutingCounters>> {
        self.x_moe0().routing(decayed)
    }

    fn x_moe0(&self) -> &dyn MoePlacement {
        &*self.st[0].moe
    }

    /// Replays the one-token step from a captured CUDA graph (the default) or launches its
    /// kernels one by one; both compute the same thing.
    pub fn set_graph(&mut self, on: bool) {
        self.use_graph = on;
    }

    /// Whether the one-sequence decode graph (the hybrid placement's per-layer graphs) has
    /// been captured.
    pub fn graph_captured(&self) -> bool {
        self.st
            .iter()
            .all(|s| s.graphs.first().is_some_and(Option::is_some))
    }

    /// The step shapes captured as graphs (on every stage): ("decode", S) for S one-token
    /// pieces, ("window", t) for one piece of t rows (`Stage::graph_key`).
    pub fn graph_shapes(&self) -> Vec<(&'static str, usize)> {
        let captured = |k: usize| self.st.iter().all(|s| s.graphs[k].is_some());
        (0..self.st[0].graphs.len())
            .filter(|&k| captured(k))
            .map(|k| self.st[0].graph_shape(k))
            .collect()
    }

    /// "captured", "not yet", "off", or "failed: why" (then the step runs kernel by kernel).
    /// A placement with host work between layers says "captured (per layer)".
    pub fn graph_state(&self) -> String {
        let g = self.st[0].graphs.first().and_then(Option::as_ref);
        let g = g.filter(|_| self.graph_captured());
        let per_layer = matches!(g, Some(StepGraph::PerLayer(_)));
        match (g.is_some(), &self.graph_error, self.use_graph) {
            (true, _, true) if per_layer => "captured (per layer)".into(),
            (true, _, true) => "captured".into(),
            (_, Some(e), _) => format!("failed: {e}"),
            (_, None, false) => "off".into(),
            (false, None, true) => "not yet".into(),
        }
    }

    fn slot_ref(&self, slot: usize) -> Result<usize> {
        self.lens.get(slot).copied().ok_or_else(|| {
            Error::Input(format!(
                "slot {slot} does not exist (the cache has {} slots)",
                self.lens.len()
            ))
        })
    }

    /// Positions the slot holds.
    pub fn slot_len(&self, slot: usize) -> Result<usize> {
        self.slot_ref(slot)
    }

    /// Keeps the first `n` positions (a prefix to reuse); `n` above the length is an error.
    /// A hybrid family's recurrent state cannot be cut back, only restored (`gdn_state`): there `n`
    /// must be 0 (start over), the slot's length or a checkpointed position, as on the CPU.
    pub fn truncate(&mut self, slot: usize, n: usize) -> Result<()> {
        self.idle_slot(slot)?;
        self.truncate_unchecked(slot, n)
    }

    /// `truncate` of a slot that may be in a pipelined window (`flight.rs` puts a discarded
    /// window's slots back).
    pub(super) fn truncate_unchecked(&mut self, slot: usize, n: usize) -> Result<()> {
        let len = self.slot_ref(slot)?;
        if n > len {
            return Err(Error::Input(format!(
                "cannot truncate slot {slot} to {n} positions: it holds {len}"
            )));
        }
        for x in self.st.iter_mut().map(|s| &mut s.x) {
            if let Some(rec) = &mut x.rec {
                if n == 0 {
                    rec.reset(&x.stream, slot)?;
                } else if n < len && !rec.restore(&x.stream, slot, n)? {
                    return Err(Error::Input(format!(
                        "cannot truncate slot {slot} to {n} of its {len} positions: {} keeps \
                         a recurrent state, restorable only to 0 (truncate to 0) or a \
                         checkpoint (the positions of a speculative window: {:?})",
                        self.hp.arch,
                        rec.positions(slot)
                    )));
                }
            }
        }
        self.lens[slot] = n;
        Ok(())
    }

    /// Marks the slot's recurrent state at its current length, so that `truncate` can come
    /// back to it (`Model::checkpoint`); a `Model` error for a family without one.
    pub fn checkpoint(&mut self, slot: usize) -> Result<()> {
        let len = self.idle_slot(slot)?;
        if self.x0().rec.is_none() {
            return Err(Error::Model(format!(
                "{} keeps no recurrent state to checkpoint",
                self.hp.arch
            )));
        }
        for x in self.st.iter_mut().map(|s| &mut s.x) {
            if let Some(rec) = &mut x.rec {
                rec.mark(&x.gpu, &x.stream, slot, len)?;
            }
        }
        Ok(())
    }

    /// The positions `truncate` can restore the slot's recurrent state to, ascending (besides
    /// 0 and its length); empty without a recurrent state.
    pub fn checkpoints(&self, slot: usize) -> Result<Vec<usize>> {
        self.slot_ref(slot)?;
        Ok(self
            .x0()
            .rec
            .as_ref()
            .map_or(Vec::new(), |r| r.positions(slot)))
    }

    /// Bytes of one slot's recurrent state (0 without one).
    pub fn recurrent_slot_bytes(&self) -> usize {
        self.x0().rec.as_ref().map_or(0, GdnState::slot_bytes)
    }

    /// A `Model` error for a family whose slots keep a recurrent state (`what` refused).
    pub(super) fn refuse_recurrent(&self, what: &str) -> Result<()> {
        match self.x0().rec {
            Some(_) => Err(Error::Model(format!(
                "{what} is not supported for {}: its slots keep a recurrent state",
                self.hp.arch
            ))),
            None => Ok(()),
        }
    }

    /// Empties the slot.
    pub fn free(&mut self, slot: usize) -> Result<()> {
        self.truncate(slot, 0)
    }

    /// Runs `tokens` after the slot's cached positions, appends their keys and values to the
    /// slot, and writes the requested logits to `out` ([V] for Last, [T, V] for All): the
    /// one-entry batched step.
    pub fn forward(
        &mut self,
        slot: usize,
        tokens: &[u32],
        want: Logits,
        out: &mut [f32],
    ) -> Result<()> {
        self.forward_batch(&[Entry { slot, tokens, want }], out)
    }

    /// Rows the step buffers hold at most.
    pub(super) fn rows_cap(&self) -> usize {
        self.chunk.max(self.stream_chunk)
    }

    /// Rows per step for a call of `n` tokens: `stream_chunk` when the placement streams
    /// chunks of that length, else `chunk`.
    pub(super) fn chunk_for(&self, n: usize) -> usize {
        match self.x_moe0().stream_min() {
            Some(min) if n >= min && self.stream_chunk >= min => self.stream_chunk,
            _ => self.chunk,
        }
    }
}
