//! The CPU side of a hybrid step, per layer: split the routed (token, slot) pairs into VRAM
//! hits, misses run over PCIe on the GPU, and misses computed by the CPU pool; then compute
//! only the CPU misses' weighted contribution (`y_miss`), which the GPU adds to its own.
//!
//! Shapes: T tokens, k slots per token; `ids`, `weights` `[T, k]`; `x`, `y_miss` `[T, H]`.

use super::table::VramTable;
use crate::error::Result;
use crate::model::compute::{Compute, ExpertLayer, MoeInput};
use crate::pool::SKIP;

/// How many misses go over PCIe: `pcie_frac` of the missed experts over time. The fractional
/// remainder carries to the next layer/step, so the long-run share is exactly `frac`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PcieShare {
    frac: f64,
    carry: f64,
    /// At most this many experts per layer (the staging area's capacity).
    cap: usize,
}

impl PcieShare {
    pub fn new(frac: f64) -> Self {
        PcieShare {
            frac: if frac.is_finite() {
                frac.clamp(0.0, 1.0)
            } else {
                0.0
            },
            carry: 0.0,
            cap: usize::MAX,
        }
    }

    /// At most `cap` experts per `take` (what is over the cap does not carry).
    pub fn with_cap(mut self, cap: usize) -> Self {
        self.cap = cap;
        self
    }

    pub fn frac(&self) -> f64 {
        self.frac
    }

    /// Of `n` missed experts, how many go over PCIe now.
    pub fn take(&mut self, n: usize) -> usize {
        self.carry += self.frac * n as f64;
        let t = (self.carry.floor() as usize).min(n).min(self.cap);
        self.carry = (self.carry - t as f64).min(1.0);
        t
    }
}

/// One layer's split. Reused across layers and steps (no allocation once grown).
#[derive(Clone, Debug, Default)]
pub struct LayerSplit {
    /// `[T, k]`: the expert id where the CPU pool computes the pair, `SKIP` elsewhere.
    pub cpu_ids: Vec<u32>,
    /// `[T, k]`: the expert id where the GPU computes the pair (VRAM hit or PCIe miss), `SKIP`
    /// where the CPU does; what the GPU side's ids mean once its pointer table is patched.
    pub gpu_ids: Vec<u32>,
    /// Distinct missed experts copied over PCIe this step (most pairs first).
    pub pcie_experts: Vec<u32>,
    pub hits: u64,
    pub miss_cpu: u64,
    pub miss_pcie: u64,
    /// Scratch: (pairs, expert) of this layer's distinct misses.
    missed: Vec<(u32, u32)>,
}

impl LayerSplit {
    /// Split `ids` of `layer` by `table`. Ids out of range count as CPU misses (the pool's
    /// validation then reports them).
    pub fn split(&mut self, table: &VramTable, layer: usize, ids: &[u32], share: &mut PcieShare) {
        self.cpu_ids.clear();
        self.gpu_ids.clear();
        self.pcie_experts.clear();
        self.missed.clear();
        let (mut hits, mut miss_cpu, mut miss_pcie) = (0, 0, 0);
        for &e in ids {
            if table.slot(layer, e).is_none() {
                match self.missed.iter_mut().find(|m| m.1 == e) {
                    Some(m) => m.0 += 1,
                    None => self.missed.push((1, e)),
                }
            }
        }
        let n_pcie = share.take(self.missed.len());
        if n_pcie > 0 {
            // Most pairs first (a prefill's shared experts pay the copy back most), then id.
            self.missed
                .sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            self.pcie_experts
                .extend(self.missed[..n_pcie].iter().map(|m| m.1));
        }
        for &e in ids {
            if table.slot(layer, e).is_some() {
                hits += 1;
                self.cpu_ids.push(SKIP);
                self.gpu_ids.push(e);
            } else if self.pcie_experts.contains(&e) {
                miss_pcie += 1;
                self.cpu_ids.push(SKIP);
                self.gpu_ids.push(e);
            } else {
                miss_cpu += 1;
                self.cpu_ids.push(e);
                self.gpu_ids.push(SKIP);
            }
        }
        self.hits = hits;
        self.miss_cpu = miss_cpu;
        self.miss_pcie = miss_pcie;
    }

    /// Whether the CPU has nothing to do for this layer (the GPU need not wait for it).
    pub fn all_on_gpu(&self) -> bool {
        self.miss_cpu == 0
    }
}

/// `y_miss[t] = Σ_{j: CPU miss} w[t,j]·expert_{ids[t,j]}(x_t)`, summed in slot order, with the
/// pool (or any `Compute`); tokens without CPU misses get zeros.
pub fn cpu_misses<C: Compute + ?Sized>(
    compute: &C,
    layer: &ExpertLayer<'_>,
    x: &[f32],
    split: &LayerSplit,
    weights: &[f32],
    k: usize,
    y_miss: &mut [f32],
) -> Result<()> {
    compute.moe_masked(layer, &MoeInput::new(x, &split.cpu_ids, weights, k), y_miss)
}
