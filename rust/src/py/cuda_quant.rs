//! `strata._core` test entry points of the quantized GPU kernels (docs/GPU.md): each uploads
//! its inputs, runs one launcher of `cuda::ops::quant` on the process's device and reads the
//! result back. Shapes are checked here (`ShapeError`) and again by the launchers.

use super::cuda::shared_gpu;
use crate::cuda::ops::quant::{self, QuantOps};
use crate::cuda::{DevBuf, Gpu};
use crate::error::{Error, Result};
use crate::quant::GgmlType;
use numpy::{
    PyArray1, PyArray2, PyArray3, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::{Arc, Mutex};

static OPS: Mutex<Option<(Arc<Gpu>, Arc<QuantOps>)>> = Mutex::new(None);

/// The shared device and its quantized kernels, resolved once.
fn ops() -> Result<(Arc<Gpu>, Arc<QuantOps>)> {
    let mut g = OPS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(v) = g.as_ref() {
        return Ok(v.clone());
    }
    let gpu = shared_gpu()?;
    let v = (gpu.clone(), Arc::new(QuantOps::new(&gpu)?));
    *g = Some(v.clone());
    Ok(v)
}

fn ggml_type(name: &str) -> Result<GgmlType> {
    GgmlType::from_name(name).ok_or_else(|| Error::Quant(format!("unknown ggml type {name:?}")))
}

/// Bytes of a [rows, k] matrix of `ty`, or ShapeError.
fn matrix_bytes(ty: GgmlType, rows: usize, k: usize) -> Result<usize> {
    ty.row_bytes(k)
        .and_then(|rb| rb.checked_mul(rows))
        .ok_or_else(|| Error::Shape(format!("{} [{rows}, {k}]: not whole blocks", ty.name())))
}

fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::Shape(format!(
            "{what}: {got} bytes, expected {want}"
        )));
    }
    Ok(())
}

fn upload_f32(gpu: &Gpu, v: &[f32]) -> Result<DevBuf> {
    gpu.upload_pod(v)
}

fn nc(e: numpy::NotContiguousError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// y f32 [n, rows] = x f32 [n, k] · Wᵀ for W [rows, k] of type `type_name` (GGUF row bytes).
#[pyfunction]
fn gpu_matmul<'py>(
    py: Python<'py>,
    type_name: &str,
    w: &[u8],
    rows: usize,
    k: usize,
    x: PyReadonlyArray2<'py, f32>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let ty = ggml_type(type_name)?;
    let n = x.shape()[0];
    if x.shape()[1] != k {
        return Err(Error::Shape(format!("x has {} columns, k is {k}", x.shape()[1])).into());
    }
    let xs = x.as_slice().map_err(nc)?;
    if let Some(bytes) = ty.row_bytes(k).and_then(|rb| rb.checked_mul(rows)) {
        check_len("weights", w.len(), bytes)?;
    }
    let y = py.detach(|| -> Result<Vec<f32>> {
        let (gpu, q) = ops()?;
        let s = gpu.stream()?;
        let wb = gpu.upload(w)?;
        let xb = upload_f32(&gpu, xs)?;
        let yb = gpu.alloc(4 * n * rows)?;
        let scratch = gpu.alloc(quant::scratch_bytes(k, n))?;
        quant::matmul(
            &q,
            &s,
            ty,
            wb.ptr(),
            rows,
            k,
            xb.ptr(),
            yb.ptr(),
            n,
            scratch.ptr(),
        )?;
        let y = yb.read::<f32>(&s, 0, n * rows)?;
        s.sync()?;
        Ok(y)
    })?;
    PyArray1::from_vec(py, y).reshape([n, rows])
}

/// out f32 [n, k] = dequantized rows ids of W [rows, k] (ids outside 0..rows give zeros).
#[pyfunction]
fn gpu_get_rows<'py>(
    py: Python<'py>,
    type_name: &str,
    w: &[u8],
    rows: usize,
    k: usize,
    ids: PyReadonlyArray1<'py, i32>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let ty = ggml_type(type_name)?;
    let ids = ids.as_slice().map_err(nc)?;
    let n = ids.len();
    if let Some(bytes) = ty.row_bytes(k).and_then(|rb| rb.checked_mul(rows)) {
        check_len("weights", w.len(), bytes)?;
    }
    let out = py.detach(|| -> Result<Vec<f32>> {
        let (gpu, q) = ops()?;
        let s = gpu.stream()?;
        let wb = gpu.upload(w)?;
        let ib = gpu.upload_pod(ids)?;
        let ob = gpu.alloc(4 * n * k)?;
        quant::get_rows(&q, &s, ty, wb.ptr(), rows, k, ib.ptr(), n, ob.ptr())?;
        let out = ob.read::<f32>(&s, 0, n * k)?;
        s.sync()?;
        Ok(out)
    })?;
    PyArray1::from_vec(py, out).reshape([n, k])
}

fn refs(v: &[Option<Vec<u8>>]) -> Vec<Option<&[u8]>> {
    v.iter().map(|b| b.as_deref()).collect()
}

