//! The PyO3 face of the core: `strata._core`. Thin wrappers only; errors become the
//! exception tree re-exported by `strata.errors`.

mod errors;
mod gguf;
mod tier;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    gguf::register(m)?;
    tier::register(m)?;
    Ok(())
}
