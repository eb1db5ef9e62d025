//! Expert deferral (opt-in, `defer_experts`; issue 23, KTransformers' idea): a layer's CPU
//! misses are added to the residual stream one layer later, so the pool computes them while
//! the GPU runs the next layer's attention and router instead of the GPU waiting for them.
//!
//! `defer_experts` = n: each token's n lowest-weight CPU pairs of a layer are deferred (n ≥
//! top-k: all of them), the others computed at once as without deferral. Per layer l of a
//! chunk whose misses go to the CPU (`hybrid.rs`):
//!   GPU: attention(l) + router(l) on x that lacks y_def(l−1); resident experts of l
//!   host: after l's routing reached the host, the job of l−1 is waited for and its
//!         y_def(l−1) f32 [T, H] uploaded and added into x (after resident(l) on the
//!         stream); the pool computes l's other CPU pairs on this thread (added as without
//!         deferral), then the job of l (its deferred pairs) starts on the helper thread
//!   the stage's last layer: its job is waited for and added before the stage ends
//!         (`MoePlacement::layers_done`), so the final norm / the next stage sees every
//!         expert's output.
//! The result is not the exact forward pass (layer l+1 reads x without layer l's CPU
//! experts); `bench/defer_quality.py` measures top-1 agreement and perplexity against it.
//!
//! One job is in flight at a time (the pool runs one call at a time): its buffers travel to
//! the helper thread and back through two one-place channels, so a step allocates nothing.
//! Both ends poll their channel for `SPIN` before they block on it: a futex wake-up on each
//! hand-off (tens of µs) is of the order of what the overlap saves per layer.

use crate::error::{Error, Result};
use crate::model::weights::Weights;
use crate::model::Compute;
use crate::pool::SKIP;
use crate::tier::vram::{cpu_misses, LayerSplit};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long either end polls for the other's hand-off before it blocks: longer than a layer's
/// GPU part, so within a step neither sleeps.
const SPIN: Duration = Duration::from_millis(2);

/// The next message: polled for `SPIN`, then waited for; None when the sender is gone.
fn recv_spinning<T>(rx: &Receiver<T>) -> Option<T> {
    let t0 = Instant::now();
    loop {
        match rx.try_recv() {
            Ok(v) => return Some(v),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) if t0.elapsed() < SPIN => std::hint::spin_loop(),
            Err(TryRecvError::Empty) => return rx.recv().ok(),
        }
    }
}

/// One layer's CPU misses: inputs filled by the loop's thread, `y` by the helper.
pub(super) struct DeferJob {
    pub layer: usize,
    /// f32 [T, H]: the layer's normed FFN input.
    pub h: Vec<f32>,
    /// f32 [T, K]: the routing weights.
    pub wts: Vec<f32>,
    /// The CPU's pairs (`cpu_ids` [T, K], SKIP where the GPU computes the pair).
    pub split: LayerSplit,
    /// f32 [T, H]: Σ over the CPU's pairs of w·expert(h).
    pub y: Vec<f32>,
    result: Result<()>,
}

/// The helper thread and the job's buffers (here when no job is in flight).
pub(super) struct Deferrer {
    to_helper: Option<SyncSender<Box<DeferJob>>>,
    from_helper: Receiver<Box<DeferJob>>,
    idle: Option<Box<DeferJob>>,
    helper: Option<JoinHandle<()>>,
}

