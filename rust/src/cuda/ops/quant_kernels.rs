//! The quantized kernels of one GPU (`QuantOps`, resolved once) and what every launcher knows
//! about a weight type (`TypeInfo`): shared by `quant` (checks and dispatch), `moe_decode`,
//! `quant_mmq` and `quant_shared`. A leaf: it imports none of them.

use std::sync::Arc;

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
/// Above this many tokens the tiled tensor-core kernels (mmq) replace the matrix-vector ones.
pub const MMVQ_MAX_TOKENS: usize = 8;

/// What the kernels know about a weight type: its kernel-name suffix, whether the activations
/// stay f32 (float weights) or become int8 blocks, the alignment its loads need, elements per
/// block.
#[derive(Clone, Copy, Debug)]
pub(super) struct TypeInfo {
    pub(super) suffix: &'static str,
    pub(super) float: bool,
    pub(super) align: u64,
    pub(super) block: usize,
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
        MXFP4 => ("mxfp4", false, 1),
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
pub(super) const TYPES: [GgmlType; 17] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::IQ4NL,
    GgmlType::MXFP4,
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

pub(super) fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// Which decode kernels `moe_gate_up` / `moe_down` launch (for timing one against another).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MoeVariant {
    /// gate/up: 8 rows a block, the activations and each warp's gate and up rows staged in
    /// shared memory; down: 4 rows a block, slots over its warps.
    #[default]
    Current,
    /// gate/up staging only the activations (`_act`; Q4_K and Q6_K, else `Current`).
    GateUpAct,
    /// the earlier kernels (`_v0`: 4 rows a block, activations from global memory; Q4_K and
    /// Q6_K, else `Current`).
    V0,
}

/// A type's alternative decode kernels (absent for most types).
pub(super) struct MoeAlt {
    pub(super) gate_up_act: Option<Kernel>,
    pub(super) gate_up_v0: Option<Kernel>,
    pub(super) down_v0: Option<Kernel>,
}

impl MoeAlt {
    pub(super) fn load(gpu: &Gpu, suffix: &str) -> MoeAlt {
        let k = |v: &str| gpu.kernel(&format!("strata_moe_{v}_{suffix}")).ok();
        MoeAlt {
            gate_up_act: k("gate_up_act"),
            gate_up_v0: k("gate_up_v0"),
            down_v0: k("down_v0"),
        }
    }
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
    /// gpt-oss's up with biases and the clamped SwiGLU (after `gate`).
    pub(super) up_oai: Kernel,
    pub(super) down: Kernel,
    pub(super) moe_alt: MoeAlt,
    pub(super) getrows: Kernel,
    pub(super) mmq: Kernel,
    pub(super) mmq_gate: Kernel,
    pub(super) mmq_up: Kernel,
    pub(super) mmq_up_oai: Kernel,
    pub(super) mmq_down: Kernel,
}

/// The quantized kernels of one GPU, resolved once.
pub struct QuantOps {
    quantize_q8_0: Kernel,
    quantize_q8_k: Kernel,
    pub(super) row_scale: Kernel,
    pub(super) group: Kernel,
    pub(super) reduce: Kernel,
    /// gpt-oss's down bias (`strata_moe_bias`).
    pub(super) bias: Kernel,
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
    /// Whether a one-token product of `rows` rows runs one row per block (`_r1`): the
    /// summation order the fused router's logits keep (`router::f32_topk`).
    pub fn one_token_row_per_block(&self, rows: usize) -> bool {
        rows < self.r1_below
    }

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
                up_oai: k("moe_up_oai")?,
                down: k("moe_down")?,
                moe_alt: MoeAlt::load(gpu, s),
                getrows: k("getrows")?,
                mmq: k("mmq")?,
                mmq_gate: k("moe_mmq_gate")?,
                mmq_up: k("moe_mmq_up")?,
                mmq_up_oai: k("moe_mmq_up_oai")?,
                mmq_down: k("moe_mmq_down")?,
            });
        }
        Ok(QuantOps {
            quantize_q8_0: gpu.kernel("strata_quantize_q8_0")?,
            quantize_q8_k: gpu.kernel("strata_quantize_q8_k")?,
            row_scale: gpu.kernel("strata_row_scale")?,
            group: gpu.kernel("strata_moe_group")?,
            reduce: gpu.kernel("strata_moe_reduce")?,
            bias: gpu.kernel("strata_moe_bias")?,
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

pub(super) fn unsupported(ty: GgmlType) -> Error {
    Error::Quant(format!("{}: no GPU kernel for this type", ty.name()))
}

pub(super) fn to_u32(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Shape(format!("{what} {v} is too large")))
}

pub(super) fn to_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Shape(format!("{what} {v} is too large")))
}
