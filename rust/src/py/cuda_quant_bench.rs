//! `strata._core` timing entry points of the quantized GPU kernels (bench/gpu_quant_bench.py):
//! device-resident random weights, CUDA events around `reps` back-to-back launches.

use super::cuda::shared_gpu;
use super::cuda_model_bench::time_graph_us;
use crate::cuda::ops::moe_decode::MoeVariant;
use crate::cuda::ops::quant::{self, QuantOps};
use crate::cuda::{DevBuf, Gpu, Stream};
use crate::error::{Error, Result};
use crate::quant::GgmlType;
use pyo3::prelude::*;

fn ggml_type(name: &str) -> Result<GgmlType> {
    GgmlType::from_name(name).ok_or_else(|| Error::Quant(format!("unknown ggml type {name:?}")))
}

/// xorshift64 bytes: timing does not depend on the values.
fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

fn upload_random(gpu: &Gpu, n: usize, seed: u64) -> Result<DevBuf> {
    gpu.upload(&random_bytes(n, seed))
}

/// Microseconds per call of `f` over `reps` calls (after 3 warm-up calls).
fn time_us(gpu: &Gpu, s: &Stream, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..3 {
        f()?;
    }
    let (start, end) = (gpu.event()?, gpu.event()?);
    start.record(s)?;
    for _ in 0..reps {
        f()?;
    }
    end.record(s)?;
    end.sync()?;
    Ok(start.elapsed_ms(&end)? as f64 * 1000.0 / reps.max(1) as f64)
}

fn quant_ops(gpu: &std::sync::Arc<Gpu>) -> Result<QuantOps> {
    QuantOps::new(gpu)
}

/// (µs per call, weight bytes per call) of `matmul` for W [rows, k] of `type_name`, n_tok tokens.
#[pyfunction]
fn gpu_bench_matmul(
    py: Python<'_>,
    type_name: &str,
    rows: usize,
    k: usize,
    n_tok: usize,
    reps: usize,
) -> PyResult<(f64, usize)> {
    let ty = ggml_type(type_name)?;
    Ok(py.detach(|| -> Result<(f64, usize)> {
        let gpu = shared_gpu()?;
        let q = quant_ops(&gpu)?;
        let s = gpu.stream()?;
        let wbytes = ty
            .row_bytes(k)
            .and_then(|rb| rb.checked_mul(rows))
            .ok_or_else(|| Error::Shape(format!("{} [{rows}, {k}]", ty.name())))?;
        let w = upload_random(&gpu, wbytes, 1)?;
        let x = gpu.alloc(4 * n_tok * k)?;
        x.zero(&s)?;
        let y = gpu.alloc(4 * n_tok * rows)?;
        let scratch = gpu.alloc(quant::scratch_bytes(k, n_tok))?;
        let us = time_us(&gpu, &s, reps, || {
            quant::matmul(
                &q,
                &s,
                ty,
                w.ptr(),
                rows,
                k,
                x.ptr(),
                y.ptr(),
                n_tok,
                scratch.ptr(),
            )
        })?;
        s.sync()?;
        Ok((us, wbytes))
    })?)
}

