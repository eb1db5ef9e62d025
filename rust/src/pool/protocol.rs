//! The pool's synchronization protocol, free of any arithmetic: call publication, tile claims,
//! phase counters, retirement, and spin-then-park of idle workers. It is written against the
//! names in `super::atomics`, so `loom_check.rs` compiles this very file against loom and
//! model-checks it in `cargo test`.
//!
//! - `claim` packs `epoch:32 | total:16 | next:16` into one word on its own cache line. A call
//!   is published by storing `(epoch, total, 0)`; a tile is claimed by a CAS that succeeds only
//!   for the epoch the worker woke for, so a late worker can never take a tile of a later call.
//! - Every claimed tile ends with `retire()`; the host's call returns only when `retired ==
//!   total`, so every write (outputs and counters) of the call happens-before the return and
//!   before the next call's resets.
//! - Phase counters (`phase_done`) and per-job counters live in the plan; waiting on them is
//!   `wait_at_least` (spin, then yield).
//! - Idle workers spin on `claim` (loads only), then announce themselves in `sleepers` and park.
//!   Publication is a store, a SeqCst fence, then a load of `sleepers`; a parking worker does
//!   the mirror image (increment, fence, load of the claim word). The fences are totally
//!   ordered, so either the worker sees the new epoch or the host sees the sleeper and unparks
//!   it (a park after an unpark returns at once): no lost wake-up.

use super::atomics::{
    fence, spin_hint, yield_now, AtomicBool, AtomicU32, AtomicU64, Ordering, SpinClock,
};

/// Largest number of tiles one call can have (the `total` field is 16 bits).
pub const MAX_TILES: u32 = u16::MAX as u32;

/// A value alone on its cache line (128 bytes: adjacent-line prefetch pairs lines on x86).
#[repr(align(128))]
pub struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

#[inline]
fn pack(epoch: u32, total: u32, next: u32) -> u64 {
    ((epoch as u64) << 32) | ((total as u64) << 16) | next as u64
}

#[inline]
fn epoch_of(w: u64) -> u32 {
    (w >> 32) as u32
}

pub struct Protocol {
    claim: Padded<AtomicU64>,
    retired: Padded<AtomicU32>,
    sleepers: Padded<AtomicU32>,
    shutdown: Padded<AtomicBool>,
}

impl Default for Protocol {
    fn default() -> Self {
        Self::new()
    }
}

impl Protocol {
    pub fn new() -> Self {
        Protocol {
            claim: Padded(AtomicU64::new(0)),
            retired: Padded(AtomicU32::new(0)),
            sleepers: Padded(AtomicU32::new(0)),
            shutdown: Padded(AtomicBool::new(false)),
        }
    }

    /// Host: start call `epoch` (never 0, never the previous one) with `total` tiles. The plan
    /// and every per-call counter must be written before this. Returns whether some worker
    /// may be parked (then the caller unparks the workers).
    pub fn publish(&self, epoch: u32, total: u32) -> bool {
        debug_assert!(total <= MAX_TILES);
        self.retired.store(0, Ordering::Relaxed);
        self.claim.store(pack(epoch, total, 0), Ordering::Release);
        fence(Ordering::SeqCst);
        self.sleepers.load(Ordering::Relaxed) > 0
    }

    /// Claim the next tile of call `epoch`; `None` once the call has no unclaimed tile or a
    /// later call has been published.
    #[inline]
    pub fn claim(&self, epoch: u32) -> Option<u32> {
        let mut w = self.claim.load(Ordering::Acquire);
        loop {
            let total = ((w >> 16) & 0xffff) as u32;
            let next = (w & 0xffff) as u32;
            if epoch_of(w) != epoch || next >= total {
                return None;
            }
            match self
                .claim
                .compare_exchange_weak(w, w + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(next),
                Err(cur) => w = cur,
            }
        }
    }

    /// The claimer of a tile has finished every write of it.
    #[inline]
    pub fn retire(&self) {
        self.retired.fetch_add(1, Ordering::Release);
    }

    /// Host: wait until all `total` tiles of the current call are retired.
    pub fn wait_retired(&self, total: u32) {
        wait_at_least(&self.retired, total);
    }

    /// Worker: wait for a call newer than `seen`; `None` on shutdown. Spins while `clock`
    /// allows, then parks with `park` (a spurious return is harmless).
    pub fn wait_new_epoch(&self, seen: u32, clock: &mut SpinClock, park: impl Fn()) -> Option<u32> {
        clock.reset();
        loop {
            if self.shutdown.load(Ordering::Acquire) {
                return None;
            }
            let e = epoch_of(self.claim.load(Ordering::Acquire));
            if e != seen {
                return Some(e);
            }
            if clock.expired() {
                self.sleepers.fetch_add(1, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                let e = epoch_of(self.claim.load(Ordering::Acquire));
                if e == seen && !self.shutdown.load(Ordering::Acquire) {
                    park();
                }
                self.sleepers.fetch_sub(1, Ordering::Relaxed);
                clock.reset();
            } else {
                spin_hint();
            }
        }
    }

    /// Host (on drop): ask the workers to exit. Returns whether some may be parked.
    pub fn shut_down(&self) -> bool {
        self.shutdown.store(true, Ordering::Release);
        fence(Ordering::SeqCst);
        self.sleepers.load(Ordering::Relaxed) > 0
    }
}

/// Spin until `c >= n` (Acquire), yielding the CPU after a while so a descheduled producer can
/// run on an oversubscribed machine.
#[inline]
pub fn wait_at_least(c: &AtomicU32, n: u32) {
    let mut spins = 0u32;
    while c.load(Ordering::Acquire) < n {
        spins = spins.wrapping_add(1);
        if spins < 4096 {
            spin_hint();
        } else {
            yield_now();
        }
    }
}

/// Spin until `c == 0` (Acquire): a job counter reaching zero means its input is ready.
#[inline]
pub fn wait_zero(c: &AtomicU32) {
    let mut spins = 0u32;
    while c.load(Ordering::Acquire) != 0 {
        spins = spins.wrapping_add(1);
        if spins < 4096 {
            spin_hint();
        } else {
            yield_now();
        }
    }
}
