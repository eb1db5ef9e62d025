//! `strata._core` dot-kernel entry points: activation quantization, `vec_dot` with a chosen
//! ISA, and what this CPU offers. Used by tests and benchmarks; the engine calls the Rust
//! API directly.

use crate::error::Error;
use crate::quant::dot::{self, Isa};
use crate::quant::GgmlType;
use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

pub(super) fn ggml_type(name: &str) -> Result<GgmlType, Error> {
    GgmlType::from_name(name).ok_or_else(|| Error::Quant(format!("unknown ggml type {name:?}")))
}

fn isa(name: &str) -> Result<Isa, Error> {
    if name.eq_ignore_ascii_case("auto") {
        return Ok(dot::active_isa());
    }
    Isa::from_name(name)
        .ok_or_else(|| Error::Quant(format!("unknown ISA {name:?} (auto|scalar|avx2|avx512)")))
}

/// Quantize the float row `x` to the activation type `type_name` (Q8_0, Q8_1, Q8_K, F32,
/// F16 or BF16) exactly as ggml's reference quantizer does.
#[pyfunction]
fn quantize_act<'py>(
    py: Python<'py>,
    type_name: &str,
    x: PyReadonlyArray1<'py, f32>,
) -> PyResult<Bound<'py, PyBytes>> {
    let ty = ggml_type(type_name)?;
    let x = x.as_slice()?;
    let n = ty.row_bytes(x.len()).ok_or_else(|| {
        Error::Quant(format!(
            "{} elements is not whole {} blocks",
            x.len(),
            ty.name()
        ))
    })?;
    let mut out = vec![0u8; n];
    dot::quantize_act(ty, x, &mut out)?;
    Ok(PyBytes::new(py, &out))
}

/// `dot(weight row, activation)` for weight type `type_name` over `n` elements, with the
/// kernels of `isa` (auto, scalar, avx2 or avx512).
#[pyfunction]
#[pyo3(signature = (type_name, n, row, act, isa = "auto"))]
fn vec_dot(type_name: &str, n: usize, row: &[u8], act: &[u8], isa: &str) -> PyResult<f32> {
    let ty = ggml_type(type_name)?;
    let isa = self::isa(isa)?;
    Ok(dot::vec_dot_isa(isa, ty, n, row, act)?)
}

/// The SIMD features of this CPU that the kernels care about.
#[pyfunction]
fn cpu_features() -> Vec<&'static str> {
    dot::cpu_features()
}

/// The ISA `vec_dot` uses (`Model.open`'s `isa`, else `STRATA_ISA`, capped at what the CPU
/// runs; chosen once per process).
#[pyfunction]
fn dot_isa() -> &'static str {
    dot::active_isa().name()
}

/// Fix the ISA `vec_dot` uses (auto, scalar, avx2 or avx512) before its first use;
/// ConfigError when the CPU cannot run it or another one is already in use.
#[pyfunction]
fn set_dot_isa(isa: &str) -> PyResult<()> {
    let isa = if isa.eq_ignore_ascii_case("auto") {
        dot::best_isa()
    } else {
        self::isa(isa)?
    };
    Ok(dot::set_active_isa(isa)?)
}

/// Set the one-token kernels' software prefetch distance in bytes (0: no hints) for every
/// later call; returns the previous one. A tuning knob for benchmarks: the results are
/// bitwise the same at any distance.
#[pyfunction]
fn set_dot_prefetch(bytes: usize) -> usize {
    dot::set_prefetch_distance(bytes)
}

/// Set the output head kernel's software prefetch distance in bytes (0: no hints); returns
/// the previous one. A tuning knob like `set_dot_prefetch` (results bitwise the same);
/// setting it stops the head's own tuning (`head_prefetch`).
#[pyfunction]
fn set_head_prefetch(bytes: usize) -> usize {
    dot::set_head_prefetch_distance(bytes)
}

/// (the output head kernel's prefetch distance in bytes now, whether it is settled: chosen
/// by timing the first decode steps' head products on this CPU, or pinned by
/// `set_head_prefetch`).
#[pyfunction]
fn head_prefetch() -> (usize, bool) {
    dot::head_prefetch_state()
}

/// The ISAs this CPU can run.
#[pyfunction]
fn dot_isas() -> Vec<&'static str> {
    Isa::ALL
        .into_iter()
        .filter(|i| i.available())
        .map(Isa::name)
        .collect()
}

/// Names of the weight types the forward pass runs (those with dot kernels).
#[pyfunction]
fn runnable_types() -> Vec<&'static str> {
    GgmlType::ALL
        .iter()
        .filter(|t| dot::supports(**t))
        .map(|t| t.name())
        .collect()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(runnable_types, m)?)?;
    m.add_function(wrap_pyfunction!(quantize_act, m)?)?;
    m.add_function(wrap_pyfunction!(vec_dot, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_features, m)?)?;
    m.add_function(wrap_pyfunction!(dot_isa, m)?)?;
    m.add_function(wrap_pyfunction!(dot_isas, m)?)?;
    m.add_function(wrap_pyfunction!(set_dot_isa, m)?)?;
    m.add_function(wrap_pyfunction!(set_dot_prefetch, m)?)?;
    m.add_function(wrap_pyfunction!(set_head_prefetch, m)?)?;
    m.add_function(wrap_pyfunction!(head_prefetch, m)?)?;
    Ok(())
}
