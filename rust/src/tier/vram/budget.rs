//! The VRAM budget: how many expert slots fit beside the dense weights, the KV cache and the
//! buffers, and where each projection sits inside a slot.
//!
//! `budget = vram_budget_mib` when set, else `free − vram_reserve_mib` (free measured at start,
//! before Strata allocates anything). Dense weights, KV and buffers are taken first; the rest
//! is cut into equal slots of the largest expert record of any layer, so any expert of any
//! layer fits any slot (a swap never has to move other slots). A slot record is
//! `[gate | pad | up | pad | down | pad]`, each part starting on a `SLOT_ALIGN` boundary (the
//! GPU kernels' 16-byte loads need ≥ 16; 256 keeps every part on its own cache sectors).

use crate::error::{Error, Result};
use crate::tier::layout::ExpertLayout;

pub const MIB: u64 = 1 << 20;
/// Default of `vram_reserve_mib`: VRAM left to the driver, other processes and fragmentation.
pub const DEFAULT_RESERVE_MIB: u64 = 700;
/// Alignment of every projection inside a slot, and of the slot size.
pub const SLOT_ALIGN: u64 = 256;

fn align(n: u64) -> u64 {
    n.div_ceil(SLOT_ALIGN) * SLOT_ALIGN
}

/// The three projections of one expert, in the order of a slot record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proj {
    Gate = 0,
    Up = 1,
    Down = 2,
}

impl Proj {
    pub const ALL: [Proj; 3] = [Proj::Gate, Proj::Up, Proj::Down];
}

/// Bytes of one expert's projections in one layer (GGUF quant blocks, as stored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertShape {
    pub gate: u64,
    pub up: u64,
    pub down: u64,
}

impl ExpertShape {
    pub fn bytes(&self, p: Proj) -> u64 {
        match p {
            Proj::Gate => self.gate,
            Proj::Up => self.up,
            Proj::Down => self.down,
        }
    }

    /// Byte offset of projection `p` inside a slot.
    pub fn offset(&self, p: Proj) -> u64 {
        match p {
            Proj::Gate => 0,
            Proj::Up => align(self.gate),
            Proj::Down => align(self.gate) + align(self.up),
        }
    }

    /// Bytes of the slot record of this layer's experts (each part aligned).
    pub fn record_bytes(&self) -> u64 {
        align(self.gate) + align(self.up) + align(self.down)
    }

    /// Bytes actually copied for one expert (the unaligned sum).
    pub fn expert_bytes(&self) -> u64 {
        self.gate + self.up + self.down
    }
}

/// The per-layer shapes of a model's experts (`None`: a layer without routed experts).
pub fn shapes_of(layout: &ExpertLayout) -> Vec<Option<ExpertShape>> {
    (0..layout.n_layer())
        .map(|l| {
            layout.layer(l).map(|s| ExpertShape {
                gate: s.gate.bytes as u64,
                up: s.up.bytes as u64,
                down: s.down.bytes as u64,
            })
        })
        .collect()
}

/// What the plan is made from. All sizes in bytes except the two settings.
#[derive(Clone, Debug)]
pub struct BudgetInputs {
    /// Free VRAM at start (`cuMemGetInfo`), before Strata allocates anything.
    pub free_bytes: u64,
    /// `vram_reserve_mib`.
    pub reserve_mib: u64,
    /// `vram_budget_mib`; `None` (or 0 in the config): `free − reserve`.
    pub budget_mib: Option<u64>,
    /// Non-expert weights (attention, norms, router, embeddings, head, shared experts).
    pub dense_bytes: u64,
    /// KV cache for every slot and context.
    pub kv_bytes: u64,
    /// Activations, scratch, graphs, staging for PCIe misses, pointer tables.
    pub buffer_bytes: u64,
    pub n_expert: usize,
    pub layers: Vec<Option<ExpertShape>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VramPlan {
    /// Bytes the plan may use in all.
    pub budget_bytes: u64,
    /// Dense weights + KV + buffers.
    pub fixed_bytes: u64,
    /// Bytes of one slot (the largest layer's record).
    pub slot_bytes: u64,
    /// Expert slots.
    pub n_slots: usize,
    /// Experts the model has (layers with experts × n_expert).
    pub n_experts: usize,
    /// Bytes of every expert, unaligned (what the file holds).
    pub expert_bytes_total: u64,
    pub n_expert: usize,
    pub layers: Vec<Option<ExpertShape>>,
}

impl VramPlan {
    /// Bytes the slots take.
    pub fn slots_bytes(&self) -> u64 {
        self.slot_bytes * self.n_slots as u64
    }

