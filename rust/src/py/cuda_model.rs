//! Test entry points of the model kernels (`cuda/{norm,rope,attention,router,elementwise}.cu`
//! through their launchers): numpy in, numpy out, on the process's GPU. tests/test_gpu_model.py
//! compares them with numpy references. A KV cache argument is one layer's bytes
//! [n_slots, Nkv, n_ctx, head_bytes] (uint8).

use super::cuda::shared_gpu;
use crate::cuda::ops::attention::{self, KvLayout};
use crate::cuda::ops::view::Dv;
use crate::cuda::ops::{elementwise, norm, rope, router};
use crate::cuda::{DevBuf, Gpu, Pod, Stream};
use crate::error::{Error, Result};
use crate::model::KvType;
use numpy::ndarray::{Array1, Array2, Array3, Array4};
use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyArray3, PyArray4, PyReadonlyArray1, PyReadonlyArray2,
    PyReadonlyArray3, PyReadonlyArray4,
};
use pyo3::prelude::*;
use std::sync::Arc;

type P2<'py> = Bound<'py, PyArray2<f32>>;
type P3<'py> = Bound<'py, PyArray3<f32>>;
type P4U8<'py> = Bound<'py, PyArray4<u8>>;
type P1<'py> = Bound<'py, PyArray1<f32>>;

fn flat<T: Copy + numpy::Element, D: numpy::ndarray::Dimension>(
    a: &numpy::PyReadonlyArray<'_, T, D>,
) -> Vec<T> {
    a.as_array().iter().copied().collect()
}

struct Dev {
    gpu: Arc<Gpu>,
    s: Stream,
}

impl Dev {
    fn new() -> Result<Dev> {
        let gpu = shared_gpu()?;
        let s = gpu.stream()?;
        Ok(Dev { gpu, s })
    }

    fn up<T: Pod>(&self, v: &[T]) -> Result<DevBuf> {
        // never a zero-size buffer, so every pointer is a real allocation
        if v.is_empty() {
            return self.gpu.alloc(16);
        }
        self.gpu.upload_pod(v)
    }

    fn down<T: Pod>(&self, b: &DevBuf, n: usize) -> Result<Vec<T>> {
        self.s.sync()?;
        b.read::<T>(&self.s, 0, n)
    }
}

fn shape_err(what: &str) -> Error {
    Error::Shape(what.to_string())
}

/// RMSNorm of each row: x f32 [rows, n], w f32 [n] → f32 [rows, n].
#[pyfunction]
fn gpu_norm_rms<'py>(
    py: Python<'py>,
    x: PyReadonlyArray2<'py, f32>,
    w: PyReadonlyArray1<'py, f32>,
    eps: f32,
) -> PyResult<P2<'py>> {
    let (rows, n) = x.as_array().dim();
    let (xv, wv) = (flat(&x), flat(&w));
    let out = py.detach(|| -> Result<Vec<f32>> {
        let d = Dev::new()?;
        let (bx, bw) = (d.up(&xv)?, d.up(&wv)?);
        let bo = d.up(&vec![0f32; rows * n])?;
        norm::rms(
            &d.gpu,
            &d.s,
            Dv::of(&bx),
            Dv::of(&bw),
            Dv::of(&bo),
            rows,
            n,
            eps,
        )?;
        d.down(&bo, rows * n)
    })?;
    let a = Array2::from_shape_vec((rows, n), out).map_err(|e| shape_err(&e.to_string()))?;
    Ok(a.into_pyarray(py))
}

/// x += y, out = RMSNorm(x)·w: returns (x, out).
#[pyfunction]
fn gpu_norm_add_rms<'py>(
    py: Python<'py>,
    x: PyReadonlyArray2<'py, f32>,
    y: PyReadonlyArray2<'py, f32>,
    w: PyReadonlyArray1<'py, f32>,
    eps: f32,
) -> PyResult<(P2<'py>, P2<'py>)> {
    let (rows, n) = x.as_array().dim();
    let (xv, yv, wv) = (flat(&x), flat(&y), flat(&w));
    let (xo, out) = py.detach(|| -> Result<(Vec<f32>, Vec<f32>)> {
        let d = Dev::new()?;
        let (bx, by, bw) = (d.up(&xv)?, d.up(&yv)?, d.up(&wv)?);
        let bo = d.up(&vec![0f32; rows * n])?;
        norm::add_rms(
            &d.gpu,
            &d.s,
            Dv::of(&bx),
            Dv::of(&by),
            Dv::of(&bw),
            Dv::of(&bo),
            None,
            rows,
            n,
            eps,
        )?;
        Ok((d.down(&bx, rows * n)?, d.down(&bo, rows * n)?))
    })?;
    let mk = |v: Vec<f32>| Array2::from_shape_vec((rows, n), v);
    let xo = mk(xo).map_err(|e| shape_err(&e.to_string()))?;
    let out = mk(out).map_err(|e| shape_err(&e.to_string()))?;
    Ok((xo.into_pyarray(py), out.into_pyarray(py)))
}

