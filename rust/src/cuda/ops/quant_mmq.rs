//! Prefill (n_tok > 8) launches of the tiled tensor-core kernels: `cuda/mmq.cu` (dense) and
//! `cuda/moe_mmq.cu` (routed experts grouped by id), called by `quant::matmul`,
//! `quant::moe_gate_up` / `moe_down` and `quant_shared::matmul_shared_x` after their checks.
//!
//! Activations, as the kernels take them (cuda/mmq.cuh):
//! - quantized weights: x is first quantized into the scratch exactly as the CPU path quantizes
//!   it for the weight type (`QuantOps::quantize_act`: q8_0 or q8_K, the ggml vec_dot type), and
//!   the kernels read those int8 blocks: the products see the CPU's activations d·q (q exact in
//!   f16, d applied per 32-value block in f32), so prefill rounds the activations as the CPU
//!   does, as decode already did. One quantization serves every product over the same rows and
//!   activation type (gate and up; Q, K and V).
//! - float weights: x f32 times an exact power of two per row (`strata_row_scale`), rounded to
//!   f16 in the kernel.

use super::quant_kernels::{to_u32, QuantOps, TypeKernels, ACT_BLOCK_BYTES, MMVQ_MAX_TOKENS};
use crate::cuda::{Arg, Kernel, Stream};
use crate::error::{Error, Result};
use crate::quant::GgmlType;

/// Output tile of the dense mmq kernel: rows × tokens.
const MMQ_ROWS: usize = 64;
const MMQ_TOKENS: usize = 64;
const MMQ_THREADS: u32 = 128;
/// Token tile of the grouped-expert mmq kernels, and the most expert ids they group
/// (cuda/moe_mmq.cu MOE_BN, MOE_MAX_E; larger ids are treated as absent).
const MOE_BN: usize = 32;
const MOE_MAX_E: usize = 4096;
/// The largest grid.y.
const GRID_Y_MAX: usize = 65535;

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

fn to_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Shape(format!("{what} {v} is too large")))
}

/// Bytes of the int8 activation blocks of `rows` rows of width k.
fn act_bytes(rows: usize, k: usize) -> usize {
    rows * k.div_ceil(32) * ACT_BLOCK_BYTES
}

/// Where the grouped launches keep their data in the scratch: n_tiles (i32), the tile table
/// (int4 × max_tiles), the grouped pair order (i32 × pairs), the activation rows' power-of-two
/// scales (f32 × pairs, float weights), the int8 activation blocks (quantized weights: `acts`
/// bytes for act_rows rows of width act_k), then (at `end`) the down projection's per-slot
/// outputs.
pub(super) struct GroupLayout {
    pub(super) max_tiles: usize,
    tiles: usize,
    order: usize,
    scales: usize,
    acts: usize,
    pub(super) end: usize,
}

impl GroupLayout {
    /// The layout for `pairs` (token, slot) pairs whose activations are act_rows × act_k.
    pub(super) fn new(pairs: usize, act_rows: usize, act_k: usize) -> GroupLayout {
        let max_tiles = pairs.div_ceil(MOE_BN) + pairs.min(MOE_MAX_E + 1);
        let tiles = 16;
        let order = tiles + 16 * max_tiles;
        let scales = round_up(order + 4 * pairs, 16);
        let acts = round_up(scales + 4 * pairs, 256);
        let end = round_up(acts + act_bytes(act_rows, act_k), 256);
        GroupLayout {
            max_tiles,
            tiles,
            order,
            scales,
            acts,
            end,
        }
    }
}

/// Scratch bytes of the prefill expert launches (`moe_gate_up_prefill` over x [n_tok, h],
/// `moe_down_prefill` over act [n_tok·top_k, ff] with its [n_tok·top_k, h] outputs).
pub(super) fn moe_prefill_scratch_bytes(h: usize, ff: usize, top_k: usize, n_tok: usize) -> usize {
    let pairs = n_tok * top_k;
    let gate_up = GroupLayout::new(pairs, n_tok, h).end;
    let down = GroupLayout::new(pairs, pairs, ff).end + 4 * pairs * h;
    gate_up.max(down)
}

impl QuantOps {
    /// scale f32 [n_rows]: the power of two per row of x f32 [n_rows, k] that the mmq kernels
    /// multiply in before rounding to f16 (and divide out after); float weights only.
    fn row_scale(&self, s: &Stream, x: u64, n_rows: usize, k: usize, scale: u64) -> Result<()> {
        self.row_scale.launch(
            s,
            (to_u32(n_rows.div_ceil(8), "rows")?, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::Ptr(x),
                Arg::I32(to_i32(n_rows, "rows")?),
                Arg::I32(to_i32(k, "k")?),
                Arg::Ptr(scale),
            ],
        )
    }

