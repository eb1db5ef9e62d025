//! The PyO3 face of the core: `strata._core`. Thin wrappers only; errors become the
//! exception tree re-exported by `strata.errors`.

mod cuda;
mod cuda_model;
mod cuda_model_bench;
mod cuda_quant;
mod cuda_quant_bench;
mod errors;
mod gguf;
mod mask;
mod model;
mod pool;
mod quant;

mod tier;
mod vram;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    cuda::register(m)?;
    cuda_model::register(m)?;
    cuda_model_bench::register(m)?;
    cuda_quant::register(m)?;
    cuda_quant_bench::register(m)?;
    gguf::register(m)?;
    mask::register(m)?;
    quant::register(m)?;
    model::register(m)?;
    pool::register(m)?;

    tier::register(m)?;
    vram::register(m)?;
    Ok(())
}
