//! How the hybrid placement (`hybrid.rs`) is set up (`HybridConfig`) and what it reports
//! (`HybridInfo`).

use crate::model::weights::Weights;
use crate::model::{Compute, HParams};
use crate::tier::vram::{AdaptConfig, HybridCounters, VramPlan};
use crate::tier::{Profile, RoutingCounters};
use std::ops::Range;
use std::sync::Arc;

/// Half-life (steps) of the routing counts the adaptive choice reads.
pub const ADAPT_HALF_LIFE: f64 = 128.0;
/// Half-life of the decayed counters reported as "hot" (as the CPU path's).
pub const HOT_HALF_LIFE: f64 = 1024.0;
/// Makes the CPU side (the expert pool) once the hybrid mode is on (called once; the stages
/// share it).
pub type ComputeMaker = Box<dyn Fn() -> Arc<dyn Compute> + Send>;

/// How the hybrid mode is set up.
pub struct HybridConfig {
    /// `vram_budget_mib` (None: free − reserve).
    pub budget_mib: Option<u64>,
    pub reserve_mib: u64,
    /// At most this many expert slots in all (tests and benchmarks: an exact share of the
    /// experts); with several stages, each stage's share follows its share of the experts.
    pub max_slots: Option<usize>,
    /// Only when the model does not fit whole (the automatic budget): else every weight goes
    /// to VRAM and the hybrid mode is off.
    pub only_if_needed: bool,
    pub adapt: AdaptConfig,
    pub tier_async: bool,
    /// Start fill order (hottest first); None: expert-major (every layer the same share).
    pub profile: Option<Profile>,
    /// The CPU side: the expert pool (or the serial reference), made only when the hybrid
    /// mode is on.
    pub compute: ComputeMaker,
    /// Chunks of at least this many tokens copy their layers' missing experts to VRAM and run
    /// every pair on the GPU (0: never; every miss on the CPU).
    pub stream_min_tokens: usize,
    /// Tokens per prefill chunk when chunks stream (0: the model's `max_chunk`): each chunk
    /// moves every missing expert once, so longer chunks move fewer bytes per token. The
    /// model's buffers are sized for it (and count as fixed VRAM in the plan).
    pub stream_chunk: usize,
    /// Threads that copy streamed experts into the page-locked bounce buffers (0: one per
    /// core, at most 8).
    pub stream_threads: usize,
    /// Share of the missed experts of decode steps (chunks of ≤ 8 tokens) run on the GPU from
    /// the registered mapping over PCIe, 0..1; negative: from a probe of the link and of the
    /// RAM bandwidth at start (`default_pcie_frac`); 0: every miss on the CPU.
    pub pcie_frac: f64,
    /// Expert deferral (`defer.rs`): each token's this many lowest-weight CPU misses of a
    /// layer are added one layer later, while the GPU runs the next layer (not exact; 0: off,
    /// the default; ≥ top-k: every CPU miss).
    pub defer_experts: usize,
}

/// Sizes of the plan as Python reports them.
#[derive(Clone, Debug)]
pub struct HybridInfo {
    pub plan: VramPlan,
    pub resident: usize,
    pub tier_async: bool,
    pub adapt_every: u32,
    pub adapt_swaps: u32,
    /// Chunks of at least this many tokens stream their missing experts (0: none do).
    pub stream_min_tokens: usize,
    /// Staging areas of the streamed chunks (2: double-buffered; 0: no streaming) and the
    /// threads that copy into the bounce buffers.
    pub stream_areas: usize,
    pub stream_threads: usize,
    /// Tokens per streamed prefill chunk (0: chunks do not stream; set by the model).
    pub stream_chunk: usize,
    /// The share of decode misses run over PCIe (0: none), and how the link is used: "off",
    /// "registered N bytes (read-only)", or why it is not.
    pub pcie_frac: f64,
    pub pcie: String,
    /// CPU misses per token deferred by one layer (`defer.rs`; 0: none).
    pub defer_experts: usize,
    /// Swaps the tier completed (with several stages: each stage's in its `StageInfo`).
    pub swaps: u64,
    /// Per stage of the protocol (docs/PROTOCOL.md): its device, windows entered, gaps, and
    /// whether a window is on it now.
    pub stages: Vec<StageInfo>,
}

/// One stage of the layer split (docs/PROTOCOL.md) as the model reports it.
#[derive(Clone, Debug, Default)]
pub struct StageInfo {
    pub device: usize,
    /// Its layers, `first .. end`.
    pub layers: (usize, usize),
    pub windows: u64,
    /// Windows whose part here ran beside another window's part on another stage, their
    /// chains of layers alternating on the host (`flight.rs`).
    pub beside: u64,
    pub gaps: u64,
    pub busy: bool,
    /// Host-seen seconds: a window on the stage (launch to its completion seen), between the
    /// previous stage and this one (waiting to enter), and the device time of the activation
    /// hops into it (CUDA events).
    pub compute_s: f64,
    pub waiting_s: f64,
    pub copying_s: f64,
    /// Windows in flight now and at most.
    pub windows_in_flight: usize,
    pub max_windows_in_flight: usize,
    /// Its expert slots and the experts in them (hybrid; 0 otherwise).
    pub n_slots: usize,
    pub resident: usize,
    /// Swaps its tier completed (hybrid).
    pub swaps: u64,
    /// Bytes moved onto its device: the activation hops into it, and its tier's swaps (each
    /// a copy of one slot's bytes).
    pub hop_bytes: u64,
    pub swap_bytes: u64,
}

/// What the stages' hybrid placements share: the CPU pool, the model's tensors in RAM, the
/// counters (per layer: each stage records its own layers) and the routing counts.
pub(super) struct HybridShared {
    pub compute: Arc<dyn Compute>,
    pub weights: Arc<Weights>,
    pub counters: Arc<HybridCounters>,
    pub routing: Arc<RoutingCounters>,
    pub routing_hot: Arc<RoutingCounters>,
}

impl HybridShared {
    pub(super) fn new(
        cfg: &HybridConfig,
        weights: Arc<Weights>,
        hp: &HParams,
        n_slots: usize,
    ) -> Self {
        let (nl, ne) = (hp.n_layer, hp.n_expert);
        HybridShared {
            compute: (cfg.compute)(),
            weights,
            counters: Arc::new(HybridCounters::with_slots(nl, n_slots)),
            routing: Arc::new(RoutingCounters::new(nl, ne, 0.0)),
            routing_hot: Arc::new(RoutingCounters::new(nl, ne, HOT_HALF_LIFE)),
        }
    }
}

/// One stage's part of the hybrid placement (`Hybrid::new`).
pub(super) struct StagePart<'a> {
    pub layers: Range<usize>,
    /// The last stage (it ends each step on the shared counters).
    pub last: bool,
    /// The stage's share of its device's memory (1: the whole device): the free memory, the
    /// reserve and a set budget are scaled by it.
    pub share: f64,
    /// Free memory of the device before the model (the plan's start) and before this stage's
    /// own buffers (what they took counts as its fixed VRAM).
    pub free0: usize,
    pub free_before: usize,
    pub dense_bytes: usize,
    pub kv_bytes: usize,
    /// The stage's share of `HybridConfig::max_slots`.
    pub max_slots: Option<usize>,
    /// KV slots (sequences in a step at most).
    pub n_seq: usize,
    pub shared: &'a HybridShared,
}

impl StagePart<'_> {
    /// `v` × the stage's share of the device (unchanged for the whole device).
    pub(super) fn scale(&self, v: u64) -> u64 {
        if self.share >= 1.0 {
            v
        } else {
            (v as f64 * self.share) as u64
        }
    }
}
