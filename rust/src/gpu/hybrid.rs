//! The hybrid MoE placement (issue #9, docs/TIERS_VRAM.md; the interface is `placement.rs`): the dense weights, the KV cache and the
//! buffers in VRAM, the hottest experts in the VRAM tier's slots, every other expert computed
//! by the CPU pool from RAM (the GGUF mapping) while the GPU runs the resident ones.
//!
//! Per layer of a chunk of T tokens (after the router on the GPU):
//!   ids i32 [T, K], wts f32 [T, K], h f32 [T, H]  → mapped pinned host buffers (one kernel),
//!         then an event
//!   GPU: moe_gate_up / moe_down through the slot pointer tables (0 = miss: no contribution)
//!   host: wait for the event; LayerSplit (hit / CPU miss); the pool computes
//!         y_miss f32 [T, H] = Σ_{CPU misses j} w[t, j]·expert_{ids[t, j]}(h[t])
//!   x += y_miss, the add reading it over the link from its mapped pinned buffer
//!   PCIe misses (`pcie_frac` of the missed experts, chunks of ≤ 8 tokens): the copy engine
//!         moves them from the registered mapping into a staging area and the GPU runs them
//!         through the same kernels (`pcie.rs`), while the pool computes the rest
//! A layer without CPU misses skips the upload and the add. Chunks of fewer than
//! `stream_min_tokens` tokens work this way; longer prefill chunks copy every missing expert
//! of each layer over PCIe and run the whole layer on the GPU (`stream_in`).
//!
//! One `Hybrid` per stage of the layer split (`split.rs`), over that stage's layers; the
//! stages share the counters, the routing counts and the CPU pool. Each step is a window of
//! the stage protocol (docs/PROTOCOL.md, `Protocol`, driven by the model: `pipeline.rs`):
//! its fence on this stage is the stage's next gap (a `GapTicket`, no event).
//! Between steps (a gap, the step complete: its logits were read): the tier driver chooses /
//! stages / issues swaps (sync or async), and the table changes go to the host pointer
//! tables; the device copy is rewritten on the compute stream before the next step is
//! launched, so a step reads the table exactly as the host split it.

use super::chain_timing::ChainTimer;
use super::defer::{split_deferred, Deferrer};
use super::experts::{layers_of, shapes, ExpertTensors, GgufStager};
use super::hybrid_cfg::{HybridConfig, HybridInfo, StagePart, ADAPT_HALF_LIFE};
use super::launch::Launcher;
use super::pcie::PcieMisses;
use super::placement::{experts_through, MoePlacement};
use super::stream_in::StreamIn;
use crate::cuda::ops::view::Dv;
use crate::cuda::ops::{elementwise, quant};
use crate::cuda::{DevBuf, Event, Gpu, Graph, PinnedBuf, Stream};
use crate::error::{Error, Result};
use crate::model::arch::Experts;
use crate::model::moe_oai::OaiScratch;
use crate::model::weights::Weights;
use crate::model::{Compute, HParams};
use crate::pool::SKIP;
use crate::tier::vram::{
    self, fill_order, initial_assignment, start_fill, BudgetInputs, CudaSlots, GapTicket,
    HybridCounters, LayerSplit, PcieShare, Proj, PtrTables, ShareTuner, SlotFences, TierDriver,
    TierFence, VramPlan, VramTable,
};
use crate::tier::RoutingCounters;
use std::sync::Arc;
use std::time::Instant;

mod cpu_leg;

/// Pinned staging buffers of one slot each (start fill and swaps in flight).
const STAGING_BUFFERS: usize = 8;