    /// The activations of weight type `ty` (float: `float`) over x f32 [n_rows, k], in the form
    /// the mmq kernels read: x itself with its row scales written to `scales` (float types), or
    /// the CPU's int8 blocks written to `blocks`, which is returned. `held`: the type whose
    /// blocks `blocks` already holds for this x (then no new quantization when the activation
    /// type is the same); updated.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn prefill_act(
        &self,
        s: &Stream,
        ty: GgmlType,
        float: bool,
        x: u64,
        n_rows: usize,
        k: usize,
        scales: u64,
        blocks: u64,
        held: &mut Option<GgmlType>,
    ) -> Result<u64> {
        if float {
            self.row_scale(s, x, n_rows, k, scales)?;
            return Ok(x);
        }
        if held.map(|h| h.vec_dot_type()) != Some(ty.vec_dot_type()) {
            self.quantize_act(s, ty, x, n_rows, k, blocks)?;
            *held = Some(ty);
        }
        Ok(blocks)
    }

    /// y f32 [n_tok, rows] = W·x for x in the kernel's form (`prefill_act`: int8 blocks for
    /// quantized W, f32 with row scales `xs` for float W).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mmq(
        &self,
        s: &Stream,
        kern: &TypeKernels,
        w: u64,
        rows: usize,
        k: usize,
        xa: u64,
        xs: u64,
        y: u64,
        n_tok: usize,
    ) -> Result<()> {
        let grid = (
            to_u32(rows.div_ceil(MMQ_ROWS), "rows")?,
            to_u32(n_tok.div_ceil(MMQ_TOKENS), "n_tok")?,
            1,
        );
        let args = [
            Arg::Ptr(w),
            Arg::I32(to_i32(rows, "rows")?),
            Arg::I32(to_i32(k / 32, "k")?),
            Arg::Ptr(xa),
            Arg::Ptr(xs),
            Arg::Ptr(y),
            Arg::I32(to_i32(n_tok, "n_tok")?),
        ];
        kern.mmq.launch(s, grid, (MMQ_THREADS, 1, 1), 0, &args)
    }

    /// Groups the (token, slot) pairs by expert into the scratch (see `GroupLayout`); returns
    /// (layout, grid.y for the tile kernels).
    pub(super) fn group(
        &self,
        s: &Stream,
        ids: u64,
        pairs: usize,
        act_rows: usize,
        act_k: usize,
        scratch: u64,
    ) -> Result<(GroupLayout, u32)> {
        let g = GroupLayout::new(pairs, act_rows, act_k);
        self.group.launch(
            s,
            (1, 1, 1),
            (1024, 1, 1),
            0,
            &[
                Arg::Ptr(ids),
                Arg::I32(to_i32(pairs, "pairs")?),
                Arg::I32(MOE_BN as i32),
                Arg::Ptr(scratch + g.order as u64),
                Arg::Ptr(scratch + g.tiles as u64),
                Arg::Ptr(scratch),
                Arg::I32(to_i32(g.max_tiles, "tiles")?),
            ],
        )?;
        // Blocks walk the tiles with a stride of grid.y: enough for the usual count.
        let gy = (pairs.div_ceil(MOE_BN) + pairs.min(512)).min(GRID_Y_MAX);
        Ok((g, gy as u32))
    }

    /// One grouped tile launch: out[p, r] (= or silu(out)·) W[ids[p]][r]·x[p / x_div], x in
    /// the kernel's form (`prefill_act`, float rows' scales in the layout's `scales`).
    #[allow(clippy::too_many_arguments)]
    fn grouped(
        &self,
        s: &Stream,
        kern: &Kernel,
        ptrs: u64,
        rows: usize,
        k: usize,
        xa: u64,
        x_div: usize,
        scratch: u64,
        layout: &GroupLayout,
        gy: u32,
        out: u64,
    ) -> Result<()> {
        let no = [];
        self.grouped_with(
            s, kern, ptrs, rows, k, xa, x_div, scratch, layout, gy, out, &no,
        )
    }

    /// `grouped` with a kernel's trailing arguments `extra` (at most 4).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn grouped_with(
        &self,
        s: &Stream,
        kern: &Kernel,
        ptrs: u64,
        rows: usize,
        k: usize,
        xa: u64,
        x_div: usize,
        scratch: u64,
        layout: &GroupLayout,
        gy: u32,
        out: u64,
        extra: &[Arg],
    ) -> Result<()> {
        let mut args = [Arg::I32(0); 14];
        let base = [
            Arg::Ptr(ptrs),
            Arg::I32(to_i32(rows, "rows")?),
            Arg::I32(to_i32(k / 32, "k")?),
            Arg::Ptr(xa),
            Arg::Ptr(scratch + layout.scales as u64),
            Arg::I32(to_i32(x_div, "x_div")?),
            Arg::Ptr(scratch + layout.order as u64),
            Arg::Ptr(scratch + layout.tiles as u64),
            Arg::Ptr(scratch),
            Arg::Ptr(out),
        ];
        let n = base.len() + extra.len();
        args[..base.len()].copy_from_slice(&base);
        args[base.len()..n].copy_from_slice(extra);
        kern.launch(
            s,
            (to_u32(rows.div_ceil(MMQ_ROWS), "rows")?, gy, 1),
            (MMQ_THREADS, 1, 1),
            0,
            &args[..n],
        )
    }
}

