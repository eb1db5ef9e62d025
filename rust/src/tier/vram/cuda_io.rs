//! The CUDA side of the VRAM tier: `Fence` for `cuda::Event`, the slot memory and its copies
//! (`CudaSlots`, a `SlotIo` on the tier's own stream), staging from the RAM tier into pinned
//! buffers (`RamStager`, host work only), and the PCIe link probe behind `pcie_frac`'s default.

use super::budget::{ExpertShape, Proj, VramPlan};
use super::driver::Stager;
use super::fence::{Fence, SlotIo};
use super::protocol::GapTicket;
use super::table::Key;
use crate::cuda::{DevBuf, Event, Gpu, PinnedBuf, Stream};
use crate::error::{Error, Result};
use crate::tier::residency::Residency;
use std::sync::Arc;

impl Fence for Event {
    fn done(&self) -> Result<bool> {
        self.is_done()
    }
}

/// A fence of the hybrid step's slots (docs/PROTOCOL.md): a step's is its stage's next gap
/// (`GapTicket`, no event recorded), a slot copy's is its own event on the tier's stream.
pub enum TierFence {
    Step(GapTicket),
    Copy(Event),
}

impl Fence for TierFence {
    fn done(&self) -> Result<bool> {
        match self {
            TierFence::Step(t) => t.done(),
            TierFence::Copy(e) => e.is_done(),
        }
    }
}

/// The expert slots in VRAM (`n_slots × slot_bytes`, one allocation) and the tier's own copy
/// stream. Copies come from pinned staging buffers of `slot_bytes` bytes each.
pub struct CudaSlots {
    gpu: Arc<Gpu>,
    stream: Stream,
    slots: DevBuf,
    slot_bytes: usize,
}

impl CudaSlots {
    pub fn new(gpu: &Arc<Gpu>, plan: &VramPlan) -> Result<CudaSlots> {
        Ok(CudaSlots {
            gpu: gpu.clone(),
            stream: gpu.stream()?,
            slots: gpu.alloc(plan.slots_bytes() as usize)?,
            slot_bytes: plan.slot_bytes as usize,
        })
    }

    /// Device address of slot 0 (`PtrTables::build`'s base).
    pub fn base(&self) -> u64 {
        self.slots.ptr()
    }

    /// A pinned staging buffer of one slot.
    pub fn staging_buffer(&self) -> Result<PinnedBuf> {
        self.gpu.host_alloc(self.slot_bytes)
    }
}

impl SlotIo<PinnedBuf> for CudaSlots {
    type Event = TierFence;

    /// Async host→device copy of the staged record into `slot`, then an event: both queued
    /// on the tier's stream, which never waits on a host flag, so neither call blocks.
    fn issue_fill(&mut self, slot: u32, _key: Key, staged: &PinnedBuf) -> Result<TierFence> {
        if staged.len() < self.slot_bytes {
            return Err(Error::Config(format!(
                "staging buffer of {} bytes for slots of {}",
                staged.len(),
                self.slot_bytes
            )));
        }
        let off = slot as usize * self.slot_bytes;
        self.slots
            .write_async(&self.stream, off, staged, 0, self.slot_bytes)?;
        let ev = self.gpu.event_no_timing()?;
        ev.record(&self.stream)?;
        Ok(TierFence::Copy(ev))
    }
}

/// A host buffer a stager writes (pinned memory on the GPU path; a Vec in tests).
pub trait StageBuf: Send + 'static {
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl StageBuf for PinnedBuf {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl StageBuf for Vec<u8> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// Stages an expert from the RAM tier (arena or map) into a host buffer in the slot record
/// layout. Host memory only: safe on the async tier's helper thread.
pub struct RamStager<B> {
    ram: Arc<Residency>,
    shapes: Vec<Option<ExpertShape>>,
    _buf: std::marker::PhantomData<fn() -> B>,
}

impl<B> RamStager<B> {
    pub fn new(ram: Arc<Residency>, plan: &VramPlan) -> RamStager<B> {
        RamStager {
            ram,
            shapes: plan.layers.clone(),
            _buf: std::marker::PhantomData,
        }
    }
}

impl<B: StageBuf> Stager for RamStager<B> {
    type Buf = B;

    fn stage(&mut self, (l, e): Key, buf: &mut B) -> Result<u64> {
        let shape = self
            .shapes
            .get(l as usize)
            .copied()
            .flatten()
            .ok_or_else(|| Error::Config(format!("layer {l} has no experts")))?;
        let src = self
            .ram
            .expert_bytes(l as usize, e as usize)
            .ok_or_else(|| Error::Config(format!("expert ({l}, {e}) is out of range")))?;
        let dst = buf.bytes_mut();
        if (dst.len() as u64) < shape.record_bytes() {
            return Err(Error::Config(format!(
                "staging buffer of {} bytes for a record of {}",
                dst.len(),
                shape.record_bytes()
            )));
        }
        for (p, part) in [
            (Proj::Gate, src.gate),
            (Proj::Up, src.up),
            (Proj::Down, src.down),
        ] {
            let o = shape.offset(p) as usize;
            dst[o..o + part.len()].copy_from_slice(part);
        }
        Ok(shape.expert_bytes())
    }
}

/// Host→device bandwidth of the link in GB/s: pinned copies of `mib` MiB timed with events
/// (one warm-up, best of three).
pub fn probe_pcie_gbps(gpu: &Arc<Gpu>, mib: usize) -> Result<f64> {
    let bytes = mib.max(1) << 20;
    let host = gpu.host_alloc(bytes)?;
    let dev = gpu.alloc(bytes)?;
    let s = gpu.stream()?;
    let (a, b) = (gpu.event()?, gpu.event()?);
    dev.write_async(&s, 0, &host, 0, bytes)?;
    s.sync()?;
    let mut best = 0f64;
    for _ in 0..3 {
        a.record(&s)?;
        dev.write_async(&s, 0, &host, 0, bytes)?;
        b.record(&s)?;
        b.sync()?;
        let ms = a.elapsed_ms(&b)? as f64;
        if ms > 0.0 {
            best = best.max(bytes as f64 / (ms * 1e6));
        }
    }
    Ok(best)
}

/// `pcie_frac`'s default: the share of missed expert bytes that makes both legs finish
/// together when the CPU pool reads RAM at `cpu_gbps` and the link copies at `link_gbps`
/// (`f = link / (link + cpu)`); 0 for a link that could not be measured.
pub fn default_pcie_frac(link_gbps: f64, cpu_gbps: f64) -> f64 {
    if !(link_gbps.is_finite() && link_gbps > 0.0) {
        return 0.0;
    }
    let cpu = if cpu_gbps.is_finite() && cpu_gbps > 0.0 {
        cpu_gbps
    } else {
        0.0
    };
    (link_gbps / (link_gbps + cpu)).clamp(0.0, 1.0)
}