pub struct Hybrid {
    plan: VramPlan,
    table: VramTable,
    ptrs: PtrTables,
    /// u64 [layer][proj][expert]: the device copy of `ptrs`.
    ptrs_dev: DevBuf,
    ptrs_dirty: bool,
    slots: CudaSlots,
    fences: SlotFences<TierFence, PinnedBuf>,
    /// The fence of the step in flight on this stage (its `GapTicket`, from the model's
    /// `Protocol`: `pipeline.rs`).
    ticket: Option<GapTicket>,
    /// The last stage ends each step on the counters the stages share.
    ends_step: bool,
    driver: TierDriver<GgufStager<PinnedBuf>>,
    compute: Arc<dyn Compute>,
    /// The model's tensors in RAM (the CPU misses read its experts; shared by the stages).
    weights: Arc<Weights>,
    counters: Arc<HybridCounters>,
    /// Undecayed picks since load, the "hot" decayed ones, and the adaptive choice's.
    routing: Arc<RoutingCounters>,
    routing_hot: Arc<RoutingCounters>,
    routing_adapt: Arc<RoutingCounters>,
    split: LayerSplit,
    share: PcieShare,
    /// `pcie_frac` -1: the share measured against 0 on the decode steps (`share_tune.rs`).
    tuner: Option<ShareTuner>,
    /// This step's decode time on its CPU-path layers (ns) and tokens: the tuner's input.
    step_ns: u64,
    step_t: usize,
    pin_ids: PinnedBuf, // i32 [T, K]
    pin_wts: PinnedBuf, // f32 [T, K]
    pin_h: PinnedBuf,   // f32 [T, H]
    pin_y: PinnedBuf,   // f32 [T, H]
    /// f32 [T, H] ×2: a deferred job's y landing at a layer (`pin_y` holds that layer's own
    /// CPU part), and after the stage's last layer (no event orders that add after the one
    /// queued at the last layer). A buffer is rewritten only after an event the stream
    /// reaches after the add that read it (the next layer's, or the next step's).
    pin_land: Option<[PinnedBuf; 2]>,
    /// Expert deferral (`defer.rs`; None: off): each token's `defer_n` lowest-weight CPU
    /// pairs.
    defer: Option<Deferrer>,
    defer_n: usize,
    ids: Vec<u32>,
    wts: Vec<f32>,
    h: Vec<f32>,
    y: Vec<f32>,
    ev: Event,
    /// The GPU part's device time (`chain_timing.rs`; None: off, the default).
    chain: Option<ChainTimer>,
    steps: u64,
    /// Swaps this stage's tier has completed (slots filled at its gaps).
    swapped: u64,
    /// This step's (KV slot, rows) per piece in row order: whose pairs the counts are.
    rows: Vec<(usize, usize)>,
    /// Prefill chunks with every expert on the GPU (None: off).
    stream: Option<StreamIn>,
    /// When the last CPU-path layer of this step returned (the phase timing).
    t_last: Option<Instant>,
    /// Decode misses over PCIe (None: off, or the mapping could not be registered).
    pcie: Option<PcieMisses>,
    pcie_note: String,
    top_k: usize,
    n_embd: usize,
    /// gpt-oss's biased experts: (alpha, limit) and the CPU misses' scratch (`moe_oai`).
    oai: Option<((f32, f32), OaiScratch)>,
}

fn read_f32s(src: &[u8], out: &mut Vec<f32>, n: usize) {
    out.clear();
    out.extend(
        src[..4 * n]
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])),
    );
}