/// RoPE NEOX of x f32 [T, H, D] at positions pos0 + t with tables cos/sin f32 [P, n_rot/2].
#[pyfunction]
fn gpu_rope_neox<'py>(
    py: Python<'py>,
    x: PyReadonlyArray3<'py, f32>,
    cos: PyReadonlyArray2<'py, f32>,
    sin: PyReadonlyArray2<'py, f32>,
    pos0: i32,
    n_rot: usize,
) -> PyResult<P3<'py>> {
    let dim = x.as_array().dim();
    let n_pos = cos.as_array().dim().0;
    let (xv, cv, sv) = (flat(&x), flat(&cos), flat(&sin));
    let out = py.detach(|| -> Result<Vec<f32>> {
        let d = Dev::new()?;
        let (bx, bc, bs) = (d.up(&xv)?, d.up(&cv)?, d.up(&sv)?);
        let sp = d.up(&[pos0, 0])?;
        rope::neox(
            &d.gpu,
            &d.s,
            Dv::of(&bx),
            Dv::of(&bc),
            Dv::of(&bs),
            Dv::of(&sp),
            dim.0,
            dim.1,
            dim.2,
            n_rot,
            n_pos,
        )?;
        d.down(&bx, xv.len())
    })?;
    let a = Array3::from_shape_vec(dim, out).map_err(|e| shape_err(&e.to_string()))?;
    Ok(a.into_pyarray(py))
}

fn layout(kv: &str, kc: &PyReadonlyArray4<'_, u8>, d: usize) -> Result<KvLayout> {
    let (n_slots, n_kv, n_ctx, hb) = kc.as_array().dim();
    let lay = KvLayout::new(KvType::parse(kv)?, n_slots, 1, n_kv, n_ctx, d)?;
    if lay.head_bytes() != hb {
        return Err(Error::Shape(format!(
            "cache rows of {hb} bytes; a {kv} head of {d} takes {}",
            lay.head_bytes()
        )));
    }
    Ok(lay)
}

/// The fused per-head step: returns (q normed and rotated, K cache, V cache) after writing
/// the T tokens' rows at positions pos0.. of `slot`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn gpu_rope_qkv<'py>(
    py: Python<'py>,
    kv: &str,
    q: PyReadonlyArray3<'py, f32>,
    k: PyReadonlyArray3<'py, f32>,
    v: PyReadonlyArray3<'py, f32>,
    qn: Option<PyReadonlyArray1<'py, f32>>,
    kn: Option<PyReadonlyArray1<'py, f32>>,
    bias: Option<(
        PyReadonlyArray1<'py, f32>,
        PyReadonlyArray1<'py, f32>,
        PyReadonlyArray1<'py, f32>,
    )>,
    cos: PyReadonlyArray2<'py, f32>,
    sin: PyReadonlyArray2<'py, f32>,
    pos0: i32,
    slot: i32,
    kc: PyReadonlyArray4<'py, u8>,
    vc: PyReadonlyArray4<'py, u8>,
    n_rot: usize,
    eps: f32,
    neox: bool,
) -> PyResult<(P3<'py>, P4U8<'py>, P4U8<'py>)> {
    let qdim = q.as_array().dim();
    let cdim = kc.as_array().dim();
    let lay = layout(kv, &kc, qdim.2)?;
    let vals = [flat(&q), flat(&k), flat(&v), flat(&cos), flat(&sin)];
    let norm = match (&qn, &kn) {
        (Some(a), Some(b)) => Some([flat(a), flat(b)]),
        _ => None,
    };
    let bias = bias.map(|(a, b, c)| [flat(&a), flat(&b), flat(&c)]);
    let (kcv, vcv) = (flat(&kc), flat(&vc));
    let (qo, ko, vo) = py.detach(|| -> Result<(Vec<f32>, Vec<u8>, Vec<u8>)> {
        let d = Dev::new()?;
        let b: Vec<DevBuf> = vals.iter().map(|x| d.up(x)).collect::<Result<_>>()?;
        let nb: Option<Vec<DevBuf>> = norm
            .as_ref()
            .map(|n| n.iter().map(|x| d.up(x)).collect::<Result<_>>())
            .transpose()?;
        let bb: Option<Vec<DevBuf>> = bias
            .as_ref()
            .map(|n| n.iter().map(|x| d.up(x)).collect::<Result<_>>())
            .transpose()?;
        let (bk, bv) = (d.up(&kcv)?, d.up(&vcv)?);
        let sp = d.up(&[pos0, slot])?;
        let blk = rope::QkvBlock {
            norm: nb.as_ref().map(|n| [Dv::of(&n[0]), Dv::of(&n[1])]),
            bias: bb
                .as_ref()
                .map(|n| [Dv::of(&n[0]), Dv::of(&n[1]), Dv::of(&n[2])]),
            neox,
        };
        rope::qkv(
            &d.gpu,
            &d.s,
            &lay,
            0,
            Dv::of(&b[0]),
            Dv::of(&b[1]),
            Dv::of(&b[2]),
            blk,
            Dv::of(&b[3]),
            Dv::of(&b[4]),
            Dv::of(&sp),
            Dv::of(&bk),
            Dv::of(&bv),
            qdim.0,
            qdim.1,
            n_rot,
            eps,
        )?;
        Ok((
            d.down(&b[0], vals[0].len())?,
            d.down(&bk, kcv.len())?,
            d.down(&bv, vcv.len())?,
        ))
    })?;
    let e = |e: numpy::ndarray::ShapeError| shape_err(&e.to_string());
    Ok((
        Array3::from_shape_vec(qdim, qo)
            .map_err(e)?
            .into_pyarray(py),
        Array4::from_shape_vec(cdim, ko)
            .map_err(e)?
            .into_pyarray(py),
        Array4::from_shape_vec(cdim, vo)
            .map_err(e)?
            .into_pyarray(py),
    ))
}

