//! The batched step's per-call bookkeeping, apart from the step itself (`batch.rs`) so that
//! `model.rs` can hold it without importing the step (no module cycle).

use super::launch::Seg;
use crate::model::batch::Plan;

/// Per-call bookkeeping, sized for `n_slots` entries at load (a step allocates nothing).
#[derive(Default)]
pub(super) struct BatchScratch {
    pub(super) plan: Plan,     // the call cut into steps (`model::batch::Plan`)
    pub(super) segs: Vec<Seg>, // [S] the pieces' rows
    pub(super) slots: Vec<(usize, usize)>, // [S] (slot, rows) per piece, in row order
}

impl BatchScratch {
    pub(super) fn new(n_slots: usize) -> BatchScratch {
        BatchScratch {
            plan: Plan::new(n_slots),
            segs: Vec::with_capacity(n_slots),
            slots: Vec::with_capacity(n_slots),
        }
    }
}
