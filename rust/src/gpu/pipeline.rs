//! The stages of a step, in order, through the stage protocol (docs/PROTOCOL.md,
//! `tier::vram::Protocol`): each batched step is a window that is launched onto stage 0,
//! leaves each stage once the host has seen its work there complete, hops to the next stage
//! and enters it, and has its verdict after the last. A stage with no window on it is at a
//! **gap**: its tier makes its device calls then (the model calls its placement's
//! `after_step` right after `leave_stage` / `verdict`).
//!
//! The activation hop x f32 [T, H] from stage s to s + 1 is a `Hop` strategy: on one device a
//! device-to-device copy on the next stage's stream, ordered after the event `ready`
//! recorded on stage s's stream (`DeviceCopy`); across devices through page-locked host
//! memory (`ThroughHost`: device → host on stage s's stream, host → device on the next's).
//! With one stage there is no boundary: launch, then the verdict (today's single-GPU step).
//!
//! A window leaves stage s when the host has waited for `ready` (its last work there, the
//! hop's send included), so stage s is at a gap while the next stage computes. With
//! `pipeline_windows` = 2 the next window may then be launched onto stage 0 while this one is
//! on a later stage (`flight.rs`); before a window's hop into stage s (on stage 0: its
//! layers) rewrites stage s's x, stage s's stream waits for `taken` (the previous window's
//! hop out of it has run on the next stage's stream).
//!
//! Metrics per stage (`StageInfo`): host-seen time with a window on it (entered to left),
//! time a window waited between the previous stage and this one, device time of the hops
//! into it (a pair of timing events around the copy, read at the verdict: no extra wait).

use super::hybrid_cfg::StageInfo;
use super::launch::Launcher;
use super::stage::{HopKind, Stage};
use crate::cuda::{Event, PinnedBuf};
use crate::error::Result;
use crate::tier::vram::{GapTicket, Protocol, WindowId};
use std::time::Instant;

/// How the activations of a step go from one stage to the next.
pub(super) trait Hop: Send {
    /// Queued on the source stage's stream after its layers.
    fn send(&mut self, src: &Launcher, rows: usize) -> Result<()>;
    /// Queued on the destination stage's stream (which already waits for the source's
    /// `ready`): x [rows, H] of `src` into `dst`'s x.
    fn recv(&mut self, src: &Launcher, dst: &Launcher, rows: usize) -> Result<()>;
}

/// Bytes of x [rows, H] f32.
fn x_bytes(x: &Launcher, rows: usize) -> usize {
    4 * rows * x.hp.n_embd
}

/// Both stages on one device: a device-to-device copy on the destination's stream.
struct DeviceCopy;

impl Hop for DeviceCopy {
    fn send(&mut self, _src: &Launcher, _rows: usize) -> Result<()> {
        Ok(())
    }

    fn recv(&mut self, src: &Launcher, dst: &Launcher, rows: usize) -> Result<()> {
        dst.b
            .x
            .copy_from(&dst.stream, 0, &src.b.x, 0, x_bytes(src, rows))
    }
}

/// Two devices: through page-locked host memory (portable: both contexts copy from it).
struct ThroughHost {
    pin: PinnedBuf, // f32 [T, H]
}

impl Hop for ThroughHost {
    fn send(&mut self, src: &Launcher, rows: usize) -> Result<()> {
        let n = x_bytes(src, rows);
        src.b.x.read_async(&src.stream, 0, &mut self.pin, 0, n)
    }

    fn recv(&mut self, src: &Launcher, dst: &Launcher, rows: usize) -> Result<()> {
        let n = x_bytes(src, rows);
        dst.b.x.write_async(&dst.stream, 0, &self.pin, 0, n)
    }
}

