//! Launchers of the quantized matrix kernels (docs/GPU.md): `cuda/quantize.cu` (f32 → int8
//! activation blocks, quantized as the CPU path quantizes them for the weight type),
//! `cuda/mmvq.cu` (matrix × few vectors), `cuda/moe.cu` (routed experts through a per-expert
//! pointer table), `cuda/getrows.cu` (embedding lookup); for prefill (n_tok > 8) `matmul` and
//! the MoE launchers hand over to the tiled kernels' launches in `quant_mmq.rs`.
//!
//! Every launcher checks its shapes and pointers first (`check_*`, pure functions, unit-tested
//! without a GPU) and returns `Error::Quant` for an unsupported type, `Error::Shape` for sizes
//! that do not fit and `Error::Config` for null or misaligned pointers; nothing is launched then.
//! Pointers are raw device addresses (u64), so the sizes of the buffers behind them are the
//! caller's contract: W [rows, k] in GGUF row layout, x f32 [n_tok, k], y f32 [n_tok, rows],
//! scratch ≥ `scratch_bytes(k, n_tok)`.

use super::moe_decode;
use super::quant_kernels::{round_up, to_i32, type_info, unsupported, TypeInfo};
pub use super::quant_kernels::{supports, weight_align, QuantOps, MMVQ_MAX_TOKENS};
use super::quant_kernels::{to_u32, ACT_BLOCK_BYTES, MMVQ_TOKENS};
use super::quant_mmq::{self, moe_prefill_scratch_bytes};
use crate::cuda::{Arg, Stream};
use crate::error::{Error, Result};
use crate::quant::GgmlType;

/// The largest grid.y / grid.z.
const GRID_YZ_MAX: usize = 65535;

/// Scratch bytes `matmul` needs for k-wide activations of n_tok tokens: the int8 copy of x
/// (quantized weights; decode, and prefill since the tiled kernels read the CPU's int8
/// activations too), or the per-row f16 range scales for prefill over float weights.
pub fn scratch_bytes(k: usize, n_tok: usize) -> usize {
    round_up(n_tok * k.div_ceil(32) * ACT_BLOCK_BYTES, 256)
}

/// Scratch bytes `moe_gate_up` / `moe_down` need (one buffer serves both, used in turn):
/// int8 activations for decode; for prefill (n_tok > 8) the expert grouping, the int8
/// activations and the down projection's per-slot outputs (`quant_mmq::GroupLayout`).
pub fn moe_scratch_bytes(h: usize, ff: usize, top_k: usize, n_tok: usize) -> usize {
    let decode = scratch_bytes(h, n_tok).max(scratch_bytes(ff, n_tok * top_k));
    if n_tok <= MMVQ_MAX_TOKENS {
        return decode;
    }
    decode.max(round_up(
        moe_prefill_scratch_bytes(h, ff, top_k, n_tok),
        256,
    ))
}

fn check_ptr(p: u64, align: u64, what: &str) -> Result<()> {
    if p == 0 {
        return Err(Error::Config(format!("{what}: null device pointer")));
    }
    if !p.is_multiple_of(align) {
        return Err(Error::Config(format!(
            "{what}: device address {p:#x} is not {align}-byte aligned"
        )));
    }
    Ok(())
}

/// The reduction length k of weight type `ty`: a positive multiple of 32 and of the block.
fn check_k(info: TypeInfo, ty: GgmlType, k: usize, what: &str) -> Result<()> {
    if k == 0 || !k.is_multiple_of(info.block) {
        return Err(Error::Shape(format!(
            "{what} {k} must be a positive multiple of {} for {}",
            info.block,
            ty.name()
        )));
    }
    to_i32(k / 32, what).map(|_| ())
}

/// Checks of `matmul`'s arguments (also the pure part of its contract).
#[allow(clippy::too_many_arguments)]
pub fn check_matmul(
    ty: GgmlType,
    w: u64,
    rows: usize,
    k: usize,
    x: u64,
    y: u64,
    n_tok: usize,
    scratch: u64,
) -> Result<()> {
    let info = type_info(ty).ok_or_else(|| unsupported(ty))?;
    check_k(info, ty, k, "k")?;
    if rows == 0 || n_tok == 0 {
        return Err(Error::Shape(format!(
            "matmul: rows {rows} and n_tok {n_tok} must be positive"
        )));
    }
    to_i32(rows, "rows")?;
    to_i32(n_tok, "n_tok")?;
    if n_tok.div_ceil(MMVQ_TOKENS) > GRID_YZ_MAX {
        return Err(Error::Shape(format!("n_tok {n_tok} is too large")));
    }
    ty.row_bytes(k)
        .and_then(|rb| rb.checked_mul(rows))
        .ok_or_else(|| Error::Shape(format!("{} [{rows}, {k}] overflows", ty.name())))?;
    check_ptr(w, info.align, "matmul weights")?;
    check_ptr(x, 16, "matmul x")?;
    check_ptr(y, 4, "matmul y")?;
    if !info.float || n_tok > MMVQ_MAX_TOKENS {
        check_ptr(scratch, 16, "matmul scratch")?;
    }
    Ok(())
}

