//! Pipelined windows (`pipeline_windows` 2; seed 003, docs/PROTOCOL.md): a batched step cut
//! into its launch and its verdict, so that window K+1 runs on stage 0 while a later stage
//! still computes, or the host still verifies, window K.
//!
//!   launch_batch(K)   stage 0's layers; the host waits for them (`leave_stage`: a gap there);
//!                     then, when stage 1 is free, the later stages and the head are queued
//!                     and the logits' copy into the window's own page-locked staging
//!   launch_batch(K+1) the same on stage 0 while K is on stage 1; K+1 waits between the
//!                     stages (the protocol lets one window on a stage at a time)
//!   finish_batch()    the oldest window's logits (the host waits for its copy): its verdict
//!   settle(true)      K is done; K+1 enters stage 1 at once (its later stages queued)
//!   settle(false)     K's verdict rejected the guess K+1 was drafted on: K+1 is discarded and
//!                     its slots are back where K left them (what K+1 wrote past them is never
//!                     read: later steps rewrite those positions first)
//!
//! A window holds its own copy of the step's plan and its own staging (`params` in, logits
//! out), so the host rewrites neither while a copy of the other window may still read it;
//! stage s's x is rewritten by the next window only after the previous one's hop out of it
//! ran (`Pipeline::launch`, the `taken` event). A pipelined window is one step: at most the
//! buffers' rows, and logit rows that fit one head block. With one window in flight at most
//! (`pipeline_windows` 1) the same calls run the step in order (launch, verdict).
//!
//! In the hybrid mode on two stages (`defers`) the host drives each stage's layers (it waits
//! for each layer's routing and computes the CPU misses), so a later stage queued at its
//! window's launch would run there, on the host, before K+1's stage 0 could start. There
//! window K's stage 1 waits instead: `launch_batch(K+1)` runs it beside K+1's stage 0, their
//! chains of layers alternating on the host (`launch_beside`, `stage_chain.rs`), so the GPU's
//! part of each layer of one runs while the pool computes the other's misses; without a next
//! launch, `finish_batch` runs it alone.

use super::batch::{
    norm_logit_rows, piece_rows, rec_pieces, stage_begin, stage_end, stage_part, write_params,
    StepIo,
};
use super::flight_state::Flight;
use super::launch::{params_len, Launcher, LOGIT_ROWS};
use super::model::GpuModel;
use crate::cuda::as_bytes_mut;
use crate::cuda::ops::view::bytes;
use crate::error::{Error, Result};
use crate::model::batch::{batch_logits_len, check_batch, logits_len, Entry, Plan};
use crate::model::Logits;

impl GpuModel {
    /// A typed error when a window is in flight (`what` needs the slots settled).
    pub(super) fn no_flight(&self, what: &str) -> Result<()> {
        match self.flights.active.len() {
            0 => Ok(()),
            n => Err(Error::Config(format!(
                "{what}: {n} pipelined window(s) in flight; finish and settle them first"
            ))),
        }
    }

    /// The slot's length, refused while a window in flight runs in it.
    pub(super) fn idle_slot(&self, slot: usize) -> Result<usize> {
        let busy = self
            .flights
            .active
            .iter()
            .any(|f| f.slots.iter().any(|&(s, _)| s == slot));
        if busy {
            return Err(Error::Config(format!(
                "slot {slot} is in a pipelined window in flight; settle it first"
            )));
        }
        self.slot_len(slot)
    }