    /// Share of all experts that has a slot (0..=1).
    pub fn resident_share(&self) -> f64 {
        if self.n_experts == 0 {
            0.0
        } else {
            self.n_slots as f64 / self.n_experts as f64
        }
    }

    pub fn shape(&self, layer: usize) -> Option<&ExpertShape> {
        self.layers.get(layer).and_then(Option::as_ref)
    }
}

/// Plan the slots. Errors (`Error::Config`) name the numbers: a budget above `free − reserve`,
/// or fixed allocations that do not fit the budget. Zero slots is a valid plan (every expert
/// runs on the CPU).
pub fn plan(inp: &BudgetInputs) -> Result<VramPlan> {
    let avail = inp.free_bytes.saturating_sub(inp.reserve_mib * MIB);
    let budget_bytes = match inp.budget_mib {
        Some(b) if b > 0 => {
            let want = b * MIB;
            if want > avail {
                return Err(Error::Config(format!(
                    "vram_budget_mib = {b} exceeds the free VRAM ({} MiB) minus vram_reserve_mib \
                     ({}): at most {} MiB",
                    inp.free_bytes / MIB,
                    inp.reserve_mib,
                    avail / MIB
                )));
            }
            want
        }
        _ => avail,
    };
    let fixed_bytes = inp.dense_bytes + inp.kv_bytes + inp.buffer_bytes;
    if fixed_bytes > budget_bytes {
        return Err(Error::Config(format!(
            "the dense weights ({} MiB), KV cache ({} MiB) and buffers ({} MiB) need {} MiB of VRAM \
             but the budget is {} MiB; lower the context or parallel slots, or raise \
             vram_budget_mib / lower vram_reserve_mib",
            inp.dense_bytes.div_ceil(MIB),
            inp.kv_bytes.div_ceil(MIB),
            inp.buffer_bytes.div_ceil(MIB),
            fixed_bytes.div_ceil(MIB),
            budget_bytes / MIB
        )));
    }
    let shapes: Vec<&ExpertShape> = inp.layers.iter().flatten().collect();
    let slot_bytes = shapes.iter().map(|s| s.record_bytes()).max().unwrap_or(0);
    let n_experts = shapes.len() * inp.n_expert;
    let n_slots = (budget_bytes - fixed_bytes)
        .checked_div(slot_bytes)
        .map_or(0, |n| (n as usize).min(n_experts));
    Ok(VramPlan {
        budget_bytes,
        fixed_bytes,
        slot_bytes,
        n_slots,
        n_experts,
        expert_bytes_total: shapes.iter().map(|s| s.expert_bytes()).sum::<u64>()
            * inp.n_expert as u64,
        n_expert: inp.n_expert,
        layers: inp.layers.clone(),
    })
}

/// The `vram_budget_mib` that gives slots for `share` of all experts (benchmarks: 0.25 is what
/// a 12 GB card holds of a 48 GB model), with the fixed part of `inp` on top.
pub fn budget_mib_for_share(inp: &BudgetInputs, share: f64) -> u64 {
    let slot = inp
        .layers
        .iter()
        .flatten()
        .map(|s| s.record_bytes())
        .max()
        .unwrap_or(0);
    let n = inp.layers.iter().flatten().count() * inp.n_expert;
    let slots = (n as f64 * share.clamp(0.0, 1.0)).round() as u64;
    (inp.dense_bytes + inp.kv_bytes + inp.buffer_bytes + slots * slot).div_ceil(MIB)
}

/// The plan with `extra` more bytes of fixed buffers (a second prefill staging area) taken
/// from the slots, if that leaves at least `keep` slots (`keep` = the slots asked for, or the
/// planned ones); None: no room (the caller goes on without the extra buffer). `want` caps
/// the slots as `max_slots` does.
pub fn with_extra(
    plan: &VramPlan,
    extra: u64,
    want: Option<usize>,
    keep: usize,
) -> Option<VramPlan> {
    let fixed = plan.fixed_bytes + extra;
    let free = plan.budget_bytes.checked_sub(fixed)?;
    let fit = free
        .checked_div(plan.slot_bytes)
        .map_or(0, |n| (n as usize).min(plan.n_experts));
    let n_slots = want.map_or(fit, |w| w.min(fit));
    (n_slots >= keep).then(|| VramPlan {
        fixed_bytes: fixed,
        n_slots,
        ..plan.clone()
    })
}