/// y[t, r] = Σ_k W[r, k]·x[t, k] for t < n_tok; x f32 [n_tok, k], y f32 [n_tok, rows].
/// Quantizes x itself (to int8 blocks as the CPU does, except for float weights) into `scratch`
/// (see `scratch_bytes`), for decode and prefill alike.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    q: &QuantOps,
    s: &Stream,
    ty: GgmlType,
    w: u64,
    rows: usize,
    k: usize,
    x: u64,
    y: u64,
    n_tok: usize,
    scratch: u64,
) -> Result<()> {
    check_matmul(ty, w, rows, k, x, y, n_tok, scratch)?;
    if n_tok > MMVQ_MAX_TOKENS {
        return quant_mmq::matmul_prefill(q, s, ty, w, rows, k, x, y, n_tok, scratch);
    }
    let (kern, info) = q.of(ty)?;
    let xa = if info.float {
        x
    } else {
        q.quantize_act(s, ty, x, n_tok, k, scratch)?;
        scratch
    };
    q.mmvq(s, kern, w, rows, k, xa, y, n_tok)
}

/// Checks of `get_rows`' arguments.
#[allow(clippy::too_many_arguments)]
pub fn check_get_rows(
    ty: GgmlType,
    w: u64,
    rows: usize,
    k: usize,
    ids: u64,
    n: usize,
    out: u64,
) -> Result<()> {
    let info = type_info(ty).ok_or_else(|| unsupported(ty))?;
    check_k(info, ty, k, "k")?;
    if rows == 0 {
        return Err(Error::Shape("get_rows: rows must be positive".into()));
    }
    to_i32(rows, "rows")?;
    if n > 0 {
        check_ptr(w, info.align, "get_rows weights")?;
        check_ptr(ids, 4, "get_rows ids")?;
        check_ptr(out, 16, "get_rows out")?;
    }
    Ok(())
}

/// out f32 [n, k] = dequantized rows ids[i] (device i32 [n]) of W [rows, k]; an id outside
/// 0..rows gives zeros. Bit-exact with the CPU dequantization.
#[allow(clippy::too_many_arguments)]
pub fn get_rows(
    q: &QuantOps,
    s: &Stream,
    ty: GgmlType,
    w: u64,
    rows: usize,
    k: usize,
    ids: u64,
    n: usize,
    out: u64,
) -> Result<()> {
    check_get_rows(ty, w, rows, k, ids, n, out)?;
    let (kern, _) = q.of(ty)?;
    let items = k / 32;
    let gx = to_u32(items.div_ceil(128), "k")?;
    let mut done = 0;
    while done < n {
        let chunk = (n - done).min(GRID_YZ_MAX);
        kern.getrows.launch(
            s,
            (gx, chunk as u32, 1),
            (128, 1, 1),
            0,
            &[
                Arg::Ptr(w),
                Arg::I32(rows as i32),
                Arg::I32(items as i32),
                Arg::Ptr(ids + 4 * done as u64),
                Arg::Ptr(out + (4 * k * done) as u64),
            ],
        )?;
        done += chunk;
    }
    Ok(())
}

/// Checks shared by the MoE launchers: types, widths, top_k and the pointers.
#[allow(clippy::too_many_arguments)]
pub fn check_moe(
    types: &[GgmlType],
    rows: usize,
    k: usize,
    top_k: usize,
    n_tok: usize,
    ptrs: &[(u64, u64, &str)],
    scratch: u64,
) -> Result<()> {
    for &ty in types {
        let info = type_info(ty).ok_or_else(|| unsupported(ty))?;
        check_k(info, ty, k, "moe input width")?;
    }
    if rows == 0 || top_k == 0 {
        return Err(Error::Shape(format!(
            "moe: rows {rows} and top_k {top_k} must be positive"
        )));
    }
    to_i32(rows, "moe rows")?;
    to_i32(top_k, "top_k")?;
    n_tok
        .checked_mul(top_k)
        .and_then(|p| p.checked_mul(rows.max(k)))
        .filter(|&v| i64::try_from(v).is_ok())
        .ok_or_else(|| Error::Shape(format!("moe: n_tok {n_tok} × top_k {top_k} overflows")))?;
    for &(p, align, what) in ptrs {
        check_ptr(p, align, what)?;
    }
    // int8 activations (quantized types) and, for prefill, the expert grouping
    let quantized = types
        .iter()
        .any(|&t| !type_info(t).is_some_and(|i| i.float));
    if quantized || n_tok > MMVQ_MAX_TOKENS {
        check_ptr(scratch, 16, "moe scratch")?;
    }
    Ok(())
}

