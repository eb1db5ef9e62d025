//! Parallel fill threads: copy planned experts into the arena (`resident`, `budget`) or fault
//! them into the page cache (`mmap`), hottest first, with progress and cancellation.
//!
//! Work is claimed one expert at a time from an atomic index into the order, so the order is
//! kept within the thread count. Cancellation is checked between experts: an expert is either
//! fully copied and published or untouched, so a cancelled fill leaves a consistent table.

use super::residency::{RamMode, Residency};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FillKind {
    /// Copy into the arena.
    Copy,
    /// Fault the map's pages in (page cache).
    Prefault,
}

#[derive(Clone, Copy, Debug)]
pub struct FillOptions {
    /// Fill threads (≥ 1).
    pub threads: usize,
    /// Bytes per second across all threads; 0 = as fast as the disk goes. Keeps a background
    /// fill from starving a serving process of I/O.
    pub max_bytes_per_s: u64,
    /// In `mmap` mode, at most this many bytes of the order (hottest first) are prefaulted;
    /// 0 = all. Ignored when copying (the plan already fits the budget).
    pub limit_bytes: u64,
}

impl Default for FillOptions {
    fn default() -> Self {
        FillOptions {
            threads: 4,
            max_bytes_per_s: 0,
            limit_bytes: 0,
        }
    }
}

/// Shared between the fill threads and whoever polls progress.
pub struct FillState {
    pub kind: FillKind,
    pub total_bytes: u64,
    pub total_experts: usize,
    done_bytes: AtomicU64,
    done_experts: AtomicUsize,
    next: AtomicUsize,
    cancel: AtomicBool,
    running: AtomicUsize,
    started: Instant,
    elapsed_ns: AtomicU64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FillProgress {
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub done_experts: usize,
    pub total_experts: usize,
    pub finished: bool,
    pub cancelled: bool,
    /// Seconds since the start (frozen at the end).
    pub seconds: f64,
}

impl FillState {
    pub fn progress(&self) -> FillProgress {
        let running = self.running.load(Ordering::Acquire);
        let seconds = if running == 0 {
            self.elapsed_ns.load(Ordering::Acquire) as f64 * 1e-9
        } else {
            self.started.elapsed().as_secs_f64()
        };
        FillProgress {
            done_bytes: self.done_bytes.load(Ordering::Acquire),
            total_bytes: self.total_bytes,
            done_experts: self.done_experts.load(Ordering::Acquire),
            total_experts: self.total_experts,
            finished: running == 0,
            cancelled: self.cancel.load(Ordering::Acquire),
            seconds,
        }
    }
}

/// A running fill. Dropping it cancels the fill and waits for its threads.
pub struct Fill {
    state: Arc<FillState>,
    threads: Vec<JoinHandle<()>>,
}

impl Fill {
    pub fn state(&self) -> &Arc<FillState> {
        &self.state
    }

    pub fn progress(&self) -> FillProgress {
        self.state.progress()
    }

    /// Stop after the experts in flight; the table stays consistent.
    pub fn cancel(&self) {
        self.state.cancel.store(true, Ordering::Release);
    }

    pub fn is_finished(&self) -> bool {
        self.state.running.load(Ordering::Acquire) == 0
    }

    /// Wait for the threads; returns the final progress.
    pub fn wait(mut self) -> FillProgress {
        self.join();
        self.state.progress()
    }

