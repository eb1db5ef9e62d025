//! `strata._core` timing entry points of the decode step's kernels (bench/gpu_decode_kernels.py):
//! `reps` launches captured in one CUDA graph and replayed, as the decode step runs them, so
//! the figure is the per-kernel time inside a graph (no host launch cost), in µs per call.

use super::cuda::shared_gpu;
use crate::cuda::ops::attention::{self, KvLayout};
use crate::cuda::ops::quant::{self, QuantOps};
use crate::cuda::ops::view::Dv;
use crate::cuda::ops::{norm, router};
use crate::cuda::{DevBuf, Gpu, Stream};
use crate::error::{Error, Result};
use crate::model::KvType;
use crate::quant::GgmlType;
use pyo3::prelude::*;

/// Replays of the captured graph that are timed (after one warm-up replay).
const REPLAYS: usize = 5;

/// µs per call of `f`: `reps` calls captured into one graph, replayed REPLAYS times.
pub(super) fn time_graph_us(
    gpu: &Gpu,
    s: &Stream,
    reps: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    let reps = reps.max(1);
    f()?; // resolves everything outside the capture
    s.sync()?;
    s.begin_capture()?;
    let mut res = Ok(());
    for _ in 0..reps {
        res = f();
        if res.is_err() {
            break;
        }
    }
    let graph = s.end_capture();
    res?;
    let graph = graph?;
    graph.launch(s)?;
    let (start, end) = (gpu.event()?, gpu.event()?);
    start.record(s)?;
    for _ in 0..REPLAYS {
        graph.launch(s)?;
    }
    end.record(s)?;
    end.sync()?;
    Ok(start.elapsed_ms(&end)? as f64 * 1000.0 / (reps * REPLAYS) as f64)
}

fn zeros(gpu: &Gpu, s: &Stream, bytes: usize) -> Result<DevBuf> {
    let b = gpu.alloc(bytes.max(4))?;
    b.zero(s)?;
    Ok(b)
}

/// µs per RMSNorm of `rows` rows of n (`fused`: the residual add + norm kernel).
#[pyfunction]
fn gpu_bench_norm(
    py: Python<'_>,
    n: usize,
    rows: usize,
    fused: bool,
    reps: usize,
) -> PyResult<f64> {
    Ok(py.detach(|| -> Result<f64> {
        let gpu = shared_gpu()?;
        let s = gpu.stream()?;
        let b = 4 * n * rows;
        let (x, y, o) = (
            zeros(&gpu, &s, b)?,
            zeros(&gpu, &s, b)?,
            zeros(&gpu, &s, b)?,
        );
        let w = zeros(&gpu, &s, 4 * n)?;
        let (x, y, o, w) = (Dv::of(&x), Dv::of(&y), Dv::of(&o), Dv::of(&w));
        time_graph_us(&gpu, &s, reps, || {
            if fused {
                norm::add_rms(&gpu, &s, x, y, w, o, None, rows, n, 1e-6)
            } else {
                norm::rms(&gpu, &s, x, w, o, rows, n, 1e-6)
            }
        })
    })?)
}

/// µs per decode attention call of n_tok tokens at positions pos .. pos + n_tok − 1 over a
/// cache of n_ctx positions ("f16" or "q8_0"), with the engine's split count for n_ctx.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn gpu_bench_attention(
    py: Python<'_>,
    kv: &str,
    n_head: usize,
    n_kv: usize,
    d: usize,
    n_ctx: usize,
    pos: usize,
    n_tok: usize,
    reps: usize,
) -> PyResult<f64> {
    let ty = match kv {
        "f16" => KvType::F16,
        "q8_0" => KvType::Q8_0,
        _ => return Err(Error::Config(format!("kv type {kv:?}: f16 or q8_0")).into()),
    };
    if pos + n_tok > n_ctx || n_tok == 0 {
        return Err(Error::Shape(format!("{n_tok} tokens at {pos} of {n_ctx}")).into());
    }
    Ok(py.detach(|| -> Result<f64> {
        let gpu = shared_gpu()?;
        let s = gpu.stream()?;
        let lay = KvLayout::new(ty, 1, 1, n_kv, n_ctx, d)?;
        let n_split = attention::n_split(&gpu, n_kv, n_ctx);
        let (po, pml) = attention::part_bytes(n_tok, n_head, n_split, d)?;
        let qb = 4 * n_tok * n_head * d;
        let (q, out) = (zeros(&gpu, &s, qb)?, zeros(&gpu, &s, qb)?);
        let (kc, vc) = (zeros(&gpu, &s, lay.total())?, zeros(&gpu, &s, lay.total())?);
        let (bpo, bpm) = (zeros(&gpu, &s, po)?, zeros(&gpu, &s, pml)?);
        let sp = gpu.upload_pod(&[pos as i32, 0i32])?;
        time_graph_us(&gpu, &s, reps, || {
            attention::decode(
                &gpu,
                &s,
                &lay,
                0,
                Dv::of(&q),
                Dv::of(&kc),
                Dv::of(&vc),
                Dv::of(&sp),
                Dv::of(&bpo),
                Dv::of(&bpm),
                Dv::of(&out),
                n_tok,
                n_head,
                n_split,
                1.0 / (d as f32).sqrt(),
            )
        })
    })?)
}

