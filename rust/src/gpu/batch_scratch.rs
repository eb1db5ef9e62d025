//! The batched step's per-call bookkeeping, apart from the step itself (`batch.rs`) so that
//! `model.rs` can hold it without importing the step (no module cycle).

use super::launch::Seg;
use crate::model::batch::Plan;

/// (slot, first position, rows, is a window) of a piece (`GdnState::begin_step`).
pub(super) type RecPiece = (usize, usize, usize, bool);

/// Per-call bookkeeping, sized for `n_slots` entries at load (a step allocates nothing).
#[derive(Default)]
pub(super) struct BatchScratch {
    pub(super) plan: Plan,     // the call cut into steps (`model::batch::Plan`)
    pub(super) segs: Vec<Seg>, // [S] the pieces' rows
    pub(super) slots: Vec<(usize, usize)>, // [S] (slot, rows) per piece, in row order
    pub(super) rec: Vec<RecPiece>, // [S] as a recurrent state sees them
}

impl BatchScratch {
    pub(super) fn new(n_slots: usize) -> BatchScratch {
        BatchScratch {
            plan: Plan::new(n_slots),
            segs: Vec::with_capacity(n_slots),
            slots: Vec::with_capacity(n_slots),
            rec: Vec::with_capacity(n_slots),
        }
    }
}
