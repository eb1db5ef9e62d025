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
