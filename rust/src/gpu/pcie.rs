//! Misses over PCIe (`pcie_frac`, issue #9): the routed-expert tensors of the GGUF mapping are
//! registered with the driver (page-locked, read-only where the device supports it), so a
//! missed expert's bytes are copied by the copy engine straight from RAM into a VRAM staging
//! area — no bounce buffer, no CPU time, no bytes the CPU pool reads too: the link adds its
//! bandwidth to the pool's. (Kernels reading the mapping in place over the link reached
//! ~21 GB/s on the H200 machine, the copy engine the link's 55.)
//!
//! Per layer of a decode step with PCIe misses (after the host's split): the host queues, on
//! the compute stream, the copies of the chosen experts (at most `cap`) into the staging
//! records, writes the layer's pointer tables — u64 [3][n_expert], the staged gate / up /
//! down of each chosen expert, 0 for every other one — into its page-locked area, copies them
//! up and queues the expert kernels over them (after the resident experts' kernels; the CPU
//! pool computes the other misses meanwhile). Stream order keeps the staging area safe: the
//! next layer's copies are queued after this layer's kernels. A layer's table area is
//! rewritten only in a later step, after the host waited for that layer's event of the later
//! step, which the stream reaches after the earlier copy.

use super::experts::ExpertTensors;
use crate::cuda::{DevBuf, Gpu, HostRegistration, PinnedBuf, Stream};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::tier::vram::{ExpertShape, Proj};
use std::sync::Arc;

const PAGE: usize = 4096;

/// The registered expert bytes, the staging records and the per-layer pointer tables.
pub struct PcieMisses {
    /// One registration per GGUF shard holding experts (dropped before the mapping).
    regs: Vec<HostRegistration>,
    _gguf: Arc<Gguf>,
    n_expert: usize,
    /// [layer][proj][expert]: (registration, byte offset in it) of each expert's bytes.
    src: Vec<(u32, usize)>,
    shapes: Vec<Option<ExpertShape>>,
    /// `cap` records of `rec` bytes (gate | up | down at `ExpertShape::offset`).
    stage: DevBuf,
    rec: u64,
    cap: usize,
    pin: PinnedBuf, // u64 [layer][3][n_expert]
    dev: DevBuf,    // u64 [layer][3][n_expert]
}

impl PcieMisses {
    /// Registers every shard's span of expert tensors (page-rounded) and allocates `cap`
    /// staging records. Errors (a driver that refuses the mapping) leave the caller to run
    /// every miss on the CPU.
    pub fn new(
        gpu: &Arc<Gpu>,
        gguf: Arc<Gguf>,
        layers: &ExpertTensors,
        n_expert: usize,
        cap: usize,
    ) -> Result<PcieMisses> {
        let nl = layers.len();
        // per shard: [lo, hi) host addresses of its expert tensors
        let mut spans: Vec<(usize, usize, usize)> = Vec::new(); // (shard, lo, hi)
        for (ts, _) in layers.iter().flatten() {
            for t in ts {
                let d = gguf.data(t);
                let (lo, hi) = (d.as_ptr() as usize, d.as_ptr() as usize + d.len());
                match spans.iter_mut().find(|s| s.0 == t.shard) {
                    Some(s) => {
                        s.1 = s.1.min(lo);
                        s.2 = s.2.max(hi);
                    }
                    None => spans.push((t.shard, lo, hi)),
                }
            }
        }
        if spans.is_empty() || cap == 0 {
            return Err(Error::Config("no routed experts to stage".into()));
        }
        let mut regs = Vec::with_capacity(spans.len());
        for &(_, lo, hi) in &spans {
            // The mapping starts on a page and its last page is mapped whole.
            let lo = lo / PAGE * PAGE;
            let hi = hi.div_ceil(PAGE) * PAGE;
            // SAFETY: the span lies in the shard's mapping, which `_gguf` keeps mapped until
            // after `regs` drops (field order).
            regs.push(unsafe { gpu.register_host(lo as *const u8, hi - lo)? });
        }
        let src_of = |p: usize| -> (u32, usize) {
            regs.iter()
                .enumerate()
                .find(|(_, r)| {
                    let b = r.host_ptr() as usize;
                    p >= b && p < b + r.len()
                })
                .map_or((0, 0), |(i, r)| (i as u32, p - r.host_ptr() as usize))
        };
        let mut src = vec![(0u32, 0usize); nl * 3 * n_expert];
        let mut shapes = vec![None; nl];
        for (l, entry) in layers.iter().enumerate() {
            let Some((ts, shape)) = entry else { continue };
            shapes[l] = Some(*shape);
            for (t, p) in ts.iter().zip(Proj::ALL) {
                let eb = shape.bytes(p) as usize;
                let base = gguf.data(t).as_ptr() as usize;
                for e in 0..n_expert {
                    src[(l * 3 + p as usize) * n_expert + e] = src_of(base + e * eb);
                }
            }
        }
        let rec = shapes
            .iter()
            .flatten()
            .map(ExpertShape::record_bytes)
            .max()
            .unwrap_or(0);
        let n = 8 * nl * 3 * n_expert;
        Ok(PcieMisses {
            regs,
            _gguf: gguf,
            n_expert,
            src,
            shapes,
            stage: gpu.alloc(cap * rec as usize)?,
            rec,
            cap,
            pin: gpu.host_alloc(n)?,
            dev: gpu.alloc(n)?,
        })
    }

