//! The PyO3 face of the core: `strata._core`. Thin wrappers only; errors become the
//! exception tree re-exported by `strata.errors`.
//!
//! The product's surface is `strata._core` itself. The kernel test and benchmark hooks
//! (`cuda_model`, `cuda_quant`, the `*_bench` modules and the runtime's smoke and fault hooks)
//! live apart, in the private submodule `strata._core._testing`, for tests/ and bench/ only.

mod backend;
mod batch_args;
mod cuda;
mod cuda_model;
mod cuda_model_bench;
mod cuda_quant;
mod cuda_quant_bench;
mod dry;
mod errors;
mod gguf;
mod heap;
mod mask;
mod model;
mod open_args;
mod pool;
mod quant;
mod quant_multi;
mod stages;

mod tier;
mod vram;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    cuda::register(m)?;
    gguf::register(m)?;
    mask::register(m)?;
    dry::register(m)?;
    quant::register(m)?;
    model::register(m)?;
    pool::register(m)?;

    tier::register(m)?;
    vram::register(m)?;
    testing(m)
}

/// `strata._core._testing`: the kernel test and benchmark hooks (not the product's surface).
fn testing(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = parent.py();
    let t = PyModule::new(py, "_testing")?;
    cuda::register_testing(&t)?;
    cuda_model::register(&t)?;
    cuda_model_bench::register(&t)?;
    cuda_quant::register(&t)?;
    cuda_quant_bench::register(&t)?;
    quant_multi::register(&t)?;
    parent.add_submodule(&t)?;
    // `import strata._core._testing` finds it (an extension's submodule is not a file)
    py.import("sys")?
        .getattr("modules")?
        .set_item("strata._core._testing", &t)?;
    Ok(())
}
