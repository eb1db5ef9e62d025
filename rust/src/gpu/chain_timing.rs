//! The hybrid layer's GPU part timed on the device (a diagnostic, off by default): CUDA timing
//! events around the hand-off add of layer l and the attention, router and top-k of layer
//! l + 1, up to the routing's event the host waits for (`HybridCounters::record_chain`,
//! `tier::vram::stats::CHAIN`). Against the host's phases (`between`, `queue`, `wait`) it
//! splits the layer's GPU part into device time and host-side lag (launch calls, the wake-up).
//! Models opened while `set_chain_timing(true)` record three more events per timed layer.

use crate::cuda::{Event, Gpu, Stream};
use crate::error::Result;
use crate::tier::vram::HybridCounters;
use std::sync::atomic::{AtomicBool, Ordering};

static ON: AtomicBool = AtomicBool::new(false);

/// Whether hybrid models opened from now on time their layers' GPU part; returns the previous
/// setting.
pub fn set_chain_timing(on: bool) -> bool {
    ON.swap(on, Ordering::Relaxed)
}

pub(super) struct ChainTimer {
    start: Event,
    mid: Event,
    route: Event,
    /// `start` and `mid` are recorded around a hand-off add of this step, `route` not yet.
    armed: bool,
}

impl ChainTimer {
    /// A timer when the knob is on (None: off).
    pub(super) fn new(gpu: &Gpu) -> Result<Option<ChainTimer>> {
        if !ON.load(Ordering::Relaxed) {
            return Ok(None);
        }
        Ok(Some(ChainTimer {
            start: gpu.event()?,
            mid: gpu.event()?,
            route: gpu.event()?,
            armed: false,
        }))
    }

    /// A step begins: its first layer has no hand-off before it.
    pub(super) fn reset(&mut self) {
        self.armed = false;
    }

    /// Around the hand-off add queued on `s` (`add` queues it).
    pub(super) fn around_add(
        &mut self,
        s: &Stream,
        add: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        self.start.record(s)?;
        add()?;
        self.mid.record(s)?;
        self.armed = true;
        Ok(())
    }

    /// Just before the host's routing event is recorded on `s`.
    pub(super) fn at_route(&self, s: &Stream) -> Result<()> {
        if self.armed {
            self.route.record(s)?;
        }
        Ok(())
    }

    /// After the host saw the routing event: the timed layer's add and attention go to
    /// `counters`.
    pub(super) fn done(&mut self, counters: &HybridCounters) -> Result<()> {
        if !std::mem::take(&mut self.armed) {
            return Ok(());
        }
        self.route.sync()?; // done already (recorded before the host's event)
        let ns = |a: &Event, b: &Event| a.elapsed_ms(b).map(|ms| (f64::from(ms) * 1e6) as u64);
        counters.record_chain([ns(&self.start, &self.mid)?, ns(&self.mid, &self.route)?]);
        Ok(())
    }
}