    /// Launches `entries` as a window (one step; see the module's comment). With a window in
    /// flight whose verdict was taken, that one is settled as accepted first.
    pub fn launch_batch(&mut self, entries: &[Entry<'_>]) -> Result<()> {
        if self.flights.verdict {
            self.settle(true)?;
        }
        if !self.pipe.can_launch() {
            return Err(Error::Config(format!(
                "no window can be launched: {} in flight (pipeline_windows {}); finish one",
                self.flights.active.len(),
                self.pipe.max_windows()
            )));
        }
        let vocab = self.hp.n_vocab;
        let total = entries.iter().map(|e| e.tokens.len()).sum::<usize>();
        let out_len = batch_logits_len(entries, vocab);
        check_batch(
            entries,
            |s| self.slot_len(s),
            out_len,
            vocab,
            self.cfg.n_ctx,
        )?;
        let cap = self.chunk_for(total).min(self.rows_cap());
        let mut fl = self.spare_flight()?;
        let lens = &self.lens;
        fl.plan.begin(entries, |slot| Ok(lens[slot]), vocab)?;
        fl.plan.next_step(entries, cap, vocab);
        let ran: usize = fl.plan.pieces.iter().map(|p| p.t).sum();
        let hr: usize = fl.plan.pieces.iter().map(|p| p.logit_rows).sum();
        if ran != total || hr > LOGIT_ROWS.min(cap) {
            self.flights.spare.push(fl);
            return Err(Error::Input(format!(
                "a pipelined window is one step: {total} tokens (at most {cap}) and {hr} logit \
                 rows (at most {})",
                LOGIT_ROWS.min(cap)
            )));
        }
        piece_rows(&fl.plan.pieces, &mut fl.segs, &mut fl.slots);
        rec_pieces(&mut fl.rec, entries, &fl.plan.pieces);
        fl.wants.clear();
        fl.wants
            .extend(entries.iter().map(|e| (e.want, e.tokens.len())));
        fl.t = total;
        fl.hr = hr;
        fl.nb = write_params(&mut fl.pin_params, entries, &fl.plan.pieces);
        fl.graph_ok = self.use_graph && self.graph_error.is_none();
        fl.next_stage = 0;
        fl.head_done = false;
        let res = self.launch_flight(&mut fl);
        for p in &fl.plan.pieces {
            self.lens[p.slot] = p.p0 + p.t;
        }
        self.flights.active.push_back(fl);
        res.or_else(|e| self.fail(e))
    }

    /// Whether a window's later stage waits for the next launch (`launch_beside`) or its
    /// verdict instead of running at its own launch: two stages, two windows, and a second
    /// stage whose chain the host drives layer by layer (the hybrid tier). Launched at once,
    /// that chain would run on the host before `launch_batch` returns, and the next window's
    /// stage 0 after it: nothing would overlap on one host.
    fn defers(&self) -> bool {
        self.st.len() == 2 && self.pipe.max_windows() >= 2 && self.st[1].moe.host_per_layer()
    }

    /// Stage 0's part of `fl`, then the later stages as far as they are free (deferred: at
    /// the next launch, beside its stage 0, or at the verdict). A window waiting for its
    /// later stage runs it beside `fl`'s stage 0.
    fn launch_flight(&mut self, fl: &mut Flight) -> Result<()> {
        let defers = self.defers();
        let waiting = |o: &Flight| o.next_stage == 1 && self.pipe.can_enter(o.window, 1);
        if defers && self.flights.active.back().is_some_and(waiting) {
            let mut older = self.flights.active.pop_back().expect("a window waits");
            let res = self.launch_beside(&mut older, fl);
            self.flights.active.push_back(older);
            return res;
        }
        let (w, ticket) = self.pipe.launch(&self.st[0].x)?;
        fl.window = w;
        let io = io_of(fl);
        let (st, pipe, ge) = (&mut self.st[..], &mut self.pipe, &mut self.graph_error);
        let head_done = stage_part(st, pipe, ge, w, 0, Some(ticket), &io)?;
        fl.head_done = head_done;
        fl.next_stage = 1;
        match defers {
            true => Ok(()),
            false => self.advance(fl),
        }
    }

    /// `older` enters stage 1 and `fl` is launched onto stage 0, their chains of layers
    /// driven alternately (`stage_chain.rs`): while the host serves one chain's CPU misses
    /// the GPU runs the other's attention. `older`'s hop out of stage 0's x is queued before
    /// `fl`'s launch rewrites that x (`Pipeline::launch` waits for its `taken`); `older`'s
    /// head and logits' copy are queued before `fl` leaves stage 0 (the host waits there).
    fn launch_beside(&mut self, older: &mut Flight, fl: &mut Flight) -> Result<()> {
        let vocab = self.hp.n_vocab;
        let (st, pipe, ge) = (&mut self.st[..], &mut self.pipe, &mut self.graph_error);
        let ow = older.window;
        let io1 = io_of(older);
        let (t1, mut c1) = stage_begin(st, pipe, ge, ow, 1, None, &io1)?;
        let (w, t0) = pipe.launch(&st[0].x)?;
        fl.window = w;
        let io0 = io_of(fl);
        let (t0, mut c0) = stage_begin(st, pipe, ge, w, 0, Some(t0), &io0)?;
        let (mut more1, mut more0) = (true, true);
        while more1 || more0 {
            if more1 {
                more1 = st[1].next_layer(&mut c1, io1.segs)?;
            }
            if more0 {
                more0 = st[0].next_layer(&mut c0, io0.segs)?;
            }
        }
        let head1 = stage_end(st, pipe, ow, 1, &t1, c1, &io1)?;
        older.head_done = head1;
        older.next_stage = 2;
        queue_logits(&st[1].x, vocab, older)?;
        let head0 = stage_end(st, pipe, w, 0, &t0, c0, &io0)?;
        pipe.ran_beside(&[0, 1]);
        fl.head_done = head0;
        fl.next_stage = 1;
        Ok(())
    }

    /// `fl`'s remaining stages as far as they are free, then (all entered) its logit rows
    /// normed back to back, the head over them and their copy into `fl.pin_logits`, and
    /// `fl.ready`.
    fn advance(&mut self, fl: &mut Flight) -> Result<()> {
        let n = self.st.len();
        let io = io_of(fl);
        let (mut head_done, mut next) = (fl.head_done, fl.next_stage);
        while next < n && self.pipe.can_enter(fl.window, next) {
            let (st, pipe, ge) = (&mut self.st[..], &mut self.pipe, &mut self.graph_error);
            head_done = stage_part(st, pipe, ge, fl.window, next, None, &io)?;
            next += 1;
        }
        fl.head_done = head_done;
        fl.next_stage = next;
        if next < n {
            return Ok(()); // a stage ahead still serves an earlier window: `settle` goes on
        }
        queue_logits(&self.st[n - 1].x, self.hp.n_vocab, fl)
    }

    /// The oldest window's verdict: its logits to `out` (entry order, as `forward_batch`),
    /// and per entry (logits wanted, tokens). `settle` tells what the verdict decided.
    pub fn finish_batch(&mut self, out: &mut Vec<f32>) -> Result<Vec<(Logits, usize)>> {
        if self.flights.verdict {
            return Err(Error::Config(
                "the oldest window's verdict is taken: settle it first".into(),
            ));
        }
        let Some(mut fl) = self.flights.active.pop_front() else {
            return Err(Error::Config("no pipelined window in flight".into()));
        };
        // a stage it has not entered yet (deferred: `defers`) runs now, as far as it is free
        let res = match fl.next_stage < self.st.len() {
            true => self.advance(&mut fl),
            false => Ok(()),
        };
        self.flights.active.push_front(fl);
        res.or_else(|e| self.fail(e))?;
        let fl = &self.flights.active[0];
        if fl.next_stage < self.st.len() {
            return Err(Error::Config(
                "the oldest window has not entered every stage".into(),
            ));
        }
        let vocab = self.hp.n_vocab;
        let res = fl.ready.sync().map(|()| {
            let n: usize = fl.wants.iter().map(|&(w, t)| logits_len(w, t, vocab)).sum();
            out.clear();
            out.resize(n, 0.0);
            let mut h0 = 0;
            for p in fl.plan.pieces.iter().filter(|p| p.logit_rows > 0) {
                let m = p.logit_rows * vocab;
                let src = &fl.pin_logits.as_slice()[4 * h0 * vocab..4 * (h0 * vocab + m)];
                as_bytes_mut(&mut out[p.dst..p.dst + m]).copy_from_slice(src);
                h0 += p.logit_rows;
            }
            fl.wants.clone()
        });
        let (w, res) = (fl.window, res);
        let wants = res.or_else(|e| self.fail(e))?;
        self.pipe.verdict(w).or_else(|e| self.fail(e))?;
        self.flights.verdict = true;
        let last = self.st.len() - 1;
        let last = &mut self.st[last];
        last.moe.after_step(&last.x).or_else(|e| self.fail(e))?;
        Ok(wants)
    }

    /// Settles the oldest window's verdict: `accepted` lets the next window go on to the
    /// later stages; a rejection discards every later window and puts their slots back.
    pub fn settle(&mut self, accepted: bool) -> Result<()> {
        if !self.flights.verdict {
            return Err(Error::Config("no verdict to settle".into()));
        }
        self.flights.verdict = false;
        let fl = self
            .flights
            .active
            .pop_front()
            .expect("a verdict has its window");
        let w = fl.window;
        self.flights.spare.push(fl);
        self.pipe.finish(w, accepted).or_else(|e| self.fail(e))?;
        if !accepted {
            while let Some(fl) = self.flights.active.pop_back() {
                self.put_back(&fl);
                self.flights.spare.push(fl);
            }
            return Ok(());
        }
        if self.defers() {
            return Ok(()); // the next window's later stage: beside the next launch, or at its verdict
        }
        if let Some(mut fl) = self.flights.active.pop_front() {
            let res = if fl.next_stage < self.st.len() {
                self.advance(&mut fl)
            } else {
                Ok(())
            };
            self.flights.active.push_front(fl);
            res.or_else(|e| self.fail(e))?;
        }
        Ok(())
    }

    /// The slots of a discarded window back at their lengths before it (a recurrent state
    /// restored to its checkpoint there).
    fn put_back(&mut self, fl: &Flight) {
        for p in &fl.plan.pieces {
            let _ = self.truncate_unchecked(p.slot, fl.plan.starts[p.entry]);
        }
    }

    /// After an error inside a pipelined call: every stream drained, every window forgotten,
    /// their slots back where the oldest found them (a recurrent state starts over). Returns
    /// the error.
    fn fail<T>(&mut self, e: Error) -> Result<T> {
        let _ = self.sync_all();
        self.pipe.abandon();
        self.flights.verdict = false;
        while let Some(fl) = self.flights.active.pop_back() {
            for p in &fl.plan.pieces {
                self.restore_slot(p.slot, fl.plan.starts[p.entry]);
            }
            self.flights.spare.push(fl);
        }
        Err(e)
    }

    /// A window's staging: a spare one, or new (the first two pipelined calls).
    fn spare_flight(&mut self) -> Result<Flight> {
        if let Some(f) = self.flights.spare.pop() {
            return Ok(f);
        }
        let (g0, gl) = (&self.st[0].x.gpu, &self.st[self.st.len() - 1].x.gpu);
        let n = self.cfg.n_slots;
        let t = self.rows_cap();
        Ok(Flight {
            window: 0,
            plan: Plan::new(n),
            segs: Vec::with_capacity(n),
            slots: Vec::with_capacity(n),
            rec: Vec::with_capacity(n),
            wants: Vec::with_capacity(n),
            t: 0,
            nb: 0,
            graph_ok: false,
            next_stage: 0,
            head_done: false,
            hr: 0,
            pin_params: g0.host_alloc(bytes(params_len(n, t), 4)?)?,
            pin_logits: gl.host_alloc(bytes(LOGIT_ROWS.min(t) * self.hp.n_vocab, 4)?)?,
            ready: gl.event_no_timing()?,
        })
    }
}

/// `fl`'s logit rows (every stage entered; on the last stage `x`) normed back to back, the
/// head over them and their copy into `fl.pin_logits` queued, then `fl.ready`.
fn queue_logits(x: &Launcher, vocab: usize, fl: &mut Flight) -> Result<()> {
    if !fl.head_done && norm_logit_rows(x, &fl.plan.pieces)? > 0 {
        x.head(0, fl.hr)?; // logits [hr, V]
    }
    if fl.hr > 0 {
        x.b.logits
            .read_async(&x.stream, 0, &mut fl.pin_logits, 0, 4 * fl.hr * vocab)?;
    }
    fl.ready.record(&x.stream)
}

fn io_of(fl: &Flight) -> StepIo<'_> {
    StepIo {
        segs: &fl.segs,
        slots: &fl.slots,
        rec: &fl.rec,
        t: fl.t,
        nb: fl.nb,
        graph_ok: fl.graph_ok,
        pin: &fl.pin_params,
    }
}