impl Hybrid {
    /// One stage's hybrid placement (`part`: its layers and its share of the device; one
    /// stage: every layer, the whole device). Buffers of the hybrid step for chunks of `t`
    /// tokens (allocated before the plan, so they count as fixed VRAM).
    pub(super) fn new(
        gpu: &Arc<Gpu>,
        hp: &HParams,
        t: usize,
        cfg: &HybridConfig,
        part: StagePart<'_>,
    ) -> Result<Hybrid> {
        let (nl, ne, k, hd) = (hp.n_layer, hp.n_expert, hp.n_expert_used, hp.n_embd);
        let weights = part.shared.weights.clone();
        // the stage's layers only: the plan, the fill order and the choice see no other
        let mut shapes = shapes(&weights)?;
        for (l, sh) in shapes.iter_mut().enumerate() {
            if !part.layers.contains(&l) {
                *sh = None;
            }
        }
        let ptrs_dev = gpu.alloc(8 * nl * 3 * ne)?;
        let layers = layers_of(&weights, &shapes);
        let (pcie, pcie_note, frac) = open_pcie(gpu, &weights, &layers, ne, k, cfg.pcie_frac);
        let min = cfg.stream_min_tokens;
        let mut stream = if min > 0 && t >= min {
            let g = weights.gguf.clone();
            let lanes = super::bounce::lanes_for(cfg.stream_threads);
            StreamIn::new(gpu, g, layers.clone(), ne, t, k, min, lanes)?
        } else {
            None
        };
        let (dense_bytes, kv_bytes) = (part.dense_bytes, part.kv_bytes);
        let used = part.free_before.saturating_sub(gpu.mem_info()?.0);
        let inp = BudgetInputs {
            free_bytes: part.scale(part.free0 as u64),
            reserve_mib: part.scale(cfg.reserve_mib),
            budget_mib: cfg.budget_mib.map(|b| part.scale(b)),
            dense_bytes: dense_bytes as u64,
            kv_bytes: kv_bytes as u64,
            buffer_bytes: used.saturating_sub(dense_bytes + kv_bytes) as u64,
            n_expert: ne,
            layers: shapes.clone(),
        };
        let mut plan = vram::plan(&inp).map_err(|e| match e {
            Error::Config(m) => Error::Config(format!(
                "{m} (the buffers are sized for chunks of {t} tokens: prefill_chunk, or \
                 stream_chunk when prefill chunks stream)"
            )),
            e => e,
        })?;
        let max_slots = part.max_slots;
        if let Some(m) = max_slots {
            plan.n_slots = plan.n_slots.min(m);
        }
        if let Some(st) = stream.as_mut() {
            // A second staging area when the plan has room: the slots asked for
            // (`max_slots`) stay, or the automatic budget gives up at most 1/16 of its slots.
            let keep = match max_slots {
                Some(_) => plan.n_slots,
                None => plan.n_slots - plan.n_slots / 16,
            };
            if let Some(p) = vram::budget::with_extra(&plan, st.area_bytes(), max_slots, keep) {
                st.add_area(gpu)?;
                plan = p;
            }
        }
        let slots = CudaSlots::new(gpu, &plan)?;
        let counters = part.shared.counters.clone();
        let mut table = VramTable::new(nl, ne, plan.n_slots);
        let mut fences: SlotFences<TierFence, PinnedBuf> = SlotFences::new(plan.n_slots);
        let mut stager = GgufStager::new(weights.gguf.clone(), layers);
        let mut bufs = (0..STAGING_BUFFERS)
            .map(|_| slots.staging_buffer())
            .collect::<Result<Vec<_>>>()?;
        let order = fill_order(&shapes, ne, cfg.profile.as_ref());
        let assignment = initial_assignment(&order, plan.n_slots);
        let mut slots = slots;
        start_fill(
            &mut stager,
            &mut bufs,
            &assignment,
            &mut fences,
            &mut table,
            &mut slots,
            Some(&counters),
            || std::thread::sleep(std::time::Duration::from_micros(50)),
        )?;
        fences.take_changes();
        let ptrs = PtrTables::build(&table, &plan, slots.base());
        let s = gpu.stream()?;
        ptrs_dev.write(&s, 0, &ptrs.ptrs)?;
        if let Some(st) = stream.as_mut() {
            st.refresh(&ptrs, &s)?;
        }
        let routing_adapt = Arc::new(RoutingCounters::new(nl, ne, ADAPT_HALF_LIFE));
        let oai = match hp.graph.experts {
            Experts::OaiBiased { alpha, limit } => {
                Some(((alpha, limit), OaiScratch::new(t, hd, hp.n_ff_exp, k)))
            }
            Experts::Swiglu => None,
        };
        let defer = match (cfg.defer_experts, &oai) {
            (0, _) => None,
            (_, Some(_)) => {
                return Err(Error::Config(
                    "defer_experts: not available for gpt-oss's biased experts".into(),
                ))
            }
            (_, None) => Some(Deferrer::new(
                part.shared.compute.clone(),
                weights.clone(),
                t,
                hd,
                k,
            )?),
        };
        let driver = TierDriver::new(
            stager,
            bufs,
            routing_adapt.clone(),
            shapes.iter().map(Option::is_some).collect(),
            cfg.adapt,
            cfg.tier_async,
            Some(counters.clone()),
        )?;
        Ok(Hybrid {
            plan,
            table,
            ptrs,
            ptrs_dev,
            ptrs_dirty: false,
            slots,
            fences,
            ticket: None,
            ends_step: part.last,
            driver,
            compute: part.shared.compute.clone(),
            weights,
            counters,
            routing: part.shared.routing.clone(),
            routing_hot: part.shared.routing_hot.clone(),
            routing_adapt,
            split: LayerSplit::default(),
            share: PcieShare::new(frac).with_cap(pcie.as_ref().map_or(0, PcieMisses::cap)),
            tuner: (cfg.pcie_frac < 0.0 && pcie.is_some()).then(|| ShareTuner::new(frac)),
            step_ns: 0,
            step_t: 0,
            pin_ids: gpu.host_alloc(4 * t * k)?,
            pin_wts: gpu.host_alloc(4 * t * k)?,
            pin_h: gpu.host_alloc(4 * t * hd)?,
            pin_y: gpu.host_alloc(4 * t * hd)?,
            pin_land: match defer {
                Some(_) => Some([gpu.host_alloc(4 * t * hd)?, gpu.host_alloc(4 * t * hd)?]),
                None => None,
            },
            defer,
            defer_n: cfg.defer_experts,
            ids: Vec::with_capacity(t * k),
            wts: Vec::with_capacity(t * k),
            h: Vec::with_capacity(t * hd),
            y: vec![0f32; t * hd],
            ev: gpu.event_no_timing()?,
            chain: ChainTimer::new(gpu)?,
            steps: 0,
            swapped: 0,
            rows: Vec::with_capacity(part.n_seq),
            stream,
            t_last: None,
            pcie,
            pcie_note,
            top_k: k,
            n_embd: hd,
            oai,
        })
    }

