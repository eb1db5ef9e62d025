//! `strata._core.Model`: the forward pass and its KV-cache slots, on the CPU (`Model`, over
//! the expert pool) or on a GPU (`GpuModel`, every weight in VRAM): `device="cpu"|"cuda"`.
//! Every heavy call releases the GIL; a model is used by one thread at a time (calls
//! serialize on its lock).

use super::backend::{Backend, MTP_CPU};
use super::batch_args::{self, parse_logits, RawEntry};
use super::cuda::shared_gpu;
use super::open_args::{config_default, make_compute};
use super::tier::{prefetch_dict, ExpertTier, Profile, RoutingCounters};
use super::vram::HybridCounters;
use crate::error::{Error, Result};
use crate::gpu::{GpuModel, HopKind, HybridConfig, SplitConfig};
use crate::model::batch::batch_logits_len;
use crate::model::{KvType, Logits, Model, ModelConfig};
use crate::quant::dot;
use crate::tier::vram::AdaptConfig;
use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

/// `$v`, or the settings object's default of the keyword of the same name when left out.
macro_rules! or_default {
    ($py:expr, $($v:ident),+) => {
        $( let $v = match $v {
            Some(v) => v,
            None => config_default($py, stringify!($v))?,
        }; )+
    };
}

/// The most sequences one model holds (`LLM` caps `parallel` at 4096, plus its own slot).
const MAX_SLOTS: usize = 8192;
#[pyclass(frozen, name = "Model")]
pub struct PyModel {
    inner: Mutex<Backend>,
    /// `forward_batch`'s logits, kept between calls: a step's [rows, V] f32 (2.4 MB at four
    /// decode rows of a 151,936 vocabulary) allocated and zeroed afresh each step cost the
    /// batched step its page faults. Taken out for a call and put back after it (a call
    /// running at the same time in another thread allocates its own); not kept past
    /// `KEEP_LOGITS` values (a prompt's "all" logits are freed with the call).
    logits: Mutex<Vec<f32>>,
}

/// The most logit values `forward_batch` keeps for the next call (64 MiB of f32: a 64-row
/// speculative window of a 151,936 vocabulary, 39 MB, stays).
const KEEP_LOGITS: usize = 16 << 20;

impl PyModel {
    fn lock(&self) -> MutexGuard<'_, Backend> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the model with the GIL released, so that waiting for a forward call in
    /// another thread never holds up the interpreter.
    fn with<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Backend) -> R + Send) -> R {
        py.detach(|| f(&mut self.lock()))
    }
}

struct Snapshot {
    hp: crate::model::HParams,
    n_ctx: usize,
    n_slots: usize,
    kv_type: &'static str,
    chunk: usize,
    expert_bytes: usize,
    non_expert_bytes: usize,
    kv_bytes: usize,
    repack_bytes: usize,
    repack_proj_bytes: usize,
    recurrent_bytes: usize,
    device: &'static str,
}

