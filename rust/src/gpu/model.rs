//! `GpuModel`: the public face of the GPU forward pass — the KV slots, the chunking, the
//! decode graphs — over a `Launcher` (the kernels, weights and buffers; `launch.rs`) and one
//! MoE placement (`placement.rs`: every expert in VRAM, or the hybrid tier). The batched
//! step (and `forward`, its one-entry case) is `batch.rs`.

use super::batch_scratch::BatchScratch;
use super::gdn_state::GdnState;
use super::hybrid::Hybrid;
use super::hybrid_cfg::{HybridConfig, HybridInfo};
use super::launch::{params_len, Bufs, Launcher, Seg, LOGIT_ROWS};
use super::placement::{MoePlacement, VramExperts};
use super::weights::GpuWeights;
use crate::cuda::ops::attention::{self, KvLayout};
use crate::cuda::ops::quant::QuantOps;
use crate::cuda::ops::view::bytes;
use crate::cuda::{Gpu, Graph, PinnedBuf};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::model::batch::Entry;
use crate::model::weights::Weights;
use crate::model::{HParams, Logits, ModelConfig};
use std::path::Path;
use std::sync::Arc;

/// A captured decode step of S one-token pieces: one graph (for S = 1 with the final norm
/// and the head of its row), or per layer (attention, router and the placement's `pre`; its
/// `resident` experts, None for a layer without routed experts) for a placement with host
/// work between layers.
enum StepGraph {
    Whole(Graph),
    PerLayer(Vec<(Graph, Option<Graph>)>),
}

pub struct GpuModel {
    pub hp: HParams,
    pub cfg: ModelConfig,
    pub(super) x: Launcher,
    /// Where the routed experts run.
    pub(super) moe: Box<dyn MoePlacement>,
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
    /// [n_slots] the decode graph of S one-token pieces at S - 1.
    graphs: Vec<Option<StepGraph>>,
    use_graph: bool,
    /// [n_slots] decode steps of S pieces run so far without the graph (the first one runs
    /// eagerly: it resolves every kernel and checks the step before it is captured).
    eager_steps: Vec<usize>,
    /// Why capturing the decode graph failed (the step then runs kernel by kernel).
    graph_error: Option<String>,
    /// Bytes of the routed-expert tensors and of everything else (for `hparams`).
    pub expert_bytes: usize,
    pub non_expert_bytes: usize,
}

/// Buffers besides the weights and the KV cache that the automatic hybrid decision assumes
/// (activations, scratch, the CUDA context's own needs).
const BUFFER_ALLOWANCE: usize = 512 << 20;

impl GpuModel {
    /// `hybrid`: the VRAM expert tier's settings (None: every weight in VRAM).
    pub fn open(
        path: impl AsRef<Path>,
        cfg: ModelConfig,
        gpu: Arc<Gpu>,
        hybrid: Option<HybridConfig>,
    ) -> Result<GpuModel> {
        let gguf = Arc::new(Gguf::open(path)?);
        let mut hp = HParams::from_gguf(&gguf)?;
        let weights = Weights::load(gguf, &mut hp)?;
        Self::new(hp, weights, cfg, gpu, hybrid)
    }

