//! Model check of the pool's protocol with loom: `protocol.rs` is compiled a second time here
//! against loom's atomics, park/unpark and cells, and run by a host plus workers over two
//! consecutive calls whose second tile depends on the first (as a Down tile depends on its
//! expert's Gate/Up tiles). Loom explores the interleavings and fails on a data race (a tile's
//! cell touched by a late worker of the previous call, or read before its producer
//! released it), a lost wake-up (deadlock: every thread parked or waiting), or a tile run
//! twice or never.

mod atomics {
    pub use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

    pub fn spin_hint() {
        loom::hint::spin_loop();
    }

    pub fn yield_now() {
        loom::thread::yield_now();
    }

    /// Park at once (the spin phase only multiplies interleavings of the same loads).
    pub struct SpinClock;

    impl SpinClock {
        pub fn expired(&mut self) -> bool {
            true
        }
        pub fn reset(&mut self) {}
    }
}

// The same source as `super::protocol`, on purpose: that is what gets model-checked.
#[path = "protocol.rs"]
#[allow(dead_code, clippy::duplicate_mod)]
mod protocol;

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU32, Ordering};
use loom::sync::Arc;
use protocol::{wait_at_least, Protocol};

const TILES: usize = 2;

struct World {
    proto: Protocol,
    /// Tile outputs of the live call (written by exactly one claimer).
    cells: [UnsafeCell<u32>; TILES],
    /// Completed tiles per phase: tile 1 waits for tile 0 (a dependency).
    first_done: AtomicU32,
    /// How many times each tile ran in the live call.
    runs: [AtomicU32; TILES],
}

/// Tile `i` of call `epoch`: tile 0 produces, tile 1 waits for it and consumes.
fn run_tile(w: &World, epoch: u32, i: u32) {
    w.runs[i as usize].fetch_add(1, Ordering::Relaxed);
    if i == 0 {
        w.cells[0].with_mut(|c| unsafe { *c = epoch * 10 });
        w.first_done.fetch_add(1, Ordering::Release);
    } else {
        wait_at_least(&w.first_done, 1);
        let v = w.cells[0].with(|c| unsafe { *c });
        assert_eq!(v, epoch * 10, "tile 1 read tile 0's output of another call");
        w.cells[1].with_mut(|c| unsafe { *c = v + 1 });
    }
    w.proto.retire();
}

fn drain(w: &World, epoch: u32) {
    while let Some(i) = w.proto.claim(epoch) {
        run_tile(w, epoch, i);
    }
}

fn worker(w: Arc<World>) {
    let mut seen = 0;
    let mut clock = atomics::SpinClock;
    while let Some(e) = w.proto.wait_new_epoch(seen, &mut clock, loom::thread::park) {
        seen = e;
        drain(&w, e);
    }
}

fn host(w: &World, threads: &[loom::thread::Thread], participate: bool, calls: u32) {
    for epoch in 1..=calls {
        // Between calls the host owns every cell and counter (the previous call retired).
        for c in &w.cells {
            c.with_mut(|c| unsafe { *c = 0 });
        }
        w.first_done.store(0, Ordering::Relaxed);
        for r in &w.runs {
            r.store(0, Ordering::Relaxed);
        }
        if w.proto.publish(epoch, TILES as u32) {
            for t in threads {
                t.unpark();
            }
        }
        if participate {
            drain(w, epoch);
        }
        w.proto.wait_retired(TILES as u32);
        for r in &w.runs {
            assert_eq!(r.load(Ordering::Relaxed), 1, "a tile ran other than once");
        }
        let out = w.cells[1].with(|c| unsafe { *c });
        assert_eq!(out, epoch * 10 + 1);
    }
    if w.proto.shut_down() {
        for t in threads {
            t.unpark();
        }
    }
}

fn model(workers: usize, participate: bool, calls: u32, preemptions: usize) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    b.max_branches = 20_000;
    b.check(move || {
        let w = Arc::new(World {
            proto: Protocol::new(),
            cells: [UnsafeCell::new(0), UnsafeCell::new(0)],
            first_done: AtomicU32::new(0),
            runs: [AtomicU32::new(0), AtomicU32::new(0)],
        });
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let w = w.clone();
                loom::thread::spawn(move || worker(w))
            })
            .collect();
        let threads: Vec<_> = handles.iter().map(|h| h.thread().clone()).collect();
        host(&w, &threads, participate, calls);
        for h in handles {
            h.join().unwrap();
        }
    });
}

/// Two calls: a worker that woke for call 1 but runs late must not touch call 2's tiles.
#[test]
fn loom_one_worker_and_participating_host_two_calls() {
    model(1, true, 2, 2);
}

#[test]
fn loom_one_worker_host_only_waits_two_calls() {
    model(1, false, 2, 3);
}

/// Two workers racing for claims (and the dependency wait) within one call.
#[test]
fn loom_two_workers_and_participating_host_one_call() {
    model(2, true, 1, 1);
}
