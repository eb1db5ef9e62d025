//! Seed 003's protocol between the stages' windows and the adaptive tier (docs/PROTOCOL.md):
//! which stage has a window in flight, when a stage is at a **gap**, and the two fences a gap
//! gives without any device event or host wait:
//!
//! - a step's fence (`GapTicket`): the step (a window's part on a stage) has completed once
//!   its stage has had a gap after it entered, because a gap is a moment the stage has no
//!   window in flight and a window leaves its stage only when the host has seen its last
//!   work there complete (the next stage's first wait, or the verdict's logits);
//! - a `RamFence`: RAM moves of a tier round wait for a gap, after the round's step 3, on
//!   every stage whose layers exchanged (a window planned before may still pull an incoming
//!   expert over PCIe from the RAM place its evicted one takes).
//!
//! ```text
//!   window:  launch ──▶ On(0) ──leave──▶ Between(0) ──enter──▶ On(1) … ──leave(last)──▶ Verdict
//!            finish(accepted = false) discards every later window: a discarded window leaves
//!            the stage it is on and never enters the next.
//!   stage s: Busy(w) while a window is on it; Idle otherwise. gap(s) only when Idle: the
//!            stage's epoch += 1 (tickets of its earlier windows complete) and every RamFence
//!            waiting for s stops waiting for it.
//! ```
//!
//! Pure host state: no device calls, no threads. The loop's thread owns it; the tier's job
//! thread never sees it (it does host work only: the choice, the bounce copies, the RAM
//! moves), and every device call of the tier is made by the loop's thread at a gap of the
//! stage it concerns (`at_gap`). The exhaustive interleaving check is `tests_protocol.rs`.

use super::fence::Fence;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub type WindowId = u64;

/// A step's fence on one stage: done once the stage has had a gap after the step entered.
/// Cloning shares the stage's epoch; `done` reads one atomic (no device call).
#[derive(Clone, Debug)]
pub struct GapTicket {
    epoch: Arc<AtomicU64>,
    entered_at: u64,
}

