//! `strata._core.ExpertPool` / `MoELayer`: the pool's Python face (the parity tool and the
//! benchmark use it). Calls release the GIL while the pool computes.

use crate::pool::reference::{matmul_serial, moe_serial};
use crate::pool::{ExpertLayer, MoeInput, Pool, PoolConfig, QExperts, QMatrix};
use crate::quant::GgmlType;
use numpy::{
    PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

fn ty(name: &str) -> PyResult<GgmlType> {
    GgmlType::from_name(name)
        .ok_or_else(|| PyValueError::new_err(format!("unknown ggml type {name:?}")))
}

/// One MoE layer's expert tensors: raw bytes (e.g. `GGUFFile.raw(...)`) of gate and up,
/// numpy shape (E, I, H), and down, (E, H, I). Holds references to the arrays.
#[pyclass(frozen)]
pub struct MoELayer {
    tys: [GgmlType; 3],
    data: [Py<PyArray1<u8>>; 3],
    #[pyo3(get)]
    n_expert: usize,
    #[pyo3(get)]
    hidden: usize,
    #[pyo3(get)]
    inter: usize,
}

#[pymethods]
impl MoELayer {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        gate_type: &str,
        gate: Py<PyArray1<u8>>,
        up_type: &str,
        up: Py<PyArray1<u8>>,
        down_type: &str,
        down: Py<PyArray1<u8>>,
        n_expert: usize,
        hidden: usize,
        inter: usize,
    ) -> PyResult<Self> {
        Ok(MoELayer {
            tys: [ty(gate_type)?, ty(up_type)?, ty(down_type)?],
            data: [gate, up, down],
            n_expert,
            hidden,
            inter,
        })
    }

    #[getter]
    fn types(&self) -> (&'static str, &'static str, &'static str) {
        (self.tys[0].name(), self.tys[1].name(), self.tys[2].name())
    }
}

/// Borrow the three byte arrays for the duration of `f`.
fn with_layer<R>(
    py: Python<'_>,
    l: &MoELayer,
    f: impl FnOnce(ExpertLayer<'_>) -> PyResult<R>,
) -> PyResult<R> {
    let b: Vec<PyReadonlyArray1<'_, u8>> = l
        .data
        .iter()
        .map(|a| a.bind(py).try_readonly())
        .collect::<Result<_, _>>()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let s: Vec<&[u8]> = b
        .iter()
        .map(|a| a.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let m = |n: usize, rows, cols| QExperts {
        ty: l.tys[n],
        data: s[n],
        n_expert: l.n_expert,
        rows,
        cols,
        slabs: None,
    };
    f(ExpertLayer {
        gate: m(0, l.inter, l.hidden),
        up: m(1, l.inter, l.hidden),
        down: m(2, l.hidden, l.inter),
    })
}

type MoeArgs<'py> = (
    PyReadonlyArray2<'py, f32>,
    PyReadonlyArray2<'py, u32>,
    PyReadonlyArray2<'py, f32>,
);

/// Shared by `ExpertPool.moe` and `moe_reference`: y[T,H] from x[T,H], ids/weights [T,k].
fn moe_call<'py>(
    py: Python<'py>,
    layer: &MoELayer,
    (x, ids, weights): MoeArgs<'py>,
    run: impl FnOnce(&ExpertLayer<'_>, &MoeInput<'_>, &mut [f32]) -> crate::Result<()> + Send,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let (t, k) = (ids.shape()[0], ids.shape()[1]);
    let h = layer.hidden;
    if x.shape() != [t, h] || weights.shape() != [t, k] {
        return Err(crate::Error::Shape(format!(
            "x must be ({t}, {h}) and weights ({t}, {k}); got {:?} and {:?}",
            x.shape(),
            weights.shape()
        ))
        .into());
    }
    let nc = |e: numpy::NotContiguousError| PyValueError::new_err(e.to_string());
    let (xs, is, ws) = (
        x.as_slice().map_err(nc)?,
        ids.as_slice().map_err(nc)?,
        weights.as_slice().map_err(nc)?,
    );
    let y = with_layer(py, layer, |l| {
        py.detach(|| -> crate::Result<Vec<f32>> {
            let mut y = vec![0f32; t * h];
            run(&l, &MoeInput::new(xs, is, ws, k), &mut y)?;
            Ok(y)
        })
        .map_err(PyErr::from)
    })?;
    PyArray1::from_vec(py, y).reshape([t, h])
}

fn qmatrix<'a>(type_name: &str, w: &'a [u8], rows: usize, cols: usize) -> PyResult<QMatrix<'a>> {
    Ok(QMatrix {
        ty: ty(type_name)?,
        data: w,
        rows,
        cols,
    })
}

/// The CPU expert pool: `workers` threads (None: one per physical core minus the caller).
#[pyclass(frozen)]
pub struct ExpertPool {
    pool: Pool,
}