    fn info(&self) -> HybridInfo {
        let a = self.driver.config();
        HybridInfo {
            plan: self.plan.clone(),
            resident: self.table.resident(),
            tier_async: self.driver.is_async(),
            adapt_every: a.every,
            adapt_swaps: a.swaps,
            stream_min_tokens: self.stream.as_ref().map_or(0, |s| s.min_tokens),
            stream_areas: self.stream.as_ref().map_or(0, |s| s.n_areas()),
            stream_threads: self.stream.as_ref().map_or(0, |s| s.n_lanes()),
            stream_chunk: 0,
            pcie_frac: if self.pcie.is_some() {
                self.share.frac()
            } else {
                0.0
            },
            pcie: match &self.tuner {
                Some(tu) => format!(
                    "{}; auto: the probe's {:.3} or 0 by measured decode time ({} measurements)",
                    self.pcie_note,
                    tu.probe(),
                    tu.measured()
                ),
                None => self.pcie_note.clone(),
            },
            defer_experts: if self.defer.is_some() {
                self.defer_n
            } else {
                0
            },
            swaps: self.swapped,
            stages: Vec::new(), // the model's (`pipeline.rs`)
        }
    }

    /// Whether a chunk of `t` tokens streams its layers' missing experts (`stream_in`).
    fn streams(&self, t: usize) -> bool {
        self.stream.as_ref().is_some_and(|st| t >= st.min_tokens)
    }

    /// Phase times of a CPU-path layer (`[start, queued, ids here, cpu done]`, now = end).
    fn layer_done(&mut self, t: [Instant; 4], between: u64) {
        let now = Instant::now();
        let ns = |a: Instant, b: Instant| (b - a).as_nanos() as u64;
        self.counters.record_times([
            between,
            ns(t[0], t[1]),
            ns(t[1], t[2]),
            ns(t[2], t[3]),
            ns(t[3], now),
        ]);
        // the layer's cycle: the GPU's part since the last layer, then this one's
        self.step_ns += between + ns(t[0], now);
        self.t_last = Some(now);
    }

    /// The last step's decode time goes to the tuner (`pcie_frac` -1), which may change the
    /// share for the next one.
    fn tune_share(&mut self) {
        let (ns, t) = (std::mem::take(&mut self.step_ns), self.step_t);
        let (Some(tu), Some(pc)) = (self.tuner.as_mut(), self.pcie.as_ref()) else {
            return;
        };
        if ns == 0 || t == 0 || t > quant::MMVQ_MAX_TOKENS {
            return;
        }
        let f = tu.step(t, ns);
        if f != self.share.frac() {
            self.share = PcieShare::new(f).with_cap(pc.cap());
        }
    }
}

impl MoePlacement for Hybrid {
    fn host_per_layer(&self) -> bool {
        true
    }

    /// `pin_y` where the previous layer (routed, on this stage) left its CPU part there
    /// (`hands_off`).
    fn handoff_y(&self, cx: &Launcher, l: usize, t: usize) -> Option<Dv> {
        self.handoff_buf(cx, l, t)
    }

    /// Chunks of at least this many tokens stream (None: none do).
    fn stream_min(&self) -> Option<usize> {
        self.stream.as_ref().map(|s| s.min_tokens)
    }

