//! The qwen3moe forward pass on one GPU with every weight in VRAM (GPU_SPEC.md §5): weights
//! uploaded once (`weights`), the KV cache for all slots in VRAM, the layer loop as kernel
//! launches (`step`), decode replayed from a captured CUDA graph, prefill in chunks
//! (`model`). Semantics of `forward`/`slot_len`/`truncate`/`free` are the CPU `Model`'s.

mod bounce;
pub mod hybrid;
mod kv_io;
mod model;
mod pcie;
mod step;
mod stream_in;
pub mod weights;

pub use hybrid::{HybridConfig, HybridInfo};
pub use model::{GpuModel, DECODE_MAX_TOKENS};
