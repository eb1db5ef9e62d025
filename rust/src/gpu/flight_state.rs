//! A pipelined window's plan and staging, and the windows in flight (`flight.rs` runs them),
//! apart from the step so that `model.rs` can hold them without importing it (no module
//! cycle).

use super::batch_scratch::RecPiece;
use super::launch::Seg;
use crate::cuda::{Event, PinnedBuf};
use crate::model::batch::Plan;
use crate::model::Logits;
use crate::tier::vram::WindowId;
use std::collections::VecDeque;

/// One window's plan and staging.
pub(super) struct Flight {
    pub(super) window: WindowId,
    pub(super) plan: Plan, // one step: its pieces, the entries' starts and offsets
    pub(super) segs: Vec<Seg>, // [S]
    pub(super) slots: Vec<(usize, usize)>, // [S] (slot, rows)
    pub(super) rec: Vec<RecPiece>, // [S]
    pub(super) wants: Vec<(Logits, usize)>, // [entries] logits wanted, tokens
    pub(super) t: usize,   // R' rows
    pub(super) nb: usize,  // bytes of `params` staged
    pub(super) graph_ok: bool,
    /// The next stage the window enters (n: every stage queued).
    pub(super) next_stage: usize,
    /// The last stage's layers included the head (a one-piece decode graph).
    pub(super) head_done: bool,
    pub(super) hr: usize, // logit rows in `pin_logits`
    pub(super) pin_params: PinnedBuf,
    pub(super) pin_logits: PinnedBuf, // f32 [LOGIT_ROWS, V]
    /// Recorded on the last stage's stream after the logits' copy.
    pub(super) ready: Event,
}

/// The windows in flight (oldest first) and the spare staging of finished ones.
#[derive(Default)]
pub(super) struct Flights {
    pub(super) active: VecDeque<Flight>,
    pub(super) spare: Vec<Flight>,
    /// The oldest window's verdict has been taken and not yet settled.
    pub(super) verdict: bool,
}