/// Attention of q f32 [T, Nh, D] (tokens at pos0.. of `slot`) over one cache layer:
/// `n_split` > 0 runs the decode kernels with that many splits, 0 the prefill kernel.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn gpu_attention<'py>(
    py: Python<'py>,
    kv: &str,
    q: PyReadonlyArray3<'py, f32>,
    kc: PyReadonlyArray4<'py, u8>,
    vc: PyReadonlyArray4<'py, u8>,
    pos0: i32,
    slot: i32,
    n_split: usize,
    scale: f32,
) -> PyResult<P3<'py>> {
    let qdim = q.as_array().dim();
    let (t, nh, dd) = qdim;
    let lay = layout(kv, &kc, dd)?;
    let (qv, kcv, vcv) = (flat(&q), flat(&kc), flat(&vc));
    let out = py.detach(|| -> Result<Vec<f32>> {
        let d = Dev::new()?;
        let (bq, bk, bv) = (d.up(&qv)?, d.up(&kcv)?, d.up(&vcv)?);
        let sp = d.up(&[pos0, slot])?;
        let bo = d.up(&vec![0f32; qv.len()])?;
        let (g, s) = (&d.gpu, &d.s);
        let (q, kc, vc, sp, out) = (
            Dv::of(&bq),
            Dv::of(&bk),
            Dv::of(&bv),
            Dv::of(&sp),
            Dv::of(&bo),
        );
        if n_split > 0 {
            let (po, pml) = attention::part_bytes(t, nh, n_split, dd)?;
            let (bpo, bpm) = (d.gpu.alloc(po)?, d.gpu.alloc(pml)?);
            bpm.zero(s)?; // the finish counters start at zero
            attention::decode(
                g,
                s,
                &lay,
                0,
                q,
                kc,
                vc,
                sp,
                Dv::of(&bpo),
                Dv::of(&bpm),
                out,
                t,
                nh,
                n_split,
                scale,
            )?;
            d.down(&bo, qv.len())
        } else {
            attention::prefill(g, s, &lay, 0, q, kc, vc, sp, out, t, nh, scale)?;
            d.down(&bo, qv.len())
        }
    })?;
    let a = Array3::from_shape_vec(qdim, out).map_err(|e| shape_err(&e.to_string()))?;
    Ok(a.into_pyarray(py))
}

