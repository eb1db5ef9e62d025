//! Kernel launchers: one file per `cuda/<family>.cu`, each checking shapes and buffer sizes
//! (`Error::Shape` / `Error::Config`) before it launches (docs/GPU.md).

pub mod act;
pub mod attention;
pub mod deltanet;
pub mod elementwise;
pub mod moe_decode;
pub mod norm;
pub mod quant;
pub mod quant_kernels;
pub mod quant_mmq;
pub mod quant_oai;
pub mod quant_shared;
pub mod rope;
pub mod router;
pub mod smoke;
pub mod view;
