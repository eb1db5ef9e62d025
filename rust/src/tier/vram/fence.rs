//! The slot fence protocol: a slot is never overwritten while a step in flight may read it,
//! and never read before its copy has landed (docs/TIERS_VRAM.md).
//!
//! States of a slot:
//!
//! ```text
//!   Free ──retire──▶ Retiring{next, after} ──(every step < after done)──▶ Filling{next, ev}
//!   Ready(k) ──retire (unmap k)──▶ Retiring …           Filling ──(ev done)──▶ Ready(next) (map)
//! ```
//!
//! - Steps are numbered in launch order. A step reads the table (the pointer tables) when it is
//!   launched; `step_launched(ev)` registers its completion event.
//! - `retire(slot, next)` unmaps the slot's expert at once (steps launched from now on see a
//!   miss) and records `after` = the number of steps launched so far.
//! - The copy into the slot is issued only when every step numbered below `after` has
//!   completed (their events report done, in any order), so none of them can still read it.
//! - `next` is mapped only when the copy's own event reports done, so a step launched after
//!   the map reads complete bytes.
//!
//! Nothing here blocks: events are only queried (`Fence::done`, `cuEventQuery`), never waited
//! on. The copy itself is the `SlotIo`'s business (the real one: an async host→device copy on
//! the tier's own stream from a pinned staging buffer, then an event record).

use super::table::{Key, VramTable};
use crate::error::{Error, Result};
use std::collections::{BTreeSet, VecDeque};

/// A completion event that can be asked, without blocking, whether it has completed
/// (`cuEventQuery`). An error (a failed device) is passed up, never taken for "done".
pub trait Fence {
    fn done(&self) -> Result<bool>;
}

/// Issues slot copies. `P` is what the copy reads from (a staged pinned buffer in the async
/// tier, nothing when the io stages by itself); it comes back from `poll` once the copy is done.
pub trait SlotIo<P> {
    type Event: Fence;
    /// Start copying expert `key` into `slot`; must not block. The event completes when the
    /// slot's bytes are complete on the device.
    fn issue_fill(&mut self, slot: u32, key: Key, payload: &P) -> Result<Self::Event>;
}

#[derive(Debug)]
pub enum SlotState<E, P> {
    Free,
    Ready(Key),
    /// Waiting for every step launched before the retire (`seq < after`) to complete.
    Retiring {
        next: Key,
        after: u64,
        payload: P,
    },
    /// The copy is in flight.
    Filling {
        next: Key,
        ev: E,
        payload: P,
    },
}

/// What one `poll` did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PollOutcome {
    /// Copies issued.
    pub issued: usize,
    /// Slots that became Ready.
    pub filled: usize,
}

#[derive(Debug)]
pub struct SlotFences<E, P> {
    slots: Vec<SlotState<E, P>>,
    /// Steps in flight: (seq, completion event).
    in_flight: VecDeque<(u64, E)>,
    /// Steps launched so far (the next step's seq).
    launched: u64,
    /// Every step with seq < `done_below` has completed.
    done_below: u64,
    /// Completed steps ≥ `done_below` (out-of-order completion).
    done_above: BTreeSet<u64>,
    /// Table changes since the last `take_changes`: `(key, Some(slot))` published,
    /// `(key, None)` unpublished. The device pointer tables must get them (stream-ordered)
    /// before the next step is launched.
    changes: Vec<(Key, Option<u32>)>,
}

impl<E: Fence, P> SlotFences<E, P> {
    pub fn new(n_slots: usize) -> Self {
        SlotFences {
            slots: (0..n_slots).map(|_| SlotState::Free).collect(),
            in_flight: VecDeque::new(),
            launched: 0,
            done_below: 0,
            done_above: BTreeSet::new(),
            changes: Vec::new(),
        }
    }

    /// Drain the table changes made since the last call (apply them with `PtrTables::set`).
    pub fn take_changes(&mut self) -> Vec<(Key, Option<u32>)> {
        std::mem::take(&mut self.changes)
    }

    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    pub fn state(&self, slot: u32) -> Option<&SlotState<E, P>> {
        self.slots.get(slot as usize)
    }

    /// Steps launched and not yet seen complete.
    pub fn steps_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Steps launched so far.
    pub fn launched(&self) -> u64 {
        self.launched
    }

    /// Whether `key` is on its way into a slot (Retiring or Filling towards it).
    pub fn pending(&self, key: Key) -> bool {
        self.slots.iter().any(|s| match s {
            SlotState::Retiring { next, .. } | SlotState::Filling { next, .. } => *next == key,
            _ => false,
        })
    }