/// `quant::matmul` for n_tok > 8 (arguments checked by the caller): y = W·x with x quantized as
/// the CPU does for quantized W (int8 blocks in the scratch), scaled rows for float W.
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul_prefill(
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
    debug_assert!(n_tok > MMVQ_MAX_TOKENS);
    let (kern, info) = q.of(ty)?;
    let xa = q.prefill_act(s, ty, info.float, x, n_tok, k, scratch, scratch, &mut None)?;
    q.mmq(s, kern, w, rows, k, xa, scratch, y, n_tok)
}

/// `quant::moe_gate_up` for n_tok > 8 (arguments checked by the caller): act [n_tok, top_k, ff]
/// = silu(gate·x)·(up·x) per routed pair; one quantization of x serves gate and up when their
/// activation types agree. With `oai` (gpt-oss: the gate and up biases, alpha, limit as the
/// kernel's trailing arguments) the up launch applies the biases and the clamped SwiGLU.
#[allow(clippy::too_many_arguments)]
pub(super) fn moe_gate_up_prefill(
    q: &QuantOps,
    s: &Stream,
    tys: [GgmlType; 2],
    ptrs: [u64; 2],
    ff: usize,
    h: usize,
    ids: u64,
    top_k: usize,
    x: u64,
    n_tok: usize,
    act: u64,
    scratch: u64,
    oai: Option<[Arg; 4]>,
) -> Result<()> {
    let (layout, gy) = q.group(s, ids, n_tok * top_k, n_tok, h, scratch)?;
    let (scales, blocks) = (scratch + layout.scales as u64, scratch + layout.acts as u64);
    let mut held = None;
    for (i, (&ty, &p)) in tys.iter().zip(&ptrs).enumerate() {
        let (kern, info) = q.of(ty)?;
        // pair p reads token p / top_k's activation row
        let xa = q.prefill_act(s, ty, info.float, x, n_tok, h, scales, blocks, &mut held)?;
        let (k, extra): (&Kernel, &[Arg]) = match (i, &oai) {
            (0, _) => (&kern.mmq_gate, &[]),
            (_, Some(a)) => (&kern.mmq_up_oai, a),
            (_, None) => (&kern.mmq_up, &[]),
        };
        q.grouped_with(s, k, p, ff, h, xa, top_k, scratch, &layout, gy, act, extra)?;
    }
    Ok(())
}

/// `quant::moe_down` for n_tok > 8 (arguments checked by the caller): y [n_tok, h] +=
/// Σ_j weights[t, j]·(Wd[ids[t, j]]·act[t, j]), act quantized as the CPU does for quantized Wd.
#[allow(clippy::too_many_arguments)]
pub(super) fn moe_down_prefill(
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
    let (kern, info) = q.of(ty)?;
    let pairs = n_tok * top_k;
    let (layout, gy) = q.group(s, ids, pairs, pairs, ff, scratch)?;
    let (scales, blocks) = (scratch + layout.scales as u64, scratch + layout.acts as u64);
    let xa = q.prefill_act(s, ty, info.float, act, pairs, ff, scales, blocks, &mut None)?;
    let out = scratch + layout.end as u64;
    q.grouped(
        s,
        &kern.mmq_down,
        down_ptrs,
        h,
        ff,
        xa,
        1,
        scratch,
        &layout,
        gy,
        out,
    )?;
    let n = n_tok * h;
    q.reduce.launch(
        s,
        (to_u32(n.div_ceil(256), "n_tok × h")?, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::Ptr(out),
            Arg::Ptr(weights),
            Arg::I32(to_i32(top_k, "top_k")?),
            Arg::I32(to_i32(h, "h")?),
            Arg::Ptr(y),
            Arg::I32(to_i32(n_tok, "n_tok")?),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_layout_regions_do_not_overlap() {
        let (n_tok, top_k, h, ff) = (512, 8, 2048, 768);
        let pairs = n_tok * top_k;
        for (rows, k) in [(n_tok, h), (pairs, ff)] {
            let g = GroupLayout::new(pairs, rows, k);
            assert!(g.max_tiles >= pairs / 32 + 128);
            assert!(g.order >= g.tiles + 16 * g.max_tiles);
            assert!(g.scales >= g.order + 4 * pairs && g.scales.is_multiple_of(16));
            // the int8 blocks: 4-byte aligned, after the scales, before the down outputs
            assert!(g.acts >= g.scales + 4 * pairs && g.acts.is_multiple_of(256));
            assert!(g.end >= g.acts + rows * (k / 32) * 36 && g.end.is_multiple_of(256));
        }
        let need = GroupLayout::new(pairs, pairs, ff).end + 4 * pairs * h;
        assert!(moe_prefill_scratch_bytes(h, ff, top_k, n_tok) >= need);
        assert!(
            moe_prefill_scratch_bytes(h, ff, top_k, n_tok) >= GroupLayout::new(pairs, n_tok, h).end
        );
    }
}
