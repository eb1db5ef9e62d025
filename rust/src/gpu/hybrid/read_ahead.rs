//! Expert read-ahead for the hybrid decode chain (issue 23): within one token the chain is
//! serial — layer l+1's attention and router on the GPU (~45 µs a layer on the device host)
//! wait for layer l's CPU misses, and the pool, idle meanwhile, then reads l+1's missed
//! experts from RAM (the leg is RAM-bound). The read-ahead fills the idle part: the GPU
//! routes layer l's FFN input h_l through layer l+1's router too (one fused launch queued
//! after l's routing event, so it is off the chain), and while l+1's attention runs the pool
//! reads the predicted experts of l+1 that are not in VRAM into its caches, most likely
//! first, until l+1's real routing lands in the mapped buffer (its first id overwrites a
//! sentinel the host left there). The arithmetic is untouched: a read only; a wrong guess
//! spends RAM bandwidth that would have been idle. (The prediction is Pre-gated MoE's: the
//! next layer's gate on this layer's input.)
//!
//! Off by default until measured (`set_read_ahead`: 0 off, 1 into L1/L2 with `prefetcht0`,
//! 2 with `prefetcht1`, 3 only the gate and up rows of the two likeliest experts, with
//! `prefetcht0`); decode steps of one token only.

use crate::cuda::ops::router;
use crate::cuda::ops::view::Dv;
use crate::cuda::{DevBuf, Event, Gpu, PinnedBuf};
use crate::error::Result;
use crate::gpu::launch::Launcher;
use crate::model::Compute;
use crate::pool::{ExpertLayer, QExperts, SKIP};
use crate::tier::vram::{HybridCounters, VramTable};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

static MODE: AtomicUsize = AtomicUsize::new(0);

/// Sets the read-ahead mode (0 off, 1 `prefetcht0`, 2 `prefetcht1`, 3 light) for steps from
/// now on; returns the previous one.
pub fn set_read_ahead(mode: usize) -> usize {
    MODE.swap(mode.min(LIGHT), Relaxed)
}

/// The light mode: the gate and up rows of this many of the likeliest experts.
const LIGHT: usize = 3;
const LIGHT_EXPERTS: usize = 2;

/// What the host leaves in the first routed id of the mapped buffer once it has read a
/// layer's ids: no expert id is negative, so the next layer's routing overwrites it.
const SENTINEL: i32 = -1;
/// Bytes one task of the pool reads ahead (the sentinel is checked between tasks).
const CHUNK: usize = 16 << 10;
const LINE: usize = 64;

pub(super) struct ReadAhead {
    ids: DevBuf,        // i32 [K]: the predicted experts of the next layer
    wts: DevBuf,        // f32 [K]: their gate weights (descending)
    logits: DevBuf,     // f32 [E]
    done: DevBuf,       // i32 [1] zero: the fused router's finish counter
    pin_ids: PinnedBuf, // i32 [K], mapped
    pin_wts: PinnedBuf, // f32 [K], mapped
    ev: Event,
    /// The layer whose prediction was launched and not yet used.
    pending: Option<usize>,
    /// The predicted experts of the coming layer that are not in VRAM, most likely first.
    predicted: Vec<u32>,
    /// (address, bytes) of what the pool reads ahead.
    spans: Vec<(usize, usize)>,
    k: usize,
}

impl ReadAhead {
    pub(super) fn new(gpu: &Gpu, n_expert: usize, k: usize) -> Result<ReadAhead> {
        Ok(ReadAhead {
            ids: gpu.alloc(4 * k)?,
            wts: gpu.alloc(4 * k)?,
            logits: gpu.alloc(4 * n_expert)?,
            done: gpu.upload_pod(&[0i32])?,
            pin_ids: gpu.host_alloc(4 * k)?,
            pin_wts: gpu.host_alloc(4 * k)?,
            ev: gpu.event_no_timing()?,
            pending: None,
            predicted: Vec::with_capacity(k),
            spans: Vec::new(),
            k,
        })
    }

    /// After layer `l`'s routing event (one token): queues the prediction of layer l+1's
    /// experts from l's FFN input, where l+1 is on this stage, routed, and its router runs
    /// fused (`Launcher::fused_router`).
    pub(super) fn predict(&mut self, cx: &Launcher, l: usize, t: usize) -> Result<()> {
        let next = l + 1;
        if MODE.load(Relaxed) == 0 || t != 1 || next >= cx.layers.end {
            return Ok(());
        }
        let lw = cx.w.layer(next);
        let Some(norm) = lw.routed().then(|| cx.fused_router(next, 1)).flatten() else {
            return Ok(());
        };
        let (hd, e) = (cx.hp.n_embd, cx.hp.n_expert);
        let w3 = [
            Dv::of(&lw.router.buf),
            Dv::of(&cx.b.h),
            Dv::of(&self.logits),
        ];
        let copy = Some((Dv::mapped(&self.pin_ids), Dv::mapped(&self.pin_wts)));
        let (ids, wts, done) = (Dv::of(&self.ids), Dv::of(&self.wts), Dv::of(&self.done));
        router::f32_topk(
            &cx.gpu, &cx.stream, w3, ids, wts, copy, done, hd, e, self.k, norm,
        )?;
        self.ev.record(&cx.stream)?;
        self.pending = Some(next);
        Ok(())
    }