    /// Uploads the weights (refusing, before any upload, a tensor type the GPU kernels lack),
    /// allocates the KV cache for `n_slots` × `n_ctx` and the buffers for `max_chunk` tokens.
    /// With `hybrid` (and, when it is `only_if_needed`, a model that does not fit whole), the
    /// expert tensors stay in RAM and the VRAM left by the budget holds expert slots.
    pub fn new(
        hp: HParams,
        w: Weights,
        cfg: ModelConfig,
        gpu: Arc<Gpu>,
        hybrid: Option<HybridConfig>,
    ) -> Result<GpuModel> {
        hp.family.require_gpu()?;
        let free0 = gpu.mem_info()?.0;
        if cfg.max_chunk == 0 {
            return Err(Error::Config(
                "prefill chunk must be at least 1 token".into(),
            ));
        }
        let lay = KvLayout::new(
            cfg.kv_type,
            cfg.n_slots,
            hp.n_attn_layer(), // a hybrid's recurrent layers keep no KV
            hp.n_head_kv,
            cfg.n_ctx,
            hp.head_dim,
        )?;
        if hp.n_head / hp.n_head_kv > attention::MAX_GROUP {
            return Err(Error::Model(format!(
                "{} query heads per KV head; the GPU attention takes at most {}",
                hp.n_head / hp.n_head_kv,
                attention::MAX_GROUP
            )));
        }
        super::weights::check_types(&w)?;
        // a hybrid family's recurrent state: every slot's, f32
        let rec_bytes = hp.ssm.as_ref().map_or(0, |sp| {
            let (cs, ss) = sp.state_floats();
            let lr = sp.recurrent.iter().filter(|&&r| r).count();
            4 * lr * (cs + ss) * cfg.n_slots
        });
        let hybrid = hybrid.filter(|h| {
            let need = w.expert_bytes() + w.non_expert_bytes() + 2 * lay.total() + rec_bytes;
            let avail = free0.saturating_sub((h.reserve_mib as usize) << 20);
            !h.only_if_needed || need + BUFFER_ALLOWANCE > avail
        });
        let stream = gpu.stream()?;
        let q = QuantOps::new(&gpu)?;
        let weights = GpuWeights::upload(&gpu, &w, hybrid.is_none())?;
        let chunk = cfg.max_chunk.min(cfg.n_ctx);
        // streamed hybrid prefill chunks may be longer: the buffers hold the longer of the two
        let stream_chunk = match &hybrid {
            Some(h) if h.stream_min_tokens > 0 && h.stream_chunk > 0 => {
                h.stream_chunk.min(cfg.n_ctx)
            }
            _ => chunk,
        };
        let t = chunk.max(stream_chunk);
        let n_split = attention::n_split(&gpu, hp.n_head_kv, cfg.n_ctx);
        let b = Bufs::new(&gpu, &stream, &hp, &lay, t, cfg.n_ctx, n_split)?;
        let pin_params = gpu.host_alloc(bytes(params_len(cfg.n_slots, t), 4)?)?;
        let pin_rows = cfg.n_slots.clamp(1, LOGIT_ROWS);
        let pin_logits = gpu.host_alloc(bytes(pin_rows * hp.n_vocab, 4)?)?;
        let (expert_bytes, non_expert_bytes) = (w.expert_bytes(), w.non_expert_bytes());
        let rec = match (hp.graph.hybrid, &hp.ssm) {
            (Some(hy), Some(sp)) => Some(GdnState::new(
                &gpu,
                &stream,
                sp.clone(),
                hy,
                cfg.n_slots,
                t,
                hp.q_dim(),
            )?),
            _ => None,
        };
        let recurrent = |l: usize| hp.ssm.as_ref().is_some_and(|sp| sp.recurrent[l]);
        let kv_of: Vec<usize> = (0..hp.n_layer)
            .scan(0, |n, l| {
                let i = *n;
                *n += usize::from(!recurrent(l));
                Some(i)
            })
            .collect();
        let attn_norm0 = w.layers.first().map_or(&[][..], |l| &l.attn_norm[..]);
        let fingerprint = crate::model::kv_blob::fingerprint(&hp, &w.output_norm, attn_norm0);
        let moe: Box<dyn MoePlacement> = match hybrid {
            Some(h) => {
                let (dense, kv) = (weights.bytes, 2 * lay.total());
                let n = cfg.n_slots;
                Box::new(Hybrid::new(&gpu, &hp, w, t, h, free0, dense, kv, n)?)
            }
            None => Box::new(VramExperts),
        };
        Ok(GpuModel {
            moe,
            expert_bytes,
            non_expert_bytes,
            lens: vec![0; cfg.n_slots],
            fingerprint,
            pin_params,
            pin_logits,
            steps: BatchScratch::new(cfg.n_slots),
            graphs: (0..cfg.n_slots).map(|_| None).collect(),
            eager_steps: vec![0; cfg.n_slots],
            x: Launcher {
                gpu,
                stream,
                q,
                w: weights,
                hp: hp.clone(),
                lay,
                b,
                n_split,
                kv_of,
                rec,
            },
            hp,
            cfg,
            chunk,
            stream_chunk,
            use_graph: true,
            graph_error: None,
        })
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.x.gpu
    }

    pub fn n_slots(&self) -> usize {
        self.lens.len()
    }

