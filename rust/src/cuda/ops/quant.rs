//! Launchers of the quantized matrix kernels (GPU_SPEC.md §4): `cuda/quantize.cu` (f32 → int8
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

use std::sync::Arc;

use super::moe_decode::{self, MoeAlt, MoeVariant};
use super::quant_mmq::{self, moe_prefill_scratch_bytes};
use crate::cuda::{Arg, Gpu, Kernel, Stream};
use crate::error::{Error, Result};
use crate::quant::GgmlType;

/// Bytes of one int8 activation block (32 values: f32 scale, 32 × int8; `block_q8a`).
pub(super) const ACT_BLOCK_BYTES: usize = 36;
/// Threads per block of the matrix-vector kernels, and weight rows per block (one per warp).
pub(super) const MMVQ_THREADS: u32 = 128;
pub(super) const MMVQ_ROWS: usize = 4;
/// Tokens per block of the `_n8` matrix-vector kernels.
pub(super) const MMVQ_TOKENS: usize = 8;
/// The largest grid.y / grid.z.
const GRID_YZ_MAX: usize = 65535;
/// Above this many tokens the tiled tensor-core kernels (mmq) replace the matrix-vector ones.
pub const MMVQ_MAX_TOKENS: usize = 8;

/// What the kernels know about a weight type: its kernel-name suffix, whether the activations
/// stay f32 (float weights) or become int8 blocks, the alignment its loads need, elements per
/// block.
#[derive(Clone, Copy, Debug)]
pub(super) struct TypeInfo {
    suffix: &'static str,
    pub(super) float: bool,
    align: u64,
    block: usize,
}

pub(super) fn type_info(ty: GgmlType) -> Option<TypeInfo> {
    use GgmlType::*;
    let (suffix, float, align) = match ty {
        F32 => ("f32", true, 16),
        F16 => ("f16", true, 8),
        BF16 => ("bf16", true, 8),
        Q8_0 => ("q8_0", false, 2),
        Q4_0 => ("q4_0", false, 2),
        Q5_0 => ("q5_0", false, 2),
        IQ4NL => ("iq4_nl", false, 2),
        Q2K => ("q2_k", false, 4),
        Q3K => ("q3_k", false, 2),
        Q4K => ("q4_k", false, 4),
        Q5K => ("q5_k", false, 4),
        Q6K => ("q6_k", false, 2),
        IQ4XS => ("iq4_xs", false, 4),
        IQ3S => ("iq3_s", false, 2),
        IQ3XXS => ("iq3_xxs", false, 2),
        IQ2XS => ("iq2_xs", false, 2),
        _ => return None,
    };
    Some(TypeInfo {
        suffix,
        float,
        align,
        block: ty.block_size().max(32),
    })
}

/// The weight types the GPU kernels run (the GPU model refuses any other at load).
pub fn supports(ty: GgmlType) -> bool {
    type_info(ty).is_some()
}

/// The alignment (bytes) a weight matrix's device address must have for type `ty`; expert
/// pointers that break it are treated as absent by the MoE kernels.
pub fn weight_align(ty: GgmlType) -> Option<u64> {
    type_info(ty).map(|i| i.align)
}

/// The types in a fixed order (index of a type's kernels in `QuantOps`).
const TYPES: [GgmlType; 16] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::IQ4NL,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ4XS,
    GgmlType::IQ3S,
    GgmlType::IQ3XXS,
    GgmlType::IQ2XS,
];

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

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

/// The kernels of one weight type.
pub(super) struct TypeKernels {
    pub(super) mmvq1: Kernel,
    pub(super) mmvq8: Kernel,
    pub(super) mmvq_r1: Kernel,
    pub(super) mmvq_st: Kernel,
    pub(super) gate_up: Kernel,
    pub(super) gate: Kernel,
    pub(super) up_glu: Kernel,
    pub(super) down: Kernel,
    pub(super) moe_alt: MoeAlt,
    getrows: Kernel,
    pub(super) mmq: Kernel,
    pub(super) mmq_gate: Kernel,
    pub(super) mmq_up: Kernel,
    pub(super) mmq_down: Kernel,
}