    /// Before a step is launched: the pointer-table changes of the last gap reach the device
    /// (on the compute stream, ahead of the step's kernels).
    fn before_step(&mut self, s: &Stream, rows: &[(usize, usize)]) -> Result<()> {
        self.t_last = None;
        if let Some(c) = self.chain.as_mut() {
            c.reset();
        }
        self.tune_share();
        self.step_t = 0;
        if let Some(d) = self.defer.as_mut() {
            // a job still in flight belongs to a step that failed part way (its error was
            // returned then): it finishes and is dropped, never landing in this step's x
            let _ = d.wait();
        }
        self.rows.clear();
        self.rows.extend_from_slice(rows);
        if let Some(st) = self.stream.as_mut() {
            st.begin_step();
        }
        if self.ptrs_dirty {
            self.ptrs_dev.write(s, 0, &self.ptrs.ptrs)?;
            if let Some(st) = self.stream.as_mut() {
                st.refresh(&self.ptrs, s)?;
            }
            self.ptrs_dirty = false;
        }
        Ok(())
    }

    /// After layer `l`'s router: the routing and the FFN input of a chunk that does not
    /// stream go to the host's pinned buffers (launches only: the per-layer decode graph
    /// holds them).
    fn pre(&mut self, cx: &Launcher, _l: usize, t: usize) -> Result<()> {
        if self.streams(t) {
            return Ok(());
        }
        let (s, b) = (&cx.stream, &cx.b);
        let (nk, hd) = (t * self.top_k, self.n_embd);
        // one kernel writes the three into the mapped pinned buffers (ids i32 [T, K],
        // wts f32 [T, K], h f32 [T, H]): no copy-engine round trips on the layer's chain
        let (ids, wts, h) = (&self.pin_ids, &self.pin_wts, &self.pin_h);
        elementwise::copy3(
            &cx.gpu,
            s,
            [Dv::mapped(ids), Dv::mapped(wts), Dv::mapped(h)],
            [Dv::of(&b.ids), Dv::of(&b.wts), Dv::of(&b.h)],
            [nk, nk, t * hd],
        )
    }

    /// The routing and FFN input of a chunk that does not stream go straight from the router
    /// and the FFN norm into the host's mapped pinned buffers (`pre` copies them for a
    /// routing whose kernel has no second output).
    fn host_out(&self, t: usize) -> Option<[Dv; 3]> {
        let (ids, wts, h) = (&self.pin_ids, &self.pin_wts, &self.pin_h);
        (!self.streams(t)).then(|| [Dv::mapped(ids), Dv::mapped(wts), Dv::mapped(h)])
    }

    /// Layer `l`'s shared expert, then its resident experts through the slot pointer tables
    /// (a miss adds nothing): launches only (the per-layer decode graph holds them).
    fn resident(&self, cx: &Launcher, l: usize, t: usize) -> Result<()> {
        cx.shared_expert(l, t)?;
        let base = self.ptrs_dev.ptr();
        let tab = |p: Proj| base + 8 * self.ptrs.index(l, p, 0) as u64;
        experts_through(cx, l, t, [tab(Proj::Gate), tab(Proj::Up), tab(Proj::Down)])
    }