/// The boundary between stage s and s + 1.
struct Boundary {
    hop: Box<dyn Hop>,
    /// Recorded on stage s's stream after its work and the hop's send.
    ready: Event,
    /// Recorded on stage s + 1's stream after the hop's receive: stage s's x may be rewritten.
    taken: Event,
    /// Timing events around the hop on stage s + 1's stream; `timed`: recorded and not read.
    t0: Event,
    t1: Event,
    timed: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct StageStats {
    compute_ns: u64,
    wait_ns: u64,
    copy_ms: f64,
    hop_bytes: u64,
    beside: u64,
}

pub(super) struct Pipeline {
    proto: Protocol,
    bounds: Vec<Boundary>,
    stats: Vec<StageStats>,
    /// When the window entered its current stage, or left the last one.
    since: Instant,
    max_in_flight: usize,
}

impl Pipeline {
    /// The protocol over `stages` (their devices) with at most `pipeline_windows` windows
    /// in flight, and the hop of each boundary (`hop`).
    pub(super) fn new(stages: &[Stage], pipeline_windows: usize, hop: HopKind) -> Result<Self> {
        let cards = stages.iter().map(|s| s.x.gpu.ordinal()).collect();
        let proto = Protocol::new(cards, pipeline_windows)?;
        let mut bounds = Vec::with_capacity(stages.len().saturating_sub(1));
        for w in stages.windows(2) {
            let (src, dst) = (&w[0].x, &w[1].x);
            let same = src.gpu.ordinal() == dst.gpu.ordinal();
            let hop: Box<dyn Hop> = if same && hop == HopKind::Auto {
                Box::new(DeviceCopy)
            } else {
                Box::new(ThroughHost {
                    pin: src.gpu.host_alloc(src.b.x.len())?,
                })
            };
            let taken = dst.gpu.event_no_timing()?;
            taken.record(&dst.stream)?; // recorded once, so the first launch's wait is defined
            bounds.push(Boundary {
                hop,
                ready: src.gpu.event_no_timing()?,
                taken,
                t0: dst.gpu.event()?,
                t1: dst.gpu.event()?,
                timed: false,
            });
        }
        Ok(Pipeline {
            proto,
            bounds,
            stats: vec![StageStats::default(); stages.len()],
            since: Instant::now(),
            max_in_flight: 0,
        })
    }

    fn n_stages(&self) -> usize {
        self.proto.n_stages()
    }

    /// Host time since the last mark, and a new mark.
    fn lap(&mut self) -> u64 {
        let now = Instant::now();
        let ns = (now - self.since).as_nanos() as u64;
        self.since = now;
        ns
    }

    /// Windows at most in flight (`pipeline_windows`).
    pub(super) fn max_windows(&self) -> usize {
        self.proto.pipeline_windows()
    }

    /// Whether a new window may be launched now (stage 0 free, fewer than
    /// `pipeline_windows` in flight).
    pub(super) fn can_launch(&self) -> bool {
        self.proto.can_launch()
    }

    /// Whether window `w` may enter stage `s` now.
    pub(super) fn can_enter(&self, w: WindowId, s: usize) -> bool {
        self.proto.can_enter(w, s)
    }

    /// After a failed step (its work may be half queued): every window is forgotten; their
    /// fences complete at the stages' next gaps, after the next window's work on the same
    /// streams.
    pub(super) fn abandon(&mut self) {
        self.proto.abandon();
        self.bounds.iter_mut().for_each(|b| b.timed = false);
    }

    /// A new window onto stage 0; its ticket is the fence of its part there. Stage 0's
    /// stream first waits until the previous window's hop out of it has run (`taken`).
    pub(super) fn launch(&mut self, first: &Launcher) -> Result<(WindowId, GapTicket)> {
        let (w, ticket) = self.proto.launch()?;
        if let Some(b) = self.bounds.first() {
            first.stream.wait(&b.taken)?;
        }
        self.max_in_flight = self.max_in_flight.max(self.proto.windows_in_flight());
        self.lap();
        Ok((w, ticket))
    }