/// Device copies of the experts (None → a 0 pointer) and the pointer table.
fn upload_experts(
    gpu: &Gpu,
    ty: GgmlType,
    experts: &[Option<&[u8]>],
    rows: usize,
    k: usize,
) -> Result<(Vec<DevBuf>, DevBuf)> {
    let want = matrix_bytes(ty, rows, k)?;
    let mut bufs = Vec::new();
    let mut ptrs = Vec::with_capacity(experts.len());
    for (e, w) in experts.iter().enumerate() {
        match w {
            Some(w) => {
                check_len(&format!("expert {e}"), w.len(), want)?;
                let b = gpu.upload(w)?;
                ptrs.push(b.ptr());
                bufs.push(b);
            }
            None => ptrs.push(0u64),
        }
    }
    let table = gpu.upload_pod(&ptrs)?;
    Ok((bufs, table))
}

type MoeOut<'py> = (Bound<'py, PyArray3<f32>>, Bound<'py, PyArray2<f32>>);

/// The routed-expert launchers on fresh device copies: gate/up/down are per-expert GGUF bytes
/// (None: not resident, a 0 pointer); ids i32 [n_tok, top_k]; weights f32 [n_tok, top_k];
/// x f32 [n_tok, h]; y f32 [n_tok, h] (the residual the down projection adds into).
/// Returns (act f32 [n_tok, top_k, ff], y + Σ_j w·down).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn gpu_moe<'py>(
    py: Python<'py>,
    ty_gate: &str,
    ty_up: &str,
    ty_down: &str,
    gate: Vec<Option<Bound<'py, PyBytes>>>,
    up: Vec<Option<Bound<'py, PyBytes>>>,
    down: Vec<Option<Bound<'py, PyBytes>>>,
    ff: usize,
    h: usize,
    ids: PyReadonlyArray2<'py, i32>,
    weights: PyReadonlyArray2<'py, f32>,
    x: PyReadonlyArray2<'py, f32>,
    y: PyReadonlyArray2<'py, f32>,
) -> PyResult<MoeOut<'py>> {
    let (tg, tu, td) = (ggml_type(ty_gate)?, ggml_type(ty_up)?, ggml_type(ty_down)?);
    let (n_tok, top_k) = (ids.shape()[0], ids.shape()[1]);
    if weights.shape() != [n_tok, top_k] || x.shape() != [n_tok, h] || y.shape() != [n_tok, h] {
        return Err(Error::Shape(format!(
            "weights must be ({n_tok}, {top_k}), x and y ({n_tok}, {h}); got {:?}, {:?}, {:?}",
            weights.shape(),
            x.shape(),
            y.shape()
        ))
        .into());
    }
    if gate.len() != up.len() || gate.len() != down.len() {
        return Err(Error::Shape("gate, up and down need one entry per expert".into()).into());
    }
    let bytes = |v: &[Option<Bound<'py, PyBytes>>]| -> Vec<Option<Vec<u8>>> {
        v.iter()
            .map(|b| b.as_ref().map(|b| b.as_bytes().to_vec()))
            .collect()
    };
    let (g, u, d) = (bytes(&gate), bytes(&up), bytes(&down));
    let (is, ws, xs, ys) = (
        ids.as_slice().map_err(nc)?,
        weights.as_slice().map_err(nc)?,
        x.as_slice().map_err(nc)?,
        y.as_slice().map_err(nc)?,
    );
    let (act, yout) = py.detach(|| -> Result<(Vec<f32>, Vec<f32>)> {
        let (gpu, q) = ops()?;
        let s = gpu.stream()?;
        let (_gb, gt) = upload_experts(&gpu, tg, &refs(&g), ff, h)?;
        let (_ub, ut) = upload_experts(&gpu, tu, &refs(&u), ff, h)?;
        let (_db, dt) = upload_experts(&gpu, td, &refs(&d), h, ff)?;
        let ib = gpu.upload_pod(is)?;
        let wb = upload_f32(&gpu, ws)?;
        let xb = upload_f32(&gpu, xs)?;
        let yb = upload_f32(&gpu, ys)?;
        let ab = gpu.alloc(4 * n_tok * top_k * ff)?;
        let scratch = gpu.alloc(quant::moe_scratch_bytes(h, ff, top_k, n_tok))?;
        quant::moe_gate_up(
            &q,
            &s,
            tg,
            tu,
            gt.ptr(),
            ut.ptr(),
            ff,
            h,
            ib.ptr(),
            top_k,
            xb.ptr(),
            n_tok,
            ab.ptr(),
            scratch.ptr(),
        )?;
        quant::moe_down(
            &q,
            &s,
            td,
            dt.ptr(),
            h,
            ff,
            ib.ptr(),
            wb.ptr(),
            top_k,
            ab.ptr(),
            n_tok,
            yb.ptr(),
            scratch.ptr(),
        )?;
        let act = ab.read::<f32>(&s, 0, n_tok * top_k * ff)?;
        let yout = yb.read::<f32>(&s, 0, n_tok * h)?;
        s.sync()?;
        Ok((act, yout))
    })?;
    Ok((
        PyArray1::from_vec(py, act).reshape([n_tok, top_k, ff])?,
        PyArray1::from_vec(py, yout).reshape([n_tok, h])?,
    ))
}

/// Whether the GPU kernels run weight type `type_name` (`cuda::ops::quant::supports`).
#[pyfunction]
fn gpu_quant_supports(type_name: &str) -> PyResult<bool> {
    Ok(quant::supports(ggml_type(type_name)?))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gpu_matmul, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_get_rows, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_moe, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_quant_supports, m)?)?;
    Ok(())
}
