//! gpt-oss's routed experts on the GPU (`model::arch::Experts::OaiBiased`, the CPU path's
//! `model::moe_oai`): gate and up with their biases and the clamped SwiGLU,
//!   act[t, j, r] = swiglu_oai(Wg[e]·x[t] + bg[e, r], Wu[e]·x[t] + bu[e, r])   e = ids[t, j]
//! and the down projection's bias, y[t] += Σ_j w[t, j]·bd[e]; the down projection itself is
//! `quant::moe_down`'s. Decode (n_tok ≤ 8): `strata_moe_gate_<ty>` then
//! `strata_moe_up_oai_<ty>` (cuda/moe.cu); prefill: the grouped tile kernels with
//! `strata_moe_mmq_up_oai_<ty>` (cuda/moe_mmq.cu); the bias: `strata_moe_bias`.
//!
//! Shapes as `quant::moe_gate_up` / `moe_down`'s; biases f32 [E, ff] (gate, up), [E, h] (down).

use super::quant::check_moe;
use super::quant_kernels::{to_i32, to_u32, weight_align, QuantOps, MMVQ_MAX_TOKENS};
use super::quant_mmq;
use crate::cuda::{Arg, Stream};
use crate::error::{Error, Result};
use crate::quant::GgmlType;

/// The largest grid.y.
const GRID_Y_MAX: usize = 65535;
/// Rows (one per warp) and threads per block of the gate/up kernels (cuda/moe.cu MOE_GU_WARPS).
const GU_ROWS: usize = 8;
const GU_THREADS: u32 = 256;

/// The biased, clamped SwiGLU: device addresses of the gate and up biases (f32 [E, ff]) and
/// `ggml_swiglu_oai`'s constants.
#[derive(Clone, Copy, Debug)]
pub struct OaiGlu {
    pub gate_bias: u64,
    pub up_bias: u64,
    pub alpha: f32,
    pub limit: f32,
}

impl OaiGlu {
    fn args(&self) -> [Arg; 4] {
        [
            Arg::Ptr(self.gate_bias),
            Arg::Ptr(self.up_bias),
            Arg::F32(self.alpha),
            Arg::F32(self.limit),
        ]
    }
}

/// `quant::moe_gate_up` with gpt-oss's biases and clamped SwiGLU (`glu`): act f32
/// [n_tok, top_k, ff]; zeros for a slot whose gate or up pointer is 0. Gate and up must share
/// an activation form (both float or one vec_dot type), as gpt-oss's files have them.
#[allow(clippy::too_many_arguments)]
pub fn moe_gate_up_oai(
    q: &QuantOps,
    s: &Stream,
    (ty_gate, ty_up): (GgmlType, GgmlType),
    (gate_ptrs, up_ptrs): (u64, u64),
    ff: usize,
    h: usize,
    ids: u64,
    top_k: usize,
    x: u64,
    n_tok: usize,
    act: u64,
    scratch: u64,
    glu: OaiGlu,
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
            (glu.gate_bias, 4, "gate bias"),
            (glu.up_bias, 4, "up bias"),
        ],
        scratch,
    )?;
    let (kg, ig) = q.of(ty_gate)?;
    let (ku, iu) = q.of(ty_up)?;
    if ig.float != iu.float || (!ig.float && ty_gate.vec_dot_type() != ty_up.vec_dot_type()) {
        return Err(Error::Quant(format!(
            "gpt-oss experts: gate {} and up {} need one activation form",
            ty_gate.name(),
            ty_up.name()
        )));
    }
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
            Some(glu.args()),
        );
    }
    let xa = if ig.float {
        x
    } else {
        q.quantize_act(s, ty_gate, x, n_tok, h, scratch)?;
        scratch
    };
    let pairs = n_tok * top_k;
    let gx = to_u32(ff.div_ceil(GU_ROWS), "ff")?;
    let (ff32, items, k32) = (
        to_i32(ff, "ff")?,
        to_i32(h / 32, "h")?,
        to_i32(top_k, "top_k")?,
    );
    let extra = glu.args();
    let mut done = 0;
    while done < pairs {
        let chunk = (pairs - done).min(GRID_Y_MAX);
        let grid = (gx, chunk as u32, 1);
        let tj0 = Arg::I32(to_i32(done, "pairs")?);
        let common = |ptrs| {
            [
                Arg::Ptr(ptrs),
                Arg::I32(ff32),
                Arg::I32(items),
                Arg::Ptr(ids),
                Arg::I32(k32),
                Arg::Ptr(xa),
                Arg::Ptr(act),
                tj0,
            ]
        };
        kg.gate
            .launch(s, grid, (GU_THREADS, 1, 1), 0, &common(gate_ptrs))?;
        let [a0, a1, a2, a3, a4, a5, a6, a7] = common(up_ptrs);
        let [e0, e1, e2, e3] = extra;
        let up = [a0, a1, a2, a3, a4, a5, a6, a7, e0, e1, e2, e3];
        ku.up_oai.launch(s, grid, (GU_THREADS, 1, 1), 0, &up)?;
        done += chunk;
    }
    Ok(())
}

/// y[t] += Σ_j weights[t, j]·bias[ids[t, j]] (f32 [n_tok, h]; bias f32 [E, h]) over the slots
/// whose expert's down pointer (of type `ty`) is present: the others are computed elsewhere
/// (the hybrid's misses), their bias with them.
#[allow(clippy::too_many_arguments)]
pub fn moe_down_bias(
    q: &QuantOps,
    s: &Stream,
    ty: GgmlType,
    down_ptrs: u64,
    ids: u64,
    weights: u64,
    bias: u64,
    top_k: usize,
    h: usize,
    y: u64,
    n_tok: usize,
) -> Result<()> {
    let align = weight_align(ty)
        .ok_or_else(|| Error::Quant(format!("{}: no GPU kernel for this type", ty.name())))?;
    for (p, a, what) in [
        (down_ptrs, 8, "down_ptrs"),
        (ids, 4, "ids"),
        (weights, 4, "weights"),
        (bias, 4, "down bias"),
        (y, 4, "y"),
    ] {
        if p == 0 || p % a != 0 {
            return Err(Error::Config(format!(
                "{what}: device address {p:#x} is null or not {a}-byte aligned"
            )));
        }
    }
    let n = n_tok
        .checked_mul(h)
        .filter(|&n| i32::try_from(n).is_ok())
        .ok_or_else(|| Error::Shape(format!("moe bias: {n_tok} × {h} is too large")))?;
    if n == 0 {
        return Ok(());
    }
    q.bias.launch(
        s,
        (to_u32(n.div_ceil(256), "n_tok × h")?, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::Ptr(down_ptrs),
            Arg::I32(align as i32),
            Arg::Ptr(ids),
            Arg::Ptr(weights),
            Arg::Ptr(bias),
            Arg::I32(to_i32(top_k, "top_k")?),
            Arg::I32(to_i32(h, "h")?),
            Arg::Ptr(y),
            Arg::I32(to_i32(n_tok, "n_tok")?),
        ],
    )
}
