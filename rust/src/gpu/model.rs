//! `GpuModel`: the public face of the GPU forward pass, its buffers and the KV slots.
//!
//! Legend: T = tokens in a chunk (≤ chunk = min(max_chunk, n_ctx), or the hybrid mode's
//! streamed chunk when longer: the buffers hold the longer), H = hidden, Nh / Nkv =
//! query / KV heads, D = head dim, E = experts, K = experts used, F = expert FFN width,
//! V = vocab, C = n_ctx.
//! Every per-call value the kernels need (pos0, slot, token ids) sits in one device buffer
//! (`params` i32 [2 + chunk]) written before the launches, so the one-token decode step is
//! captured once as a CUDA graph and replayed for any slot and position.

use super::hybrid::{Hybrid, HybridConfig, HybridInfo};
use super::weights::GpuWeights;
use crate::cuda::ops::attention::{self, KvLayout};
use crate::cuda::ops::quant::{self, QuantOps};
use crate::cuda::ops::view::{bytes, prod};
use crate::cuda::{as_bytes_mut, DevBuf, Gpu, Graph, PinnedBuf, Stream};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::model::forward::{check_forward_args, chunk_logits};
use crate::model::ops::Rope;
use crate::model::weights::Weights;
use crate::model::{HParams, Logits, ModelConfig};
use std::path::Path;
use std::sync::Arc;

/// Chunks of at most this many tokens use the decode attention kernel (split over the
/// positions); longer ones the prefill kernel.
pub const DECODE_MAX_TOKENS: usize = 8;
/// Logit rows computed per output-head launch (bounds the logits buffer).
const LOGIT_ROWS: usize = 64;

pub(super) struct Bufs {
    pub params: DevBuf,  // i32 [2 + chunk]: pos0, slot, token ids
    pub x: DevBuf,       // f32 [T, H] residual stream
    pub h: DevBuf,       // f32 [T, H] normed block input
    pub o: DevBuf,       // f32 [T, H] attention output projection
    pub q: DevBuf,       // f32 [T, Nh·D]
    pub att: DevBuf,     // f32 [T, Nh·D]
    pub k: DevBuf,       // f32 [T, Nkv·D]
    pub v: DevBuf,       // f32 [T, Nkv·D]
    pub router: DevBuf,  // f32 [T, E]
    pub ids: DevBuf,     // i32 [T, K]
    pub wts: DevBuf,     // f32 [T, K]
    pub act: DevBuf,     // f32 [T, K, F]
    pub scratch: DevBuf, // the quant kernels' scratch
    pub part_o: DevBuf,  // decode attention partials
    pub part_ml: DevBuf,
    pub logits: DevBuf, // f32 [LOGIT_ROWS, V]
    pub kc: DevBuf,     // K cache (KvLayout)
    pub vc: DevBuf,     // V cache
    pub cos: DevBuf,    // f32 [C, n_rot/2]
    pub sin: DevBuf,    // f32 [C, n_rot/2]
}

pub struct GpuModel {
    pub hp: HParams,
    pub cfg: ModelConfig,
    pub(super) gpu: Arc<Gpu>,
    pub(super) stream: Stream,
    pub(super) q: QuantOps,
    pub(super) w: GpuWeights,
    pub(super) lay: KvLayout,
    pub(super) b: Bufs,
    pub(super) chunk: usize,
    /// Tokens per chunk of a hybrid prefill whose chunks stream (`HybridConfig::stream_chunk`;
    /// the buffers hold max(chunk, stream_chunk) tokens).
    stream_chunk: usize,
    pub(super) n_split: usize,
    pub(super) lens: Vec<usize>,
    /// Names this model in KV exports (`kv_blob::fingerprint`).
    pub(super) fingerprint: u64,
    /// Page-locked staging of `params` and of one row of logits: the per-token copies go
    /// straight to and from them (no driver staging through pageable memory).
    pin_params: PinnedBuf,
    pin_logits: PinnedBuf,
    graph: Option<Graph>,
    use_graph: bool,
    /// One-token steps run so far without the graph (the first one runs eagerly: it
    /// resolves every kernel and checks the step before it is captured).
    eager_steps: usize,
    /// Why capturing the decode graph failed (the step then runs kernel by kernel).
    graph_error: Option<String>,
    /// The hybrid one-token step's graphs, per layer: [attention, router and the routing to
    /// the host; the resident experts] (the host's split and the CPU misses run between).
    hy_graphs: Option<Vec<[Graph; 2]>>,
    /// Bytes of the routed-expert tensors and of everything else (for `hparams`).
    pub expert_bytes: usize,
    pub non_expert_bytes: usize,
    /// The hybrid mode (`gpu::hybrid`): experts in the VRAM tier's slots and on the CPU.
    hybrid: Option<Box<Hybrid>>,
}

