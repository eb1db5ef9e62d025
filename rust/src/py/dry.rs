//! DRY's repetition scan (`crate::dry`) for `strata.dry`.

use numpy::PyReadonlyArray1;
use pyo3::prelude::*;

/// `rat` i32 [n]: the history's last n tokens, newest first. Returns the tokens that would
/// extend a repetition of at least `allowed` tokens (lengths capped at `limit`) and, per
/// token, the longest one: two lists, in order of discovery (llama.cpp's walk).
#[pyfunction]
fn dry_longest(
    rat: PyReadonlyArray1<'_, i32>,
    limit: usize,
    allowed: usize,
) -> PyResult<(Vec<i32>, Vec<u32>)> {
    Ok(crate::dry::dry_longest(rat.as_slice()?, limit, allowed)
        .into_iter()
        .unzip())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(dry_longest, m)?)
}