impl Fence for GapTicket {
    fn done(&self) -> Result<bool> {
        Ok(self.epoch.load(Ordering::Acquire) > self.entered_at)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowState {
    /// Its layers of this stage are being served.
    On(usize),
    /// It has left this stage and waits for the next one to be free.
    Between(usize),
    /// It has left the last stage: its verdict is ready.
    Verdict,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Window {
    id: WindowId,
    state: WindowState,
    /// A later window than a rejected one: leaves its stage and goes no further.
    discarded: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct RamWait {
    id: u64,
    /// Stages that still have to pass a gap.
    stages: Vec<usize>,
}

/// Per-stage counts (the metrics: windows entered, gaps).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageCounts {
    pub windows: u64,
    pub gaps: u64,
}

#[derive(Debug)]
pub struct Protocol {
    /// The device of each stage (a device may repeat: several stages on one card).
    stage_card: Vec<usize>,
    max_windows: usize,
    on_stage: Vec<Option<WindowId>>,
    /// Launched and not finished, in launch order.
    windows: Vec<Window>,
    next_window: WindowId,
    epochs: Vec<Arc<AtomicU64>>,
    ram_waits: Vec<RamWait>,
    ram_ready: Vec<u64>,
    next_fence: u64,
    counts: Vec<StageCounts>,
}

fn err<T>(m: String) -> Result<T> {
    Err(Error::Config(m))
}

impl Protocol {
    /// `stage_card[s]`: the device of stage `s`; `pipeline_windows`: windows in flight at
    /// most (1, or 2 with at least two stages).
    pub fn new(stage_card: Vec<usize>, pipeline_windows: usize) -> Result<Protocol> {
        let n = stage_card.len();
        if n == 0 {
            return err("the layer split has no stage".into());
        }
        if pipeline_windows == 0 || pipeline_windows > n.min(2) {
            return err(format!(
                "pipeline_windows {pipeline_windows} needs 1, or 2 with at least two stages \
                 (there are {n})"
            ));
        }
        Ok(Protocol {
            stage_card,
            max_windows: pipeline_windows,
            on_stage: vec![None; n],
            windows: Vec::new(),
            next_window: 0,
            epochs: (0..n).map(|_| Arc::new(AtomicU64::new(0))).collect(),
            ram_waits: Vec::new(),
            ram_ready: Vec::new(),
            next_fence: 0,
            counts: vec![StageCounts::default(); n],
        })
    }

    pub fn n_stages(&self) -> usize {
        self.stage_card.len()
    }

    pub fn card(&self, stage: usize) -> usize {
        self.stage_card[stage]
    }

    pub fn pipeline_windows(&self) -> usize {
        self.max_windows
    }

    /// Windows launched and not finished (discarded ones count until they have left).
    pub fn windows_in_flight(&self) -> usize {
        self.windows.len()
    }

    /// Windows launched and not finished, not discarded (the ones whose verdict counts).
    pub fn live_windows(&self) -> usize {
        self.windows.iter().filter(|w| !w.discarded).count()
    }

    pub fn window_state(&self, w: WindowId) -> Option<(WindowState, bool)> {
        self.windows
            .iter()
            .find(|x| x.id == w)
            .map(|x| (x.state, x.discarded))
    }

    /// The window on stage `s`, if any.
    pub fn on_stage(&self, s: usize) -> Option<WindowId> {
        self.on_stage[s]
    }

    /// Whether stage `s` is at a gap (no window on it): the tier's device calls for its
    /// slots may be made now, by the loop's thread.
    pub fn at_gap(&self, s: usize) -> bool {
        self.on_stage.get(s).is_some_and(Option::is_none)
    }

    pub fn counts(&self, s: usize) -> StageCounts {
        self.counts[s]
    }

    /// Whether a new window may be launched now.
    pub fn can_launch(&self) -> bool {
        self.windows.len() < self.max_windows && self.on_stage[0].is_none()
    }

    fn ticket(&self, s: usize) -> GapTicket {
        let epoch = self.epochs[s].clone();
        let entered_at = epoch.load(Ordering::Acquire);
        GapTicket { epoch, entered_at }
    }

    /// A new window onto stage 0; its ticket is the fence of its part there.
    pub fn launch(&mut self) -> Result<(WindowId, GapTicket)> {
        if !self.can_launch() {
            return err(format!(
                "no window can be launched: {} in flight of {}, stage 0 {}",
                self.windows.len(),
                self.max_windows,
                if self.on_stage[0].is_some() {
                    "busy"
                } else {
                    "free"
                }
            ));
        }
        let id = self.next_window;
        self.next_window += 1;
        self.windows.push(Window {
            id,
            state: WindowState::On(0),
            discarded: false,
        });
        self.on_stage[0] = Some(id);
        self.counts[0].windows += 1;
        Ok((id, self.ticket(0)))
    }

    fn index(&self, w: WindowId) -> Result<usize> {
        match self.windows.iter().position(|x| x.id == w) {
            Some(i) => Ok(i),
            None => err(format!("window {w} is not in flight")),
        }
    }

    /// Whether window `w` may enter stage `s` now (it waits between `s - 1` and `s`).
    pub fn can_enter(&self, w: WindowId, s: usize) -> bool {
        s > 0
            && s < self.n_stages()
            && self.on_stage[s].is_none()
            && self
                .windows
                .iter()
                .any(|x| x.id == w && !x.discarded && x.state == WindowState::Between(s - 1))
    }

    /// Window `w` onto stage `s` (its activations have hopped there).
    pub fn enter(&mut self, w: WindowId, s: usize) -> Result<GapTicket> {
        if !self.can_enter(w, s) {
            return err(format!("window {w} cannot enter stage {s} now"));
        }
        let i = self.index(w)?;
        self.windows[i].state = WindowState::On(s);
        self.on_stage[s] = Some(w);
        self.counts[s].windows += 1;
        Ok(self.ticket(s))
    }

    /// The host has seen window `w`'s last work on stage `s` complete. A discarded window is
    /// gone after this.
    pub fn leave(&mut self, w: WindowId, s: usize) -> Result<()> {
        let i = self.index(w)?;
        if self.windows[i].state != WindowState::On(s) {
            return err(format!("window {w} is not on stage {s}"));
        }
        self.on_stage[s] = None;
        if self.windows[i].discarded {
            self.windows.remove(i);
        } else if s + 1 == self.n_stages() {
            self.windows[i].state = WindowState::Verdict;
        } else {
            self.windows[i].state = WindowState::Between(s);
        }
        Ok(())
    }

    /// Window `w`'s verdict has been taken. Rejected (`accepted = false`): every later
    /// window is speculative on a wrong guess and is discarded (those between stages at
    /// once, those on a stage when they leave it).
    pub fn finish(&mut self, w: WindowId, accepted: bool) -> Result<()> {
        let i = self.index(w)?;
        if self.windows[i].state != WindowState::Verdict {
            return err(format!("window {w} has no verdict yet"));
        }
        self.windows.remove(i);
        if !accepted {
            self.windows.retain_mut(|x| {
                if x.id < w {
                    return true;
                }
                x.discarded = true;
                matches!(x.state, WindowState::On(_))
            });
        }
        Ok(())
    }

    /// After an error inside a window (its work may be half queued): forget every window.
    /// Their tickets complete at the stages' next gaps, which come after the next window's
    /// completion on the same streams.
    pub fn abandon(&mut self) {
        self.windows.clear();
        self.on_stage.iter_mut().for_each(|s| *s = None);
    }

    /// A gap on stage `s` (no window on it): earlier windows' tickets there complete, and
    /// RAM fences stop waiting for `s`. Returns the stage's new epoch.
    pub fn gap(&mut self, s: usize) -> Result<u64> {
        if !self.at_gap(s) {
            return err(format!("stage {s} has a window in flight: no gap"));
        }
        let e = self.epochs[s].fetch_add(1, Ordering::AcqRel) + 1;
        self.counts[s].gaps += 1;
        let ready = &mut self.ram_ready;
        self.ram_waits.retain_mut(|f| {
            f.stages.retain(|&x| x != s);
            if f.stages.is_empty() {
                ready.push(f.id);
            }
            !f.stages.is_empty()
        });
        Ok(e)
    }

    /// A tier round's step 3 (the host's RAM map has changed): its RAM moves wait for a gap
    /// on each of `stages` (those whose layers exchanged). Returns the fence's id;
    /// `take_ram_ready` lists it once every stage has passed a gap.
    pub fn ram_fence(&mut self, stages: &[usize]) -> Result<u64> {
        if let Some(&s) = stages.iter().find(|&&s| s >= self.n_stages()) {
            return err(format!("stage {s} is out of range"));
        }
        let id = self.next_fence;
        self.next_fence += 1;
        let mut st = stages.to_vec();
        st.sort_unstable();
        st.dedup();
        if st.is_empty() {
            self.ram_ready.push(id);
        } else {
            self.ram_waits.push(RamWait { id, stages: st });
        }
        Ok(id)
    }

    /// RAM fences whose stages have all passed a gap since (their moves may run now).
    pub fn take_ram_ready(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.ram_ready)
    }

    /// RAM fences still waiting.
    pub fn ram_waiting(&self) -> usize {
        self.ram_waits.len()
    }

    /// Whether a RAM fence waits for a gap of stage `s`.
    pub fn ram_waits_on(&self, s: usize) -> bool {
        self.ram_waits.iter().any(|f| f.stages.contains(&s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_refuses_what_its_states_forbid() {
        assert!(Protocol::new(vec![], 1).is_err());
        assert!(Protocol::new(vec![0], 2).is_err()); // two windows need two stages
        assert!(Protocol::new(vec![0, 0], 3).is_err());
        let mut p = Protocol::new(vec![0, 0], 2).unwrap();
        let (a, ta) = p.launch().unwrap();
        assert!(!p.can_launch() && p.launch().is_err()); // stage 0 busy
        assert!(p.gap(0).is_err() && p.at_gap(1));
        assert!(p.enter(a, 1).is_err()); // still on stage 0
        assert!(p.finish(a, true).is_err()); // no verdict yet
        p.leave(a, 0).unwrap();
        assert!(!ta.done().unwrap()); // no gap yet
        p.gap(0).unwrap();
        assert!(ta.done().unwrap());
        let tb = p.enter(a, 1).unwrap();
        let (b, _) = p.launch().unwrap(); // K+1 on stage 0 while K is on stage 1
        assert!(!p.can_launch()); // two windows in flight
        let f = p.ram_fence(&[0, 1]).unwrap();
        p.leave(a, 1).unwrap();
        p.gap(1).unwrap();
        assert!(tb.done().unwrap() && p.take_ram_ready().is_empty()); // stage 0 still busy
                                                                      // a rejected verdict discards the speculative window: it leaves stage 0 and stops
        p.finish(a, false).unwrap();
        assert_eq!(p.window_state(b), Some((WindowState::On(0), true)));
        assert_eq!(p.live_windows(), 0);
        p.leave(b, 0).unwrap();
        assert_eq!(p.windows_in_flight(), 0);
        assert!(p.enter(b, 1).is_err());
        p.gap(0).unwrap();
        assert_eq!(p.take_ram_ready(), vec![f]);
        assert_eq!((p.counts(0).windows, p.counts(0).gaps), (2, 2));
        assert_eq!((p.counts(1).windows, p.counts(1).gaps), (1, 1));
    }
}
