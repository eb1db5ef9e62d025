//! The batched step's arguments and results as Python values (`Model.forward_batch`, and the
//! pipelined windows' `launch_batch` / `finish_batch`).

use crate::model::batch::logits_len;
use crate::model::{Entry, Logits};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// An entry as Python gives it: (slot, token ids, logits wanted).
pub type RawEntry = (usize, Vec<u32>, String);

/// "last" | "all" | "window" | "none" → `Logits`.
pub fn parse_logits(logits: &str) -> PyResult<Logits> {
    match logits {
        "last" => Ok(Logits::Last),
        "all" => Ok(Logits::All),
        "window" => Ok(Logits::Window),
        "none" => Ok(Logits::None),
        other => Err(PyValueError::new_err(format!(
            "logits must be \"last\", \"all\", \"window\" or \"none\", not {other:?}"
        ))),
    }
}

/// Each entry's `Logits` (a bad name raises before any work).
pub fn wants(entries: &[RawEntry]) -> PyResult<Vec<Logits>> {
    entries.iter().map(|(_, _, l)| parse_logits(l)).collect()
}

/// The entries as the core takes them.
pub fn entries<'a>(raw: &'a [RawEntry], wants: &[Logits]) -> Vec<Entry<'a>> {
    raw.iter()
        .zip(wants)
        .map(|((slot, toks, _), &want)| Entry {
            slot: *slot,
            tokens: toks,
            want,
        })
        .collect()
}

/// Per entry (logits wanted, tokens): None ("none"), (n_vocab,) ("last") or (tokens, n_vocab)
/// ("all", "window"), cut from `out` (the entries' logits back to back).
pub fn results<'py>(
    py: Python<'py>,
    shapes: impl Iterator<Item = (Logits, usize)>,
    out: &[f32],
    vocab: usize,
) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
    let mut res = Vec::new();
    let mut off = 0;
    for (want, t) in shapes {
        let n = logits_len(want, t, vocab);
        let part = &out[off..off + n];
        off += n;
        res.push(match want {
            Logits::None => None,
            Logits::Last => Some(PyArray1::from_slice(py, part).into_any()),
            Logits::All | Logits::Window => Some(
                PyArray1::from_slice(py, part)
                    .reshape([t, vocab])?
                    .into_any(),
            ),
        });
    }
    Ok(res)
}
