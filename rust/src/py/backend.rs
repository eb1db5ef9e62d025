//! The backend behind `strata._core.Model`: the CPU `Model` or the `GpuModel`, with the
//! calls both answer (the CPU path's slot semantics) and the GPU-only ones as typed errors.

use crate::error::{Error, Result};
use crate::gpu::GpuModel;
use crate::model::kv_shift::{shift_blob, Chunk};
use crate::model::ops::Rope;
use crate::model::{Entry, HParams, Logits, Model, ModelConfig};
use crate::tier::RoutingCounters as Counters;
use std::sync::Arc;

/// The forward pass on one device; both backends have the CPU `Model`'s slot semantics.
pub(super) enum Backend {
    Cpu(Box<Model>),
    Gpu { m: Box<GpuModel> },
}

/// Where the MTP layer runs.
pub(super) const MTP_CPU: &str = "the MTP layer runs on the CPU path (device=\"cpu\")";

/// Why the routing counters of a GPU model with every expert in VRAM are refused.
const NOT_COUNTED: &str = "the GPU path with every expert in VRAM does not count the routing \
    (the routed ids never leave the GPU): count on device=cpu (the same routing) or in the \
    hybrid mode (vram_budget_mib)";

impl Backend {
    pub(super) fn hp(&self) -> &HParams {
        match self {
            Backend::Cpu(m) => &m.hp,
            Backend::Gpu { m, .. } => &m.hp,
        }
    }

    pub(super) fn cfg(&self) -> &ModelConfig {
        match self {
            Backend::Cpu(m) => &m.cfg,
            Backend::Gpu { m, .. } => &m.cfg,
        }
    }

    pub(super) fn n_slots(&self) -> usize {
        match self {
            Backend::Cpu(m) => m.kv.n_slots(),
            Backend::Gpu { m, .. } => m.n_slots(),
        }
    }

    pub(super) fn forward(
        &mut self,
        slot: usize,
        toks: &[u32],
        want: Logits,
        out: &mut [f32],
    ) -> Result<()> {
        match self {
            Backend::Cpu(m) => m.forward(slot, toks, want, out),
            Backend::Gpu { m, .. } => m.forward(slot, toks, want, out),
        }
    }

    pub(super) fn forward_batch(&mut self, entries: &[Entry<'_>], out: &mut [f32]) -> Result<()> {
        match self {
            Backend::Cpu(m) => m.forward_batch(entries, out),
            Backend::Gpu { m, .. } => m.forward_batch(entries, out),
        }
    }

    pub(super) fn kv_export(&self, slot: usize, n: usize) -> Result<Vec<u8>> {
        match self {
            Backend::Cpu(m) => m.kv_export(slot, n),
            Backend::Gpu { m, .. } => m.kv_export(slot, n),
        }
    }

    pub(super) fn kv_import(&mut self, slot: usize, data: &[u8]) -> Result<usize> {
        match self {
            Backend::Cpu(m) => m.kv_import(slot, data),
            Backend::Gpu { m, .. } => m.kv_import(slot, data),
        }
    }

    /// `kv_shift::shift_blob` on the slot's export, imported back (the CPU and GPU caches
    /// export the same bytes).
    pub(super) fn kv_shift(&mut self, slot: usize, keep: usize, chunks: &[Chunk]) -> Result<usize> {
        let end = chunks
            .last()
            .map_or(Some(keep), |&(from, n)| from.checked_add(n));
        let len = self.slot_len(slot)?;
        let Some(end) = end.filter(|&e| e <= len) else {
            return Err(Error::Input(format!(
                "KV shift: slot {slot} holds {len} positions, the chunks reach past them"
            )));
        };
        let blob = self.kv_export(slot, end)?;
        let hp = self.hp();
        let moved = shift_blob(
            &blob,
            keep,
            chunks,
            &Rope::new(hp),
            hp.head_dim,
            self.cfg().kv_type,
        )?;
        self.kv_import(slot, &moved)
    }

    pub(super) fn slot_len(&self, slot: usize) -> Result<usize> {
        match self {
            Backend::Cpu(m) => m.slot_len(slot),
            Backend::Gpu { m, .. } => m.slot_len(slot),
        }
    }

    pub(super) fn truncate(&mut self, slot: usize, n: usize) -> Result<()> {
        match self {
            Backend::Cpu(m) => m.truncate(slot, n),
            Backend::Gpu { m, .. } => m.truncate(slot, n),
        }
    }

    pub(super) fn free(&mut self, slot: usize) -> Result<()> {
        match self {
            Backend::Cpu(m) => m.free(slot),
            Backend::Gpu { m, .. } => m.free(slot),
        }
    }

    /// A hybrid's recurrent-state checkpoint at the slot's length.
    pub(super) fn checkpoint(&mut self, slot: usize) -> Result<()> {
        match self {
            Backend::Cpu(m) => m.checkpoint(slot),
            Backend::Gpu { m, .. } => m.checkpoint(slot),
        }
    }

    pub(super) fn checkpoints(&self, slot: usize) -> Result<Vec<usize>> {
        match self {
            Backend::Cpu(m) => m.checkpoints(slot),
            Backend::Gpu { m, .. } => m.checkpoints(slot),
        }
    }

    /// The GPU model, or a `Config` error naming `what` (a GPU path's call).
    pub(super) fn gpu(&mut self, what: &str) -> Result<&mut GpuModel> {
        match self {
            Backend::Gpu { m } => Ok(m),
            Backend::Cpu(_) => Err(Error::Config(format!(
                "{what}: device=\"cpu\" has no pipelined windows"
            ))),
        }
    }

    /// The routing counters; an error where this path does not count (`NOT_COUNTED`).
    pub(super) fn routing(&self, decayed: bool) -> Result<Arc<Counters>> {
        match self {
            Backend::Cpu(m) if decayed => Ok(m.routing_hot.clone()),
            Backend::Cpu(m) => Ok(m.routing.clone()),
            Backend::Gpu { m } => m
                .routing(decayed)
                .ok_or_else(|| Error::Config(NOT_COUNTED.into())),
        }
    }
}