    /// Window `w` leaves stage `s` (not the last; its layers queued on `src`): the hop's
    /// send is queued, the host waits for `ready`, and stage `s` is at a gap.
    pub(super) fn leave_stage(
        &mut self,
        w: WindowId,
        s: usize,
        src: &Launcher,
        rows: usize,
    ) -> Result<()> {
        let b = &mut self.bounds[s];
        b.hop.send(src, rows)?;
        b.ready.record(&src.stream)?;
        b.ready.sync()?;
        self.stats[s].compute_ns += self.lap();
        self.proto.leave(w, s)?;
        self.proto.gap(s)?;
        Ok(())
    }

    /// Window `w` enters stage `s` > 0: the hop from `src` (stage s - 1) into `dst` is
    /// queued on `dst`'s stream after the previous stage's `ready`, then `taken`. Returns the
    /// fence of its part on `s`.
    pub(super) fn enter_stage(
        &mut self,
        w: WindowId,
        s: usize,
        src: &Launcher,
        dst: &Launcher,
        rows: usize,
    ) -> Result<GapTicket> {
        let ticket = self.proto.enter(w, s)?;
        self.stats[s].wait_ns += self.lap();
        if let Some(out) = self.bounds.get(s) {
            // the hop rewrites stage s's x: after the previous window's hop out of it ran
            dst.stream.wait(&out.taken)?;
        }
        let b = &mut self.bounds[s - 1];
        dst.stream.wait(&b.ready)?;
        b.t0.record(&dst.stream)?;
        b.hop.recv(src, dst, rows)?;
        self.stats[s].hop_bytes += x_bytes(src, rows) as u64;
        b.t1.record(&dst.stream)?;
        b.taken.record(&dst.stream)?;
        b.timed = true;
        Ok(ticket)
    }

    /// Window `w`'s verdict (the last stage's logits were read: its work is complete): it
    /// leaves the last stage, and that stage is at a gap. The hops' device times are read
    /// (their events are complete). `finish` settles it.
    pub(super) fn verdict(&mut self, w: WindowId) -> Result<()> {
        let s = self.n_stages() - 1;
        self.stats[s].compute_ns += self.lap();
        self.proto.leave(w, s)?;
        self.proto.gap(s)?;
        for (i, b) in self.bounds.iter_mut().enumerate() {
            if std::mem::take(&mut b.timed) {
                self.stats[i + 1].copy_ms += f64::from(b.t0.elapsed_ms(&b.t1)?);
            }
        }
        Ok(())
    }

    /// Windows ran on stages `s` beside each other (their chains alternating on the host).
    pub(super) fn ran_beside(&mut self, s: &[usize]) {
        s.iter().for_each(|&s| self.stats[s].beside += 1);
    }

    /// Window `w` (past its verdict) is settled: accepted, or rejected, which discards every
    /// later window (one between stages is gone at once).
    pub(super) fn finish(&mut self, w: WindowId, accepted: bool) -> Result<()> {
        self.proto.finish(w, accepted)
    }

    /// Per stage: device, windows entered, gaps, whether a window is on it, the times and
    /// the windows in flight (layers and slots are the model's).
    pub(super) fn info(&self) -> Vec<StageInfo> {
        (0..self.n_stages())
            .map(|s| {
                let (c, st) = (self.proto.counts(s), &self.stats[s]);
                StageInfo {
                    device: self.proto.card(s),
                    windows: c.windows,
                    beside: st.beside,
                    gaps: c.gaps,
                    busy: !self.proto.at_gap(s),
                    compute_s: st.compute_ns as f64 * 1e-9,
                    waiting_s: st.wait_ns as f64 * 1e-9,
                    copying_s: st.copy_ms * 1e-3,
                    hop_bytes: st.hop_bytes,
                    windows_in_flight: self.proto.windows_in_flight(),
                    max_windows_in_flight: self.max_in_flight,
                    ..StageInfo::default()
                }
            })
            .collect()
    }
}