/// µs per router top-k (softmax over n_expert, k picks, renormalized) of n_tok tokens.
#[pyfunction]
fn gpu_bench_router(
    py: Python<'_>,
    n_expert: usize,
    k: usize,
    n_tok: usize,
    reps: usize,
) -> PyResult<f64> {
    Ok(py.detach(|| -> Result<f64> {
        let gpu = shared_gpu()?;
        let s = gpu.stream()?;
        let logits = gpu.upload_pod(
            &(0..n_tok * n_expert)
                .map(|i| ((i * 7919) % 1000) as f32 * 1e-3)
                .collect::<Vec<f32>>(),
        )?;
        let (ids, w) = (
            zeros(&gpu, &s, 4 * n_tok * k)?,
            zeros(&gpu, &s, 4 * n_tok * k)?,
        );
        time_graph_us(&gpu, &s, reps, || {
            router::topk(
                &gpu,
                &s,
                Dv::of(&logits),
                Dv::of(&ids),
                Dv::of(&w),
                None,
                n_tok,
                n_expert,
                k,
                true,
            )
        })
    })?)
}

/// µs per `quant::matmul` of W [rows, k] (`type_name`, zero bytes: timing does not depend on
/// the values) with n_tok tokens inside a graph, the activation quantization of x included.
/// `row_per_block`: None lets the
/// launcher choose the one-token kernel, True / False force the row-per-block (`_r1`) / the
/// plain warp-per-row one. `staged`: True / False force the warp-per-row kernel with x and the
/// rows staged in shared memory (`_st`) / without.
#[pyfunction]
#[pyo3(signature = (type_name, rows, k, n_tok, reps, row_per_block = None, staged = None))]
#[allow(clippy::too_many_arguments)]
fn gpu_bench_matmul_graph(
    py: Python<'_>,
    type_name: &str,
    rows: usize,
    k: usize,
    n_tok: usize,
    reps: usize,
    row_per_block: Option<bool>,
    staged: Option<bool>,
) -> PyResult<f64> {
    let ty = GgmlType::from_name(type_name)
        .ok_or_else(|| Error::Quant(format!("unknown ggml type {type_name:?}")))?;
    Ok(py.detach(|| -> Result<f64> {
        let gpu = shared_gpu()?;
        let mut q = QuantOps::new(&gpu)?;
        if let Some(r1) = row_per_block {
            q.set_row_per_block_below(if r1 { usize::MAX } else { 0 });
            q.set_stage_from(usize::MAX);
        }
        if let Some(st) = staged {
            q.set_row_per_block_below(0);
            q.set_stage_from(if st { 0 } else { usize::MAX });
        }
        let s = gpu.stream()?;
        let wb = ty
            .row_bytes(k)
            .and_then(|rb| rb.checked_mul(rows))
            .ok_or_else(|| Error::Shape(format!("{} [{rows}, {k}]", ty.name())))?;
        let w = zeros(&gpu, &s, wb)?;
        let x = zeros(&gpu, &s, 4 * n_tok * k)?;
        let y = zeros(&gpu, &s, 4 * n_tok * rows)?;
        let scratch = zeros(&gpu, &s, quant::scratch_bytes(k, n_tok))?;
        time_graph_us(&gpu, &s, reps, || {
            let (xp, yp) = (x.ptr(), y.ptr());
            quant::matmul(&q, &s, ty, w.ptr(), rows, k, xp, yp, n_tok, scratch.ptr())
        })
    })?)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gpu_bench_norm, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_bench_attention, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_bench_router, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_bench_matmul_graph, m)?)?;
    Ok(())
}