#[pymethods]
impl PyModel {
    /// Opens a GGUF and builds the KV cache: `n_slots` sequences of `n_ctx` positions. Every
    /// keyword named like a `strata.config.Config` field means what the field means, and a
    /// keyword left out takes the field's default (`Config.default`).
    /// `device="cpu"`: compute runs on the CPU expert pool: `threads` compute threads in all,
    /// the caller included, as llama.cpp's `-t` (0: one per physical core; -1: the serial
    /// single-threaded reference instead). `isa` fixes the dot kernels' instruction set for
    /// the process ("auto": the best the CPU runs). `device="cuda"`: every weight and the KV cache in the VRAM of GPU
    /// 0 (f16 or q8_0 cache); the one-token step replays a CUDA graph unless `cuda_graph` is
    /// false. No usable GPU raises `GpuError` saying why.
    /// The hybrid mode (docs/TIERS_VRAM.md) keeps the experts in RAM and the hottest of them
    /// in VRAM slots; the CPU pool (`threads`) computes the others. It is on when
    /// `vram_budget_mib` > 0 (dense weights, KV and buffers first, the rest as slots) or
    /// `vram_slots` ≥ 0 (at most that many slots), or when the model does not fit in the free
    /// VRAM minus `vram_reserve_mib`. Slots are filled hottest first along `profile` (else the
    /// same share of every layer); every `adapt_every` steps up to `adapt_swaps` experts swap
    /// in (0: never), chosen on a helper thread with `tier_async`. Chunks of at least
    /// `stream_min_tokens` tokens (0: none) copy each layer's missing experts over PCIe and
    /// run every pair on the GPU; shorter ones (decode) compute the misses on the CPU. A call
    /// whose chunks stream is cut into chunks of `stream_chunk` tokens (0: `prefill_chunk`;
    /// the buffers are sized for the longer of the two), and `stream_threads` threads (0: one
    /// per core, at most 8) copy the experts into page-locked bounce buffers. `pcie_frac` of
    /// the missed experts of decode steps (0..1; negative: from a probe of the link and the
    /// RAM at start; 0: none) run on the GPU, read over PCIe from the registered mapping.
    /// `defer_experts` = n adds each token's n lowest-weight CPU misses of a layer to the
    /// residual one layer later (the pool, one thread fewer so the loop's thread keeps a
    /// core, overlaps the next layer's GPU work; not exact; 0: off).
    /// `gpus` ("0,0": one GPU as two stages), `layer_split` and `pipeline_windows` cut the
    /// layers into stages (docs/PROTOCOL.md); `split_hop="host"` sends the activations between
    /// stages through page-locked host memory even on one device (the hop between two
    /// devices; "auto": a device-to-device copy on one device).
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (path, n_ctx=None, n_slots=1, kv_type=None, prefill_chunk=None,
                        threads=None, host_participates=None, pool_pipeline=None, pool_balanced=None,
                        device=None,
                        cuda_graph=true, vram_budget_mib=None, vram_reserve_mib=None,
                        vram_slots=None, adapt_every=None, adapt_swaps=None, tier_async=None,
                        profile=None, stream_min_tokens=None, stream_chunk=None,
                        stream_threads=None, cpu_repack=None, pcie_frac=None, isa=None,
                        gpus=None, layer_split=None, pipeline_windows=None, split_hop="auto",
                        defer_experts=None))]
    fn open(
        py: Python<'_>,
        path: PathBuf,
        n_ctx: Option<usize>,
        n_slots: usize,
        kv_type: Option<String>,
        prefill_chunk: Option<usize>,
        threads: Option<i64>,
        host_participates: Option<bool>,
        pool_pipeline: Option<bool>,
        pool_balanced: Option<bool>,
        device: Option<String>,
        cuda_graph: bool,
        vram_budget_mib: Option<i64>,
        vram_reserve_mib: Option<u64>,
        vram_slots: Option<i64>,
        adapt_every: Option<u32>,
        adapt_swaps: Option<u32>,
        tier_async: Option<bool>,
        profile: Option<PyRef<'_, Profile>>,
        stream_min_tokens: Option<usize>,
        stream_chunk: Option<usize>,
        stream_threads: Option<usize>,
        cpu_repack: Option<bool>,
        pcie_frac: Option<f64>,
        isa: Option<String>,
        gpus: Option<String>,
        layer_split: Option<String>,
        pipeline_windows: Option<usize>,
        split_hop: &str,
        defer_experts: Option<usize>,
    ) -> PyResult<Self> {
        or_default!(
            py,
            n_ctx,
            kv_type,
            prefill_chunk,
            threads,
            host_participates,
            pool_pipeline,
            pool_balanced,
            device,
            vram_budget_mib,
            vram_reserve_mib,
            vram_slots,
            adapt_every,
            adapt_swaps,
            tier_async,
            stream_min_tokens,
            stream_chunk,
            stream_threads,
            cpu_repack,
            pcie_frac,
            isa,
            gpus,
            layer_split,
            pipeline_windows,
            defer_experts
        );
        if !isa.eq_ignore_ascii_case("auto") {
            let want = dot::Isa::from_name(&isa).ok_or_else(|| {
                Error::Config(format!(
                    "isa {isa:?} is not one of auto, scalar, avx2, avx512"
                ))
            })?;
            dot::set_active_isa(want)?;
        }
        super::heap::keep_freed_heap();
        if n_slots > MAX_SLOTS {
            return Err(Error::Config(format!(
                "n_slots {n_slots} is more than the {MAX_SLOTS} sequences one model holds"
            ))
            .into());
        }
        let cfg = ModelConfig {
            n_ctx,
            n_slots,
            kv_type: KvType::parse(&kv_type)?,
            max_chunk: prefill_chunk,
            cpu_repack,
        };
        let loop_core = defer_experts > 0 && device == "cuda";
        let pool = (host_participates, pool_pipeline, pool_balanced);
        let make = move || make_compute(threads, pool, loop_core);
        match device.as_str() {
            "cpu" => {}
            "cuda" => {
                let hybrid = HybridConfig {
                    budget_mib: (vram_budget_mib > 0).then_some(vram_budget_mib as u64),
                    reserve_mib: vram_reserve_mib,
                    max_slots: (vram_slots >= 0).then_some(vram_slots as usize),
                    only_if_needed: vram_budget_mib <= 0 && vram_slots < 0,
                    adapt: AdaptConfig {
                        every: adapt_every,
                        swaps: adapt_swaps,
                        ..AdaptConfig::default()
                    },
                    tier_async,
                    profile: profile.map(|p| p.inner.clone()),
                    stream_min_tokens,
                    stream_chunk,
                    stream_threads,
                    pcie_frac,
                    defer_experts,
                    compute: Box::new(make),
                };
                let split = SplitConfig {
                    gpus: SplitConfig::parse_gpus(&gpus)?,
                    layer_split,
                    pipeline_windows,
                    hop: HopKind::parse(split_hop)?,
                };
                let b = py.detach(|| -> Result<Backend> {
                    let _gpu = shared_gpu()?; // keeps GPU 0's context between models
                    let mut m = Box::new(GpuModel::open(&path, cfg, &split, Some(hybrid))?);
                    m.set_graph(cuda_graph);
                    Ok(Backend::Gpu { m })
                })?;
                return Ok(PyModel {
                    logits: Mutex::default(),
                    inner: Mutex::new(b),
                });
            }
            other => {
                return Err(Error::Config(format!(
                    "device {other:?} is not one of \"cpu\", \"cuda\""
                ))
                .into())
            }
        }
        let compute = make();
        let m = py.detach(|| Model::open(&path, cfg, compute))?;
        Ok(PyModel {
            logits: Mutex::default(),
            inner: Mutex::new(Backend::Cpu(Box::new(m))),
        })
    }

    /// Hyper-parameters and sizes as a dict.
    #[getter]
    fn hparams<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.with(py, |b| match b {
            Backend::Cpu(m) => Snapshot {
                hp: m.hp.clone(),
                n_ctx: m.cfg.n_ctx,
                n_slots: m.kv.n_slots(),
                kv_type: m.kv.ty.name(),
                chunk: m.cfg.max_chunk,
                expert_bytes: m.weights.expert_bytes(),
                non_expert_bytes: m.weights.non_expert_bytes(),
                kv_bytes: m.kv.bytes(),
                repack_bytes: m.repack_bytes(),
                repack_proj_bytes: m.repack_proj_bytes(),
                recurrent_bytes: m.recurrent_slot_bytes(),
                device: "cpu",
            },
            Backend::Gpu { m, .. } => Snapshot {
                hp: m.hp.clone(),
                n_ctx: m.cfg.n_ctx,
                n_slots: m.n_slots(),
                kv_type: m.cfg.kv_type.name(),
                chunk: m.cfg.max_chunk,
                expert_bytes: m.expert_bytes,
                non_expert_bytes: m.non_expert_bytes,
                kv_bytes: m.kv_bytes(),
                repack_bytes: 0,
                repack_proj_bytes: 0,
                recurrent_bytes: m.recurrent_slot_bytes(),
                device: "cuda",
            },
        });
        let hp = &s.hp;
        let d = PyDict::new(py);
        d.set_item("architecture", &hp.arch)?;
        d.set_item("n_layer", hp.n_layer)?;
        d.set_item("n_ctx_train", hp.n_ctx_train)?;
        d.set_item("n_embd", hp.n_embd)?;
        d.set_item("n_head", hp.n_head)?;
        d.set_item("n_head_kv", hp.n_head_kv)?;
        d.set_item("head_dim", hp.head_dim)?;
        d.set_item("n_rot", hp.n_rot)?;
        d.set_item("n_expert", hp.n_expert)?;
        d.set_item("n_expert_used", hp.n_expert_used)?;
        d.set_item("n_ff_exp", hp.n_ff_exp)?;
        d.set_item("n_vocab", hp.n_vocab)?;
        // A hybrid family: slots keep a recurrent state (truncate only to 0, no KV export).
        d.set_item("recurrent", hp.ssm.is_some())?;
        d.set_item("rms_eps", hp.rms_eps)?;
        d.set_item("rope_freq_base", hp.rope_freq_base)?;
        d.set_item("rope_scaling", format!("{:?}", hp.rope_scaling))?;
        d.set_item("n_ctx", s.n_ctx)?;
        d.set_item("n_slots", s.n_slots)?;
        d.set_item("kv_type", s.kv_type)?;
        d.set_item("prefill_chunk", s.chunk)?;
        d.set_item("expert_bytes", s.expert_bytes)?;
        d.set_item("non_expert_bytes", s.non_expert_bytes)?;
        d.set_item("kv_bytes", s.kv_bytes)?;
        d.set_item("repack_bytes", s.repack_bytes)?;
        // of which the attention projections' copies (the rest: the head's)
        d.set_item("repack_proj_bytes", s.repack_proj_bytes)?;
        // Per slot: a hybrid's recurrent state (f32), beside its KV; checkpoints add up to
        // `model::checkpoints::CAP` copies of it per slot that runs windows.
        d.set_item("recurrent_state_bytes", s.recurrent_bytes)?;
        d.set_item("device", s.device)?;
        Ok(d)
    }

    #[getter]
    fn n_vocab(&self, py: Python<'_>) -> usize {
        self.with(py, |m| m.hp().n_vocab)
    }

    #[getter]
    fn n_ctx(&self, py: Python<'_>) -> usize {
        self.with(py, |m| m.cfg().n_ctx)
    }

    #[getter]
    fn n_slots(&self, py: Python<'_>) -> usize {
        self.with(py, |m| m.n_slots())
    }

    /// Runs `token_ids` after the slot's cached positions and appends them to the slot.
    /// `logits`: "last" → (n_vocab,), "all" → (len, n_vocab), "none" → (0, n_vocab).
    #[pyo3(signature = (slot, token_ids, logits="last"))]
    fn forward<'py>(
        &self,
        py: Python<'py>,
        slot: usize,
        token_ids: Vec<u32>,
        logits: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let want = parse_logits(logits)?;
        let (out, vocab) = py.detach(|| -> crate::Result<(Vec<f32>, usize)> {
            let mut m = self.lock();
            let vocab = m.hp().n_vocab;
            let n = match want {
                Logits::None => 0,
                Logits::Last => vocab,
                Logits::All | Logits::Window => token_ids.len() * vocab,
            };
            let mut out = vec![0f32; n];
            m.forward(slot, &token_ids, want, &mut out)?;
            Ok((out, vocab))
        })?;
        Ok(match want {
            Logits::Last => PyArray1::from_vec(py, out).into_any(),
            _ => {
                let rows = out.len() / vocab;
                PyArray1::from_vec(py, out)
                    .reshape([rows, vocab])?
                    .into_any()
            }
        })
    }

    /// One forward pass over several slots: `entries` are `(slot, token_ids, logits)`, each
    /// continuing its slot at the slot's length (slots distinct within a call; `logits` as in
    /// `forward`). Returns per entry None ("none"), (n_vocab,) ("last") or
    /// (len, n_vocab) ("all"; "window": the same, each row bitwise a one-token step's on the
    /// CPU path, for verifying a speculative window). A refused call (bad slot, duplicate slot, token id, context
    /// overflow) raises and changes no slot.
    fn forward_batch<'py>(
        &self,
        py: Python<'py>,
        entries: Vec<RawEntry>,
    ) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
        let wants = batch_args::wants(&entries)?;
        let buf = std::mem::take(&mut *self.logits.lock().unwrap_or_else(|e| e.into_inner()));
        let (buf, n, vocab) = py.detach(|| -> crate::Result<(Vec<f32>, usize, usize)> {
            let batch = batch_args::entries(&entries, &wants);
            let mut m = self.lock();
            let vocab = m.hp().n_vocab;
            let n = batch_logits_len(&batch, vocab);
            let mut buf = buf;
            if buf.len() < n {
                buf.resize(n, 0.0);
            }
            m.forward_batch(&batch, &mut buf[..n])?;
            Ok((buf, n, vocab))
        })?;
        let shapes = entries.iter().zip(&wants).map(|(e, &w)| (w, e.1.len()));
        let res = batch_args::results(py, shapes, &buf[..n], vocab);
        if buf.len() <= KEEP_LOGITS {
            *self.logits.lock().unwrap_or_else(|e| e.into_inner()) = buf;
        }
        res
    }

    /// Pipelined windows (`pipeline_windows` 2, device="cuda"; docs/PROTOCOL.md): launches
    /// `entries` (as `forward_batch`'s, one step) as a window and returns once its first
    /// stage's work is done; `finish_batch` returns the oldest window's logits as
    /// `forward_batch` would, and `settle(accepted)` tells whether the window launched after
    /// it may go on (a rejection discards it and puts its slots back).
    fn launch_batch(&self, py: Python<'_>, entries: Vec<RawEntry>) -> PyResult<()> {
        let wants = batch_args::wants(&entries)?;
        self.with(py, |m| {
            m.gpu("launch_batch")?
                .launch_batch(&batch_args::entries(&entries, &wants))
        })?;
        Ok(())
    }

    /// The oldest pipelined window's logits (see `launch_batch`).
    fn finish_batch<'py>(&self, py: Python<'py>) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
        let (out, shapes, vocab) = self.with(py, |m| -> crate::Result<_> {
            let m = m.gpu("finish_batch")?;
            let mut out = Vec::new();
            let shapes = m.finish_batch(&mut out)?;
            Ok((out, shapes, m.hp.n_vocab))
        })?;
        batch_args::results(py, shapes.into_iter(), &out, vocab)
    }

    /// Settles the oldest pipelined window's verdict (see `launch_batch`).
    fn settle(&self, py: Python<'_>, accepted: bool) -> PyResult<()> {
        Ok(self.with(py, |m| m.gpu("settle")?.settle(accepted))?)
    }

    /// Windows at most in flight (1 unless `pipeline_windows` 2 on the GPU path).
    #[getter]
    fn pipeline_windows(&self, py: Python<'_>) -> usize {
        self.with(py, |m| match m {
            Backend::Gpu { m } => m.pipeline_windows(),
            Backend::Cpu(_) => 1,
        })
    }

    /// The slot's first `n` positions (every layer's keys and values, in the KV type) as
    /// bytes that `kv_import` of this model and KV type takes back.
    fn kv_export<'py>(
        &self,
        py: Python<'py>,
        slot: usize,
        n: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let v = self.with(py, |m| m.kv_export(slot, n))?;
        Ok(PyBytes::new(py, &v))
    }

    /// Replaces the slot's KV with `data` from `kv_export`; returns its length in positions.
    /// Data of another model or KV type raises ValueError and leaves the slot as it was.
    fn kv_import(&self, py: Python<'_>, slot: usize, data: &[u8]) -> PyResult<usize> {
        Ok(self.with(py, |m| m.kv_import(slot, data))?)
    }

    /// Moves cached chunks down (llama-server's `--cache-reuse`): the slot keeps its first
    /// `keep` positions, then each `(from, n)` of `chunks` in order (ascending, apart) at the
    /// next position, its keys rotated by the move; returns the slot's new length. Refused
    /// (ValueError / ModelError) for chunks out of order or past the slot's length and for
    /// the families whose slots keep a recurrent state; the slot is as it was then.
    fn kv_shift(
        &self,
        py: Python<'_>,
        slot: usize,
        keep: usize,
        chunks: Vec<(usize, usize)>,
    ) -> PyResult<usize> {
        Ok(self.with(py, |m| m.kv_shift(slot, keep, &chunks))?)
    }

    /// Positions the slot holds.
    fn slot_len(&self, py: Python<'_>, slot: usize) -> PyResult<usize> {
        Ok(self.with(py, |m| m.slot_len(slot))?)
    }

    /// Keeps the slot's first `n` positions (prefix reuse).
    fn truncate(&self, py: Python<'_>, slot: usize, n: usize) -> PyResult<()> {
        Ok(self.with(py, |m| m.truncate(slot, n))?)
    }

    /// Router picks per (layer, expert) since load, undecayed: float32 [n_layer, n_expert].
    /// ConfigError where the routing is not counted (`counts_routing` false).
    fn routing_counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (v, l, e) = self.with(py, |m| -> Result<_> {
            Ok((
                m.routing(false)?.snapshot(),
                m.hp().n_layer,
                m.hp().n_expert,
            ))
        })?;
        Ok(PyArray1::from_vec(py, v).reshape([l, e])?.into_any())
    }

    /// The model's live routing counters (shared, not a copy): `decayed` picks the ones with
    /// exponential decay, else the undecayed counts since load. ConfigError where the routing
    /// is not counted (`counts_routing` false).
    #[pyo3(signature = (decayed=true))]
    fn routing_counters(&self, py: Python<'_>, decayed: bool) -> PyResult<RoutingCounters> {
        let inner = self.with(py, |m| m.routing(decayed))?;
        Ok(RoutingCounters { inner })
    }

    /// Whether this model counts the routing: the CPU path and the hybrid GPU mode do; the GPU
    /// path with every expert in VRAM does not (its routed ids never leave the GPU).
    #[getter]
    fn counts_routing(&self, py: Python<'_>) -> bool {
        self.with(py, |m| m.routing(false).is_ok())
    }

    /// Reads routed experts through `tier` (its residency table: arena or map) from now on,
    /// counting each use per tier.
    fn set_tier(&self, py: Python<'_>, tier: &ExpertTier) -> PyResult<()> {
        let res = tier.res.clone();
        Ok(self.with(py, |m| match m {
            Backend::Cpu(m) => m.set_tier(res),
            Backend::Gpu { .. } => Err(Error::Config(
                "the RAM tier does not apply to device=\"cuda\": every expert is in VRAM".into(),
            )),
        })?)
    }

    /// While each layer runs, `threads` prefetch threads read ahead the mapped experts the
    /// next layer most likely routes to (0: off): per token, the K its router applied to the
    /// current hidden state ranks first, plus `extra`. Needs `set_tier` first.
    #[pyo3(signature = (threads, extra = 0))]
    fn set_readahead(&self, py: Python<'_>, threads: usize, extra: usize) -> PyResult<()> {
        Ok(self.with(py, |m| match m {
            Backend::Cpu(m) => m.set_readahead(threads, extra),
            Backend::Gpu { .. } => Err(Error::Config(
                "read-ahead does not apply to device=\"cuda\": every expert is in VRAM".into(),
            )),
        })?)
    }

    /// A hybrid family's prefill pieces of at least `min_tokens` tokens run the chunked
    /// DeltaNet form on the CPU path (within float rounding of the recurrence, not bitwise);
    /// 0: the recurrence everywhere (the default). ModelError without DeltaNet layers,
    /// ConfigError on the GPU path.
    fn set_deltanet_chunked(&self, py: Python<'_>, min_tokens: usize) -> PyResult<()> {
        Ok(self.with(py, |m| match m {
            Backend::Cpu(m) => m.set_deltanet_chunked(min_tokens),
            Backend::Gpu { .. } => Err(Error::Config(
                "the chunked DeltaNet prefill runs on the CPU path only (device=\"cpu\")".into(),
            )),
        })?)
    }

    /// The read-ahead's counts (`{queued, dropped, cancelled, done, bytes, hits, late,
    /// misses}`), or None when it is off.
    fn readahead_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        match self.with(py, |m| match m {
            Backend::Cpu(m) => m.readahead_stats(),
            Backend::Gpu { .. } => None,
        }) {
            Some(s) => Ok(Some(prefetch_dict(py, &s)?)),
            None => Ok(None),
        }
    }

    /// Empties the slot.
    fn free(&self, py: Python<'_>, slot: usize) -> PyResult<()> {
        Ok(self.with(py, |m| m.free(slot))?)
    }

    /// Marks a hybrid slot's recurrent state at its length, so that `truncate` can come back
    /// to it (ModelError for a family without a recurrent state).
    fn checkpoint(&self, py: Python<'_>, slot: usize) -> PyResult<()> {
        Ok(self.with(py, |m| m.checkpoint(slot))?)
    }

    /// The positions `truncate` can restore a hybrid slot to (besides 0 and its length).
    fn checkpoints(&self, py: Python<'_>, slot: usize) -> PyResult<Vec<usize>> {
        Ok(self.with(py, |m| m.checkpoints(slot))?)
    }

    /// Whether the file carries a NextN / MTP layer Strata runs (on the CPU path).
    #[getter]
    fn has_mtp(&self, py: Python<'_>) -> bool {
        self.with(py, |m| matches!(m, Backend::Cpu(m) if m.has_mtp()))
    }

    /// Starts (or stops) the MTP layer as a drafter: while on, each forward call also runs
    /// it over the positions it adds. ModelError without one; ConfigError on the GPU path.
    fn set_mtp(&self, py: Python<'_>, on: bool) -> PyResult<()> {
        Ok(self.with(py, |m| match m {
            Backend::Cpu(m) => m.set_mtp(on),
            Backend::Gpu { .. } => Err(Error::Config(MTP_CPU.into())),
        })?)
    }

    /// Whether the slot's MTP layer is in step with the slot's positions (it can draft).
    fn mtp_ready(&self, py: Python<'_>, slot: usize) -> PyResult<bool> {
        Ok(self.with(py, |m| match m {
            Backend::Cpu(m) => m.mtp_ready(slot),
            Backend::Gpu { .. } => Ok(false),
        })?)
    }

    /// One MTP draft step: `token` at the slot's next draft position (`first`: the slot's
    /// length, paired with the target's last hidden state; else after the previous step,
    /// paired with its output). Returns the logits (n_vocab,) of the token after `token`.
    fn mtp_draft<'py>(
        &self,
        py: Python<'py>,
        slot: usize,
        token: u32,
        first: bool,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let out = self.with(py, |m| match m {
            Backend::Cpu(m) => {
                let mut out = vec![0f32; m.hp.n_vocab];
                m.mtp_draft(slot, token, first, &mut out).map(|_| out)
            }
            Backend::Gpu { .. } => Err(Error::Config(MTP_CPU.into())),
        })?;
        Ok(PyArray1::from_vec(py, out))
    }

    /// "cpu" or "cuda".
    #[getter]
    fn device(&self, py: Python<'_>) -> &'static str {
        self.with(py, |m| match m {
            Backend::Cpu(_) => "cpu",
            Backend::Gpu { .. } => "cuda",
        })
    }

    /// Whether the one-token step has been captured as a CUDA graph (always False on the
    /// CPU, and on the GPU with cuda_graph=False).
    #[getter]
    fn cuda_graph_captured(&self, py: Python<'_>) -> bool {
        self.with(py, |m| match m {
            Backend::Cpu(_) => false,
            Backend::Gpu { m, .. } => m.graph_captured(),
        })
    }

    /// The VRAM tier's counters (hits, misses, swaps, bytes), shared with the running model;
    /// None unless the model runs in the hybrid mode.
    fn hybrid_counters(&self, py: Python<'_>) -> Option<HybridCounters> {
        self.with(py, |m| match m {
            Backend::Cpu(_) => None,
            Backend::Gpu { m, .. } => m.hybrid_counters(),
        })
        .map(|inner| HybridCounters { inner })
    }

    /// The hybrid mode's plan: `budget_bytes`, `fixed_bytes`, `slot_bytes`, `n_slots`,
    /// `n_experts`, `expert_bytes_total`, `resident_share`, `resident` (experts in slots now),
    /// `tier_async`, `adapt_every`, `adapt_swaps`, `stream_min_tokens` (0: chunks do not
    /// stream, or cannot), `stream_chunk` (tokens per streamed chunk; 0: none stream),
    /// `stream_areas` (staging areas: 2 = double-buffered, 0: none), `stream_threads`
    /// (bounce copy threads), `pcie_frac` (share of decode misses run over PCIe) and `pcie`
    /// ("off", "registered N bytes (read-only)", or why not), `defer_experts`, `stages` (per stage of the
    /// protocol, docs/PROTOCOL.md: `device`, `windows` entered, `gaps`, `busy`); None unless
    /// the model runs in that mode.
    fn hybrid_info<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(i) = self.with(py, |m| match m {
            Backend::Cpu(_) => None,
            Backend::Gpu { m, .. } => m.hybrid_info(),
        }) else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        let p = &i.plan;
        d.set_item("budget_bytes", p.budget_bytes)?;
        d.set_item("fixed_bytes", p.fixed_bytes)?;
        d.set_item("slot_bytes", p.slot_bytes)?;
        d.set_item("n_slots", p.n_slots)?;
        d.set_item("n_experts", p.n_experts)?;
        d.set_item("expert_bytes_total", p.expert_bytes_total)?;
        d.set_item("resident_share", p.resident_share())?;
        d.set_item("resident", i.resident)?;
        d.set_item("tier_async", i.tier_async)?;
        d.set_item("adapt_every", i.adapt_every)?;
        d.set_item("adapt_swaps", i.adapt_swaps)?;
        d.set_item("stream_min_tokens", i.stream_min_tokens)?;
        d.set_item("stream_areas", i.stream_areas)?;
        d.set_item("stream_threads", i.stream_threads)?;
        d.set_item("stream_chunk", i.stream_chunk)?;
        d.set_item("pcie_frac", i.pcie_frac)?;
        d.set_item("pcie", i.pcie)?;
        d.set_item("defer_experts", i.defer_experts)?;
        d.set_item("swaps", i.swaps)?;
        d.set_item("stages", super::stages::stage_list(py, &i.stages)?)?;
        Ok(Some(d))
    }

    /// Per stage of the layer split (docs/PROTOCOL.md; one stage without a split): `device`,
    /// `layers` (first, end), `windows` entered, `gaps`, `busy`, `compute_s` (host-seen time
    /// with a window on it), `waiting_s` (a window waiting to enter it), `copying_s` (device
    /// time of the activation hops into it), `windows_in_flight` (now) and
    /// `max_windows_in_flight`, `n_slots`, `resident` and `swaps` (its expert slots, hybrid). The
    /// CPU path: an empty list.
    fn stages<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let info = self.with(py, |m| match m {
            Backend::Cpu(_) => Vec::new(),
            Backend::Gpu { m, .. } => m.stage_info(),
        });
        super::stages::stage_list(py, &info)
    }

    /// The step shapes replayed from captured CUDA graphs: ("decode", S) for S one-token
    /// pieces, ("window", t) for one piece of t rows (a speculative window); [] on the CPU.
    #[getter]
    fn cuda_graph_shapes(&self, py: Python<'_>) -> Vec<(&'static str, usize)> {
        self.with(py, |m| match m {
            Backend::Cpu(_) => Vec::new(),
            Backend::Gpu { m, .. } => m.graph_shapes(),
        })
    }

    /// The decode graph: "captured", "captured (per layer)" (hybrid), "not yet", "off",
    /// "failed: why", or "cpu".
    #[getter]
    fn cuda_graph_state(&self, py: Python<'_>) -> String {
        self.with(py, |m| match m {
            Backend::Cpu(_) => "cpu".into(),
            Backend::Gpu { m, .. } => m.graph_state(),
        })
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyModel>()
}