/// (µs gate_up, µs down, weight bytes gate_up, weight bytes down) per call of the MoE
/// launchers: n_expert experts of [ff, h] (gate, up: `ty_gate_up`) and [h, ff] (down:
/// `ty_down`), n_tok tokens each routed to top_k distinct random experts.
/// `variant`: the decode kernels ("current", "act": gate/up staging only the activations,
/// "v0": the earlier kernels). `graph`: `reps` calls captured in one CUDA graph and replayed
/// (as the decode step runs them), each call routed to another of 16 random expert sets so
/// that the weights come from HBM as in a real step (bytes: one set's distinct experts);
/// otherwise back-to-back launches on one routing.
#[pyfunction]
#[pyo3(signature = (ty_gate_up, ty_down, n_expert, ff, h, top_k, n_tok, reps, variant = "current", graph = false))]
#[allow(clippy::too_many_arguments)]
fn gpu_bench_moe(
    py: Python<'_>,
    ty_gate_up: &str,
    ty_down: &str,
    n_expert: usize,
    ff: usize,
    h: usize,
    top_k: usize,
    n_tok: usize,
    reps: usize,
    variant: &str,
    graph: bool,
) -> PyResult<(f64, f64, usize, usize)> {
    let (tgu, td) = (ggml_type(ty_gate_up)?, ggml_type(ty_down)?);
    if top_k == 0 || top_k > n_expert {
        return Err(Error::Shape(format!("top_k {top_k} of {n_expert} experts")).into());
    }
    let variant = match variant {
        "current" => MoeVariant::Current,
        "act" => MoeVariant::GateUpAct,
        "v0" => MoeVariant::V0,
        _ => return Err(Error::Config(format!("moe variant {variant:?}")).into()),
    };
    Ok(py.detach(|| -> Result<(f64, f64, usize, usize)> {
        let gpu = shared_gpu()?;
        let mut q = quant_ops(&gpu)?;
        q.set_moe_variant(variant);
        let s = gpu.stream()?;
        let bytes = |ty: GgmlType, rows: usize, k: usize| {
            ty.row_bytes(k)
                .and_then(|rb| rb.checked_mul(rows))
                .ok_or_else(|| Error::Shape(format!("{} [{rows}, {k}]", ty.name())))
        };
        let (eg, ed) = (bytes(tgu, ff, h)?, bytes(td, h, ff)?);
        let slab = |eb: usize, seed| upload_random(&gpu, eb * n_expert, seed);
        let (gs, us_, ds) = (slab(eg, 1)?, slab(eg, 2)?, slab(ed, 3)?);
        let table = |b: &DevBuf, eb: usize| {
            let ptrs: Vec<u64> = (0..n_expert).map(|e| b.ptr() + (e * eb) as u64).collect();
            gpu.upload_pod(&ptrs)
        };
        let (gt, ut, dt) = (table(&gs, eg)?, table(&us_, eg)?, table(&ds, ed)?);
        let sets = if graph { SETS } else { 1 };
        let (ids, distinct) = routing(n_expert, top_k, n_tok, sets);
        let idb = gpu.upload_pod(&ids)?;
        let wts = gpu.upload_pod(&vec![1.0f32 / top_k as f32; n_tok * top_k])?;
        let x = gpu.alloc(4 * n_tok * h)?;
        x.zero(&s)?;
        let y = gpu.alloc(4 * n_tok * h)?;
        y.zero(&s)?;
        let act = gpu.alloc(4 * n_tok * top_k * ff)?;
        act.zero(&s)?;
        let scratch = gpu.alloc(quant::moe_scratch_bytes(h, ff, top_k, n_tok))?;
        let mut call = 0usize;
        let mut next_ids = || {
            call += 1;
            idb.ptr() + (4 * n_tok * top_k * (call % sets)) as u64
        };
        let mut gate_up = || {
            let ids = next_ids();
            quant::moe_gate_up(
                &q,
                &s,
                tgu,
                tgu,
                gt.ptr(),
                ut.ptr(),
                ff,
                h,
                ids,
                top_k,
                x.ptr(),
                n_tok,
                act.ptr(),
                scratch.ptr(),
            )
        };
        let t_gu = if graph {
            time_graph_us(&gpu, &s, reps, &mut gate_up)?
        } else {
            time_us(&gpu, &s, reps, &mut gate_up)?
        };
        let mut call = 0usize;
        let mut down = || {
            call += 1;
            let ids = idb.ptr() + (4 * n_tok * top_k * (call % sets)) as u64;
            quant::moe_down(
                &q,
                &s,
                td,
                dt.ptr(),
                h,
                ff,
                ids,
                wts.ptr(),
                top_k,
                act.ptr(),
                n_tok,
                y.ptr(),
                scratch.ptr(),
            )
        };
        let t_d = if graph {
            time_graph_us(&gpu, &s, reps, &mut down)?
        } else {
            time_us(&gpu, &s, reps, &mut down)?
        };
        s.sync()?;
        Ok((t_gu, t_d, 2 * eg * distinct, ed * distinct))
    })?)
}

/// Routings of the graph-timed MoE bench: each call takes another set.
const SETS: usize = 16;

/// ids i32 [sets, n_tok, top_k] (each token's top_k distinct random experts) and the number of
/// distinct experts of the first set.
fn routing(n_expert: usize, top_k: usize, n_tok: usize, sets: usize) -> (Vec<i32>, usize) {
    let n = n_tok * sets;
    let r = random_bytes(8 * n * top_k, 7);
    let mut ids = Vec::with_capacity(n * top_k);
    let mut used = vec![false; n_expert];
    for t in 0..n {
        let mut row: Vec<i32> = Vec::new();
        let mut i = 0;
        while row.len() < top_k {
            let b = &r[(8 * (t * top_k + i)) % r.len()..];
            let e = (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize + i) % n_expert;
            if !row.contains(&(e as i32)) {
                row.push(e as i32);
                if t < n_tok {
                    used[e] = true;
                }
            }
            i += 1;
        }
        ids.extend(row);
    }
    (ids, used.iter().filter(|&&u| u).count())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gpu_bench_matmul, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_bench_moe, m)?)?;
    Ok(())
}