    /// The routed experts of layer `l` for the T tokens whose normed FFN input is `b.h` and
    /// routing `b.ids`/`b.wts` (`pre` queued their copies to the host): resident pairs on
    /// the GPU (`resident`, or its captured graph), PCIe misses staged and run on the GPU,
    /// the others on the CPU, all added into `b.x`.
    fn moe(&mut self, cx: &Launcher, l: usize, t: usize, resident: Option<&Graph>) -> Result<()> {
        let (s, b, hp) = (&cx.stream, &cx.b, &cx.hp);
        let (hd, k) = (hp.n_embd, hp.n_expert_used);
        let nk = t * k;
        if let Some(st) = self.stream.as_mut().filter(|st| t >= st.min_tokens) {
            // every pair on the GPU: the shared expert, the missing experts copied into the
            // staging area
            cx.shared_expert(l, t)?;
            let bytes = st.begin_layer(s, &self.table, &b.ids, l, t, k)?;
            self.counters.record_pcie(bytes);
            let tab = |p: Proj| st.table(&self.ptrs, l, p);
            experts_through(cx, l, t, [tab(Proj::Gate), tab(Proj::Up), tab(Proj::Down)])?;
            return st.done_layer(s, l);
        }
        let t0 = Instant::now();
        let between = self.t_last.map_or(0, |t| (t0 - t).as_nanos() as u64);
        self.step_t = t;
        // the event the host waits for (routing and input are on their way to the host;
        // the chain timer's first: the host's wait covers it)
        if let Some(c) = &self.chain {
            c.at_route(s)?;
        }
        self.ev.record(s)?;
        // the GPU's part: resident experts through the slot tables (0: a miss adds nothing)
        match resident {
            Some(g) => g.launch(s)?,
            None => self.resident(cx, l, t)?,
        }
        // the CPU's part, while the GPU runs the resident experts
        let t1 = Instant::now();
        self.ev.sync()?;
        let t2 = Instant::now();
        if let Some(c) = self.chain.as_mut() {
            c.done(&self.counters)?;
        }
        // deferral: the previous layer's CPU misses land in x now (after this layer's
        // attention read it; ordered after its resident experts on the stream)
        self.land_deferred(cx, false)?;
        self.ids.clear();
        self.ids.extend(
            self.pin_ids.as_slice()[..4 * nk]
                .chunks_exact(4)
                .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]) as u32),
        );
        self.routing.observe(l, &self.ids);
        self.routing_hot.observe(l, &self.ids);
        self.routing_adapt.observe(l, &self.ids);
        let mut none = PcieShare::new(0.0);
        let share = match self.pcie {
            Some(_) if t <= quant::MMVQ_MAX_TOKENS => &mut self.share,
            _ => &mut none,
        };
        self.split.split(&self.table, l, &self.ids, share);
        let sp = &self.split;
        self.counters
            .record_layer(l, sp.hits, sp.miss_cpu, sp.miss_pcie);
        tally_slots(&self.counters, &self.rows, k, |i| {
            let e = sp.gpu_ids[i];
            let hit = e != SKIP && self.table.slot(l, e).is_some();
            (hit, e == SKIP)
        });
        if let Some(pc) = self.pcie.as_mut().filter(|_| sp.miss_pcie > 0) {
            // the PCIe misses on the GPU, while the pool computes the CPU's
            let (tabs, bytes) = pc.stage(s, l, &sp.pcie_experts)?;
            self.counters.record_pcie(bytes);
            experts_through(cx, l, t, tabs)?;
        }
        if sp.all_on_gpu() {
            self.counters.record_handoff((8 * nk) as u64);
            self.no_handoff(cx, l, t);
            self.layer_done([t0, t1, t2, Instant::now()], between);
            return Ok(());
        }
        read_f32s(self.pin_wts.as_slice(), &mut self.wts, nk);
        read_f32s(self.pin_h.as_slice(), &mut self.h, t * hd);
        // deferral: each token's `defer_n` lowest-weight CPU pairs go to the helper's job,
        // started once this thread's call below has freed the pool
        let mut deferred = 0;
        if let Some(d) = self.defer.as_mut() {
            let job = d.job().ok_or_else(|| {
                Error::Config("defer_experts: the previous layer's job did not land".into())
            })?;
            let (ids, n) = (&mut self.split.cpu_ids, self.defer_n);
            deferred = split_deferred(ids, &self.wts, k, n, &mut job.split.cpu_ids);
            if deferred > 0 {
                job.layer = l;
                job.h.clone_from(&self.h);
                job.wts.clone_from(&self.wts);
            }
        }
        let now = self.split.cpu_ids.iter().any(|&e| e != SKIP);
        if now {
            self.cpu_now(cx, l, t)?;
        } else {
            self.no_handoff(cx, l, t);
        }
        let t3 = Instant::now();
        if deferred > 0 {
            self.defer.as_mut().map_or(Ok(()), Deferrer::start)?;
            if !now {
                // the routing and the input came down for the job alone (its y: at landing)
                self.counters.record_handoff((8 * nk + 4 * t * hd) as u64);
            }
        }
        self.layer_done([t0, t1, t2, t3], between);
        Ok(())
    }

    /// The stage's last layer is queued: its deferred CPU misses land before the stage ends.
    fn layers_done(&mut self, cx: &Launcher) -> Result<()> {
        self.land_deferred(cx, true)
    }

    /// Right after a step's kernels are queued: its fence (`ticket`: the stage's next gap)
    /// goes to the slot fences (slots it may read are not overwritten before it).
    fn step_launched(&mut self, _cx: &Launcher, ticket: &GapTicket) -> Result<()> {
        self.ticket = Some(ticket.clone());
        self.fences.step_launched(TierFence::Step(ticket.clone()));
        Ok(())
    }

    /// A gap of the stage after a step that has completed there (`step_launched` first; the
    /// model's `Protocol` has seen the window leave and the gap): a streamed chunk's ids
    /// are counted, the tier driver advances (choices, staging, copies: never a wait), and
    /// the table changes go to the host pointer tables (the device gets them in
    /// `before_step`).
    fn after_step(&mut self, cx: &Launcher) -> Result<()> {
        let k = cx.hp.n_expert_used;
        if let Some(st) = self.stream.as_mut() {
            let (c, r) = (&self.counters, [&self.routing, &self.routing_hot]);
            let ra = &self.routing_adapt;
            let (table, rows) = (&self.table, &self.rows);
            st.count(table, k, |l, ids, n| {
                c.record_layer(l, n.hits, 0, n.misses);
                // every pair on the GPU: resident ones hit, the others came over PCIe
                tally_slots(c, rows, k, |i| (table.slot(l, ids[i]).is_some(), false));
                r[0].observe(l, ids);
                r[1].observe(l, ids);
                ra.observe(l, ids);
            });
        }
        if self.ends_step {
            self.routing.end_step();
            self.routing_hot.end_step();
        }
        self.routing_adapt.end_step();
        // the window has left the stage (`pipeline.rs`) and this is its gap
        if self.ticket.take().is_none() {
            return Err(Error::Config(
                "a stage's gap without a step before it".into(),
            ));
        }
        self.steps += 1;
        let out = self.driver.at_gap(
            self.steps,
            &mut self.fences,
            &mut self.table,
            &mut self.slots,
        )?;
        self.swapped += out.filled as u64;
        for (key, slot) in self.fences.take_changes() {
            self.ptrs.set(&self.plan, key, slot);
            self.ptrs_dirty = true;
        }
        Ok(())
    }

    fn hybrid_info(&self) -> Option<HybridInfo> {
        Some(self.info())
    }

    fn hybrid_counters(&self) -> Option<Arc<HybridCounters>> {
        Some(self.counters.clone())
    }

    fn routing(&self, decayed: bool) -> Option<Arc<RoutingCounters>> {
        Some(if decayed {
            self.routing_hot.clone()
        } else {
            self.routing.clone()
        })
    }
}