#[pymethods]
impl ExpertPool {
    #[new]
    #[pyo3(signature = (workers=None, host_participates=true, pipelined=true, pin=true, spin_us=2000, balanced=true))]
    fn new(
        workers: Option<usize>,
        host_participates: bool,
        pipelined: bool,
        pin: bool,
        spin_us: u32,
        balanced: bool,
    ) -> Self {
        let mut cfg = PoolConfig::default();
        if let Some(w) = workers {
            cfg.workers = w;
        }
        cfg.host_participates = host_participates;
        cfg.pipelined = pipelined;
        cfg.pin = pin;
        cfg.spin_us = spin_us;
        cfg.balanced = balanced;
        ExpertPool {
            pool: Pool::new(cfg),
        }
    }

    #[getter]
    fn workers(&self) -> usize {
        self.pool.workers()
    }

    #[getter]
    fn host_participates(&self) -> bool {
        self.pool.config().host_participates
    }

    #[getter]
    fn pipelined(&self) -> bool {
        self.pool.config().pipelined
    }

    /// y[T,H] for x[T,H] (float32), ids[T,k] (uint32), weights[T,k] (float32).
    fn moe<'py>(
        &self,
        py: Python<'py>,
        layer: &MoELayer,
        x: PyReadonlyArray2<'py, f32>,
        ids: PyReadonlyArray2<'py, u32>,
        weights: PyReadonlyArray2<'py, f32>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let pool = &self.pool;
        moe_call(py, layer, (x, ids, weights), |l, a, y| pool.moe(l, a, y))
    }

    /// y[T,rows] = x[T,cols]·Wᵀ with W the raw bytes of a (rows, cols) matrix of `type_name`.
    fn matmul<'py>(
        &self,
        py: Python<'py>,
        type_name: &str,
        w: PyReadonlyArray1<'py, u8>,
        rows: usize,
        cols: usize,
        x: PyReadonlyArray2<'py, f32>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let t = x.shape()[0];
        let ws = w
            .as_slice()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let xs = x
            .as_slice()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let m = qmatrix(type_name, ws, rows, cols)?;
        let pool = &self.pool;
        let y = py.detach(|| -> crate::Result<Vec<f32>> {
            let mut y = vec![0f32; t * rows];
            pool.matmul(&m, xs, t, &mut y)?;
            Ok(y)
        })?;
        PyArray1::from_vec(py, y).reshape([t, rows])
    }
}

/// The serial reference (`pool::reference`), same arguments as `ExpertPool.moe`.
#[pyfunction]
fn moe_reference<'py>(
    py: Python<'py>,
    layer: &MoELayer,
    x: PyReadonlyArray2<'py, f32>,
    ids: PyReadonlyArray2<'py, u32>,
    weights: PyReadonlyArray2<'py, f32>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    moe_call(py, layer, (x, ids, weights), |l, a, y| {
        // The reference trusts its inputs: validate them through a zero-worker pool's checks.
        crate::pool::validate_moe(l, a, y)?;
        moe_serial(l, a, y)
    })
}

/// The serial dense reference, same arguments as `ExpertPool.matmul`.
#[pyfunction]
fn matmul_reference<'py>(
    py: Python<'py>,
    type_name: &str,
    w: PyReadonlyArray1<'py, u8>,
    rows: usize,
    cols: usize,
    x: PyReadonlyArray2<'py, f32>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let t = x.shape()[0];
    let ws = w
        .as_slice()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let xs = x
        .as_slice()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let m = qmatrix(type_name, ws, rows, cols)?;
    let y = py.detach(|| -> crate::Result<Vec<f32>> {
        let mut y = vec![0f32; t * rows];
        crate::pool::validate_matmul(&m, xs, t, &y)?;
        matmul_serial(&m, xs, t, &mut y)?;
        Ok(y)
    })?;
    PyArray1::from_vec(py, y).reshape([t, rows])
}

/// Whether the pool can run weights of this type (a dot kernel exists).
#[pyfunction]
fn pool_supports(type_name: &str) -> PyResult<bool> {
    Ok(crate::quant::dot::supports(ty(type_name)?))
}

/// Measured RAM read bandwidth (GB/s, best of `reps`) with `threads` threads.
#[pyfunction]
#[pyo3(signature = (threads, mib=1024, reps=5))]
fn ram_read_gbps(py: Python<'_>, threads: usize, mib: usize, reps: usize) -> f64 {
    py.detach(|| crate::pool::membench::read_gbps(mib << 20, threads, reps))
}

/// The CPUs the pool pins its threads to: the first CPU of each physical core among those
/// this thread may run on, ascending (the caller keeps the first, workers take the next).
#[pyfunction]
fn physical_cores() -> Vec<usize> {
    crate::pool::physical_cores()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(pool_supports, m)?)?;
    m.add_function(wrap_pyfunction!(physical_cores, m)?)?;
    m.add_function(wrap_pyfunction!(ram_read_gbps, m)?)?;
    m.add_class::<ExpertPool>()?;
    m.add_class::<MoELayer>()?;
    m.add_function(wrap_pyfunction!(moe_reference, m)?)?;
    m.add_function(wrap_pyfunction!(matmul_reference, m)?)?;
    Ok(())
}
