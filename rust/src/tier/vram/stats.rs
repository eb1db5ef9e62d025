//! Counters of the hybrid tier: per-layer hits and misses (by CPU and by PCIe), swaps and bytes
//! moved. One relaxed add per category per layer per step (the step thread is the only writer
//! of the per-layer counters); readers (metrics, status) see slightly stale, never torn values.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Default)]
struct PairCtr {
    hits: AtomicU64,
    miss_cpu: AtomicU64,
    miss_pcie: AtomicU64,
}

impl PairCtr {
    /// One writer (the step thread): a relaxed load and store, no read-modify-write.
    #[inline]
    fn add(&self, hits: u64, miss_cpu: u64, miss_pcie: u64) {
        let add = |a: &AtomicU64, v: u64| {
            if v > 0 {
                a.store(a.load(Relaxed) + v, Relaxed);
            }
        };
        add(&self.hits, hits);
        add(&self.miss_cpu, miss_cpu);
        add(&self.miss_pcie, miss_pcie);
    }
}

pub struct HybridCounters {
    layers: Box<[PairCtr]>,
    /// Per KV slot: the pairs of the rows that slot's sequences fed (a request's own share,
    /// whatever else shared its steps). Written by the step thread only, like `layers`.
    slots: Box<[PairCtr]>,
    swaps: AtomicU64,
    /// Host→device bytes of slot fills (start fill and swaps).
    fill_bytes: AtomicU64,
    /// Host→device bytes of experts run on the GPU as PCIe misses.
    pcie_bytes: AtomicU64,
    /// Device→host and host→device bytes of activations for CPU misses (x, ids, y_miss).
    handoff_bytes: AtomicU64,
    /// Host time of the layers whose misses ran on the CPU (decode), by phase.
    times: [AtomicU64; PHASES.len()],
    /// Device time of the GPU's part of such layers (`CHAIN`; only while a model was opened
    /// with the chain timing on: `set_hybrid_chain_timing`).
    chain: [AtomicU64; CHAIN.len()],
}

/// The GPU's part of a CPU-path layer after the previous layer's hand-off, as CUDA timing
/// events on the compute stream see it (ns summed; `layers` counts them): `add` from the
/// add's queueing to its end (x += y_miss read over the link, with the launch latency on an
/// idle GPU), `attention` from there to the routing's event (norm, Q/K/V, RoPE, attention, O,
/// the FFN norm, the router and its top-k, with the graph's launch).
pub const CHAIN: [&str; 3] = ["layers", "add", "attention"];

/// Phases of a layer whose misses run on the CPU, as the step thread sees them (ns summed
/// over such layers; `layers` counts them): `between` from the previous layer's return to
/// this layer's expert part (queueing the attention and router kernels), `queue` (the
/// copies of ids/weights/input and the GPU's expert kernels queued), `wait` (the host waits
/// for the routed ids: the GPU's attention and router not yet done, plus the wake-up),
/// `cpu` (split, counting and the pool's miss computation), `tail` (y_miss up and the add
/// queued).
pub const PHASES: [&str; 6] = ["layers", "between", "queue", "wait", "cpu", "tail"];

/// `sums[0]` counts one more record, `sums[1..]` add `ns`.
fn count_sums(sums: &[AtomicU64], ns: &[u64]) {
    sums[0].fetch_add(1, Relaxed);
    for (a, &v) in sums[1..].iter().zip(ns) {
        a.fetch_add(v, Relaxed);
    }
}

/// `names` paired with the current `sums`.
fn named(names: &[&'static str], sums: &[AtomicU64]) -> Vec<(&'static str, u64)> {
    names
        .iter()
        .zip(sums)
        .map(|(&n, a)| (n, a.load(Relaxed)))
        .collect()
}

/// A snapshot. Hits and misses count routed (token, slot) pairs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HybridSnapshot {
    pub hits: Vec<u64>,
    pub miss_cpu: Vec<u64>,
    pub miss_pcie: Vec<u64>,
    pub swaps: u64,
    pub fill_bytes: u64,
    pub pcie_bytes: u64,
    pub handoff_bytes: u64,
}

impl HybridSnapshot {
    pub fn total_hits(&self) -> u64 {
        self.hits.iter().sum()
    }
    pub fn total_miss_cpu(&self) -> u64 {
        self.miss_cpu.iter().sum()
    }
    pub fn total_miss_pcie(&self) -> u64 {
        self.miss_pcie.iter().sum()
    }
    fn rate(h: u64, m: u64) -> Option<f64> {
        (h + m > 0).then(|| h as f64 / (h + m) as f64)
    }
    /// Hits / routed pairs; None before any pair was routed.
    pub fn hit_rate(&self) -> Option<f64> {
        let m = self.total_miss_cpu() + self.total_miss_pcie();
        Self::rate(self.total_hits(), m)
    }
    pub fn layer_hit_rate(&self, l: usize) -> Option<f64> {
        Self::rate(*self.hits.get(l)?, self.miss_cpu[l] + self.miss_pcie[l])
    }
    /// PCIe misses / all misses; None without misses.
    pub fn pcie_share(&self) -> Option<f64> {
        let (c, p) = (self.total_miss_cpu(), self.total_miss_pcie());
        (c + p > 0).then(|| p as f64 / (c + p) as f64)
    }
    /// `self − earlier` (a request's share of the totals).
    pub fn since(&self, earlier: &HybridSnapshot) -> HybridSnapshot {
        let d = |a: &[u64], b: &[u64]| -> Vec<u64> {
            a.iter()
                .enumerate()
                .map(|(i, &x)| x.saturating_sub(b.get(i).copied().unwrap_or(0)))
                .collect()
        };
        HybridSnapshot {
            hits: d(&self.hits, &earlier.hits),
            miss_cpu: d(&self.miss_cpu, &earlier.miss_cpu),
            miss_pcie: d(&self.miss_pcie, &earlier.miss_pcie),
            swaps: self.swaps.saturating_sub(earlier.swaps),
            fill_bytes: self.fill_bytes.saturating_sub(earlier.fill_bytes),
            pcie_bytes: self.pcie_bytes.saturating_sub(earlier.pcie_bytes),
            handoff_bytes: self.handoff_bytes.saturating_sub(earlier.handoff_bytes),
        }
    }
}