/// Router of logits f32 [T, E]: (ids i32 [T, k], weights f32 [T, k]).
#[pyfunction]
fn gpu_router_topk<'py>(
    py: Python<'py>,
    logits: PyReadonlyArray2<'py, f32>,
    k: usize,
    norm: bool,
) -> PyResult<(Bound<'py, PyArray2<i32>>, P2<'py>)> {
    let (t, e) = logits.as_array().dim();
    let lv = flat(&logits);
    let (ids, w) = py.detach(|| -> Result<(Vec<i32>, Vec<f32>)> {
        let d = Dev::new()?;
        let bl = d.up(&lv)?;
        let (bi, bw) = (d.up(&vec![0i32; t * k])?, d.up(&vec![0f32; t * k])?);
        router::topk(
            &d.gpu,
            &d.s,
            Dv::of(&bl),
            Dv::of(&bi),
            Dv::of(&bw),
            None,
            t,
            e,
            k,
            norm,
        )?;
        Ok((d.down(&bi, t * k)?, d.down(&bw, t * k)?))
    })?;
    let e = |e: numpy::ndarray::ShapeError| shape_err(&e.to_string());
    Ok((
        Array2::from_shape_vec((t, k), ids)
            .map_err(e)?
            .into_pyarray(py),
        Array2::from_shape_vec((t, k), w)
            .map_err(e)?
            .into_pyarray(py),
    ))
}

/// First index of each row's maximum: x f32 [rows, n] → i32 [rows].
#[pyfunction]
fn gpu_argmax<'py>(
    py: Python<'py>,
    x: PyReadonlyArray2<'py, f32>,
) -> PyResult<Bound<'py, PyArray1<i32>>> {
    let (rows, n) = x.as_array().dim();
    let xv = flat(&x);
    let out = py.detach(|| -> Result<Vec<i32>> {
        let d = Dev::new()?;
        let (bx, bo) = (d.up(&xv)?, d.up(&vec![0i32; rows])?);
        elementwise::argmax(&d.gpu, &d.s, Dv::of(&bx), Dv::of(&bo), rows, n)?;
        d.down(&bo, rows)
    })?;
    Ok(Array1::from_vec(out).into_pyarray(py))
}

/// x + y (the residual add kernel) and a copy of x (the copy kernel): f32 [n] each.
#[pyfunction]
fn gpu_add_copy<'py>(
    py: Python<'py>,
    x: PyReadonlyArray1<'py, f32>,
    y: PyReadonlyArray1<'py, f32>,
) -> PyResult<(P1<'py>, P1<'py>)> {
    let (xv, yv) = (flat(&x), flat(&y));
    if xv.len() != yv.len() {
        return Err(shape_err("x and y differ in length").into());
    }
    let (sum, copy) = py.detach(|| -> Result<(Vec<f32>, Vec<f32>)> {
        let d = Dev::new()?;
        let (bx, by) = (d.up(&xv)?, d.up(&yv)?);
        let bc = d.up(&vec![0f32; xv.len()])?;
        let n = xv.len();
        elementwise::copy(&d.gpu, &d.s, Dv::of(&bc), Dv::of(&bx), n)?;
        elementwise::add(&d.gpu, &d.s, Dv::of(&bx), Dv::of(&by), n)?;
        Ok((d.down(&bx, n)?, d.down(&bc, n)?))
    })?;
    Ok((
        Array1::from_vec(sum).into_pyarray(py),
        Array1::from_vec(copy).into_pyarray(py),
    ))
}

/// Device-to-device copy bandwidth: (read + write bytes) per second of copying `mib` MiB,
/// the best of `reps` copies timed with events, in GB/s (the HBM figure decode is bound by).
#[pyfunction]
fn gpu_copy_gbps(py: Python<'_>, mib: usize, reps: usize) -> PyResult<f64> {
    Ok(py.detach(|| -> Result<f64> {
        let d = Dev::new()?;
        let n = mib
            .checked_mul(1 << 20)
            .ok_or_else(|| shape_err("mib too large"))?;
        let (a, b) = (d.gpu.alloc(n)?, d.gpu.alloc(n)?);
        a.zero(&d.s)?;
        b.copy_from(&d.s, 0, &a, 0, n)?; // warm-up
        let (start, end) = (d.gpu.event()?, d.gpu.event()?);
        let mut best = f64::INFINITY;
        for _ in 0..reps.max(1) {
            start.record(&d.s)?;
            b.copy_from(&d.s, 0, &a, 0, n)?;
            end.record(&d.s)?;
            end.sync()?;
            best = best.min(start.elapsed_ms(&end)? as f64);
        }
        Ok(2.0 * n as f64 / (best * 1e-3) / 1e9)
    })?)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gpu_copy_gbps, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_norm_rms, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_norm_add_rms, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_rope_neox, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_rope_qkv, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_attention, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_router_topk, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_argmax, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_add_copy, m)?)?;
    Ok(())
}
