//! The expert tiers: where each expert lives and how it gets there.
//!
//! - `counters`: per (layer, expert) routing counts with exponential decay (the router feeds
//!   them; metrics, profiles and the adaptive tier read them).
//! - `profile`: hotness profiles on disk, tied to a model by its fingerprint.
//! - `layout`: each expert's slabs in the GGUF file(s).
//! - `residency`: the RAM tier (`mmap`, `resident`, `budget`), its arena and the residency
//!   table; `expert_bytes` is what the pool reads.
//! - `fill`: parallel fill threads (copy into the arena or prefault the page cache).
//! - `prefetch`: read-ahead of the experts about to be used.
//!
//! - `vram`: the VRAM expert slots of the hybrid step, the adaptive tier and its fences.

pub mod counters;
pub mod fill;
pub mod layout;
pub mod prefetch;
pub mod profile;
pub mod residency;
pub mod sys;
pub mod vram;

pub use counters::RoutingCounters;
pub use fill::{Fill, FillKind, FillOptions, FillProgress};
pub use layout::{ExpertLayout, LayerSlabs, Slab};
pub use prefetch::{PrefetchStats, Prefetcher};
pub use profile::{model_id, ModelId, Profile};
pub use residency::{ExpertBytes, Place, RamMode, Residency, TierUses};

#[cfg(test)]
pub(crate) mod tests;