impl HybridCounters {
    pub fn new(n_layer: usize) -> Self {
        Self::with_slots(n_layer, 0)
    }

    /// Counters for `n_layer` layers and `n_slots` KV slots.
    pub fn with_slots(n_layer: usize, n_slots: usize) -> Self {
        HybridCounters {
            layers: (0..n_layer).map(|_| PairCtr::default()).collect(),
            slots: (0..n_slots).map(|_| PairCtr::default()).collect(),
            swaps: AtomicU64::new(0),
            fill_bytes: AtomicU64::new(0),
            pcie_bytes: AtomicU64::new(0),
            handoff_bytes: AtomicU64::new(0),
            times: Default::default(),
            chain: Default::default(),
        }
    }

    /// One timed layer's GPU part in ns (`CHAIN[1..]`).
    pub fn record_chain(&self, ns: [u64; 2]) {
        count_sums(&self.chain, &ns);
    }

    /// `CHAIN` with their sums (layers, then ns).
    pub fn chain_times(&self) -> Vec<(&'static str, u64)> {
        named(&CHAIN, &self.chain)
    }

    /// One CPU-path layer's phases in ns (`PHASES[1..]`; `between` 0 for a step's first).
    pub fn record_times(&self, ns: [u64; 5]) {
        count_sums(&self.times, &ns);
    }

    /// `PHASES` with their sums (layers, then ns).
    pub fn times(&self) -> Vec<(&'static str, u64)> {
        named(&PHASES, &self.times)
    }

    pub fn n_layer(&self) -> usize {
        self.layers.len()
    }

    /// Pairs of rows that KV slot `slot`'s sequence fed (any layer); slots out of range are
    /// ignored.
    #[inline]
    pub fn record_slot(&self, slot: usize, hits: u64, miss_cpu: u64, miss_pcie: u64) {
        if let Some(c) = self.slots.get(slot) {
            c.add(hits, miss_cpu, miss_pcie);
        }
    }

    /// `(hits, miss_cpu, miss_pcie)` of KV slot `slot` since load (None: no such slot).
    pub fn slot_totals(&self, slot: usize) -> Option<(u64, u64, u64)> {
        let c = self.slots.get(slot)?;
        Some((
            c.hits.load(Relaxed),
            c.miss_cpu.load(Relaxed),
            c.miss_pcie.load(Relaxed),
        ))
    }

    /// One layer of one step: `hits` pairs ran from VRAM slots, `miss_cpu` on the CPU pool,
    /// `miss_pcie` on the GPU after a copy over PCIe. Layers out of range are ignored.
    #[inline]
    pub fn record_layer(&self, layer: usize, hits: u64, miss_cpu: u64, miss_pcie: u64) {
        if let Some(c) = self.layers.get(layer) {
            c.add(hits, miss_cpu, miss_pcie);
        }
    }

    pub fn record_swaps(&self, n: u64, bytes: u64) {
        self.swaps.fetch_add(n, Relaxed);
        self.fill_bytes.fetch_add(bytes, Relaxed);
    }

    /// Start fill (not a swap).
    pub fn record_fill(&self, bytes: u64) {
        self.fill_bytes.fetch_add(bytes, Relaxed);
    }

    pub fn record_pcie(&self, bytes: u64) {
        self.pcie_bytes.fetch_add(bytes, Relaxed);
    }

    pub fn record_handoff(&self, bytes: u64) {
        self.handoff_bytes.fetch_add(bytes, Relaxed);
    }

    pub fn snapshot(&self) -> HybridSnapshot {
        let g = |f: fn(&PairCtr) -> &AtomicU64| -> Vec<u64> {
            self.layers.iter().map(|c| f(c).load(Relaxed)).collect()
        };
        HybridSnapshot {
            hits: g(|c| &c.hits),
            miss_cpu: g(|c| &c.miss_cpu),
            miss_pcie: g(|c| &c.miss_pcie),
            swaps: self.swaps.load(Relaxed),
            fill_bytes: self.fill_bytes.load(Relaxed),
            pcie_bytes: self.pcie_bytes.load(Relaxed),
            handoff_bytes: self.handoff_bytes.load(Relaxed),
        }
    }
}
