//! Prefill chunks of the hybrid mode with every expert on the GPU: the layer's experts that
//! are not in a VRAM slot are copied from RAM (the GGUF mapping) over PCIe into a staging
//! area, and the whole layer runs on the GPU through a pointer table whose entries are the
//! slot of a resident expert or the staging copy of a missing one. For long chunks this moves
//! each missed expert once instead of computing every (token, expert) pair on the CPU; the
//! bytes moved per token fall with the chunk length (`stream_chunk`, the model's chunking).
//!
//! Staging layout of one area, per projection p: `[n_expert]` copies of `eb(p)` bytes (the
//! largest of any layer), projections one after the other (256-aligned), so a run of
//! consecutive missing experts is one source range.
//!
//! The copies go through page-locked bounce buffers filled by CPU threads (`bounce`: the
//! mapping is pageable, and a DMA from pageable memory blocks the caller and runs far below
//! the link's speed).
//!
//! Fences, with A staging areas (2 when the VRAM plan has room, else 1): layer l uses area
//! `l % A`. On the copy stream, layer l's copies first wait for `moe_done[l % A]`, recorded
//! on the compute stream after the expert kernels of the last layer that used the area
//! (l − A); then the DMAs; then `copied`, which the compute stream waits on before layer l's
//! expert kernels. So with two areas layer l's copies run while layer l − 1 computes, and an
//! area is never rewritten while kernels that read it may still run. Events never recorded
//! (the first layers) are no waits. A bounce buffer is refilled only after the event recorded
//! behind its last DMA (`bounce`). The host blocks only in the bounce lanes (waiting for
//! their own DMAs), while the compute stream runs the layers already queued.
//!
//! The routed ids of a streamed chunk reach the host with the chunk (no per-layer wait): they
//! are counted after it (hits: resident pairs; PCIe misses: the others).

use super::bounce::{self, Dma, Lane, Piece, BUFS_PER_LANE, PIECE_BYTES};
use crate::cuda::ops::quant;
use crate::cuda::{DevBuf, Event, Gpu, PinnedBuf, Stream};
use crate::error::Result;
use crate::gguf::{Gguf, TensorInfo};
use crate::tier::vram::budget::SLOT_ALIGN;
use crate::tier::vram::{ExpertShape, Proj, PtrTables, VramTable};
use std::sync::Arc;

fn align(n: u64) -> u64 {
    n.div_ceil(SLOT_ALIGN) * SLOT_ALIGN
}

/// DMAs from the bounce buffers into one staging area on the copy stream.
struct CudaDma<'a> {
    area: &'a DevBuf,
    copy: &'a Stream,
}

impl Dma for CudaDma<'_> {
    type Buf = PinnedBuf;
    type Fence = Event;
    fn wait(&self, f: &Event) -> Result<()> {
        f.sync()
    }
    fn issue(&self, buf: &PinnedBuf, len: usize, dst: u64, f: &Event) -> Result<()> {
        self.area
            .write_async(self.copy, dst as usize, buf, 0, len)?;
        f.record(self.copy)
    }
}

pub(super) struct StreamIn {
    /// Chunks of at least this many tokens stream.
    pub min_tokens: usize,
    gguf: Arc<Gguf>,
    /// Per layer: the (gate, up, down) tensors and one expert's shape.
    layers: Vec<Option<([TensorInfo; 3], ExpertShape)>>,
    n_expert: usize,
    /// Byte offset of each projection's copies in an area.
    base: [u64; 3],
    /// The staging areas (layer l uses `areas[l % len]`).
    areas: Vec<DevBuf>,
    /// u64 [layer][proj][expert]: slot address (resident) or staging address (missing).
    tables: DevBuf,
    host: Vec<u64>,
    copy: Stream,
    copied: Event,
    /// Per area: after the expert kernels of the last layer that read it.
    moe_done: Vec<Event>,
    lanes: Vec<Lane<PinnedBuf, Event>>,
    /// i32 [layer][T][K]: the routed ids of the streamed chunk.
    pin_ids: PinnedBuf,
    /// T of the streamed chunk whose ids are not counted yet.
    pending: Option<usize>,
}

