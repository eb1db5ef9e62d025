//! The GPU batched step (`GpuModel::forward_batch`; `forward` is its one-entry case).
//!
//! A call's entries are cut into pieces of at most `cap` tokens (where `forward` would cut a
//! long call into chunks: `cap` = the chunk, or the streamed chunk of a hybrid prefill). Each
//! step runs the next piece of as many entries as fit in the R rows of the buffers, as one
//! forward (`step.rs`): the dense projections over all R' rows at once, RoPE, the KV writes
//! and attention per piece over its own slot's cache, and per MoE layer the (token, expert)
//! pairs of the whole step grouped by expert (the grouped kernels, and the hybrid tier's CPU
//! misses through the pool, read each expert once per step). Logits only for the rows asked
//! for: those rows are normed back to back into h and go through the head in blocks.
//! A decode step of S one-token pieces replays a graph captured for S (`model.rs`).
//!
//! Legend: R' = rows of the step (Σ piece lengths ≤ R), S = pieces, V = vocab.

use super::batch_scratch::{BatchScratch, RecPiece};
use super::launch::{Launcher, Seg, LOGIT_ROWS};
use super::model::GpuModel;
use super::pipeline::Pipeline;
use super::stage::Stage;
use super::stage_chain::Chain;
use crate::cuda::{as_bytes_mut, PinnedBuf};
use crate::error::{Error, Result};
use crate::model::batch::{check_batch, Entry, Piece};
use crate::model::Logits;
use crate::tier::vram::{GapTicket, WindowId};

/// What a stage's share of a step reads (the step's plan, as the pieces' rows and slots).
pub(super) struct StepIo<'a> {
    pub(super) segs: &'a [Seg],             // [S] the pieces' rows
    pub(super) slots: &'a [(usize, usize)], // [S] (slot, rows)
    pub(super) rec: &'a [RecPiece],         // [S] for a recurrent state's checkpoints
    pub(super) t: usize,                    // R' rows
    pub(super) nb: usize,                   // bytes of `params` in `pin`
    pub(super) graph_ok: bool,
    pub(super) pin: &'a PinnedBuf, // the staged `params`
}

