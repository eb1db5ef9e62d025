//! `GpuModel`: the public face of the GPU forward pass — the KV slots, the chunking, the
//! decode graphs — over a `Launcher` (the kernels, weights and buffers; `launch.rs`) and one
//! MoE placement (`placement.rs`: every expert in VRAM, or the hybrid tier).

use super::hybrid::Hybrid;
use super::hybrid_cfg::{HybridConfig, HybridInfo};
use super::launch::{Bufs, Launcher, LOGIT_ROWS};
use super::placement::{MoePlacement, VramExperts};
use super::weights::GpuWeights;
use crate::cuda::ops::attention::{self, KvLayout};
use crate::cuda::ops::quant::QuantOps;
use crate::cuda::ops::view::bytes;
use crate::cuda::{as_bytes_mut, Gpu, Graph, PinnedBuf};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::model::forward::{check_forward_args, chunk_logits};
use crate::model::weights::Weights;
use crate::model::{HParams, Logits, ModelConfig};
use std::path::Path;
use std::sync::Arc;

/// The captured one-token step: one graph, or per layer [attention, router and the
/// placement's `pre`; its `resident` experts] for a placement with host work between layers.
enum StepGraph {
    Whole(Graph),
    PerLayer(Vec<[Graph; 2]>),
}

pub struct GpuModel {
    pub hp: HParams,
    pub cfg: ModelConfig,
    pub(super) x: Launcher,
    /// Where the routed experts run.
    moe: Box<dyn MoePlacement>,
    chunk: usize,
    /// Tokens per chunk of a hybrid prefill whose chunks stream (`HybridConfig::stream_chunk`;
    /// the buffers hold max(chunk, stream_chunk) tokens).
    stream_chunk: usize,
    pub(super) lens: Vec<usize>,
    /// Names this model in KV exports (`kv_blob::fingerprint`).
    pub(super) fingerprint: u64,
    /// Page-locked staging of `params` and of one row of logits: the per-token copies go
    /// straight to and from them (no driver staging through pageable memory).
    pin_params: PinnedBuf,
    pin_logits: PinnedBuf,
    graph: Option<StepGraph>,
    use_graph: bool,
    /// One-token steps run so far without the graph (the first one runs eagerly: it
    /// resolves every kernel and checks the step before it is captured).
    eager_steps: usize,
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
            hp.n_layer,
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
        let hybrid = hybrid.filter(|h| {
            let need = w.expert_bytes() + w.non_expert_bytes() + 2 * lay.total();
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
        let pin_params = gpu.host_alloc(bytes(2 + t, 4)?)?;
        let pin_logits = gpu.host_alloc(bytes(hp.n_vocab, 4)?)?;
        let (expert_bytes, non_expert_bytes) = (w.expert_bytes(), w.non_expert_bytes());
        let attn_norm0 = w.layers.first().map_or(&[][..], |l| &l.attn_norm[..]);
        let fingerprint = crate::model::kv_blob::fingerprint(&hp, &w.output_norm, attn_norm0);
        let moe: Box<dyn MoePlacement> = match hybrid {
            Some(h) => {
                let (dense, kv) = (weights.bytes, 2 * lay.total());
                Box::new(Hybrid::new(&gpu, &hp, w, t, h, free0, dense, kv)?)
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
            x: Launcher {
                gpu,
                stream,
                q,
                w: weights,
                hp: hp.clone(),
                lay,
                b,
                n_split,
            },
            hp,
            cfg,
            chunk,
            stream_chunk,
            graph: None,
            use_graph: true,
            eager_steps: 0,
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

    /// Whether the decode graph (the hybrid placement's per-layer graphs) has been captured.
    pub fn graph_captured(&self) -> bool {
        self.graph.is_some()
    }

    /// "captured", "not yet", "off", or "failed: why" (then the step runs kernel by kernel).
    /// A placement with host work between layers says "captured (per layer)".
    pub fn graph_state(&self) -> String {
        let per_layer = matches!(self.graph, Some(StepGraph::PerLayer(_)));
        match (self.graph.is_some(), &self.graph_error, self.use_graph) {
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
    pub fn truncate(&mut self, slot: usize, n: usize) -> Result<()> {
        let len = self.slot_ref(slot)?;
        if n > len {
            return Err(Error::Input(format!(
                "cannot truncate slot {slot} to {n} positions: it holds {len}"
            )));
        }
        self.lens[slot] = n;
        Ok(())
    }

    /// Empties the slot.
    pub fn free(&mut self, slot: usize) -> Result<()> {
        self.truncate(slot, 0)
    }

    /// Runs `tokens` after the slot's cached positions, appends their keys and values to the
    /// slot, and writes the requested logits to `out` ([V] for Last, [T, V] for All).
    pub fn forward(
        &mut self,
        slot: usize,
        tokens: &[u32],
        want: Logits,
        out: &mut [f32],
    ) -> Result<()> {
        let vocab = self.hp.n_vocab;
        let start = self.slot_ref(slot)?;
        let n = tokens.len();
        if !check_forward_args(slot, start, tokens, want, out.len(), vocab, self.cfg.n_ctx)? {
            return Ok(());
        }
        let chunk = self.chunk_for(n);
        let mut p0 = start;
        for (ci, toks) in tokens.chunks(chunk).enumerate() {
            let (rows, dst) = chunk_logits(want, out, ci, chunk, toks.len(), n, vocab);
            if let Err(e) = self.run_chunk(slot, p0, toks, rows, dst) {
                // A failed call leaves the slot as it was (and no copy from the staging
                // buffers in flight).
                let _ = self.x.stream.sync();
                self.lens[slot] = start;
                return Err(e);
            }
            p0 += toks.len();
            self.lens[slot] = p0;
        }
        Ok(())
    }

    /// Tokens per chunk for a call of `n` tokens: `stream_chunk` when the placement streams
    /// chunks of that length, else `chunk`.
    fn chunk_for(&self, n: usize) -> usize {
        match self.moe.stream_min() {
            Some(min) if n >= min && self.stream_chunk >= min => self.stream_chunk,
            _ => self.chunk,
        }
    }

    /// One chunk of T tokens at positions p0..; the last `rows` rows' logits go to `dst`. A
    /// one-token step replays the captured graph(s) (captured after the first step ran
    /// eagerly); a placement with host work between layers waits on the host per layer.
    fn run_chunk(
        &mut self,
        slot: usize,
        p0: usize,
        toks: &[u32],
        rows: usize,
        dst: Option<&mut [f32]>,
    ) -> Result<()> {
        let t = toks.len();
        // pos0, slot, token ids → pinned staging → `params` (ordered before the kernels; the
        // staging is rewritten only after the sync that ends this call)
        let nb = 4 * (2 + t);
        {
            let pin = &mut self.pin_params.as_mut_slice()[..nb];
            let words = [p0 as i32, slot as i32];
            let ids = toks.iter().map(|&x| x as i32);
            for (c, v) in pin.chunks_exact_mut(4).zip(words.into_iter().chain(ids)) {
                c.copy_from_slice(&v.to_ne_bytes());
            }
        }
        let x = &self.x;
        x.b.params
            .write_async(&x.stream, 0, &self.pin_params, 0, nb)?;
        self.moe.before_step(&x.stream)?;
        let graph_ok = self.use_graph && self.graph_error.is_none();
        let graphed = t == 1 && graph_ok && (self.graph.is_some() || self.eager_steps > 0);
        if graphed && self.graph.is_none() {
            self.capture()?;
        }
        let (x, moe) = (&self.x, &mut self.moe);
        match self.graph.as_ref().filter(|_| graphed) {
            Some(StepGraph::Whole(g)) => {
                g.launch(&x.stream)?;
                moe.step_launched(x)?;
                self.logits_pinned(dst)?;
                return self.moe.after_step(&self.x);
            }
            Some(StepGraph::PerLayer(gs)) => {
                x.embed(1)?;
                for (l, g) in gs.iter().enumerate() {
                    g[0].launch(&x.stream)?;
                    moe.moe(x, l, 1, Some(&g[1]))?;
                }
            }
            None => {
                x.layers(t, &mut **moe)?;
                self.eager_steps += usize::from(t == 1);
            }
        }
        self.moe.step_launched(&self.x)?;
        self.logits_out(t, rows, dst)?;
        self.moe.after_step(&self.x)
    }

    /// The one-token step's logits row to `dst` through the pinned staging (then the stream
    /// is idle); without `dst`, only the sync.
    fn logits_pinned(&mut self, dst: Option<&mut [f32]>) -> Result<()> {
        let (x, vocab) = (&self.x, self.hp.n_vocab);
        if let Some(dst) = dst {
            let n = 4 * vocab;
            x.b.logits
                .read_async(&x.stream, 0, &mut self.pin_logits, 0, n)?;
            x.stream.sync()?;
            as_bytes_mut(&mut dst[..vocab]).copy_from_slice(&self.pin_logits.as_slice()[..n]);
            Ok(())
        } else {
            x.stream.sync()
        }
    }

    /// The last `rows` rows' logits of a chunk of `t` tokens to `dst` (then the stream is
    /// idle); without `dst`, only the sync.
    fn logits_out(&mut self, t: usize, rows: usize, dst: Option<&mut [f32]>) -> Result<()> {
        let (x, vocab) = (&self.x, self.hp.n_vocab);
        if let Some(dst) = dst {
            let first = t - rows;
            x.final_norm(first, rows)?;
            for (i, out) in dst.chunks_mut(LOGIT_ROWS * vocab).enumerate() {
                let nr = out.len() / vocab;
                x.head(first + i * LOGIT_ROWS, nr)?;
                x.b.logits.read_into(&x.stream, 0, out)?;
            }
        } else {
            x.stream.sync()?;
        }
        Ok(())
    }

    /// Captures the one-token step: as one graph (layers, final norm, head), or per layer
    /// when the placement works on the host between layers. A capture the driver refuses is
    /// recorded in `graph_error` and the step runs kernel by kernel from then on
    /// (`graph_state` says why); an error of the step itself is returned.
    fn capture(&mut self) -> Result<()> {
        let (x, moe) = (&self.x, &mut self.moe);
        if moe.host_per_layer() {
            return self.capture_per_layer();
        }
        x.stream.begin_capture()?;
        let body = x
            .layers(1, &mut **moe)
            .and_then(|()| x.final_norm(0, 1))
            .and_then(|()| x.head(0, 1));
        let g = x.stream.end_capture();
        body?;
        match g {
            Ok(g) => self.graph = Some(StepGraph::Whole(g)),
            Err(e) => self.graph_error = Some(e.to_string()),
        }
        Ok(())
    }

    /// The per-layer graphs of the one-token step: [attention, router, the placement's
    /// `pre`; its `resident` experts] (its host work runs between them).
    fn capture_per_layer(&mut self) -> Result<()> {
        let (x, moe) = (&self.x, &mut self.moe);
        let mut gs = Vec::with_capacity(x.w.layers.len());
        for l in 0..x.w.layers.len() {
            let mut pair = Vec::with_capacity(2);
            for part in 0..2 {
                x.stream.begin_capture()?;
                let body = if part == 0 {
                    x.attn_router(l, 1).and_then(|()| moe.pre(x, l, 1))
                } else {
                    moe.resident(x, l, 1)
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
            let [a, b]: [Graph; 2] = pair
                .try_into()
                .map_err(|_| Error::Config("a layer's graphs were not both captured".into()))?;
            gs.push([a, b]);
        }
        self.graph = Some(StepGraph::PerLayer(gs));
        Ok(())
    }
}
