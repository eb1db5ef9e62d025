//! The batched step's entries and their checks, shared by the CPU and GPU forward passes:
//! one call takes entries `(slot, tokens, logits wanted)`, each continuing its slot at the
//! slot's current length, and writes the requested logits of every entry back to back into
//! one buffer (None: nothing, Last: [V], All: [T_e, V], in entry order).

use super::forward::{check_forward_args, Logits};
use crate::error::{Error, Result};

/// One sequence's part of a batched step.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    pub slot: usize,
    pub tokens: &'a [u32],
    pub want: Logits,
}

/// Logit floats an entry of `n` tokens writes.
pub fn logits_len(want: Logits, n: usize, vocab: usize) -> usize {
    match want {
        Logits::None => 0,
        Logits::Last => vocab,
        Logits::All | Logits::Window => n * vocab,
    }
}

/// Total logit floats of a batch.
pub fn batch_logits_len(entries: &[Entry<'_>], vocab: usize) -> usize {
    entries
        .iter()
        .map(|e| logits_len(e.want, e.tokens.len(), vocab))
        .sum()
}

/// Every check a batched call makes before it changes anything: each entry's slot exists
/// (`len` gives its cached positions, or the error for a slot that does not exist), no slot
/// appears twice, each entry passes `check_forward_args`, and `out_len` is the batch's
/// logits length. Allocates nothing.
pub fn check_batch(
    entries: &[Entry<'_>],
    len: impl Fn(usize) -> Result<usize>,
    out_len: usize,
    n_vocab: usize,
    n_ctx: usize,
) -> Result<()> {
    for (i, e) in entries.iter().enumerate() {
        let start = len(e.slot)?;
        if entries[..i].iter().any(|o| o.slot == e.slot) {
            return Err(Error::Input(format!(
                "slot {} appears in more than one entry of the batch",
                e.slot
            )));
        }
        let n = logits_len(e.want, e.tokens.len(), n_vocab);
        check_forward_args(e.slot, start, e.tokens, e.want, n, n_vocab, n_ctx).map_err(|err| {
            match entries.len() {
                1 => err,
                _ => Error::Input(format!("batch entry {i}: {err}")),
            }
        })?;
    }
    let need = batch_logits_len(entries, n_vocab);
    if out_len != need {
        return Err(Error::Input(format!(
            "logits buffer holds {out_len} floats, the batch needs {need}"
        )));
    }
    Ok(())
}

/// One entry's piece in a step: `t` tokens of entry `entry` from its token `tok0`, at slot
/// positions `p0..p0 + t` and step rows `r0..r0 + t`; its last `logit_rows` rows' logits go
/// to the call's buffer at float `dst`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Piece {
    pub entry: usize,
    pub slot: usize,
    pub tok0: usize,
    pub p0: usize,
    pub r0: usize,
    pub t: usize,
    pub logit_rows: usize,
    pub dst: usize,
}

/// How a batched call is cut into steps of at most `cap` rows, the same on every path: each
/// step takes the next piece of every entry that still has tokens and fits, in entry order.
/// Sized for `n_slots` entries at load (a call allocates nothing).
#[derive(Default)]
pub struct Plan {
    pub pieces: Vec<Piece>, // [pieces] of the current step
    pub done: Vec<usize>,   // [entries] tokens run so far
    pub starts: Vec<usize>, // [entries] slot length before the call
    pub offs: Vec<usize>,   // [entries] first float of the entry's logits
}

impl Plan {
    pub fn new(n_slots: usize) -> Plan {
        let v = || Vec::with_capacity(n_slots);
        Plan {
            pieces: Vec::with_capacity(n_slots),
            done: v(),
            starts: v(),
            offs: v(),
        }
    }

    /// Starts a call: every entry's slot length (`len`) and the first float of its logits.
    pub fn begin(
        &mut self,
        entries: &[Entry<'_>],
        len: impl Fn(usize) -> Result<usize>,
        vocab: usize,
    ) -> Result<()> {
        self.done.clear();
        self.starts.clear();
        self.offs.clear();
        let mut off = 0;
        for e in entries {
            self.done.push(0);
            self.starts.push(len(e.slot)?);
            self.offs.push(off);
            off += logits_len(e.want, e.tokens.len(), vocab);
        }
        Ok(())
    }

    /// Plans the next step of at most `cap` rows into `pieces`; false when every token has run.
    /// The step's runner adds each piece's `t` to `done[entry]`.
    pub fn next_step(&mut self, entries: &[Entry<'_>], cap: usize, vocab: usize) -> bool {
        self.pieces.clear();
        let mut rows = 0;
        for (i, e) in entries.iter().enumerate() {
            let (n, done) = (e.tokens.len(), self.done[i]);
            let t = (n - done).min(cap);
            if t == 0 || rows + t > cap {
                continue;
            }
            let last = done + t == n;
            let (logit_rows, dst) = match e.want {
                Logits::Last if last => (1, self.offs[i]),
                Logits::All | Logits::Window => (t, self.offs[i] + done * vocab),
                _ => (0, 0),
            };
            self.pieces.push(Piece {
                entry: i,
                slot: e.slot,
                tok0: done,
                p0: self.starts[i] + done,
                r0: rows,
                t,
                logit_rows,
                dst,
            });
            rows += t;
        }
        !self.pieces.is_empty()
    }
}

/// A model with the one-sequence calls (`run_each` drives them).
pub trait SlotForward {
    fn slot_len(&self, slot: usize) -> Result<usize>;
    fn forward(&mut self, slot: usize, tokens: &[u32], want: Logits, out: &mut [f32])
        -> Result<()>;
    fn truncate(&mut self, slot: usize, n: usize) -> Result<()>;
}

/// Runs each entry with `forward` in turn (the per-entry path of a backend without a fused
/// step), each writing its logits to its part of `out`. When one entry fails, the slots of
/// the entries before it are cut back to where they were, so a failed call changes nothing.
pub fn run_each<M: SlotForward + ?Sized>(
    m: &mut M,
    entries: &[Entry<'_>],
    out: &mut [f32],
    vocab: usize,
) -> Result<()> {
    let mut off = 0;
    for (i, e) in entries.iter().enumerate() {
        let n = logits_len(e.want, e.tokens.len(), vocab);
        if let Err(err) = m.forward(e.slot, e.tokens, e.want, &mut out[off..off + n]) {
            // Entries before i each added their tokens after their start.
            for done in &entries[..i] {
                let len = m.slot_len(done.slot)?;
                m.truncate(done.slot, len - done.tokens.len())?;
            }
            return Err(err);
        }
        off += n;
    }
    Ok(())
}
