//! The primitives `protocol.rs` is written against. This is the production set (std); the loom
//! check (`loom_check.rs`) compiles the same `protocol.rs` against loom's versions of these names.

pub use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

/// One busy-wait step.
#[inline]
pub fn spin_hint() {
    std::hint::spin_loop();
}

/// Let another thread run (the slow path of an in-call dependency wait).
#[inline]
pub fn yield_now() {
    std::thread::yield_now();
}

/// Decides when an idle worker stops spinning and parks: after `spin_us` microseconds of
/// spinning. The clock is read every 256 spins (vDSO, no syscall).
pub struct SpinClock {
    budget: std::time::Duration,
    start: Option<std::time::Instant>,
    spins: u32,
}

impl SpinClock {
    pub fn new(spin_us: u32) -> Self {
        SpinClock {
            budget: std::time::Duration::from_micros(spin_us as u64),
            start: None,
            spins: 0,
        }
    }

    /// Whether the spin budget is spent (the first call starts the clock).
    pub fn expired(&mut self) -> bool {
        self.spins = self.spins.wrapping_add(1);
        if !self.spins.is_multiple_of(256) {
            return false;
        }
        let now = std::time::Instant::now();
        match self.start {
            None => {
                self.start = Some(now);
                self.budget.is_zero()
            }
            Some(s) => now.duration_since(s) >= self.budget,
        }
    }

    pub fn reset(&mut self) {
        self.start = None;
        self.spins = 0;
    }
}
