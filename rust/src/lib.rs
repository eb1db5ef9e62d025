//! Strata's Rust core: the GGUF reader, quant kernels, the CPU expert pool and the model
//! forward pass. The Python face lives in `py` and is compiled only with the `python`
//! feature (maturin turns it on), so `cargo test` builds and links without libpython.

pub mod cuda;
pub mod dry;
pub mod error;
pub mod gguf;
pub mod gpu;
pub mod mask;
pub mod model;
pub mod pool;
pub mod quant;
pub mod tier;

#[cfg(feature = "python")]
mod py;

pub use error::{Error, Result};
