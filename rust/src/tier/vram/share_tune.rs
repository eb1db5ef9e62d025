//! `pcie_frac` -1 (auto): the link's share of the decode misses chosen by measuring the step,
//! not by a model of it. The probe's share (`default_pcie_frac`: link ÷ (link + RAM)) assumes
//! the link and the CPU pool read RAM independently; they read the same RAM, so once the pool
//! alone reads it at its bound the link's copies only take bandwidth from the pool (measured
//! on the H200 host: the probe's 0.37 ran decode 16% slower than no PCIe misses at all, where
//! it had run 2–8% faster while the pool reached only 55% of the RAM's bandwidth).
//!
//! So the share is a choice between two candidates — the probe's and 0 — made on the decode
//! steps' own time per token: after `WARM` steps (graph capture, first touches), blocks of
//! `BLOCK` steps alternate the two for `ROUNDS` rounds each; the faster one is held for `HOLD`
//! steps, then measured again (the VRAM cache adapts and contexts grow, so the answer can
//! move). Interleaved blocks keep slow drifts (context length, the mix of batch sizes) out of
//! the comparison. Host work only: one comparison per step.

/// Steps skipped before the first measurement.
pub const WARM: u32 = 8;
/// Steps per block of one candidate.
pub const BLOCK: u32 = 4;
/// Blocks per candidate per measurement.
pub const ROUNDS: u32 = 3;
/// Steps the choice is held before it is measured again.
pub const HOLD: u64 = 2048;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// `left` steps before measuring.
    Wait { left: u64 },
    /// Block `block` of `2 · ROUNDS`, `n` steps into it.
    Measure { block: u32, n: u32 },
}

/// Chooses between the probe's share and 0 by measured decode time per token.
#[derive(Clone, Debug)]
pub struct ShareTuner {
    cands: [f64; 2],
    /// Nanoseconds and tokens per candidate over the current measurement.
    ns: [u64; 2],
    toks: [u64; 2],
    chosen: usize,
    phase: Phase,
    /// Measurements completed (for the engine's info).
    rounds_done: u64,
}

impl ShareTuner {
    /// `probe`: the link probe's share (> 0; a probe of no bandwidth keeps PCIe misses off).
    pub fn new(probe: f64) -> Self {
        ShareTuner {
            cands: [probe.clamp(0.0, 1.0), 0.0],
            ns: [0; 2],
            toks: [0; 2],
            chosen: 0,
            phase: Phase::Wait {
                left: u64::from(WARM),
            },
            rounds_done: 0,
        }
    }

    /// The share to use for the next step.
    pub fn current(&self) -> f64 {
        match self.phase {
            Phase::Wait { .. } => self.cands[self.chosen],
            Phase::Measure { block, .. } => self.cands[(block % 2) as usize],
        }
    }

    /// The probe's share (the candidate besides 0).
    pub fn probe(&self) -> f64 {
        self.cands[0]
    }

    /// Measurements completed so far.
    pub fn measured(&self) -> u64 {
        self.rounds_done
    }

    /// A decode step of `tokens` tokens took `ns` on its CPU-path layers (at `current()`'s
    /// share); returns the share for the next step.
    pub fn step(&mut self, tokens: usize, ns: u64) -> f64 {
        self.phase = match self.phase {
            Phase::Wait { left } if left > 1 => Phase::Wait { left: left - 1 },
            Phase::Wait { .. } => {
                self.ns = [0; 2];
                self.toks = [0; 2];
                Phase::Measure { block: 0, n: 0 }
            }
            Phase::Measure { block, n } => {
                let c = (block % 2) as usize;
                self.ns[c] += ns;
                self.toks[c] += tokens.max(1) as u64;
                if n + 1 < BLOCK {
                    Phase::Measure { block, n: n + 1 }
                } else if block + 1 < 2 * ROUNDS {
                    Phase::Measure {
                        block: block + 1,
                        n: 0,
                    }
                } else {
                    self.chosen = self.faster();
                    self.rounds_done += 1;
                    Phase::Wait { left: HOLD }
                }
            }
        };
        self.current()
    }

    /// The candidate with less time per token (the probe's on a tie: it was the default).
    fn faster(&self) -> usize {
        let per = |c: usize| self.ns[c] as f64 / self.toks[c].max(1) as f64;
        if per(1) < per(0) {
            1
        } else {
            0
        }
    }
}