    /// Bytes of the K and V caches together.
    pub fn kv_bytes(&self) -> usize {
        2 * self.x.lay.total()
    }

    /// The hybrid placement's plan and state (None: every weight in VRAM).
    pub fn hybrid_info(&self) -> Option<HybridInfo> {
        self.moe.hybrid_info().map(|mut i| {
            if i.stream_areas > 0 {
                i.stream_chunk = self.stream_chunk;
            }
            i
        })
    }

    /// The hybrid placement's counters (None: every weight in VRAM).
    pub fn hybrid_counters(&self) -> Option<Arc<crate::tier::vram::HybridCounters>> {
        self.moe.hybrid_counters()
    }

    /// The routing counters of the placement (the hybrid one sees the routed ids on the
    /// host): undecayed since load, or decayed ("hot"). None: not counted.
    pub fn routing(&self, decayed: bool) -> Option<Arc<crate::tier::RoutingCounters>> {
        self.moe.routing(decayed)
    }

    /// Replays the one-token step from a captured CUDA graph (the default) or launches its
    /// kernels one by one; both compute the same thing.
    pub fn set_graph(&mut self, on: bool) {
        self.use_graph = on;
    }

    /// Whether the one-sequence decode graph (the hybrid placement's per-layer graphs) has
    /// been captured.
    pub fn graph_captured(&self) -> bool {
        self.graphs.first().is_some_and(Option::is_some)
    }

    /// "captured", "not yet", "off", or "failed: why" (then the step runs kernel by kernel).
    /// A placement with host work between layers says "captured (per layer)".
    pub fn graph_state(&self) -> String {
        let g = self.graphs.first().and_then(Option::as_ref);
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
        let len = self.slot_ref(slot)?;
        if n > len {
            return Err(Error::Input(format!(
                "cannot truncate slot {slot} to {n} positions: it holds {len}"
            )));
        }
        let x = &mut self.x;
        if let Some(rec) = &mut x.rec {
            if n == 0 {
                rec.reset(&x.stream, slot)?;
            } else if n < len && !rec.restore(&x.stream, slot, n)? {
                return Err(Error::Input(format!(
                    "cannot truncate slot {slot} to {n} of its {len} positions: {} keeps a \
                     recurrent state, restorable only to 0 (truncate to 0) or a checkpoint \
                     (the positions of a speculative window: {:?})",
                    self.hp.arch,
                    rec.positions(slot)
                )));
            }
        }
        self.lens[slot] = n;
        Ok(())
    }

    /// Marks the slot's recurrent state at its current length, so that `truncate` can come
    /// back to it (`Model::checkpoint`); a `Model` error for a family without one.
    pub fn checkpoint(&mut self, slot: usize) -> Result<()> {
        let len = self.slot_ref(slot)?;
        let x = &mut self.x;
        match &mut x.rec {
            Some(rec) => rec.mark(&x.gpu, &x.stream, slot, len),
            None => Err(Error::Model(format!(
                "{} keeps no recurrent state to checkpoint",
                self.hp.arch
            ))),
        }
    }

    /// The positions `truncate` can restore the slot's recurrent state to, ascending (besides
    /// 0 and its length); empty without a recurrent state.
    pub fn checkpoints(&self, slot: usize) -> Result<Vec<usize>> {
        self.slot_ref(slot)?;
        Ok(self
            .x
            .rec
            .as_ref()
            .map_or(Vec::new(), |r| r.positions(slot)))
    }

    /// Bytes of one slot's recurrent state (0 without one).
    pub fn recurrent_slot_bytes(&self) -> usize {
        self.x.rec.as_ref().map_or(0, GdnState::slot_bytes)
    }

