//! Launches of the routed-expert decode kernels (`cuda/moe.cu`, n_tok ≤ 8): gate/up (+ SwiGLU)
//! and down, after `quant::moe_gate_up` / `quant::moe_down` have checked their arguments and
//! quantized the activations. Also the earlier kernel forms, kept to be timed against
//! (`QuantOps::set_moe_variant`, bench/gpu_quant_bench.py).

pub use super::quant_kernels::MoeVariant;
use super::quant_kernels::{to_i32, to_u32, QuantOps, TypeKernels, MMVQ_ROWS, MMVQ_THREADS};
use crate::cuda::{Arg, Stream};
use crate::error::Result;

/// The largest grid.y.
const GRID_Y_MAX: usize = 65535;
/// Rows (one per warp) and threads per block of the gate/up kernels (cuda/moe.cu MOE_GU_WARPS).
const GU_ROWS: usize = 8;
const GU_THREADS: u32 = 256;
/// Output rows per block of the down kernel, and the most warps it runs (MOE_DOWN_ROWS,
/// MOE_DOWN_WARPS).
const DOWN_ROWS: usize = 4;
const DOWN_WARPS: usize = 8;

impl QuantOps {
    /// The decode kernels `moe_gate_up` / `moe_down` use from now on (default `Current`).
    pub fn set_moe_variant(&mut self, v: MoeVariant) {
        self.moe_variant = v;
    }
}

/// act[p, r] for the n_tok·top_k pairs: gate/up on x in the kernels' form (xg, xu: f32 for
/// float types, else the int8 blocks of `quantize_act`). Arguments as `quant::moe_gate_up`'s.
#[allow(clippy::too_many_arguments)]
pub(super) fn gate_up(
    q: &QuantOps,
    s: &Stream,
    (kg, ku): (&TypeKernels, &TypeKernels),
    same_type: bool,
    (gate_ptrs, up_ptrs): (u64, u64),
    ff: usize,
    h: usize,
    ids: u64,
    top_k: usize,
    (xg, xu): (u64, u64),
    n_tok: usize,
    act: u64,
) -> Result<()> {
    let alt = match q.moe_variant {
        MoeVariant::Current => None,
        MoeVariant::GateUpAct => kg.moe_alt.gate_up_act.as_ref(),
        MoeVariant::V0 => kg.moe_alt.gate_up_v0.as_ref(),
    }
    .filter(|_| same_type);
    let (rows, threads) = match (q.moe_variant, alt) {
        (MoeVariant::V0, Some(_)) => (MMVQ_ROWS, MMVQ_THREADS),
        _ => (GU_ROWS, GU_THREADS),
    };
    let pairs = n_tok * top_k;
    let gx = to_u32(ff.div_ceil(rows), "ff")?;
    let (ff32, items, k32) = (ff as i32, (h / 32) as i32, top_k as i32);
    let mut done = 0;
    while done < pairs {
        let chunk = (pairs - done).min(GRID_Y_MAX);
        let grid = (gx, chunk as u32, 1);
        let block = (threads, 1, 1);
        let tj0 = Arg::I32(to_i32(done, "pairs")?);
        if same_type {
            alt.unwrap_or(&kg.gate_up).launch(
                s,
                grid,
                block,
                0,
                &[
                    Arg::Ptr(gate_ptrs),
                    Arg::Ptr(up_ptrs),
                    Arg::I32(ff32),
                    Arg::I32(items),
                    Arg::Ptr(ids),
                    Arg::I32(k32),
                    Arg::Ptr(xg),
                    Arg::Ptr(act),
                    tj0,
                ],
            )?;
        } else {
            for (kern, ptrs, xa) in [(&kg.gate, gate_ptrs, xg), (&ku.up_glu, up_ptrs, xu)] {
                kern.launch(
                    s,
                    grid,
                    block,
                    0,
                    &[
                        Arg::Ptr(ptrs),
                        Arg::I32(ff32),
                        Arg::I32(items),
                        Arg::Ptr(ids),
                        Arg::I32(k32),
                        Arg::Ptr(xa),
                        Arg::Ptr(act),
                        tj0,
                    ],
                )?;
            }
        }
        done += chunk;
    }
    Ok(())
}

/// y[t] += Σ_j weights[t, j]·(Wd[ids[t, j]]·a[t, j]) on a in the kernels' form. Arguments as
/// `quant::moe_down`'s.
#[allow(clippy::too_many_arguments)]
pub(super) fn down(
    q: &QuantOps,
    s: &Stream,
    kern: &TypeKernels,
    down_ptrs: u64,
    h: usize,
    ff: usize,
    ids: u64,
    weights: u64,
    top_k: usize,
    a: u64,
    n_tok: usize,
    y: u64,
) -> Result<()> {
    let v0 = kern
        .moe_alt
        .down_v0
        .as_ref()
        .filter(|_| q.moe_variant == MoeVariant::V0);
    let (k, rows, threads) = match v0 {
        Some(k) => (k, MMVQ_ROWS, MMVQ_THREADS),
        None => (&kern.down, DOWN_ROWS, 32 * top_k.min(DOWN_WARPS) as u32),
    };
    let gx = to_u32(h.div_ceil(rows), "h")?;
    let mut done = 0;
    while done < n_tok {
        let chunk = (n_tok - done).min(GRID_Y_MAX);
        k.launch(
            s,
            (gx, chunk as u32, 1),
            (threads, 1, 1),
            0,
            &[
                Arg::Ptr(down_ptrs),
                Arg::I32(h as i32),
                Arg::I32((ff / 32) as i32),
                Arg::Ptr(ids),
                Arg::Ptr(weights),
                Arg::I32(top_k as i32),
                Arg::Ptr(a),
                Arg::Ptr(y),
                Arg::I32(to_i32(done, "n_tok")?),
            ],
        )?;
        done += chunk;
    }
    Ok(())
}