/// (pos0, slot) per piece, then the token ids of the rows, as i32 → `pin`; returns its bytes.
pub(super) fn write_params(pin: &mut PinnedBuf, entries: &[Entry<'_>], pieces: &[Piece]) -> usize {
    let t: usize = pieces.iter().map(|p| p.t).sum();
    let nb = 4 * (2 * pieces.len() + t);
    let pin = &mut pin.as_mut_slice()[..nb];
    let pairs = pieces.iter().flat_map(|p| [p.p0 as i32, p.slot as i32]);
    let ids = pieces.iter().flat_map(|p| {
        let e = &entries[p.entry];
        e.tokens[p.tok0..p.tok0 + p.t].iter().map(|&x| x as i32)
    });
    for (c, v) in pin.chunks_exact_mut(4).zip(pairs.chain(ids)) {
        c.copy_from_slice(&v.to_ne_bytes());
    }
    nb
}

/// The pieces as a recurrent state sees them (a window's slot checkpoints after each token).
pub(super) fn rec_pieces(out: &mut Vec<RecPiece>, entries: &[Entry<'_>], pieces: &[Piece]) {
    out.clear();
    out.extend(pieces.iter().map(|p| {
        let window = entries[p.entry].want == Logits::Window;
        (p.slot, p.p0, p.t, window)
    }));
}

/// The pieces' rows (`segs`) and (slot, rows) pairs (`slots`).
pub(super) fn piece_rows(pieces: &[Piece], segs: &mut Vec<Seg>, slots: &mut Vec<(usize, usize)>) {
    segs.clear();
    segs.extend(pieces.iter().map(|p| Seg { r0: p.r0, t: p.t }));
    slots.clear();
    slots.extend(pieces.iter().map(|p| (p.slot, p.t)));
}

/// The pieces' logit rows normed back to back into h [Σ logit rows, H] on the last stage
/// `x`; returns their count.
pub(super) fn norm_logit_rows(x: &Launcher, pieces: &[Piece]) -> Result<usize> {
    let mut hr = 0;
    for p in pieces.iter().filter(|p| p.logit_rows > 0) {
        x.final_norm(p.r0 + p.t - p.logit_rows, hr, p.logit_rows)?;
        hr += p.logit_rows;
    }
    Ok(hr)
}

/// Window `w`'s part on stage `s`: entered (s > 0: the hop from s - 1; stage 0 takes the
/// launch's `ticket0`), the recurrent flags and `params` written, the layers launched (or a
/// decode graph replayed); a stage before the last is left (the host waits for its work)
/// and the stage's tier has its turn at the gap. Returns whether the layers included the
/// head (a one-piece decode graph on the last stage).
pub(super) fn stage_part(
    st: &mut [Stage],
    pipe: &mut Pipeline,
    graph_error: &mut Option<String>,
    w: WindowId,
    s: usize,
    ticket0: Option<GapTicket>,
    io: &StepIo<'_>,
) -> Result<bool> {
    let (ticket, mut c) = stage_begin(st, pipe, graph_error, w, s, ticket0, io)?;
    while st[s].next_layer(&mut c, io.segs)? {}
    stage_end(st, pipe, w, s, &ticket, c, io)
}

/// `stage_part` up to its chain of layers begun (`stage_chain.rs`): returns the part's
/// fence and the chain, which the caller drives (`Stage::next_layer`) before `stage_end`.
pub(super) fn stage_begin(
    st: &mut [Stage],
    pipe: &mut Pipeline,
    graph_error: &mut Option<String>,
    w: WindowId,
    s: usize,
    ticket0: Option<GapTicket>,
    io: &StepIo<'_>,
) -> Result<(GapTicket, Chain)> {
    let (done, rest) = st.split_at_mut(s);
    let stg = &mut rest[0];
    let ticket = match (done.last(), ticket0) {
        (Some(prev), _) => pipe.enter_stage(w, s, &prev.x, &stg.x, io.t)?,
        (None, Some(t)) => t,
        (None, None) => return Err(Error::Config("stage 0 without its launch".into())),
    };
    let x = &mut stg.x;
    if let Some(rec) = &mut x.rec {
        rec.begin_step(&x.gpu, &x.stream, io.rec.iter().copied())?;
    }
    x.b.params.write_async(&x.stream, 0, io.pin, 0, io.nb)?;
    stg.moe.before_step(&stg.x.stream, io.slots)?;
    let c = stg.begin_layers(io.segs, io.graph_ok, graph_error)?;
    Ok((ticket, c))
}

/// `stage_part` after its chain's layers are all queued: the fence to the placement, and a
/// stage before the last left (its gap). Returns whether the layers included the head.
pub(super) fn stage_end(
    st: &mut [Stage],
    pipe: &mut Pipeline,
    w: WindowId,
    s: usize,
    ticket: &GapTicket,
    c: Chain,
    io: &StepIo<'_>,
) -> Result<bool> {
    let n = st.len();
    let stg = &mut st[s];
    let head = stg.end_layers(c)?;
    stg.moe.step_launched(&stg.x, ticket)?;
    if s + 1 < n {
        // the host has seen stage s's work complete: a gap there, its tier's turn
        pipe.leave_stage(w, s, &stg.x, io.t)?;
        stg.moe.after_step(&stg.x)?;
    }
    Ok(head)
}

impl GpuModel {
    /// A batched step (`model::batch`): every entry continues its slot; the requested logits
    /// go to `out` back to back in entry order. A refused or failed call changes no slot.
    pub fn forward_batch(&mut self, entries: &[Entry<'_>], out: &mut [f32]) -> Result<()> {
        let (vocab, n_ctx) = (self.hp.n_vocab, self.cfg.n_ctx);
        self.no_flight("forward_batch")?;
        check_batch(entries, |s| self.slot_len(s), out.len(), vocab, n_ctx)?;
        let mut ss = std::mem::take(&mut self.steps);
        let res = self.run_batch(entries, out, &mut ss);
        if res.is_err() {
            // no copy from the staging buffers stays in flight; every slot as it was, except
            // that a slot with a recurrent state (a hybrid family) starts over, as its state
            // may have advanced
            let _ = self.sync_all();
            self.pipe.abandon();
            for (e, &start) in entries.iter().zip(&ss.plan.starts) {
                self.restore_slot(e.slot, start);
            }
        }
        self.steps = ss;
        res
    }

    /// After a failed step (the streams drained): `slot` back at length `start`, or at 0 where
    /// it keeps a recurrent state (which may have advanced; it starts over).
    pub(super) fn restore_slot(&mut self, slot: usize, start: usize) {
        self.lens[slot] = start;
        for x in self.st.iter_mut().map(|s| &mut s.x) {
            if let Some(rec) = &mut x.rec {
                let _ = rec.reset(&x.stream, slot);
                self.lens[slot] = 0;
            }
        }
    }

    fn run_batch(
        &mut self,
        entries: &[Entry<'_>],
        out: &mut [f32],
        ss: &mut BatchScratch,
    ) -> Result<()> {
        let vocab = self.hp.n_vocab;
        let total: usize = entries.iter().map(|e| e.tokens.len()).sum();
        let cap = self.chunk_for(total); // R
        let lens = &self.lens;
        ss.plan.begin(entries, |slot| Ok(lens[slot]), vocab)?;
        while ss.plan.next_step(entries, cap, vocab) {
            piece_rows(&ss.plan.pieces, &mut ss.segs, &mut ss.slots);
            self.step(entries, ss, out)?;
            for p in &ss.plan.pieces {
                ss.plan.done[p.entry] += p.t;
                self.lens[p.slot] = p.p0 + p.t;
            }
        }
        Ok(())
    }

    /// One step over `ss.plan.pieces` (R' rows): `params` written, the layers launched (or a
    /// decode graph replayed) stage by stage, each piece's logit rows to its `dst` in `out`;
    /// the stream is idle after.
    fn step(
        &mut self,
        entries: &[Entry<'_>],
        ss: &mut BatchScratch,
        out: &mut [f32],
    ) -> Result<()> {
        let nb = write_params(&mut self.pin_params, entries, &ss.plan.pieces);
        rec_pieces(&mut ss.rec, entries, &ss.plan.pieces);
        let io = StepIo {
            segs: &ss.segs,
            slots: &ss.slots,
            rec: &ss.rec,
            t: super::step::rows(&ss.segs),
            nb,
            graph_ok: self.use_graph && self.graph_error.is_none(),
            pin: &self.pin_params,
        };
        // the step is a window through the stages (`pipeline.rs`); one stage: launch, verdict
        let (w, ticket) = self.pipe.launch(&self.st[0].x)?;
        let mut ticket = Some(ticket);
        let mut head_done = false;
        for s in 0..self.st.len() {
            let (st, pipe, ge) = (&mut self.st[..], &mut self.pipe, &mut self.graph_error);
            head_done = stage_part(st, pipe, ge, w, s, ticket.take(), &io)?;
        }
        if head_done {
            let p = &ss.plan.pieces[0];
            let dst = (p.logit_rows > 0).then(|| &mut out[p.dst..p.dst + self.hp.n_vocab]);
            self.logits_pinned(dst)?;
        } else {
            self.logits_out(&ss.plan.pieces, out)?;
        }
        self.pipe.verdict(w)?;
        self.pipe.finish(w, true)?;
        let last = self.st.len() - 1;
        let last = &mut self.st[last];
        last.moe.after_step(&last.x)
    }

    /// The one-token step's logits row (the whole graph's head) to `dst` through the pinned
    /// staging (then the stream is idle); without `dst`, only the sync.
    fn logits_pinned(&mut self, dst: Option<&mut [f32]>) -> Result<()> {
        let (x, vocab) = (&self.st[self.st.len() - 1].x, self.hp.n_vocab);
        if let Some(dst) = dst {
            let n = 4 * vocab;
            x.b.logits
                .read_async(&x.stream, 0, &mut self.pin_logits, 0, n)?;
            x.stream.sync()?;
            as_bytes_mut(&mut dst[..vocab]).copy_from_slice(&self.pin_logits.as_slice()[..n]);
            Ok(())
        } else {
            x.stream.sync()
        }
    }

    /// The pieces' logit rows: normed back to back into h [Σ logit rows, H], the head over
    /// them in blocks of LOGIT_ROWS, each block's rows copied to their pieces' `dst` in `out`
    /// (through the pinned staging when the block fits it); then the stream is idle.
    fn logits_out(&mut self, pieces: &[Piece], out: &mut [f32]) -> Result<()> {
        let vocab = self.hp.n_vocab;
        let hr = norm_logit_rows(&self.st[self.st.len() - 1].x, pieces)?; // rows of h filled
        let pin_rows = self.pin_logits.len() / (4 * vocab);
        let mut a = 0;
        while a < hr {
            let nr = (hr - a).min(LOGIT_ROWS);
            let x = &self.st[self.st.len() - 1].x;
            x.head(a, nr)?; // logits [nr, V] = h rows a .. a + nr
            let pinned = nr <= pin_rows;
            if pinned {
                let n = 4 * nr * vocab;
                x.b.logits
                    .read_async(&x.stream, 0, &mut self.pin_logits, 0, n)?;
                x.stream.sync()?;
            }
            // each piece's rows [h0, h0 + lr) of h that fall in this block
            let mut h0 = 0;
            for p in pieces.iter().filter(|p| p.logit_rows > 0) {
                let (i0, i1) = (h0.max(a), (h0 + p.logit_rows).min(a + nr));
                if i0 < i1 {
                    let d = p.dst + (i0 - h0) * vocab;
                    let dst = &mut out[d..d + (i1 - i0) * vocab];
                    if pinned {
                        let src = &self.pin_logits.as_slice()[4 * (i0 - a) * vocab..];
                        let nb = 4 * dst.len();
                        as_bytes_mut(dst).copy_from_slice(&src[..nb]);
                    } else {
                        let x = &self.st[self.st.len() - 1].x;
                        x.b.logits.read_into(&x.stream, (i0 - a) * vocab, dst)?;
                    }
                }
                h0 += p.logit_rows;
            }
            a += nr;
        }
        if hr == 0 {
            self.st[self.st.len() - 1].x.stream.sync()?;
        }
        Ok(())
    }
}