    fn join(&mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Fill {
    fn drop(&mut self) {
        self.cancel();
        self.join();
    }
}

/// Clears `Residency::filling` when the last fill thread exits.
struct Finish {
    res: Arc<Residency>,
    state: Arc<FillState>,
}

impl Drop for Finish {
    fn drop(&mut self) {
        if self.state.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            let ns = self.state.started.elapsed().as_nanos() as u64;
            self.state.elapsed_ns.store(ns, Ordering::Release);
            self.res.filling.store(false, Ordering::Release);
        }
    }
}

/// Start filling: arena copies for `resident`/`budget`, page-cache prefault for `mmap`.
/// One fill at a time per table (`Error::Config` otherwise).
pub fn start(res: &Arc<Residency>, opts: FillOptions) -> Result<Fill> {
    if opts.threads == 0 || opts.threads > 1024 {
        return Err(Error::Config(format!(
            "fill threads must be in 1..=1024 (got {})",
            opts.threads
        )));
    }
    if res
        .filling
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Err(Error::Config(
            "a fill is already running on this table".into(),
        ));
    }
    let layout = res.layout();
    let (kind, items): (FillKind, Vec<(u32, u32, u64)>) = match res.mode() {
        RamMode::Mmap => {
            let mut v = Vec::new();
            let mut sum = 0u64;
            for &(l, e) in res.order() {
                let b = layout.expert_bytes(l as usize) as u64;
                if opts.limit_bytes > 0 && sum + b > opts.limit_bytes {
                    break;
                }
                sum += b;
                v.push((l, e, 0));
            }
            (FillKind::Prefault, v)
        }
        RamMode::Resident | RamMode::Budget(_) => (
            FillKind::Copy,
            res.plan()
                .iter()
                .copied()
                .filter(|&(l, e, _)| {
                    matches!(
                        res.place(l as usize, e as usize),
                        Some(super::residency::Place::Mapped)
                    )
                })
                .collect(),
        ),
    };
    let total_bytes = items
        .iter()
        .map(|&(l, _, _)| layout.expert_bytes(l as usize) as u64)
        .sum();
    let n_threads = opts.threads.min(items.len().max(1));
    let state = Arc::new(FillState {
        kind,
        total_bytes,
        total_experts: items.len(),
        done_bytes: AtomicU64::new(0),
        done_experts: AtomicUsize::new(0),
        next: AtomicUsize::new(0),
        cancel: AtomicBool::new(false),
        running: AtomicUsize::new(n_threads),
        started: Instant::now(),
        elapsed_ns: AtomicU64::new(0),
    });
    let items = Arc::new(items);
    let mut threads = Vec::with_capacity(n_threads);
    for i in 0..n_threads {
        let finish = Finish {
            res: res.clone(),
            state: state.clone(),
        };
        let items = items.clone();
        let rate = opts.max_bytes_per_s;
        let spawned = std::thread::Builder::new()
            .name(format!("strata-fill-{i}"))
            .spawn(move || worker(finish, &items, rate));
        match spawned {
            Ok(h) => threads.push(h),
            Err(e) => {
                // The closure (and its Finish) was dropped, so `running` already counts down.
                state.cancel.store(true, Ordering::Release);
                // Count down for the threads that will never start.
                for _ in i + 1..n_threads {
                    drop(Finish {
                        res: res.clone(),
                        state: state.clone(),
                    });
                }
                drop(Fill { state, threads });
                return Err(Error::Io {
                    path: "fill thread".into(),
                    source: e,
                });
            }
        }
    }
    Ok(Fill { state, threads })
}

fn worker(f: Finish, items: &[(u32, u32, u64)], max_bytes_per_s: u64) {
    let (res, st) = (&f.res, &f.state);
    loop {
        if st.cancel.load(Ordering::Acquire) {
            return;
        }
        let i = st.next.fetch_add(1, Ordering::Relaxed);
        let Some(&(l, e, off)) = items.get(i) else {
            return;
        };
        let bytes = res.layout().expert_bytes(l as usize) as u64;
        match st.kind {
            FillKind::Copy => {
                res.copy_in(l, e, off);
            }
            FillKind::Prefault => {
                res.prefault(l, e);
            }
        }
        let done = st.done_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes;
        st.done_experts.fetch_add(1, Ordering::AcqRel);
        if max_bytes_per_s > 0 {
            throttle(st, done, max_bytes_per_s);
        }
    }
}

/// Sleep (in short slices that watch for cancellation) until `done` bytes are within the rate.
fn throttle(st: &FillState, done: u64, rate: u64) {
    let due = Duration::from_secs_f64(done as f64 / rate as f64);
    loop {
        let now = st.started.elapsed();
        if now >= due || st.cancel.load(Ordering::Acquire) {
            return;
        }
        std::thread::sleep((due - now).min(Duration::from_millis(5)));
    }
}
