//! Read-ahead of mapped experts the model is about to use (`budget` and `mmap` modes).
//!
//! `prefetch(layer, ids)` is called on the per-token path: it only queues `(layer, expert)`
//! pairs into a bounded channel (`try_send`, never blocks; a full queue drops the request and
//! counts it). Prefetch threads fault the experts' pages in, so the pool rarely waits on a
//! cold page. Resident experts are skipped at the call.

use super::residency::{Place, Residency};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

#[derive(Default)]
struct Counts {
    queued: AtomicU64,
    dropped: AtomicU64,
    done: AtomicU64,
    bytes: AtomicU64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefetchStats {
    /// Experts queued for read-ahead.
    pub queued: u64,
    /// Requests dropped because the queue was full.
    pub dropped: u64,
    /// Experts faulted in by the prefetch threads.
    pub done: u64,
    pub bytes: u64,
}

pub struct Prefetcher {
    res: Arc<Residency>,
    tx: Option<SyncSender<(u32, u32)>>,
    threads: Vec<JoinHandle<()>>,
    counts: Arc<Counts>,
}

impl Prefetcher {
    /// `threads` ≥ 1 prefetch threads and a queue of `depth` experts.
    pub fn start(res: Arc<Residency>, threads: usize, depth: usize) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel::<(u32, u32)>(depth.max(1));
        let rx = Arc::new(Mutex::new(rx));
        let counts = Arc::new(Counts::default());
        let mut hs = Vec::new();
        for i in 0..threads.max(1) {
            let (rx, res, counts) = (rx.clone(), res.clone(), counts.clone());
            hs.push(
                std::thread::Builder::new()
                    .name(format!("strata-prefetch-{i}"))
                    .spawn(move || run(&rx, &res, &counts))?,
            );
        }
        Ok(Prefetcher {
            res,
            tx: Some(tx),
            threads: hs,
            counts,
        })
    }

    /// Queue the mapped experts among `ids` of `layer` for read-ahead. Never blocks.
    pub fn prefetch(&self, layer: usize, ids: &[u32]) {
        let Some(tx) = &self.tx else { return };
        for &e in ids {
            if self.res.place(layer, e as usize) != Some(Place::Mapped) {
                continue;
            }
            match tx.try_send((layer as u32, e)) {
                Ok(()) => self.counts.queued.fetch_add(1, Ordering::Relaxed),
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                    self.counts.dropped.fetch_add(1, Ordering::Relaxed)
                }
            };
        }
    }

    pub fn stats(&self) -> PrefetchStats {
        let c = &self.counts;
        PrefetchStats {
            queued: c.queued.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            done: c.done.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
        }
    }

    /// Finish the queued work and stop the threads.
    pub fn stop(&mut self) {
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(rx: &Mutex<Receiver<(u32, u32)>>, res: &Residency, counts: &Counts) {
    loop {
        // The lock is held only by idle prefetch threads waiting for work, never by the caller.
        let msg = match rx.lock() {
            Ok(r) => r.recv(),
            Err(_) => return,
        };
        let Ok((l, e)) = msg else { return };
        let b = res.prefault(l, e);
        counts.done.fetch_add(1, Ordering::Relaxed);
        counts.bytes.fetch_add(b, Ordering::Relaxed);
    }
}