    /// Layer `l`'s predicted experts that are not in VRAM (`predicted`), where its
    /// prediction was launched and has landed (before `predict` queues the next one).
    pub(super) fn take(&mut self, l: usize, table: &VramTable) -> Result<()> {
        self.predicted.clear();
        if self.pending.take() != Some(l) || !self.ev.is_done()? {
            return Ok(());
        }
        let ids = self.pin_ids.as_slice()[..4 * self.k].chunks_exact(4);
        for e in ids.map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]) as u32) {
            if table.slot(l, e).is_none() && !self.predicted.contains(&e) {
                self.predicted.push(e);
            }
        }
        Ok(())
    }

    /// Before the host waits for a layer's routing: the pool reads the taken experts of the
    /// layer (`layer`) until the routing overwrites the sentinel in `routed` (the mapped ids
    /// i32 [T, K] the host reads after its event). Returns the bytes read.
    pub(super) fn read(
        &mut self,
        layer: &ExpertLayer<'_>,
        compute: &dyn Compute,
        routed: &PinnedBuf,
    ) -> Result<u64> {
        // gate and up first (the pool's first phase reads them), then down
        let hint = MODE.load(Relaxed);
        let light = hint == LIGHT;
        let es = &self.predicted[..if light {
            LIGHT_EXPERTS.min(self.predicted.len())
        } else {
            self.predicted.len()
        }];
        self.spans.clear();
        for m in [&layer.gate, &layer.up] {
            spans(m, es, &mut self.spans);
        }
        if !light {
            spans(&layer.down, es, &mut self.spans);
        }
        let n: usize = self.spans.iter().map(|s| s.1.div_ceil(CHUNK)).sum();
        if n == 0 {
            return Ok(0);
        }
        let flag = routed.as_slice().as_ptr() as usize;
        let read = AtomicU64::new(0);
        let spans = &self.spans;
        compute.for_each(n, &|i| {
            // SAFETY: the mapped buffer outlives the call; the GPU writes it concurrently,
            // hence a volatile read of one aligned word.
            if unsafe { std::ptr::read_volatile(flag as *const i32) } != SENTINEL {
                return;
            }
            let (addr, len) = chunk_of(spans, i);
            touch(addr, len, hint);
            read.fetch_add(len as u64, Relaxed);
        })?;
        Ok(read.into_inner())
    }

    /// Layer `l`'s real CPU misses (`cpu_ids`, SKIP elsewhere) against its prediction: counts
    /// the experts read ahead and how many of them the pool then computed.
    pub(super) fn score(&self, counters: &HybridCounters, cpu_ids: &[u32], bytes: u64) {
        if self.predicted.is_empty() {
            return;
        }
        let hits = self
            .predicted
            .iter()
            .filter(|e| cpu_ids.iter().any(|c| c == *e && *c != SKIP))
            .count();
        counters.record_read_ahead(self.predicted.len() as u64, hits as u64, bytes);
    }

    /// After the host has read a layer's routed ids from `routed`: the sentinel in the first,
    /// for the next layer's read-ahead to stop at.
    pub(super) fn arm(&self, routed: &mut PinnedBuf) {
        if self.pending.is_some() {
            routed.as_mut_slice()[..4].copy_from_slice(&SENTINEL.to_ne_bytes());
        }
    }
}

/// The (address, bytes) of experts `es` of `m`.
fn spans(m: &QExperts<'_>, es: &[u32], out: &mut Vec<(usize, usize)>) {
    let Some(eb) = m.ty.row_bytes(m.cols).map(|r| r * m.rows) else {
        return;
    };
    for &e in es.iter().filter(|&&e| (e as usize) < m.n_expert) {
        let d = m.expert_data(e as usize, eb);
        out.push((d.as_ptr() as usize, d.len()));
    }
}

/// The `i`-th CHUNK-sized piece of the spans, in order.
fn chunk_of(spans: &[(usize, usize)], mut i: usize) -> (usize, usize) {
    for &(a, len) in spans {
        let n = len.div_ceil(CHUNK);
        if i < n {
            let off = i * CHUNK;
            return (a + off, CHUNK.min(len - off));
        }
        i -= n;
    }
    (0, 0)
}

/// Reads `len` bytes at `addr` into the caches, a line at a time.
fn touch(addr: usize, len: usize, hint: usize) {
    let mut p = addr & !(LINE - 1);
    while p < addr + len {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch never faults; the address lies in a live mapping anyway.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
            if hint != 2 {
                _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
            } else {
                _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        // SAFETY: `p` is within (or the line start of) a live span of the mapping.
        unsafe {
            let _ = (hint, std::ptr::read_volatile(p.max(addr) as *const u8));
        }
        p += LINE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_spans_in_order() {
        let spans = [(1 << 20, CHUNK + 100), (4 << 20, 3 * CHUNK)];
        let n: usize = spans.iter().map(|s| s.1.div_ceil(CHUNK)).sum();
        assert_eq!(n, 5);
        let got: Vec<_> = (0..n).map(|i| chunk_of(&spans, i)).collect();
        assert_eq!(got[0], (1 << 20, CHUNK));
        assert_eq!(got[1], ((1 << 20) + CHUNK, 100));
        assert_eq!(got[2], (4 << 20, CHUNK));
        assert_eq!(got[4], ((4 << 20) + 2 * CHUNK, CHUNK));
        assert_eq!(
            got.iter().map(|c| c.1).sum::<usize>(),
            CHUNK + 100 + 3 * CHUNK
        );
        assert_eq!(chunk_of(&spans, n), (0, 0));
    }
}