/// What a streamed chunk's counting found for one layer.
pub(super) struct LayerCount {
    pub hits: u64,
    pub misses: u64,
}

impl StreamIn {
    /// Bytes of one staging area for these layers; None when a projection's expert size is
    /// not a multiple of its kernels' alignment (then chunks do not stream).
    fn layout(
        layers: &[Option<([TensorInfo; 3], ExpertShape)>],
        ne: usize,
    ) -> Option<([u64; 3], u64)> {
        let mut widest = [0u64; 3];
        for (ts, sh) in layers.iter().flatten() {
            for (i, p) in Proj::ALL.into_iter().enumerate() {
                let a = quant::weight_align(ts[i].ty).unwrap_or(1).max(1);
                if !sh.bytes(p).is_multiple_of(a) {
                    return None;
                }
                widest[i] = widest[i].max(sh.bytes(p));
            }
        }
        let ne = ne as u64;
        let base = [
            0,
            align(ne * widest[0]),
            align(ne * widest[0]) + align(ne * widest[1]),
        ];
        Some((base, base[2] + align(ne * widest[2])))
    }

    /// One staging area, the tables and `lanes` bounce lanes for chunks of up to `t` tokens;
    /// None when chunks cannot stream (`layout`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Arc<Gpu>,
        gguf: Arc<Gguf>,
        layers: Vec<Option<([TensorInfo; 3], ExpertShape)>>,
        n_expert: usize,
        t: usize,
        k: usize,
        min_tokens: usize,
        lanes: usize,
    ) -> Result<Option<StreamIn>> {
        let Some((base, total)) = Self::layout(&layers, n_expert) else {
            return Ok(None);
        };
        let nl = layers.len();
        let lanes = (0..lanes.max(1))
            .map(|_| -> Result<Lane<PinnedBuf, Event>> {
                Ok(Lane {
                    bufs: (0..BUFS_PER_LANE)
                        .map(|_| gpu.host_alloc(PIECE_BYTES))
                        .collect::<Result<_>>()?,
                    fences: (0..BUFS_PER_LANE)
                        .map(|_| gpu.event_no_timing())
                        .collect::<Result<_>>()?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(StreamIn {
            min_tokens,
            gguf,
            layers,
            n_expert,
            base,
            areas: vec![gpu.alloc(total as usize)?],
            tables: gpu.alloc(8 * nl * 3 * n_expert)?,
            host: vec![0; nl * 3 * n_expert],
            copy: gpu.stream()?,
            copied: gpu.event_no_timing()?,
            moe_done: vec![gpu.event_no_timing()?],
            lanes,
            pin_ids: gpu.host_alloc(4 * nl * t * k)?,
            pending: None,
        }))
    }

    /// Bytes of one staging area.
    pub fn area_bytes(&self) -> u64 {
        self.areas[0].len() as u64
    }

    /// Staging areas (1 or 2).
    pub fn n_areas(&self) -> usize {
        self.areas.len()
    }

    /// Bounce lanes (threads that copy).
    pub fn n_lanes(&self) -> usize {
        self.lanes.len()
    }

    /// A second staging area (double buffering: a layer's copies overlap the previous
    /// layer's kernels). Call before `refresh`.
    pub fn add_area(&mut self, gpu: &Gpu) -> Result<()> {
        self.areas.push(gpu.alloc(self.areas[0].len())?);
        self.moe_done.push(gpu.event_no_timing()?);
        Ok(())
    }

    /// Rebuild the tables from the slot pointer tables (the host table changed) and write
    /// them on `s` (ahead of the next step's kernels).
    pub fn refresh(&mut self, ptrs: &PtrTables, s: &Stream) -> Result<()> {
        for (l, lay) in self.layers.iter().enumerate() {
            let Some((_, sh)) = lay else { continue };
            let stage = self.areas[l % self.areas.len()].ptr();
            for (i, p) in Proj::ALL.into_iter().enumerate() {
                for e in 0..self.n_expert {
                    let at = ptrs.index(l, p, e as u32);
                    self.host[at] = match ptrs.ptrs[at] {
                        0 => stage + self.base[i] + e as u64 * sh.bytes(p),
                        v => v,
                    };
                }
            }
        }
        self.tables.write(s, 0, &self.host)
    }

    /// A step begins: ids of a failed earlier chunk are not counted.
    pub fn begin_step(&mut self) {
        self.pending = None;
    }

    /// Device address of layer `l`'s `[n_expert]` table of projection `p`.
    pub fn table(&self, ptrs: &PtrTables, l: usize, p: Proj) -> u64 {
        self.tables.ptr() + 8 * ptrs.index(l, p, 0) as u64
    }

    /// Queue layer `l`'s routed ids ([T, K] in `ids`) for counting, copy the layer's missing
    /// experts into its staging area (after the kernels of the last layer that used it) and
    /// make `s` wait for the copies. Returns the bytes copied. Call `done_layer` after the
    /// layer's expert kernels.
    pub fn begin_layer(
        &mut self,
        s: &Stream,
        table: &VramTable,
        ids: &DevBuf,
        l: usize,
        t: usize,
        k: usize,
    ) -> Result<u64> {
        ids.read_async(s, 0, &mut self.pin_ids, 4 * l * t * k, 4 * t * k)?;
        self.pending = Some(t);
        let a = l % self.areas.len();
        self.copy.wait(&self.moe_done[a])?;
        let Some((ts, sh)) = &self.layers[l] else {
            return Ok(0);
        };
        let mut pieces: Vec<Piece<'_>> = Vec::new();
        let mut e = 0;
        while e < self.n_expert {
            if table.slot(l, e as u32).is_some() {
                e += 1;
                continue;
            }
            let first = e;
            while e < self.n_expert && table.slot(l, e as u32).is_none() {
                e += 1;
            }
            for (i, p) in Proj::ALL.into_iter().enumerate() {
                let eb = sh.bytes(p) as usize;
                let src = &self.gguf.data(&ts[i])[first * eb..e * eb];
                let off = self.base[i] + (first * eb) as u64;
                bounce::cut(src, off, PIECE_BYTES, &mut pieces);
            }
        }
        let dma = CudaDma {
            area: &self.areas[a],
            copy: &self.copy,
        };
        let bytes = bounce::copy_pieces(&dma, &mut self.lanes, &pieces)?;
        self.copied.record(&self.copy)?;
        s.wait(&self.copied)?;
        Ok(bytes)
    }

    /// After layer `l`'s expert kernels are queued on `s`: its staging area may be rewritten
    /// once they have run.
    pub fn done_layer(&mut self, s: &Stream, l: usize) -> Result<()> {
        self.moe_done[l % self.areas.len()].record(s)
    }

    /// After the chunk has completed: per layer, the routed ids of a streamed chunk and how
    /// many were resident (`f(layer, ids, count)`); nothing when the chunk did not stream.
    pub fn count(
        &mut self,
        table: &VramTable,
        k: usize,
        mut f: impl FnMut(usize, &[u32], LayerCount),
    ) {
        let Some(t) = self.pending.take() else { return };
        let mut ids = Vec::with_capacity(t * k);
        for l in 0..self.layers.len() {
            let bytes = &self.pin_ids.as_slice()[4 * l * t * k..4 * (l + 1) * t * k];
            ids.clear();
            ids.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]) as u32),
            );
            let hits = ids.iter().filter(|&&e| table.slot(l, e).is_some()).count() as u64;
            let c = LayerCount {
                hits,
                misses: ids.len() as u64 - hits,
            };
            f(l, &ids, c);
        }
    }
}