/// Buffers besides the weights and the KV cache that the automatic hybrid decision assumes
/// (activations, scratch, the CUDA context's own needs).
const BUFFER_ALLOWANCE: usize = 512 << 20;

fn alloc_f32(gpu: &Gpu, dims: &[usize]) -> Result<DevBuf> {
    gpu.alloc(bytes(prod(dims)?, 4)?)
}

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
        let (hd, qd, kvd) = (hp.n_embd, hp.q_dim(), hp.kv_dim());
        let (e, k, f) = (hp.n_expert, hp.n_expert_used, hp.n_ff_exp);
        let n_split = attention::n_split(&gpu, hp.n_head_kv, cfg.n_ctx);
        let td = t.min(DECODE_MAX_TOKENS);
        let (po, pml) = attention::part_bytes(td, hp.n_head, n_split, hp.head_dim)?;
        let scratch = [hd, qd]
            .iter()
            .map(|&kk| quant::scratch_bytes(kk, t))
            .chain([quant::moe_scratch_bytes(hd, f, k, t)])
            .max()
            .unwrap_or(0);
        // cos/sin of every position, from the CPU path's table (exact parity of the angles)
        let rope = Rope::new(&hp);
        let half = hp.n_rot / 2;
        let mut cos = vec![0f32; cfg.n_ctx * half];
        let mut sin = vec![0f32; cfg.n_ctx * half];
        for p in 0..cfg.n_ctx {
            let r = p * half..(p + 1) * half;
            rope.table(p, &mut cos[r.clone()], &mut sin[r]);
        }
        let b = Bufs {
            params: gpu.alloc(bytes(2 + t, 4)?)?,
            x: alloc_f32(&gpu, &[t, hd])?,
            h: alloc_f32(&gpu, &[t, hd])?,
            o: alloc_f32(&gpu, &[t, hd])?,
            q: alloc_f32(&gpu, &[t, qd])?,
            att: alloc_f32(&gpu, &[t, qd])?,
            k: alloc_f32(&gpu, &[t, kvd])?,
            v: alloc_f32(&gpu, &[t, kvd])?,
            router: alloc_f32(&gpu, &[t, e])?,
            ids: alloc_f32(&gpu, &[t, k])?,
            wts: alloc_f32(&gpu, &[t, k])?,
            act: alloc_f32(&gpu, &[t, k, f])?,
            scratch: gpu.alloc(scratch)?,
            part_o: gpu.alloc(po)?,
            part_ml: gpu.alloc(pml)?,
            logits: alloc_f32(&gpu, &[LOGIT_ROWS.min(t), hp.n_vocab])?,
            kc: gpu.alloc(lay.total())?,
            vc: gpu.alloc(lay.total())?,
            cos: gpu.upload_pod(&cos)?,
            sin: gpu.upload_pod(&sin)?,
        };
        let pin_params = gpu.host_alloc(bytes(2 + t, 4)?)?;
        let pin_logits = gpu.host_alloc(bytes(hp.n_vocab, 4)?)?;
        // never-written positions hold zeros, not garbage
        b.kc.zero(&stream)?;
        b.vc.zero(&stream)?;
        b.part_ml.zero(&stream)?; // the decode kernel's finish counters start at zero
        stream.sync()?;
        let (expert_bytes, non_expert_bytes) = (w.expert_bytes(), w.non_expert_bytes());
        let attn_norm0 = w.layers.first().map_or(&[][..], |l| &l.attn_norm[..]);
        let fingerprint = crate::model::kv_blob::fingerprint(&hp, &w.output_norm, attn_norm0);
        let hybrid = match hybrid {
            Some(h) => Some(Box::new(Hybrid::new(
                &gpu,
                &hp,
                w,
                t,
                h,
                free0,
                weights.bytes,
                2 * lay.total(),
            )?)),
            None => None,
        };
        Ok(GpuModel {
            hybrid,
            expert_bytes,
            non_expert_bytes,
            lens: vec![0; cfg.n_slots],
            fingerprint,
            pin_params,
            pin_logits,
            hp,
            cfg,
            gpu,
            stream,
            q,
            w: weights,
            lay,
            b,
            chunk,
            stream_chunk,
            n_split,
            graph: None,
            use_graph: true,
            eager_steps: 0,
            graph_error: None,
            hy_graphs: None,
        })
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub fn n_slots(&self) -> usize {
        self.lens.len()
    }

    /// Bytes of the K and V caches together.
    pub fn kv_bytes(&self) -> usize {
        2 * self.lay.total()
    }

    /// The hybrid mode's plan and state (None: every weight in VRAM).
    pub fn hybrid_info(&self) -> Option<HybridInfo> {
        self.hybrid.as_ref().map(|h| {
            let mut i = h.info();
            if i.stream_areas > 0 {
                i.stream_chunk = self.stream_chunk;
            }
            i
        })
    }

    /// The hybrid mode's counters (None: every weight in VRAM).
    pub fn hybrid_counters(&self) -> Option<Arc<crate::tier::vram::HybridCounters>> {
        self.hybrid.as_ref().map(|h| h.counters.clone())
    }

    /// The routing counters of the hybrid mode (the routed ids reach the host there):
    /// undecayed since load, or decayed ("hot"). None: every weight in VRAM (not counted).
    pub fn routing(&self, decayed: bool) -> Option<Arc<crate::tier::RoutingCounters>> {
        self.hybrid.as_ref().map(|h| {
            if decayed {
                h.routing_hot.clone()
            } else {
                h.routing.clone()
            }
        })
    }

    /// Replays the one-token step from a captured CUDA graph (the default) or launches its
    /// kernels one by one; both compute the same thing.
    pub fn set_graph(&mut self, on: bool) {
        self.use_graph = on;
    }

    /// Whether the decode graph (the hybrid mode's per-layer graphs) has been captured.
    pub fn graph_captured(&self) -> bool {
        self.graph.is_some() || self.hy_graphs.is_some()
    }

    /// "captured", "not yet", "off", or "failed: why" (then the step runs kernel by kernel).
    /// The hybrid mode says "captured (per layer)" for its per-layer graphs.
    pub fn graph_state(&self) -> String {
        let captured = match self.hybrid {
            Some(_) => self.hy_graphs.is_some(),
            None => self.graph.is_some(),
        };
        match (captured, &self.graph_error, self.use_graph) {
            (true, _, true) if self.hybrid.is_some() => "captured (per layer)".into(),
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
                let _ = self.stream.sync();
                self.lens[slot] = start;
                return Err(e);
            }
            p0 += toks.len();
            self.lens[slot] = p0;
        }
        Ok(())
    }

    /// Tokens per chunk for a call of `n` tokens: `stream_chunk` when the hybrid mode streams
    /// chunks of that length, else `chunk`.
    fn chunk_for(&self, n: usize) -> usize {
        match self.hybrid.as_ref().and_then(|h| h.stream_min()) {
            Some(min) if n >= min && self.stream_chunk >= min => self.stream_chunk,
            _ => self.chunk,
        }
    }

    /// One chunk of T tokens at positions p0..; the last `rows` rows' logits go to `dst`.
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
        self.b
            .params
            .write_async(&self.stream, 0, &self.pin_params, 0, nb)?;
        let vocab = self.hp.n_vocab;
        if self.hybrid.is_some() {
            return self.run_chunk_hybrid(t, rows, dst);
        }
        let graph_ok = self.use_graph && self.graph_error.is_none();
        if t == 1 && graph_ok && (self.graph.is_some() || self.eager_steps > 0) {
            if self.graph.is_none() {
                self.capture()?;
            }
            match &self.graph {
                Some(g) => g.launch(&self.stream)?,
                None => self.one_token_step()?,
            }
            if let Some(dst) = dst {
                let n = 4 * vocab;
                self.b
                    .logits
                    .read_async(&self.stream, 0, &mut self.pin_logits, 0, n)?;
                self.stream.sync()?;
                as_bytes_mut(&mut dst[..vocab]).copy_from_slice(&self.pin_logits.as_slice()[..n]);
            } else {
                self.stream.sync()?;
            }
            return Ok(());
        }
        self.layers(t, None)?;
        if t == 1 {
            self.eager_steps += 1;
        }
        self.logits_out(t, rows, dst)
    }

    /// One chunk in the hybrid mode, with a host wait per layer, between the tier's gaps; a
    /// one-token step replays per-layer graphs (captured after the first step ran eagerly).
    /// `params` is queued already.
    fn run_chunk_hybrid(&mut self, t: usize, rows: usize, dst: Option<&mut [f32]>) -> Result<()> {
        let mut hy = self.hybrid.take().expect("hybrid mode");
        let r = (|| -> Result<()> {
            hy.before_step(&self.stream)?;
            let graph_ok = self.use_graph && self.graph_error.is_none();
            let graphed = t == 1 && graph_ok && (self.hy_graphs.is_some() || self.eager_steps > 0);
            if graphed && self.hy_graphs.is_none() {
                self.capture_hybrid(&mut hy)?;
            }
            match self.hy_graphs.as_ref().filter(|_| graphed) {
                Some(gs) => self.layers_graphed(&mut hy, gs)?,
                None => {
                    self.layers(t, Some(&mut hy))?;
                    self.eager_steps += usize::from(t == 1);
                }
            }
            hy.step_launched(&self.gpu, &self.stream)?;
            self.logits_out(t, rows, dst)?;
            hy.after_step(self.hp.n_expert_used)
        })();
        self.hybrid = Some(hy);
        r
    }

    /// The last `rows` rows' logits of a chunk of `t` tokens to `dst` (then the stream is
    /// idle); without `dst`, only the sync.
    fn logits_out(&mut self, t: usize, rows: usize, dst: Option<&mut [f32]>) -> Result<()> {
        let vocab = self.hp.n_vocab;
        if let Some(dst) = dst {
            let first = t - rows;
            self.final_norm(first, rows)?;
            for (i, out) in dst.chunks_mut(LOGIT_ROWS * vocab).enumerate() {
                let nr = out.len() / vocab;
                self.head(first + i * LOGIT_ROWS, nr)?;
                self.b.logits.read_into(&self.stream, 0, out)?;
            }
        } else {
            self.stream.sync()?;
        }
        Ok(())
    }

    /// The hybrid one-token step's layers from the per-layer graphs `gs`.
    fn layers_graphed(&self, hy: &mut Hybrid, gs: &[[Graph; 2]]) -> Result<()> {
        self.embed(1)?;
        for ((l, lw), g) in self.w.layers.iter().enumerate().zip(gs) {
            g[0].launch(&self.stream)?;
            let (gpu, s, q, hp, b) = (&self.gpu, &self.stream, &self.q, &self.hp, &self.b);
            hy.moe_layer(gpu, s, q, hp, b, lw, l, 1, Some(&g[1]))?;
        }
        Ok(())
    }

    /// Captures the hybrid one-token step's per-layer graphs (as `capture`: a refused capture
    /// goes to `graph_error`, and the step runs kernel by kernel).
    fn capture_hybrid(&mut self, hy: &mut Hybrid) -> Result<()> {
        let mut gs = Vec::with_capacity(self.w.layers.len());
        for (l, lw) in self.w.layers.iter().enumerate() {
            let mut pair = Vec::with_capacity(2);
            for part in 0..2 {
                self.stream.begin_capture()?;
                let body = if part == 0 {
                    self.attn_router(l, 1)
                        .and_then(|()| hy.moe_pre(&self.stream, &self.b, 1))
                } else {
                    hy.resident(&self.q, &self.stream, &self.hp, &self.b, lw, l, 1)
                };
                let g = self.stream.end_capture();
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
        self.hy_graphs = Some(gs);
        Ok(())
    }

    /// Captures the one-token step as a graph. A capture the driver refuses is recorded in
    /// `graph_error` and the step runs kernel by kernel from then on (`graph_state` says
    /// why); an error of the step itself is returned.
    fn capture(&mut self) -> Result<()> {
        self.stream.begin_capture()?;
        let body = self.one_token_step();
        let g = self.stream.end_capture();
        body?;
        match g {
            Ok(g) => self.graph = Some(g),
            Err(e) => self.graph_error = Some(e.to_string()),
        }
        Ok(())
    }

    /// The whole one-token step (what the decode graph holds): layers, final norm, head.
    fn one_token_step(&self) -> Result<()> {
        self.layers(1, None)?;
        self.final_norm(0, 1)?;
        self.head(0, 1)
    }
}
