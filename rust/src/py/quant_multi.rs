//! `strata._core._testing` hooks of the multi-token (prefill) dot kernels: one weight row
//! against several tokens' activations with a chosen ISA / AVX-512 variant, and a timing loop
//! over a weight matrix (tests/test_gemm_isa.py, bench/bench_gemm_isa.py).

use super::quant::ggml_type;
use crate::error::Error;
use crate::quant::dot::{self, Isa, MultiDot, Order, MAX_T};
use pyo3::prelude::*;
use std::time::Instant;

fn order(name: &str) -> Result<Order, Error> {
    match name {
        "single" => Ok(Order::Single),
        "many" => Ok(Order::Many),
        _ => Err(Error::Quant(format!(
            "unknown order {name:?} (single|many)"
        ))),
    }
}

/// The handle of `isa` (auto, scalar, avx2, avx512), or with `vnni` given the AVX-512 multi
/// kernel with / without VNNI; checks the type, `n` and the CPU.
fn handle(ty: &str, n: usize, ord: &str, isa: &str, vnni: Option<bool>) -> Result<MultiDot, Error> {
    let w = ggml_type(ty)?;
    let order = order(ord)?;
    if !dot::supports(w) || w.row_bytes(n).is_none() {
        return Err(Error::Quant(format!("no {} dot over n = {n}", w.name())));
    }
    let isa = if isa.eq_ignore_ascii_case("auto") {
        dot::active_isa()
    } else {
        Isa::from_name(isa).ok_or_else(|| Error::Quant(format!("unknown ISA {isa:?}")))?
    };
    if !isa.available() {
        return Err(Error::Quant(format!("this CPU cannot run {}", isa.name())));
    }
    match vnni {
        None => Ok(MultiDot::with_isa(isa, w, n, order)),
        Some(v) if isa == Isa::Avx512 => {
            MultiDot::avx512_variant(w, n, order, v).ok_or_else(|| {
                Error::Quant(format!(
                    "no AVX-512{} multi-token kernel for {} on this CPU",
                    if v { " VNNI" } else { "BW" },
                    w.name()
                ))
            })
        }
        Some(_) => Err(Error::Quant("vnni applies to isa='avx512' only".into())),
    }
}

fn check_lengths(ty: &str, n: usize, row: usize, acts: &[&[u8]]) -> Result<(), Error> {
    let w = ggml_type(ty)?;
    let (rb, ab) = (w.row_bytes(n), dot::act_bytes(w, n));
    if rb != Some(row) || acts.iter().any(|a| Some(a.len()) != ab) {
        return Err(Error::Quant(format!(
            "{}: n = {n} with a {row}-byte row and activations of {:?} bytes",
            w.name(),
            acts.iter().map(|a| a.len()).collect::<Vec<_>>()
        )));
    }
    Ok(())
}

/// `out[t] = dot(row, acts[t])` through the multi-token path (`MultiDot::call`, at most
/// `MAX_T` tokens per call as the tiles hand them) in `order` ("single": `vec_dot`'s float
/// order, "many": ggml's multi-row order), with the kernels of `isa`; `vnni` (True/False)
/// picks the AVX-512 kernel variant.
#[pyfunction]
#[pyo3(signature = (type_name, n, row, acts, order = "single", isa = "auto", vnni = None))]
fn multi_dot(
    type_name: &str,
    n: usize,
    row: &[u8],
    acts: Vec<Vec<u8>>,
    order: &str,
    isa: &str,
    vnni: Option<bool>,
) -> PyResult<Vec<f32>> {
    let md = handle(type_name, n, order, isa, vnni)?;
    let refs: Vec<&[u8]> = acts.iter().map(|a| &a[..]).collect();
    check_lengths(type_name, n, row.len(), &refs)?;
    let mut out = vec![0f32; refs.len()];
    for (o, a) in out.chunks_mut(MAX_T).zip(refs.chunks(MAX_T)) {
        md.call(row, a, o);
    }
    Ok(out)
}