/// The quantized kernels of one GPU, resolved once.
pub struct QuantOps {
    quantize_q8_0: Kernel,
    quantize_q8_k: Kernel,
    pub(super) row_scale: Kernel,
    pub(super) group: Kernel,
    pub(super) reduce: Kernel,
    types: Vec<TypeKernels>,
    /// One-token products of fewer rows than this take the row-per-block kernel (`_r1`):
    /// the warp-per-row one would launch fewer than four blocks per SM.
    pub(super) r1_below: usize,
    /// One-token products of at least this many rows stage x in shared memory (`_st`).
    pub(super) st_from: usize,
    /// The routed-expert decode kernels in use (`set_moe_variant`).
    pub(super) moe_variant: MoeVariant,
}

impl QuantOps {
    pub fn new(gpu: &Arc<Gpu>) -> Result<QuantOps> {
        let mut types = Vec::with_capacity(TYPES.len());
        for ty in TYPES {
            let s = type_info(ty).expect("TYPES are supported").suffix;
            let k = |family: &str| gpu.kernel(&format!("strata_{family}_{s}"));
            types.push(TypeKernels {
                mmvq1: k("mmvq")?,
                mmvq8: gpu.kernel(&format!("strata_mmvq_{s}_n8"))?,
                mmvq_r1: gpu.kernel(&format!("strata_mmvq_{s}_r1"))?,
                mmvq_st: gpu.kernel(&format!("strata_mmvq_{s}_st"))?,
                gate_up: k("moe_gate_up")?,
                gate: k("moe_gate")?,
                up_glu: k("moe_up_glu")?,
                down: k("moe_down")?,
                moe_alt: MoeAlt::load(gpu, s),
                getrows: k("getrows")?,
                mmq: k("mmq")?,
                mmq_gate: k("moe_mmq_gate")?,
                mmq_up: k("moe_mmq_up")?,
                mmq_down: k("moe_mmq_down")?,
            });
        }
        Ok(QuantOps {
            quantize_q8_0: gpu.kernel("strata_quantize_q8_0")?,
            quantize_q8_k: gpu.kernel("strata_quantize_q8_k")?,
            row_scale: gpu.kernel("strata_row_scale")?,
            group: gpu.kernel("strata_moe_group")?,
            reduce: gpu.kernel("strata_moe_reduce")?,
            types,
            r1_below: 4 * gpu.sm_count() as usize * MMVQ_ROWS,
            st_from: 16 * gpu.sm_count() as usize * MMVQ_ROWS,
            moe_variant: MoeVariant::default(),
        })
    }

    pub(super) fn of(&self, ty: GgmlType) -> Result<(&TypeKernels, TypeInfo)> {
        let info = type_info(ty).ok_or_else(|| unsupported(ty))?;
        let i = TYPES
            .iter()
            .position(|&t| t == ty)
            .expect("supported types are in TYPES");
        Ok((&self.types[i], info))
    }

    /// x f32 [n_rows, k] → int8 activation blocks [n_rows, k/32] at `out`, quantized as the CPU
    /// path quantizes the activations of weight type `ty` (its ggml vec_dot type: Q8_K for the
    /// K-quants and the 256-element IQ types, Q8_0 otherwise), so the decode kernels' integer
    /// dots are the CPU's.
    pub(super) fn quantize_act(
        &self,
        s: &Stream,
        ty: GgmlType,
        x: u64,
        n_rows: usize,
        k: usize,
        out: u64,
    ) -> Result<()> {
        let (kern, per_item) = match ty.vec_dot_type() {
            GgmlType::Q8K => (&self.quantize_q8_k, 256),
            _ => (&self.quantize_q8_0, 32),
        };
        if !k.is_multiple_of(per_item) {
            return Err(Error::Shape(format!(
                "{} activations of width {k}: not whole blocks of {per_item}",
                ty.name()
            )));
        }
        let n_items = n_rows * (k / per_item);
        let grid = n_items.div_ceil(8);
        kern.launch(
            s,
            (to_u32(grid, "quantize grid")?, 1, 1),
            (256, 1, 1),
            0,
            &[Arg::Ptr(x), Arg::Ptr(out), Arg::I64(n_items as i64)],
        )
    }
}

fn unsupported(ty: GgmlType) -> Error {
    Error::Quant(format!("{}: no GPU kernel for this type", ty.name()))
}

pub(super) fn to_u32(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Shape(format!("{what} {v} is too large")))
}

pub(super) fn to_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Shape(format!("{what} {v} is too large")))
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
