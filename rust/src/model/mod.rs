//! The model forward pass: hyper-parameters and weights from a GGUF for each family the
//! architecture layer (`arch`) names, the KV cache, attention and the layer loop. Heavy
//! matmuls go through the `Compute` seam.

pub mod arch;
mod arch_oai;
pub mod attention;
#[cfg_attr(target_arch = "x86_64", path = "attn_avx2.rs")]
#[cfg_attr(not(target_arch = "x86_64"), path = "attn_stub.rs")]
mod attn_avx2;
pub mod attn_gqa;
#[cfg_attr(target_arch = "x86_64", path = "attn_gqa_avx2.rs")]
#[cfg_attr(not(target_arch = "x86_64"), path = "attn_gqa_stub.rs")]
mod attn_gqa_avx2;
pub mod attn_par;
pub mod batch;
pub mod blocks;
pub mod checkpoints;
pub mod compute;
pub mod deltanet;
mod deltanet_chunk;
mod deltanet_par;
mod dense_r16;
pub mod forward;
pub mod head;
pub mod hparams;
mod huge_buf;
pub mod kv;
pub mod kv_blob;
pub mod kv_shift;
pub mod moe_oai;
pub mod mtp;
pub mod ops;
pub mod readahead;
mod rows_par;
mod step;
pub mod weights;

pub use arch::Family;
pub use batch::Entry;
pub use compute::{Compute, ExpertLayer, QExperts, QMatrix, SerialCompute};
pub use forward::{Logits, Model, ModelConfig};
pub use hparams::HParams;
pub use kv::KvType;