    /// Keys on their way in.
    pub fn pending_keys(&self) -> Vec<Key> {
        self.slots
            .iter()
            .filter_map(|s| match s {
                SlotState::Retiring { next, .. } | SlotState::Filling { next, .. } => Some(*next),
                _ => None,
            })
            .collect()
    }

    /// Slots that may be chosen as victims (Ready or Free): `(slot, key)`.
    pub fn evictable(&self) -> Vec<(u32, Option<Key>)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                SlotState::Free => Some((i as u32, None)),
                SlotState::Ready(k) => Some((i as u32, Some(*k))),
                _ => None,
            })
            .collect()
    }

    /// A step was launched (after reading the table); `ev` completes when it has finished.
    /// Returns its seq.
    pub fn step_launched(&mut self, ev: E) -> u64 {
        let s = self.launched;
        self.launched += 1;
        self.in_flight.push_back((s, ev));
        s
    }

    /// Start moving `next` into `slot`: the slot's expert (if any) is unmapped from `table`
    /// now, and the copy waits for the steps launched so far. `slot` must be Ready or Free and
    /// `next` neither resident nor pending.
    pub fn retire(
        &mut self,
        table: &mut VramTable,
        slot: u32,
        next: Key,
        payload: P,
    ) -> Result<Option<Key>> {
        if table.slot(next.0 as usize, next.1).is_some() || self.pending(next) {
            return Err(Error::Config(format!(
                "expert {next:?} is already resident or on its way"
            )));
        }
        let st = self
            .slots
            .get_mut(slot as usize)
            .ok_or_else(|| Error::Config(format!("slot {slot} is out of range")))?;
        let old = match st {
            SlotState::Free => None,
            SlotState::Ready(k) => Some(*k),
            _ => return Err(Error::Config(format!("slot {slot} is already changing"))),
        };
        let unmapped = table.unmap(slot);
        debug_assert_eq!(unmapped, old, "host table and slot states disagree");
        if let Some(k) = old {
            self.changes.push((k, None));
        }
        *st = SlotState::Retiring {
            next,
            after: self.launched,
            payload,
        };
        Ok(old)
    }

    /// Query step events (each at most once per poll, in any completion order) and advance
    /// the prefix of completed steps.
    fn collect_steps(&mut self) -> Result<()> {
        let mut i = 0;
        while i < self.in_flight.len() {
            if self.in_flight[i].1.done()? {
                let (s, _) = self.in_flight.remove(i).expect("index in range");
                self.done_above.insert(s);
            } else {
                i += 1;
            }
        }
        while self.done_above.remove(&self.done_below) {
            self.done_below += 1;
        }
        Ok(())
    }

    /// Advance every slot as far as it can go now, without blocking: issue the copies whose
    /// fence has passed, publish the copies that have landed. Published slots' payloads are
    /// handed to `recycle` (a staging buffer goes back to its pool). Call it between steps.
    pub fn poll<Io: SlotIo<P, Event = E>>(
        &mut self,
        table: &mut VramTable,
        io: &mut Io,
        mut recycle: impl FnMut(P),
    ) -> Result<PollOutcome> {
        self.collect_steps()?;
        let mut out = PollOutcome::default();
        for slot in 0..self.slots.len() {
            let st = &mut self.slots[slot];
            match st {
                SlotState::Retiring {
                    next,
                    after,
                    payload,
                } if *after <= self.done_below => {
                    let ev = io.issue_fill(slot as u32, *next, payload)?;
                    let old = std::mem::replace(st, SlotState::Free);
                    if let SlotState::Retiring { next, payload, .. } = old {
                        *st = SlotState::Filling { next, ev, payload };
                    }
                    out.issued += 1;
                }
                _ => {}
            }
            // A copy issued just now may already be done (a fake, or a tiny copy).
            if let SlotState::Filling { ev, .. } = st {
                if ev.done()? {
                    let old = std::mem::replace(st, SlotState::Free);
                    if let SlotState::Filling { next, payload, .. } = old {
                        table.map(next, slot as u32)?;
                        self.changes.push((next, Some(slot as u32)));
                        *st = SlotState::Ready(next);
                        recycle(payload);
                        out.filled += 1;
                    }
                }
            }
        }
        Ok(out)
    }

    /// Whether no slot is changing (every slot Free or Ready).
    pub fn settled(&self) -> bool {
        self.slots
            .iter()
            .all(|s| matches!(s, SlotState::Free | SlotState::Ready(_)))
    }
}
