//! `apply_token_bitmask`: a grammar's token mask applied to a logits row in place.

use numpy::{PyReadonlyArray1, PyReadwriteArray1};
use pyo3::prelude::*;

/// Sets the logits of the tokens `mask` forbids to -inf, in place: `logits` f32 [V]
/// (contiguous), `mask` i32 [ceil(V/32)] (bit j of word i: token 32·i + j allowed).
#[pyfunction]
fn apply_token_bitmask(
    mut logits: PyReadwriteArray1<'_, f32>,
    mask: PyReadonlyArray1<'_, i32>,
) -> PyResult<()> {
    crate::mask::apply_token_bitmask(logits.as_slice_mut()?, mask.as_slice()?);
    Ok(())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(apply_token_bitmask, m)?)
}
