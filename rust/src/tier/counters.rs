//! Routing counters: how often the router picked each (layer, expert), with exponential decay
//! so the counts follow what the model is being asked now.
//!
//! Layout: one flat array `[n_layer × n_expert]` of fixed-point counts (one hit = `ONE`).
//! Single writer: the forward pass runs one layer at a time on one thread, so `observe` is a
//! relaxed load and a relaxed store per id (no locked instruction; ~1 ns per id). Readers on
//! other threads (metrics, the adaptive tier) see a slightly stale but never torn value. If two
//! threads did call `observe` on the same layer at once, some hits could be lost, never
//! corrupted.
//!
//! Decay: `end_step()` counts steps; every `DECAY_PERIOD` steps every count is multiplied by
//! `0.5^(DECAY_PERIOD / half_life_steps)`, so a hit `half_life_steps` steps ago weighs half.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Fixed-point scale: one routing hit. 2^8 keeps decayed fractions of a hit.
pub const ONE: u64 = 256;
/// Steps between decay passes (a pass reads and writes every counter once).
pub const DECAY_PERIOD: u64 = 64;

pub struct RoutingCounters {
    n_layer: usize,
    n_expert: usize,
    /// `[layer][expert]` decayed counts × ONE.
    counts: Box<[AtomicU64]>,
    /// Undecayed hits per layer (routing decisions observed; tokens × top-k).
    hits: Box<[AtomicU64]>,
    steps: AtomicU64,
    half_life_steps: f64,
    factor: f64,
}

impl RoutingCounters {
    /// `half_life_steps` ≤ 0: no decay (plain counts, as a profile run wants).
    pub fn new(n_layer: usize, n_expert: usize, half_life_steps: f64) -> Self {
        let factor = if half_life_steps > 0.0 {
            0.5f64.powf(DECAY_PERIOD as f64 / half_life_steps)
        } else {
            1.0
        };
        RoutingCounters {
            n_layer,
            n_expert,
            counts: (0..n_layer * n_expert).map(|_| AtomicU64::new(0)).collect(),
            hits: (0..n_layer).map(|_| AtomicU64::new(0)).collect(),
            steps: AtomicU64::new(0),
            half_life_steps: half_life_steps.max(0.0),
            factor,
        }
    }

    pub fn n_layer(&self) -> usize {
        self.n_layer
    }

    pub fn n_expert(&self) -> usize {
        self.n_expert
    }

    pub fn half_life_steps(&self) -> f64 {
        self.half_life_steps
    }

    pub fn steps(&self) -> u64 {
        self.steps.load(Relaxed)
    }

    /// Record the router's choices for one layer of one step: `ids` are expert indices (all
    /// tokens' top-k, flattened). Ids out of range are ignored (a router bug must not corrupt
    /// another layer's counts). Layers out of range are ignored too.
    #[inline]
    pub fn observe(&self, layer: usize, ids: &[u32]) {
        if layer >= self.n_layer {
            return;
        }
        let row = &self.counts[layer * self.n_expert..(layer + 1) * self.n_expert];
        for &id in ids {
            if let Some(c) = row.get(id as usize) {
                c.store(c.load(Relaxed).saturating_add(ONE), Relaxed);
            }
        }
        let h = &self.hits[layer];
        h.store(h.load(Relaxed) + ids.len() as u64, Relaxed);
    }

    /// One decode/prefill step is over; decays every `DECAY_PERIOD` steps.
    pub fn end_step(&self) {
        let s = self.steps.load(Relaxed) + 1;
        self.steps.store(s, Relaxed);
        if self.factor < 1.0 && s.is_multiple_of(DECAY_PERIOD) {
            self.decay(self.factor);
        }
    }

    /// Multiply every count by `factor` (in [0, 1]).
    pub fn decay(&self, factor: f64) {
        let f = factor.clamp(0.0, 1.0);
        for c in self.counts.iter() {
            c.store((c.load(Relaxed) as f64 * f) as u64, Relaxed);
        }
    }

    pub fn reset(&self) {
        self.counts.iter().for_each(|c| c.store(0, Relaxed));
        self.hits.iter().for_each(|c| c.store(0, Relaxed));
        self.steps.store(0, Relaxed);
    }

    /// Routing decisions observed in `layer` since creation or reset (not decayed).
    pub fn hits(&self, layer: usize) -> u64 {
        self.hits.get(layer).map_or(0, |h| h.load(Relaxed))
    }

    pub fn count(&self, layer: usize, expert: usize) -> f32 {
        if layer >= self.n_layer || expert >= self.n_expert {
            return 0.0;
        }
        self.counts[layer * self.n_expert + expert].load(Relaxed) as f32 / ONE as f32
    }

    /// All counts, `[layer][expert]` flattened, in hits.
    pub fn snapshot(&self) -> Vec<f32> {
        self.counts
            .iter()
            .map(|c| c.load(Relaxed) as f32 / ONE as f32)
            .collect()
    }

    /// The `k` most-routed experts of `layer`, hottest first (ties: lower id first).
    pub fn top_k(&self, layer: usize, k: usize) -> Vec<(u32, f32)> {
        if layer >= self.n_layer {
            return Vec::new();
        }
        let row = &self.counts[layer * self.n_expert..(layer + 1) * self.n_expert];
        let mut v: Vec<(u32, u64)> = row
            .iter()
            .enumerate()
            .map(|(i, c)| (i as u32, c.load(Relaxed)))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(k);
        v.into_iter()
            .map(|(i, c)| (i, c as f32 / ONE as f32))
            .collect()
    }
}
