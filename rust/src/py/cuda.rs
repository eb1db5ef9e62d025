//! `strata._core` GPU runtime entry points: `gpu_status`, `gpu_info`, and the test entry points
//! of the runtime itself (round trip, smoke kernel, graph replay, event timing, kernel lookup).
//! Other GPU wrappers (`cuda_quant.rs`, ...) get the process's device from `shared_gpu()`.

use crate::cuda::{self, ops, Gpu};
use crate::error::{Error, Result};
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::sync::{Arc, Mutex};

static SHARED: Mutex<Option<Arc<Gpu>>> = Mutex::new(None);

/// Device 0, opened once and kept for the life of the process (modules stay loaded).
pub(crate) fn shared_gpu() -> Result<Arc<Gpu>> {
    let mut g = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(gpu) = g.as_ref() {
        return Ok(gpu.clone());
    }
    let gpu = Gpu::open(0)?;
    *g = Some(gpu.clone());
    Ok(gpu)
}

/// (True, "NVIDIA H200, sm_90, 139 GiB") when a usable GPU is present, else (False, why not).
#[pyfunction]
fn gpu_status(py: Python<'_>) -> (bool, String) {
    // Through the shared device, so that asking does not open and close a context each time.
    let _keep = py.detach(shared_gpu).ok();
    match py.detach(cuda::status) {
        Ok(s) => (true, s),
        Err(why) => (false, why),
    }
}

/// Whether GPU models opened from now on fuse the decode chain's producer and consumer
/// kernels (the default: the attention norm and the decode attention quantize the
/// activations of the products that read them; the attention norm adds the hybrid layer's
/// CPU part) rather than running each step in a kernel of its own: the same results, one
/// launch fewer per fusion. Returns the previous setting (A/B timings, the bitwise test).
#[pyfunction]
fn set_gpu_fusion(on: bool) -> bool {
    crate::gpu::set_fusion(on)
}

/// Whether GPU models opened from now on replay a speculative window's step (one piece of
/// 2-8 rows) from CUDA graphs captured for its size (the default) rather than launching its
/// kernels one by one: the same results. Returns the previous setting (A/B timings).
#[pyfunction]
fn set_gpu_window_graphs(on: bool) -> bool {
    crate::gpu::set_window_graphs(on)
}

/// Over how many blocks the GPU decode attention spreads each KV head's query heads in
/// launches and graphs captured from now on (0: the default choice; 1: one block per KV head):
/// the same logits either way, bitwise; for A/B timings. Returns the previous setting.
#[pyfunction]
fn set_gpu_head_split(n: usize) -> usize {
    crate::cuda::ops::attention::set_head_split(n)
}

/// The build's kernels and, when a GPU is usable, the device: a dict for logs and reports.
#[pyfunction]
fn gpu_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    match cuda::kernels_built() {
        Ok(info) => {
            d.set_item("kernels_built", true)?;
            d.set_item("kernels", info)?;
        }
        Err(why) => {
            d.set_item("kernels_built", false)?;
            d.set_item("kernels", why)?;
        }
    }
    d.set_item("kernel_files", cuda::kernel_files())?;
    if let Ok(gpu) = py.detach(shared_gpu) {
        let (free, total) = gpu.mem_info()?;
        d.set_item("name", gpu.name())?;
        d.set_item("cc", gpu.cc())?;
        d.set_item("sm_count", gpu.sm_count())?;
        d.set_item("max_shmem_optin", gpu.max_shmem_optin())?;
        d.set_item("mem_free", free)?;
        d.set_item("mem_total", total)?;
    }
    Ok(d)
}

/// Uploads `data`, then reads back `length` bytes (default: the rest) from byte `offset` of
/// the device copy. Out-of-range reads raise `ShapeError` (checked before any copy).
#[pyfunction]
#[pyo3(signature = (data, offset = 0, length = None))]
fn gpu_roundtrip<'py>(
    py: Python<'py>,
    data: &[u8],
    offset: usize,
    length: Option<usize>,
) -> PyResult<Bound<'py, PyBytes>> {
    let out = py.detach(|| -> Result<Vec<u8>> {
        let gpu = shared_gpu()?;
        let s = gpu.stream()?;
        let buf = gpu.upload(data)?;
        let n = length.unwrap_or(data.len().saturating_sub(offset));
        buf.read::<u8>(&s, offset, n)
    })?;
    Ok(PyBytes::new(py, &out))
}

/// y = a·x + b on the GPU (the smoke kernel): x f32 [n] → y f32 [n].
#[pyfunction]
fn gpu_smoke<'py>(
    py: Python<'py>,
    x: PyReadonlyArray1<'py, f32>,
    a: f32,
    b: f32,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let x = x.as_slice()?.to_vec();
    let y = py.detach(|| -> Result<Vec<f32>> {
        let gpu = shared_gpu()?;
        let s = gpu.stream()?;
        let dx = gpu.upload_pod(&x)?;
        let dy = gpu.alloc(dx.len())?;
        ops::smoke::axpb(&gpu, &s, &dx, &dy, a, b, x.len())?;
        dy.read::<f32>(&s, 0, x.len())
    })?;
    Ok(PyArray1::from_vec(py, y))
}