/// `out[r·nt + t] = dot(row r, acts[t])` for the rows of `rows` (`len / row_bytes` back to
/// back) in one `MultiDot::rows_call` through the rows × tokens scheme `tiles` ("amx",
/// "vnni", "none"): what the pool's tiles run, for tests against the scalar kernel.
#[pyfunction]
#[pyo3(signature = (type_name, n, rows, acts, order, tiles))]
fn rows_dot(
    type_name: &str,
    n: usize,
    rows: &[u8],
    acts: Vec<Vec<u8>>,
    order: &str,
    tiles: &str,
) -> PyResult<Vec<f32>> {
    let md = handle(type_name, n, order, "auto", None)?
        .with_tile_scheme(tiles)
        .map_err(Error::Quant)?;
    let rb = ggml_type(type_name)?.row_bytes(n).unwrap_or(1);
    let refs: Vec<&[u8]> = acts.iter().map(|a| &a[..]).collect();
    if rows.is_empty() || !rows.len().is_multiple_of(rb) || acts.is_empty() {
        return Err(Error::Quant("rows must be whole rows; acts non-empty".into()).into());
    }
    check_lengths(type_name, n, rb, &refs)?;
    let nr = rows.len() / rb;
    let mut out = vec![0f32; nr * refs.len()];
    md.rows_call(rows, nr, &refs, &mut out);
    Ok(out)
}

/// Seconds (best of `reps`) to compute `rows` (`len / row_bytes` rows back to back) against
/// every activation in `acts` with the multi-token path as the pool's tiles run it: token
/// groups of `MultiDot::group()`, every run of 64 rows of a thread's share per group
/// (`MultiDot::rows_call`: the tiles (AMX or VNNI registers) where the handle has them), the rows split evenly
/// over `threads` threads. `group` = 1 times the single-token kernel per token instead;
/// `tiles` ("amx", "vnni", "none") sets the rows × tokens scheme instead of the engine's.
#[pyfunction]
#[pyo3(signature = (type_name, n, rows, acts, order = "single", isa = "auto", vnni = None, reps = 5, threads = 1, group = None, tiles = None))]
#[allow(clippy::too_many_arguments)]
fn multi_dot_bench(
    py: Python<'_>,
    type_name: &str,
    n: usize,
    rows: &[u8],
    acts: Vec<Vec<u8>>,
    order: &str,
    isa: &str,
    vnni: Option<bool>,
    reps: usize,
    threads: usize,
    group: Option<usize>,
    tiles: Option<&str>,
) -> PyResult<f64> {
    let md = handle(type_name, n, order, isa, vnni)?;
    let md = match tiles {
        Some(t) => md.with_tile_scheme(t).map_err(Error::Quant)?,
        None => md,
    };
    let rb = ggml_type(type_name)?.row_bytes(n).unwrap_or(1);
    let refs: Vec<&[u8]> = acts.iter().map(|a| &a[..]).collect();
    if rows.is_empty() || !rows.len().is_multiple_of(rb) || acts.is_empty() || threads == 0 {
        return Err(
            Error::Quant("rows must be whole rows; acts and threads non-empty".into()).into(),
        );
    }
    check_lengths(type_name, n, rb, &refs)?;
    let nrows = rows.len() / rb;
    let per = nrows.div_ceil(threads);
    let g = group.unwrap_or(md.group()).clamp(1, MAX_T);
    let best = py.detach(|| {
        let mut best = f64::INFINITY;
        for _ in 0..reps.max(1) {
            let t0 = Instant::now();
            std::thread::scope(|s| {
                for share in rows.chunks(per * rb) {
                    let refs = &refs;
                    s.spawn(move || {
                        // runs of 64 rows per group, as the pool's `blocked` hands them
                        let mut out = vec![0f32; 64 * MAX_T];
                        let mut sink = 0f32;
                        for grp in refs.chunks(g) {
                            for run in share.chunks(64 * rb) {
                                let nr = run.len() / rb;
                                md.rows_call(run, nr, grp, &mut out[..nr * grp.len()]);
                                sink += out[0];
                            }
                        }
                        std::hint::black_box(sink);
                    });
                }
            });
            best = best.min(t0.elapsed().as_secs_f64());
        }
        best
    });
    Ok(best)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(multi_dot, m)?)?;
    m.add_function(wrap_pyfunction!(multi_dot_bench, m)?)?;
    m.add_function(wrap_pyfunction!(rows_dot, m)?)?;
    Ok(())
}
