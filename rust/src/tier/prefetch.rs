//! Read-ahead of mapped experts the model is about to use (`budget` and `mmap` modes).
//!
//! The forward pass predicts which experts the next layer will route to (its router applied
//! to the current hidden state, `model::forward`) and calls `prefetch(layer, ids)`: that only
//! queues `(layer, expert, generation)` into a bounded channel (`try_send`, never blocks; a
//! full queue drops the request and counts it). Prefetch threads fault the experts' pages in
//! (`Residency::prefault`), so the pool rarely waits on a cold page. Resident experts are
//! skipped at the call, and an expert is queued at most once per generation.
//!
//! Generations: the forward pass ends one (`end_step`) after each chunk. Queued requests of
//! an older generation are dropped by the threads unread (counted as `cancelled`): they were
//! for layers that have already run. `stop` cancels what is queued, waits for the reads in
//! flight and joins the threads.
//!
//! Accounting: `note_use(layer, expert)` is called once per distinct mapped expert a layer
//! uses. It is a `hit` when the read-ahead of this generation finished before the use, `late`
//! when it was queued but not finished (the pool then waits on the same pages), and a `miss`
//! when it was not queued (mispredicted, or dropped).

use super::residency::{Place, Residency};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

#[derive(Default)]
struct Counts {
    queued: AtomicU64,
    dropped: AtomicU64,
    cancelled: AtomicU64,
    done: AtomicU64,
    bytes: AtomicU64,
    hits: AtomicU64,
    late: AtomicU64,
    misses: AtomicU64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefetchStats {
    /// Experts queued for read-ahead.
    pub queued: u64,
    /// Requests dropped because the queue was full.
    pub dropped: u64,
    /// Queued requests skipped because their generation had ended.
    pub cancelled: u64,
    /// Experts faulted in by the prefetch threads.
    pub done: u64,
    /// Bytes the prefetch threads faulted in.
    pub bytes: u64,
    /// Mapped experts used after their read-ahead finished.
    pub hits: u64,
    /// Mapped experts used while their read-ahead was queued or running.
    pub late: u64,
    /// Mapped experts used without a read-ahead.
    pub misses: u64,
}

struct Shared {
    res: Arc<Residency>,
    counts: Counts,
    /// Current generation (starts at 1; 0 marks "never").
    generation: AtomicU64,
    /// `[layer][expert]`: generation in which it was last queued.
    queued_in: Box<[AtomicU64]>,
    /// `[layer][expert]`: generation in which its read-ahead last finished.
    done_in: Box<[AtomicU64]>,
}

impl Shared {
    fn index(&self, layer: usize, expert: usize) -> Option<usize> {
        let ne = self.res.layout().n_expert;
        (expert < ne)
            .then_some(layer * ne + expert)
            .filter(|&i| i < self.queued_in.len())
    }
}

pub struct Prefetcher {
    shared: Arc<Shared>,
    tx: Option<SyncSender<(u32, u32, u64)>>,
    threads: Vec<JoinHandle<()>>,
}

impl Prefetcher {
    /// `threads` ≥ 1 prefetch threads and a queue of `depth` experts.
    pub fn start(res: Arc<Residency>, threads: usize, depth: usize) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel::<(u32, u32, u64)>(depth.max(1));
        let rx = Arc::new(Mutex::new(rx));
        let cells = res.layout().n_layer() * res.layout().n_expert;
        let cell = |_| AtomicU64::new(0);
        let shared = Arc::new(Shared {
            res,
            counts: Counts::default(),
            generation: AtomicU64::new(1),
            queued_in: (0..cells).map(cell).collect(),
            done_in: (0..cells).map(cell).collect(),
        });
        let mut p = Prefetcher {
            shared,
            tx: Some(tx),
            threads: Vec::new(),
        };
        for i in 0..threads.max(1) {
            let (rx, sh) = (rx.clone(), p.shared.clone());
            // On a spawn error `p` is dropped, which stops the threads already started.
            p.threads.push(
                std::thread::Builder::new()
                    .name(format!("strata-prefetch-{i}"))
                    .spawn(move || run(&rx, &sh))?,
            );
        }
        Ok(p)
    }

    /// Queue the mapped experts among `ids` of `layer` that are not queued yet in this
    /// generation. Never blocks. Returns how many were queued.
    pub fn prefetch(&self, layer: usize, ids: &[u32]) -> usize {
        let Some(tx) = &self.tx else { return 0 };
        let sh = &*self.shared;
        let g = sh.generation.load(Ordering::Acquire);
        let mut n = 0;
        for &e in ids {
            let Some(i) = sh.index(layer, e as usize) else {
                continue;
            };
            if sh.res.place(layer, e as usize) != Some(Place::Mapped)
                || sh.queued_in[i].swap(g, Ordering::AcqRel) == g
            {
                continue;
            }
            match tx.try_send((layer as u32, e, g)) {
                Ok(()) => {
                    sh.counts.queued.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                    sh.queued_in[i].store(0, Ordering::Release);
                    sh.counts.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        n
    }

    /// Count one use of `expert` of `layer` (once per distinct expert per layer and chunk);
    /// resident experts are not counted. Returns whether it was a mapped expert not queued in
    /// this generation (a miss).
    pub fn note_use(&self, layer: usize, expert: usize) -> bool {
        let sh = &*self.shared;
        let Some(i) = sh.index(layer, expert) else {
            return false;
        };
        if sh.res.place(layer, expert) != Some(Place::Mapped) {
            return false;
        }
        let g = sh.generation.load(Ordering::Acquire);
        let c = &sh.counts;
        if sh.done_in[i].load(Ordering::Acquire) == g {
            c.hits.fetch_add(1, Ordering::Relaxed);
            false
        } else if sh.queued_in[i].load(Ordering::Acquire) == g {
            c.late.fetch_add(1, Ordering::Relaxed);
            false
        } else {
            c.misses.fetch_add(1, Ordering::Relaxed);
            true
        }
    }

    /// End the generation: requests still queued are skipped (their layers have run).
    pub fn end_step(&self) {
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
    }

    pub fn stats(&self) -> PrefetchStats {
        let c = &self.shared.counts;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PrefetchStats {
            queued: r(&c.queued),
            dropped: r(&c.dropped),
            cancelled: r(&c.cancelled),
            done: r(&c.done),
            bytes: r(&c.bytes),
            hits: r(&c.hits),
            late: r(&c.late),
            misses: r(&c.misses),
        }
    }

    /// Cancel what is queued, wait for the reads in flight and stop the threads.
    pub fn stop(&mut self) {
        self.end_step();
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// Finish every queued read (none cancelled), then stop the threads.
    pub fn drain(&mut self) {
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

fn run(rx: &Mutex<Receiver<(u32, u32, u64)>>, sh: &Shared) {
    loop {
        // The lock is held only by idle prefetch threads waiting for work, never by the caller.
        let msg = match rx.lock() {
            Ok(r) => r.recv(),
            Err(_) => return,
        };
        let Ok((l, e, g)) = msg else { return };
        let c = &sh.counts;
        if g != sh.generation.load(Ordering::Acquire) {
            c.cancelled.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let b = sh.res.prefault(l, e);
        if let Some(i) = sh.index(l as usize, e as usize) {
            sh.done_in[i].store(g, Ordering::Release);
        }
        c.done.fetch_add(1, Ordering::Relaxed);
        c.bytes.fetch_add(b, Ordering::Relaxed);
    }
}