impl Deferrer {
    /// A helper thread computing jobs through `compute` on `weights`' experts; buffers for
    /// chunks of `t` tokens of hidden size `hd` and `k` experts per token.
    pub fn new(
        compute: Arc<dyn Compute>,
        weights: Arc<Weights>,
        t: usize,
        hd: usize,
        k: usize,
    ) -> Result<Deferrer> {
        let (to_helper, jobs) = sync_channel::<Box<DeferJob>>(1);
        let (done, from_helper) = sync_channel::<Box<DeferJob>>(1);
        let helper = std::thread::Builder::new()
            .name("strata-defer".into())
            .spawn(move || {
                while let Some(mut job) = recv_spinning(&jobs) {
                    let t = job.h.len() / hd.max(1);
                    let layer = weights.expert_layer(job.layer);
                    let j = &mut *job;
                    j.result = cpu_misses(
                        &*compute,
                        &layer,
                        &j.h,
                        &j.split,
                        &j.wts,
                        k,
                        &mut j.y[..t * hd],
                    );
                    if done.send(job).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| Error::Config(format!("defer_experts: no helper thread: {e}")))?;
        let mut split = LayerSplit::default();
        split.cpu_ids.reserve(t * k);
        Ok(Deferrer {
            to_helper: Some(to_helper),
            from_helper,
            idle: Some(Box::new(DeferJob {
                layer: 0,
                h: Vec::with_capacity(t * hd),
                wts: Vec::with_capacity(t * k),
                split,
                y: vec![0f32; t * hd],
                result: Ok(()),
            })),
            helper: Some(helper),
        })
    }

    /// The job's buffers to fill (None while one is in flight).
    pub fn job(&mut self) -> Option<&mut DeferJob> {
        self.idle.as_deref_mut()
    }

    /// Hands the filled job to the helper.
    pub fn start(&mut self) -> Result<()> {
        let job = self
            .idle
            .take()
            .ok_or_else(|| Error::Config("defer_experts: a job is already in flight".into()))?;
        let tx = self.to_helper.as_ref().ok_or_else(gone)?;
        tx.send(job).map_err(|_| gone())
    }

    /// Waits for the job in flight (None: none was); its result is the pool's.
    pub fn wait(&mut self) -> Result<Option<&DeferJob>> {
        if self.idle.is_none() {
            let mut job = recv_spinning(&self.from_helper).ok_or_else(gone)?;
            let r = std::mem::replace(&mut job.result, Ok(()));
            self.idle = Some(job);
            r?;
            return Ok(self.idle.as_deref());
        }
        Ok(None)
    }
}

/// Moves each token's `n` lowest-weight CPU pairs (ties: the earlier slot first) out of
/// `ids` u32 [T, K] (the CPU's pairs; SKIP elsewhere) into `out` u32 [T, K] (SKIP
/// elsewhere), by the routing weights `wts` f32 [T, K]; the number moved.
pub(super) fn split_deferred(
    ids: &mut [u32],
    wts: &[f32],
    k: usize,
    n: usize,
    out: &mut Vec<u32>,
) -> usize {
    out.clear();
    out.resize(ids.len(), SKIP);
    let mut moved = 0;
    for (t, row) in ids.chunks_exact_mut(k).enumerate() {
        for _ in 0..n {
            let pick = (0..k)
                .filter(|&j| row[j] != SKIP)
                .min_by(|&a, &b| wts[t * k + a].total_cmp(&wts[t * k + b]).then(a.cmp(&b)));
            let Some(j) = pick else { break };
            out[t * k + j] = std::mem::replace(&mut row[j], SKIP);
            moved += 1;
        }
    }
    moved
}

fn gone() -> Error {
    Error::Config("defer_experts: the helper thread has ended".into())
}

impl Drop for Deferrer {
    fn drop(&mut self) {
        // a job in flight finishes first (its buffers come back), then the helper ends
        let _ = self.wait();
        self.to_helper = None;
        if let Some(h) = self.helper.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_defers_each_tokens_lowest_weight_cpu_pairs() {
        const S: u32 = SKIP;
        // two tokens, top-4; token 0: CPU pairs at slots 0, 2, 3; token 1: at 1, 3 (equal
        // weights: the earlier slot goes first)
        let ids0 = [7, S, 5, 2, S, 4, S, 6];
        let wts = [0.1, 0.4, 0.3, 0.2, 0.5, 0.25, 0.0, 0.25];
        let cases: [(usize, [u32; 8], [u32; 8], usize); 4] = [
            (0, ids0, [S; 8], 0),
            (1, [S, S, 5, 2, S, S, S, 6], [7, S, S, S, S, 4, S, S], 2),
            (2, [S, S, 5, S, S, S, S, S], [7, S, S, 2, S, 4, S, 6], 4),
            (9, [S; 8], ids0, 5),
        ];
        for (n, keep, moved, count) in cases {
            let mut ids = ids0;
            let mut out = vec![1u32; 3]; // cleared and sized by the call
            assert_eq!(
                split_deferred(&mut ids, &wts, 4, n, &mut out),
                count,
                "n={n}"
            );
            assert_eq!(ids, keep, "n={n}");
            assert_eq!(out, moved, "n={n}");
        }
    }
}
