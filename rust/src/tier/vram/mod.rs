//! The VRAM expert tier of the hybrid step (issue #9, docs/TIERS_VRAM.md): the budget and
//! slot layout, the residency table and pointer tables, the adaptive choice, the slot fence
//! protocol and its driver (sync or async), the CPU side of a step, and the counters.
//!
//! Everything here is device-agnostic: the device is reached through two traits, `Fence`
//! (a completion event that can be queried) and `SlotIo` (issue a copy into a slot), and the
//! host-only staging through `Stager`; the CUDA backend implements them.

pub mod adapt;
pub mod budget;
pub mod cuda_io;
pub mod driver;
pub mod fence;
pub mod miss;
pub mod protocol;
pub mod share_tune;
pub mod stats;
pub mod table;

pub use adapt::{choose, AdaptConfig, Swap};
pub use budget::{plan, shapes_of, BudgetInputs, ExpertShape, Proj, VramPlan};
pub use cuda_io::{default_pcie_frac, probe_pcie_gbps, CudaSlots, RamStager, StageBuf, TierFence};
pub use driver::{start_fill, GapOutcome, Prepared, Stager, TierDriver};
pub use fence::{Fence, PollOutcome, SlotFences, SlotIo, SlotState};
pub use miss::{cpu_misses, LayerSplit, PcieShare};
pub use protocol::{GapTicket, Protocol, StageCounts, WindowId, WindowState};
pub use share_tune::ShareTuner;
pub use stats::{HybridCounters, HybridSnapshot};
pub use table::{fill_order, initial_assignment, Key, PtrTables, VramTable};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_fence;
#[cfg(test)]
mod tests_protocol;