/// Captures {y = a·x + b; x = y} once as a CUDA graph and replays it `replays` times:
/// returns x after the replays (x_{i+1} = a·x_i + b, in f32).
#[pyfunction]
fn gpu_smoke_graph<'py>(
    py: Python<'py>,
    x: PyReadonlyArray1<'py, f32>,
    a: f32,
    b: f32,
    replays: usize,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let x = x.as_slice()?.to_vec();
    let y = py.detach(|| -> Result<Vec<f32>> {
        let gpu = shared_gpu()?;
        let s = gpu.stream()?;
        let dx = gpu.upload_pod(&x)?;
        let dy = gpu.alloc(dx.len())?;
        // Warm-up outside the capture (resolves the kernel; graphs capture launches only).
        ops::smoke::axpb(&gpu, &s, &dx, &dy, a, b, x.len())?;
        s.sync()?;
        s.begin_capture()?;
        let captured = ops::smoke::axpb(&gpu, &s, &dx, &dy, a, b, x.len())
            .and_then(|_| dx.copy_from(&s, 0, &dy, 0, dy.len()));
        // End the capture even when a step failed, so the stream is usable again.
        let graph = s.end_capture();
        captured?;
        let graph = graph?;
        if s.is_capturing()? {
            return Err(Error::Config(
                "stream still capturing after end_capture".into(),
            ));
        }
        for _ in 0..replays {
            graph.launch(&s)?;
        }
        dx.read::<f32>(&s, 0, x.len())
    })?;
    Ok(PyArray1::from_vec(py, y))
}

/// Times `reps` smoke launches over `n` elements with CUDA events: milliseconds in all.
#[pyfunction]
fn gpu_time_smoke(py: Python<'_>, n: usize, reps: usize) -> PyResult<f32> {
    Ok(py.detach(|| -> Result<f32> {
        let gpu = shared_gpu()?;
        let s = gpu.stream()?;
        let bytes = n
            .checked_mul(4)
            .ok_or_else(|| Error::Shape(format!("n = {n} too large")))?;
        let dx = gpu.alloc(bytes)?;
        let dy = gpu.alloc(bytes)?;
        dx.zero(&s)?;
        let (start, end) = (gpu.event()?, gpu.event()?);
        start.record(&s)?;
        for _ in 0..reps {
            ops::smoke::axpb(&gpu, &s, &dx, &dy, 1.0, 1.0, n)?;
        }
        end.record(&s)?;
        end.sync()?;
        if !end.is_done()? {
            return Err(Error::Config("event not done after sync".into()));
        }
        start.elapsed_ms(&end)
    })?)
}

/// The parameter sizes (bytes) of kernel `name` as the driver reports them (None: driver
/// cannot tell). Unknown names raise `GpuError` naming the kernel.
#[pyfunction]
fn gpu_kernel_params(py: Python<'_>, name: &str) -> PyResult<Option<Vec<usize>>> {
    Ok(py.detach(|| -> Result<Option<Vec<usize>>> {
        let gpu = shared_gpu()?;
        let k = gpu.kernel(name)?;
        Ok(k.param_sizes().map(|p| p.to_vec()))
    })?)
}

/// Launches the smoke kernel with a wrong argument list (an i64 where a float goes, two
/// short): must raise `ConfigError` before anything reaches the device. Raises `GpuError`
/// without launching when the driver cannot list the kernel's parameters.
#[pyfunction]
fn gpu_bad_launch(py: Python<'_>) -> PyResult<()> {
    Ok(py.detach(|| -> Result<()> {
        let gpu = shared_gpu()?;
        let s = gpu.stream()?;
        let k = gpu.kernel("strata_smoke_axpb")?;
        if k.param_sizes().is_none() {
            // Without the driver's parameter list a wrong launch would read wild pointers.
            return Err(Error::NoGpu(
                "the driver cannot report kernel parameters (cuFuncGetParamInfo)".into(),
            ));
        }
        let buf = gpu.alloc(16)?;
        use crate::cuda::Arg;
        k.launch(
            &s,
            (1, 1, 1),
            (32, 1, 1),
            0,
            &[Arg::Ptr(buf.ptr()), Arg::Ptr(buf.ptr()), Arg::I64(1)],
        )?;
        s.sync()
    })?)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gpu_status, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_info, m)?)?;
    m.add_function(wrap_pyfunction!(set_gpu_fusion, m)?)?;
    m.add_function(wrap_pyfunction!(set_gpu_window_graphs, m)?)?;
    m.add_function(wrap_pyfunction!(set_gpu_head_split, m)?)?;
    Ok(())
}

/// The runtime's test hooks, into `strata._core._testing`.
pub fn register_testing(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gpu_roundtrip, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_smoke, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_smoke_graph, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_time_smoke, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_kernel_params, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_bad_launch, m)?)?;
    Ok(())
}