    /// Bytes registered, and whether read-only.
    pub fn registered(&self) -> (u64, bool) {
        (
            self.regs.iter().map(|r| r.len() as u64).sum(),
            self.regs.iter().all(HostRegistration::read_only),
        )
    }

    /// Most experts one layer stages.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Queues on `s` the copies of layer `l`'s `experts` (the first `cap`) into the staging
    /// records and their pointer tables: the device addresses of the [gate, up, down] tables
    /// (`[n_expert]` u64 each) and the bytes copied.
    pub fn stage(&mut self, s: &Stream, l: usize, experts: &[u32]) -> Result<([u64; 3], u64)> {
        let ne = self.n_expert;
        let shape = self
            .shapes
            .get(l)
            .copied()
            .flatten()
            .ok_or_else(|| Error::Config(format!("layer {l} has no routed experts")))?;
        let off = l * 3 * ne;
        let mut staged = vec![0u64; 3 * ne];
        let mut n = 0;
        for &e in experts.iter().take(self.cap) {
            let e = e as usize;
            if e >= ne || staged[e] != 0 {
                continue;
            }
            let at = n as u64 * self.rec;
            for p in Proj::ALL {
                let (r, o) = self.src[off + p as usize * ne + e];
                let dst = (at + shape.offset(p)) as usize;
                let bytes = shape.bytes(p) as usize;
                self.regs[r as usize].copy_to_async(s, &self.stage, dst, o, bytes)?;
                staged[p as usize * ne + e] = self.stage.ptr() + dst as u64;
            }
            n += 1;
        }
        let mut tab = vec![0u64; 3 * ne];
        let all: Vec<u32> = (0..ne as u32).collect();
        let moved = fill_tables(
            &staged,
            ne,
            &all,
            &mut tab,
            [shape.gate, shape.up, shape.down],
        );
        let dst = &mut self.pin.as_mut_slice()[8 * off..8 * (off + 3 * ne)];
        for (d, v) in dst.chunks_exact_mut(8).zip(&tab) {
            d.copy_from_slice(&v.to_ne_bytes());
        }
        self.dev
            .write_async(s, 8 * off, &self.pin, 8 * off, 8 * 3 * ne)?;
        let base = self.dev.ptr() + 8 * off as u64;
        Ok(([base, base + 8 * ne as u64, base + 16 * ne as u64], moved))
    }
}

/// `tab` u64 [3][ne] = `src` for the experts in `experts` (and ids in range), 0 elsewhere;
/// returns the bytes those entries name (`bytes` per projection of one expert).
pub fn fill_tables(
    src: &[u64],
    ne: usize,
    experts: &[u32],
    tab: &mut [u64],
    bytes: [u64; 3],
) -> u64 {
    tab.fill(0);
    let mut moved = 0;
    for &e in experts {
        let e = e as usize;
        if e >= ne || tab[e] != 0 || src[e] == 0 {
            continue;
        }
        for p in 0..3 {
            tab[p * ne + e] = src[p * ne + e];
            moved += bytes[p];
        }
    }
    moved
}

#[cfg(test)]
mod tests {
    use super::fill_tables;

    #[test]
    fn tables_name_only_the_chosen_experts_once() {
        let ne = 5;
        let src: Vec<u64> = (0..3 * ne as u64).map(|i| 0x1000 + i).collect();
        let mut tab = vec![7u64; 3 * ne];
        let moved = fill_tables(&src, ne, &[3, 1, 3, 9], &mut tab, [10, 20, 40]);
        assert_eq!(
            moved,
            2 * 70,
            "experts 1 and 3, each once; 9 is out of range"
        );
        for p in 0..3 {
            for e in 0..ne {
                let want = if e == 1 || e == 3 { src[p * ne + e] } else { 0 };
                assert_eq!(tab[p * ne + e], want, "proj {p} expert {e}");
            }
        }
        assert_eq!(fill_tables(&src, ne, &[], &mut tab, [1, 1, 1]), 0);
        assert!(tab.iter().all(|&v| v == 0));
    }
}