    /// A `Model` error for a family whose slots keep a recurrent state (`what` refused).
    pub(super) fn refuse_recurrent(&self, what: &str) -> Result<()> {
        match self.x.rec {
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

    /// Rows per step for a call of `n` tokens: `stream_chunk` when the placement streams
    /// chunks of that length, else `chunk`.
    pub(super) fn chunk_for(&self, n: usize) -> usize {
        match self.moe.stream_min() {
            Some(min) if n >= min && self.stream_chunk >= min => self.stream_chunk,
            _ => self.chunk,
        }
    }

    /// Launches a step's layers over the pieces `segs` (`params` written): a decode step of
    /// S = `decode` one-token pieces replays its captured graph(s) (captured after its first
    /// step ran eagerly); a placement with host work between layers waits on the host per
    /// layer. True when the launches include the final norm and head of row 0 (S = 1, one
    /// graph).
    pub(super) fn launch_layers(&mut self, decode: Option<usize>, segs: &[Seg]) -> Result<bool> {
        let graph_ok = self.use_graph && self.graph_error.is_none();
        let key = decode.filter(|&n| graph_ok && n >= 1 && n <= self.graphs.len());
        let graphed =
            key.is_some_and(|n| self.graphs[n - 1].is_some() || self.eager_steps[n - 1] > 0);
        if let Some(n) = key.filter(|_| graphed) {
            if self.graphs[n - 1].is_none() {
                self.capture(segs)?;
            }
        }
        let (x, moe) = (&self.x, &mut self.moe);
        let g = key
            .filter(|_| graphed)
            .and_then(|n| self.graphs[n - 1].as_ref());
        match g {
            Some(StepGraph::Whole(g)) => {
                g.launch(&x.stream)?;
                return Ok(segs.len() == 1);
            }
            Some(StepGraph::PerLayer(gs)) => {
                let n = segs.len();
                x.embed(n, n)?;
                for (l, (a, r)) in gs.iter().enumerate() {
                    a.launch(&x.stream)?;
                    if let Some(r) = r {
                        moe.moe(x, l, n, Some(r))?;
                    }
                }
            }
            None => {
                x.layers(segs, &mut **moe)?;
                if let Some(n) = key {
                    self.eager_steps[n - 1] += 1;
                }
            }
        }
        Ok(false)
    }

    /// Captures the decode step of the S = `segs.len()` one-token pieces `segs`: as one graph
    /// (layers; for S = 1 also the final norm and head), or per layer when the placement
    /// works on the host between layers. A capture the driver refuses is recorded in
    /// `graph_error` and steps run kernel by kernel from then on (`graph_state` says why);
    /// an error of the step itself is returned.
    fn capture(&mut self, segs: &[Seg]) -> Result<()> {
        let (x, moe) = (&self.x, &mut self.moe);
        if moe.host_per_layer() {
            return self.capture_per_layer(segs);
        }
        x.stream.begin_capture()?;
        let mut body = x.layers(segs, &mut **moe);
        if segs.len() == 1 {
            body = body
                .and_then(|()| x.final_norm(0, 0, 1))
                .and_then(|()| x.head(0, 1));
        }
        let g = x.stream.end_capture();
        body?;
        match g {
            Ok(g) => self.graphs[segs.len() - 1] = Some(StepGraph::Whole(g)),
            Err(e) => self.graph_error = Some(e.to_string()),
        }
        Ok(())
    }

    /// The per-layer graphs of a decode step of S one-token pieces: (attention, router, the
    /// placement's `pre`; its `resident` experts, for a layer with routed experts) (its host
    /// work runs between them).
    fn capture_per_layer(&mut self, segs: &[Seg]) -> Result<()> {
        let (x, moe) = (&self.x, &mut self.moe);
        let n = segs.len();
        let mut gs = Vec::with_capacity(x.w.layers.len());
        for l in 0..x.w.layers.len() {
            let routed = x.w.layers[l].routed();
            let mut pair = Vec::with_capacity(2);
            for part in 0..1 + routed as usize {
                x.stream.begin_capture()?;
                let body = match part {
                    0 if routed => x.attn_router(l, segs).and_then(|()| moe.pre(x, l, n)),
                    0 => x.attn_router(l, segs),
                    _ => moe.resident(x, l, n),
                };
                let g = x.stream.end_capture();
                body?;
                match g {
                    Ok(g) => pair.push(g),
                    Err(e) => {
                        self.graph_error = Some(e.to_string());
                        return Ok(());
                    }
                }
            }
            let mut it = pair.into_iter();
            let a = it
                .next()
                .ok_or_else(|| Error::Config("a layer's graph was not captured".into()))?;
            gs.push((a, it.next()));
        }
        self.graphs[n - 1] = Some(StepGraph::PerLayer(gs));
        Ok(())
    }
}
