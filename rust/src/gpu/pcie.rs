//! Misses over PCIe (`pcie_frac`, issue #9): the routed-expert tensors of the GGUF mapping are
//! registered with the driver (page-locked and mapped into the device's address space,
//! read-only where the device supports it), so the expert kernels read a missed expert's
//! bytes straight from RAM over the link: no staging copy, no VRAM, and no bytes the CPU pool
//! reads too — the link adds its bandwidth to the pool's.
//!
//! Per layer of a decode step with PCIe misses (after the host's split): the host writes the
//! layer's pointer tables — u64 [3][n_expert], the device address of each chosen expert's
//! gate / up / down bytes in the mapping, 0 for every other expert — into its page-locked
//! area, copies them to the device on the compute stream and queues the expert kernels over
//! them (after the resident experts' kernels; the CPU pool computes the other misses
//! meanwhile). A layer's area is rewritten only in a later step, after the host waited for
//! that layer's event of the later step, which the stream reaches after the earlier copy.

use super::hybrid::ExpertTensors;
use crate::cuda::{DevBuf, Gpu, HostRegistration, PinnedBuf, Stream};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::tier::vram::Proj;
use std::sync::Arc;

const PAGE: usize = 4096;

/// The registered expert bytes and the per-layer pointer tables of the PCIe misses.
pub struct PcieMisses {
    /// One registration per GGUF shard holding experts (dropped before the mapping).
    regs: Vec<HostRegistration>,
    _gguf: Arc<Gguf>,
    n_expert: usize,
    /// u64 [layer][proj][expert]: device address of each expert's bytes (0: no experts).
    addr: Vec<u64>,
    /// u64 [layer][proj][expert]: bytes of each projection of one expert of the layer.
    bytes: Vec<[u64; 3]>,
    pin: PinnedBuf, // u64 [layer][3][n_expert]
    dev: DevBuf,    // u64 [layer][3][n_expert]
}

impl PcieMisses {
    /// Registers every shard's span of expert tensors (page-rounded). Errors (a driver that
    /// refuses the mapping) leave the caller to run every miss on the CPU.
    pub fn new(
        gpu: &Arc<Gpu>,
        gguf: Arc<Gguf>,
        layers: &ExpertTensors,
        n_expert: usize,
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
        if spans.is_empty() {
            return Err(Error::Config("the model has no routed experts".into()));
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
        let dev_of = |p: usize| -> u64 {
            regs.iter()
                .find(|r| {
                    let b = r.host_ptr() as usize;
                    p >= b && p < b + r.len()
                })
                .map_or(0, |r| r.dev_ptr() + (p - r.host_ptr() as usize) as u64)
        };
        let mut addr = vec![0u64; nl * 3 * n_expert];
        let mut bytes = vec![[0u64; 3]; nl];
        for (l, entry) in layers.iter().enumerate() {
            let Some((ts, shape)) = entry else { continue };
            for (t, p) in ts.iter().zip(Proj::ALL) {
                let eb = shape.bytes(p);
                bytes[l][p as usize] = eb;
                let base = gguf.data(t).as_ptr() as usize;
                for e in 0..n_expert {
                    addr[(l * 3 + p as usize) * n_expert + e] = dev_of(base + e * eb as usize);
                }
            }
        }
        let n = 8 * nl * 3 * n_expert;
        Ok(PcieMisses {
            regs,
            _gguf: gguf,
            n_expert,
            addr,
            bytes,
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

    /// Queues layer `l`'s tables for `experts` on `s`: the device addresses of the
    /// [gate, up, down] tables (`[n_expert]` u64 each) and the expert bytes they name.
    pub fn tables(&mut self, s: &Stream, l: usize, experts: &[u32]) -> Result<([u64; 3], u64)> {
        let ne = self.n_expert;
        let off = l * 3 * ne;
        let src = self
            .addr
            .get(off..off + 3 * ne)
            .ok_or_else(|| Error::Config(format!("layer {l} is out of range")))?;
        let mut tab = vec![0u64; 3 * ne];
        let moved = fill_tables(src, ne, experts, &mut tab, self.bytes[l]);
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