/// The PCIe side of decode misses for `pcie_frac` = `frac` (negative: probe the link and the
/// RAM): the registration (None when off or refused), what `HybridInfo::pcie` says, and the
/// share.
fn open_pcie(
    gpu: &Arc<Gpu>,
    w: &Weights,
    layers: &ExpertTensors,
    ne: usize,
    cap: usize,
    frac: f64,
) -> (Option<PcieMisses>, String, f64) {
    if frac == 0.0 || frac.is_nan() {
        return (None, "off".into(), 0.0);
    }
    let frac = if frac < 0.0 {
        let link = vram::probe_pcie_gbps(gpu, 64).unwrap_or(0.0);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let ram = crate::pool::membench::read_gbps(256 << 20, threads, 3);
        vram::default_pcie_frac(link, ram)
    } else {
        frac.min(1.0)
    };
    if frac <= 0.0 {
        return (None, "off (the link probe gave no bandwidth)".into(), 0.0);
    }
    match PcieMisses::new(gpu, w.gguf.clone(), layers, ne, cap) {
        Ok(p) => {
            let (n, ro) = p.registered();
            let how = if ro { "read-only" } else { "read-write" };
            (Some(p), format!("registered {n} bytes ({how})"), frac)
        }
        Err(e) => (None, format!("unavailable: {e}"), 0.0),
    }
}

/// Adds each piece's pairs to its KV slot's counters: `rows` (slot, rows) per piece in row
/// order, `k` pairs per row; `class(i)` of pair i is (hit, CPU miss) — neither: a PCIe miss.
fn tally_slots(
    c: &HybridCounters,
    rows: &[(usize, usize)],
    k: usize,
    class: impl Fn(usize) -> (bool, bool),
) {
    let mut i = 0;
    for &(slot, t) in rows {
        let (mut hits, mut cpu, mut pcie) = (0, 0, 0);
        for j in i..i + t * k {
            match class(j) {
                (true, _) => hits += 1,
                (false, true) => cpu += 1,
                (false, false) => pcie += 1,
            }
        }
        c.record_slot(slot, hits, cpu, pcie);
        i += t * k;
    }
}
