//! The forward pass of the GPU families (`model::arch::GPU_FAMILIES`) on one GPU (docs/GPU.md): weights uploaded once (`weights`),
//! the KV cache for all slots in VRAM, the layer loop as kernel launches (`step`, over the
//! `launch::Launcher`), decode replayed from captured CUDA graphs, prefill in chunks
//! (`model`). Where the routed experts run is a MoE placement (`placement`): all in VRAM, or
//! the hybrid tier (`hybrid`: VRAM slots, the CPU pool, PCIe). Semantics of
//! `forward`/`slot_len`/`truncate`/`free` are the CPU `Model`'s.

mod batch;
mod batch_scratch;
mod bounce;
mod chain_timing;
mod defer;
mod experts;
mod ffn;
mod flight;
mod flight_state;
mod gdn;
mod gdn_state;
mod hybrid;
mod hybrid_cfg;
mod kv_io;
mod launch;
mod model;
mod pcie;
mod pipeline;
mod placement;
pub mod split;
mod stage;
mod stage_chain;
mod step;
mod stream_in;
pub mod weights;

pub use chain_timing::set_chain_timing as set_hybrid_chain_timing;
pub use hybrid_cfg::{ComputeMaker, HybridConfig, HybridInfo, StageInfo};
pub use launch::set_fusion;
pub use launch::DECODE_MAX_TOKENS;
pub use model::GpuModel;
pub use stage::{set_window_graphs, HopKind, SplitConfig};
