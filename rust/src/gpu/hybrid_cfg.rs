//! How the hybrid placement (`hybrid.rs`) is set up (`HybridConfig`) and what it reports
//! (`HybridInfo`).

use crate::model::Compute;
use crate::tier::vram::{AdaptConfig, VramPlan};
use crate::tier::Profile;
use std::sync::Arc;

/// Half-life (steps) of the routing counts the adaptive choice reads.
pub const ADAPT_HALF_LIFE: f64 = 128.0;
/// Half-life of the decayed counters reported as "hot" (as the CPU path's).
pub const HOT_HALF_LIFE: f64 = 1024.0;
/// Makes the CPU side (the expert pool) once the hybrid mode is on.
pub type ComputeMaker = Box<dyn FnOnce() -> Arc<dyn Compute> + Send>;

/// How the hybrid mode is set up.
pub struct HybridConfig {
    /// `vram_budget_mib` (None: free − reserve).
    pub budget_mib: Option<u64>,
    pub reserve_mib: u64,
    /// At most this many expert slots (tests and benchmarks: an exact share of the experts).
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
    /// Per stage of the protocol (docs/PROTOCOL.md): its device, windows entered, gaps, and
    /// whether a window is on it now.
    pub stages: Vec<StageInfo>,
}

#[derive(Clone, Copy, Debug)]
pub struct StageInfo {
    pub device: usize,
    pub windows: u64,
    pub gaps: u64,
    pub busy: bool,
}