/// Routed experts, gate and up: for each token t and slot j with e = ids[t, j],
/// act[t, j, r] = silu(Wg[e][r]·x[t])·(Wu[e][r]·x[t]) (zeros when gate_ptrs[e] or up_ptrs[e]
/// is 0). gate_ptrs/up_ptrs: device u64 [n_expert] addresses of each expert's [ff, h] matrix;
/// ids: device i32 [n_tok, top_k] (trusted to be < n_expert; negative = absent);
/// x f32 [n_tok, h]; act f32 [n_tok, top_k, ff]. One launch (two when the types differ).
#[allow(clippy::too_many_arguments)]
pub fn moe_gate_up(
    q: &QuantOps,
    s: &Stream,
    ty_gate: GgmlType,
    ty_up: GgmlType,
    gate_ptrs: u64,
    up_ptrs: u64,
    ff: usize,
    h: usize,
    ids: u64,
    top_k: usize,
    x: u64,
    n_tok: usize,
    act: u64,
    scratch: u64,
) -> Result<()> {
    check_moe(
        &[ty_gate, ty_up],
        ff,
        h,
        top_k,
        n_tok,
        &[
            (gate_ptrs, 8, "gate_ptrs"),
            (up_ptrs, 8, "up_ptrs"),
            (ids, 4, "ids"),
            (x, 16, "x"),
            (act, 4, "act"),
        ],
        scratch,
    )?;
    if n_tok == 0 {
        return Ok(());
    }
    if n_tok > MMVQ_MAX_TOKENS {
        return quant_mmq::moe_gate_up_prefill(
            q,
            s,
            [ty_gate, ty_up],
            [gate_ptrs, up_ptrs],
            ff,
            h,
            ids,
            top_k,
            x,
            n_tok,
            act,
            scratch,
            None,
        );
    }
    let (kg, ig) = q.of(ty_gate)?;
    let (ku, iu) = q.of(ty_up)?;
    if !(ig.float && iu.float) {
        // one int8 copy of x serves both: as the gate type's activations (the up type's when
        // the gate is a float type; real models give gate and up one type)
        let ty_act = if ig.float { ty_up } else { ty_gate };
        q.quantize_act(s, ty_act, x, n_tok, h, scratch)?;
    }
    let xg = if ig.float { x } else { scratch };
    let xu = if iu.float { x } else { scratch };
    moe_decode::gate_up(
        q,
        s,
        (kg, ku),
        ty_gate == ty_up,
        (gate_ptrs, up_ptrs),
        ff,
        h,
        ids,
        top_k,
        (xg, xu),
        n_tok,
        act,
    )
}

/// Routed experts, down, accumulated into the residual stream:
/// y[t] += Σ_j weights[t, j]·(Wd[ids[t, j]]·act[t, j]); slots whose pointer is 0 add nothing.
/// down_ptrs: device u64 [n_expert] addresses of [h, ff] matrices; weights f32 [n_tok, top_k];
/// act f32 [n_tok, top_k, ff]; y f32 [n_tok, h]. One launch (plus the int8 quantization of act).
#[allow(clippy::too_many_arguments)]
pub fn moe_down(
    q: &QuantOps,
    s: &Stream,
    ty: GgmlType,
    down_ptrs: u64,
    h: usize,
    ff: usize,
    ids: u64,
    weights: u64,
    top_k: usize,
    act: u64,
    n_tok: usize,
    y: u64,
    scratch: u64,
) -> Result<()> {
    check_moe(
        &[ty],
        h,
        ff,
        top_k,
        n_tok,
        &[
            (down_ptrs, 8, "down_ptrs"),
            (ids, 4, "ids"),
            (weights, 4, "weights"),
            (act, 16, "act"),
            (y, 4, "y"),
        ],
        scratch,
    )?;
    if n_tok == 0 {
        return Ok(());
    }
    if n_tok > MMVQ_MAX_TOKENS {
        return quant_mmq::moe_down_prefill(
            q, s, ty, down_ptrs, h, ff, ids, weights, top_k, act, n_tok, y, scratch,
        );
    }
    let (kern, info) = q.of(ty)?;
    let a = if info.float {
        act
    } else {
        q.quantize_act(s, ty, act, n_tok * top_k, ff, scratch)?;
        scratch
    };
    moe_decode::down(
        q, s, kern, down_ptrs, h, ff, ids, weights, top_k, a, n_tok, y,
    )
}

#[cfg(test)]
#[path = "quant_tests.rs"]
mod tests;
