//! The output head's prefetch distance (`avx2::pf::knob::HEAD`) chosen on this CPU while the
//! engine runs: the first one-token head products cycle through `CANDIDATES`, each timed, and
//! after `SAMPLES` rounds the knob keeps the candidate with the least median time. A hint
//! changes no value, so the logits are bitwise the same during and after the tuning.
//!
//! Why tune instead of a constant: the best distance differs by CPU more than any constant
//! can bridge (docs/BENCHMARKS.md, CPU decode, 2026-12-07 20:50–21:50): on a Zen 4 VM 64-384
//! bytes ahead decoded 3-10% faster than 2048; on an Emerald Rapids VM 2048-8192 bytes
//! decoded the whole step 25-33% faster than 128 (the head is most of a decode step's bytes
//! on a small model).
//! The head is the largest matrix a step reads (151,936 × 2,048 Q6_K for Qwen3, 255 MB), so
//! one product takes milliseconds and a few of them time a candidate well.
//! `set_head_prefetch_distance` pins the knob (tuning stops).

use super::avx2::pf::{knob::HEAD, Knob};
use std::sync::Mutex;
use std::time::Instant;

/// Distances tried, in bytes ahead of the block being decoded.
const CANDIDATES: [usize; 4] = [128, 512, 2048, 8192];
/// Timed products per candidate (the median is compared).
const SAMPLES: usize = 5;

enum State {
    /// `ns[c][s]`: sample s of candidate c; `n` products timed so far (round-robin order).
    Tuning {
        ns: [[u64; SAMPLES]; CANDIDATES.len()],
        n: usize,
    },
    /// Chosen or pinned: the knob stays as it is.
    Done,
}

/// A knob tuned by timing the products run with each candidate.
pub struct Tuner {
    knob: &'static Knob,
    state: Mutex<State>,
}

/// One timed product: `Tuner::begin` set the knob to its candidate.
pub struct Trial {
    n: usize,
    t0: Instant,
}

/// The head's tuner.
pub static HEAD_TUNER: Tuner = Tuner::new(&HEAD);

impl Tuner {
    const fn new(knob: &'static Knob) -> Tuner {
        Tuner {
            knob,
            state: Mutex::new(State::Tuning {
                ns: [[0; SAMPLES]; CANDIDATES.len()],
                n: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// While tuning: sets the knob to the next candidate and starts timing the product the
    /// caller runs next (always the same work: one activation row, the whole head); `None`
    /// once the knob is settled.
    pub fn begin(&self) -> Option<Trial> {
        match *self.lock() {
            State::Tuning { n, .. } => {
                self.knob.set(CANDIDATES[n % CANDIDATES.len()]);
                Some(Trial {
                    n,
                    t0: Instant::now(),
                })
            }
            State::Done => None,
        }
    }

    /// Ends `trial`; after the last sample sets the knob to the fastest candidate. A trial
    /// that overlapped another one (two heads at once) is dropped.
    pub fn end(&self, trial: Trial) {
        self.record(trial.n, trial.t0.elapsed().as_nanos() as u64);
    }

    fn record(&self, trial: usize, ns: u64) {
        let mut st = self.lock();
        let State::Tuning { ns: times, n } = &mut *st else {
            return;
        };
        if *n != trial {
            return;
        }
        let k = CANDIDATES.len();
        times[*n % k][*n / k] = ns;
        *n += 1;
        if *n == k * SAMPLES {
            self.knob.set(CANDIDATES[fastest(times)]);
            *st = State::Done;
        }
    }

    /// Stops the tuning, leaving the knob as the caller sets it.
    pub fn pin(&self) {
        *self.lock() = State::Done;
    }

    /// (the distance now, whether it is settled: chosen or pinned).
    pub fn state(&self) -> (usize, bool) {
        let st = self.lock();
        (self.knob.get(), matches!(*st, State::Done))
    }
}

/// The candidate with the least median time (the first of equals).
fn fastest(times: &[[u64; SAMPLES]; CANDIDATES.len()]) -> usize {
    let median = |s: &[u64; SAMPLES]| {
        let mut s = *s;
        s.sort_unstable();
        s[SAMPLES / 2]
    };
    (0..times.len())
        .min_by_key(|&c| (median(&times[c]), c))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The least median wins, not the least sample: one fast outlier does not pick a
    /// candidate, and equal medians keep the shorter distance.
    #[test]
    fn fastest_takes_the_least_median() {
        let mut t = [[100u64; SAMPLES]; CANDIDATES.len()];
        t[0] = [1, 100, 100, 100, 100]; // one outlier
        t[2] = [90, 90, 95, 200, 300]; // median 95
        assert_eq!(fastest(&t), 2);
        let t = [[50u64; SAMPLES]; CANDIDATES.len()];
        assert_eq!(fastest(&t), 0);
    }

    /// The knob cycles through the candidates while tuning, then holds the fastest; a
    /// stale trial is dropped; after the choice (or a pin) nothing changes it.
    #[test]
    fn tunes_then_settles() {
        static K: Knob = Knob::new(7);
        let t = Tuner::new(&K);
        let k = CANDIDATES.len();
        for i in 0..k * SAMPLES {
            let trial = t.begin().expect("tuning");
            assert_eq!(K.get(), CANDIDATES[i % k]);
            assert_eq!(t.state(), (CANDIDATES[i % k], false));
            t.record(trial.n + 1, 1); // a stale trial: not counted
                                      // candidate 2 the fastest
            t.record(trial.n, if i % k == 2 { 10 } else { 20 + i as u64 });
        }
        assert_eq!(t.state(), (CANDIDATES[2], true));
        assert!(t.begin().is_none());
        let p = Tuner::new(&K);
        K.set(99);
        p.pin();
        assert!(p.begin().is_none());
        assert_eq!(p.state(), (99, true));
    }
}
