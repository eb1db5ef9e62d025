//! Exhaustive interleaving check of seed 003's protocol (docs/PROTOCOL.md) on the code the
//! engine runs: `Protocol` (stages, windows, gaps, RAM fences) and one `SlotFences` per stage
//! whose step fences are the protocol's `GapTicket`s, under a fake device and a fake tier job
//! thread. Every interleaving of the loop's thread (launch, leave, enter, verdict, gap), the
//! device (copies landing) and the job thread (choose + bounce copies, RAM moves) is explored
//! (depth-first, replaying the action list from the start; states deduplicated by a digest).
//!
//! Rules checked in every state reached:
//! 1. no device call from the job thread while a window waits, and the loop's device calls
//!    for a stage only at that stage's gap;
//! 2. no copy into a slot that a window in flight may read (and no read before a copy landed);
//! 3. a RAM place is rewritten only when no window in flight may read it (`RamFence`);
//! 4. no stall: every reachable state has an action, and the finished state (all windows
//!    verified, every tier round done, nothing pending) is reachable from every state.
//!
//! Each rule is shown to be checked by a variant that breaks it (`Rules`).

use super::fence::{Fence, SlotFences, SlotIo, SlotState};
use super::protocol::{GapTicket, Protocol, WindowState};
use super::table::{Key, VramTable};
use crate::error::Result;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Experts per stage's layer (each stage holds one MoE layer here), slots per stage.
const EXPERTS: u32 = 3;
const SLOTS: usize = 1;

#[derive(Clone, Copy, Debug, Default)]
struct Rules {
    /// Copies into an evicted slot wait for a gap after the retire (the engine's rule).
    no_step_fence: bool,
    /// RAM moves wait for a gap on every stage that exchanged.
    no_ram_fence: bool,
    /// A gap of one stage also flushes the copy queues of the other stages on its card (a
    /// per-card queue taken for a per-stage one), whose windows may be in flight.
    poll_card: bool,
    /// The job thread makes a device call (a copy) itself, which blocks in the driver while a
    /// window is in flight on that card (issue #31's behaviour).
    job_device_call: bool,
    /// The loop's thread waits for the job's answer after sending it a tick.
    loop_waits_for_job: bool,
}

#[derive(Clone, Debug)]
struct Cfg {
    stage_card: Vec<usize>,
    windows: usize,
    /// Verdicts accepted before the run ends; every second verdict is a rejection.
    accept: u32,
    rounds: u32,
    rules: Rules,
}

#[derive(Clone, Debug)]
struct CopyEv(Arc<AtomicBool>);

#[derive(Clone, Debug)]
enum Ev {
    Step(GapTicket),
    Unfenced,
    Copy(CopyEv),
}

impl Fence for Ev {
    fn done(&self) -> Result<bool> {
        match self {
            Ev::Step(t) => t.done(),
            Ev::Unfenced => Ok(true),
            Ev::Copy(c) => Ok(c.0.load(Ordering::Acquire)),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Bytes {
    Expert(u32),
    Garbage,
}

/// What a window in flight on a stage may read: (slot, expert) through the pointer table,
/// (RAM place, expert) over PCIe.
#[derive(Clone, Debug, Default, Hash)]
struct Reads {
    slots: Vec<(u32, u32)>,
    places: Vec<(usize, u32)>,
}

#[derive(Debug, Default)]
struct Dev {
    slot: Vec<Vec<Bytes>>,  // [stage][slot]
    place: Vec<Vec<Bytes>>, // [stage][RAM place]
    /// Copies issued: (stage, slot, expert, event).
    copies: Vec<(usize, u32, u32, CopyEv)>,
    reads: BTreeMap<(u64, usize), Reads>,
    violations: Vec<String>,
}

/// The loop's copy issue for one stage (the engine's `CudaSlots` on that stage's card).
struct StageIo<'a> {
    dev: &'a mut Dev,
    stage: usize,
    at_gap: bool,
}

impl SlotIo<u32> for StageIo<'_> {
    type Event = Ev;
    fn issue_fill(&mut self, slot: u32, key: Key, staged: &u32) -> Result<Ev> {
        let d = &mut *self.dev;
        let s = self.stage;
        if !self.at_gap {
            d.violations
                .push(format!("stage {s}: copy queued with a window in flight"));
        }
        if *staged != key.1 {
            d.violations
                .push(format!("stage {s}: staged {staged}, copying {key:?}"));
        }
        for ((w, st), r) in &d.reads {
            if *st == s && r.slots.iter().any(|&(x, _)| x == slot) {
                d.violations.push(format!(
                    "stage {s}: copy into slot {slot} while window {w} may read it"
                ));
            }
        }
        d.slot[s][slot as usize] = Bytes::Garbage;
        let ev = CopyEv(Arc::new(AtomicBool::new(false)));
        d.copies.push((s, slot, key.1, ev.clone()));
        Ok(Ev::Copy(ev))
    }
}

#[derive(Clone, Copy, Debug, Hash)]
struct SwapM {
    stage: usize,
    slot: u32,
    out: u32,
    into: u32,
    /// The RAM place `into` leaves and `out` takes.
    place: usize,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Job {
    Idle,
    /// A tick waits; with `job_device_call`, `Some(card)` while its call blocks.
    Tick(Option<usize>),
    /// RAM moves released to it.
    Ram,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Round {
    Idle,
    Asked,
    /// Choices in the loop's inbox (not yet retired).
    Chosen,
    Copying,
    /// Step 3 done: the RAM moves wait for the fence.
    Fenced(u64),
    Moving,
    Moved,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    Launch,
    Enter(u64, usize),
    Leave(u64, usize),
    Verdict(u64),
    Gap(usize),
    CopyDone(usize),
    JobTick,
    JobReturn,
    JobRam,
}

struct Sys {
    cfg: Cfg,
    proto: Protocol,
    fences: Vec<SlotFences<Ev, u32>>,
    tables: Vec<VramTable>,
    /// Host RAM map per stage: expert → place, for the experts read from RAM.
    ram: Vec<BTreeMap<u32, usize>>,
    dev: Dev,
    job: Job,
    round: Round,
    swaps: Vec<SwapM>,
    rounds_done: u32,
    verdicts: u32,
    accepted: u32,
    /// Some action other than a gap happened since stage s's last gap (bounds the gaps).
    since_gap: Vec<bool>,
}

impl Sys {
    fn new(cfg: &Cfg) -> Sys {
        let n = cfg.stage_card.len();
        let mut dev = Dev {
            slot: vec![vec![Bytes::Garbage; SLOTS]; n],
            // experts 1.. in RAM places 0..
            place: vec![(1..EXPERTS).map(Bytes::Expert).collect(); n],
            ..Dev::default()
        };
        let (mut tables, mut fences) = (Vec::new(), Vec::new());
        for s in 0..n {
            // the start fill through the fences: expert 0 into slot 0
            let mut t = VramTable::new(1, EXPERTS as usize, SLOTS);
            let mut f: SlotFences<Ev, u32> = SlotFences::new(SLOTS);
            f.retire(&mut t, 0, (0, 0), 0).unwrap();
            let mut io = StageIo {
                dev: &mut dev,
                stage: s,
                at_gap: true,
            };
            f.poll(&mut t, &mut io, |_| ()).unwrap();
            let (_, _, e, ev) = dev.copies.pop().unwrap();
            ev.0.store(true, Ordering::Release);
            dev.slot[s][0] = Bytes::Expert(e);
            let mut io = StageIo {
                dev: &mut dev,
                stage: s,
                at_gap: true,
            };
            f.poll(&mut t, &mut io, |_| ()).unwrap();
            assert!(matches!(f.state(0), Some(SlotState::Ready(_))));
            f.take_changes();
            tables.push(t);
            fences.push(f);
        }
        assert!(dev.violations.is_empty());
        Sys {
            proto: Protocol::new(cfg.stage_card.clone(), cfg.windows).unwrap(),
            cfg: cfg.clone(),
            fences,
            tables,
            ram: vec![(1..EXPERTS).map(|e| (e, e as usize - 1)).collect(); n],
            dev,
            job: Job::Idle,
            round: Round::Idle,
            swaps: Vec::new(),
            rounds_done: 0,
            verdicts: 0,
            accepted: 0,
            since_gap: vec![false; n],
        }
    }

    fn n(&self) -> usize {
        self.cfg.stage_card.len()
    }

    /// The loop's thread is blocked on the job (variant `loop_waits_for_job`).
    fn loop_blocked(&self) -> bool {
        self.cfg.rules.loop_waits_for_job && matches!(self.job, Job::Tick(_))
    }

    fn windows_on_card(&self, card: usize) -> bool {
        (0..self.n()).any(|s| self.proto.card(s) == card && self.proto.on_stage(s).is_some())
    }

    fn enabled(&self) -> Vec<Act> {
        let mut out = Vec::new();
        let p = &self.proto;
        if !self.loop_blocked() {
            let live = p.live_windows() as u32;
            if p.can_launch() && self.accepted + live < self.cfg.accept {
                out.push(Act::Launch);
            }
            for s in 0..self.n() {
                if let Some(w) = p.on_stage(s) {
                    out.push(Act::Leave(w, s));
                }
                if p.at_gap(s) && (self.since_gap[s] || p.ram_waits_on(s)) {
                    out.push(Act::Gap(s));
                }
            }
            for w in self.window_ids() {
                match p.window_state(w) {
                    Some((WindowState::Between(s), false)) if p.can_enter(w, s + 1) => {
                        out.push(Act::Enter(w, s + 1))
                    }
                    Some((WindowState::Verdict, false)) => out.push(Act::Verdict(w)),
                    _ => {}
                }
            }
        }
        for (i, c) in self.dev.copies.iter().enumerate() {
            if !c.3 .0.load(Ordering::Acquire) {
                out.push(Act::CopyDone(i));
            }
        }
        match self.job {
            Job::Tick(None) => out.push(Act::JobTick),
            Job::Tick(Some(card)) if !self.windows_on_card(card) => out.push(Act::JobReturn),
            Job::Ram => out.push(Act::JobRam),
            _ => {}
        }
        out
    }

    fn window_ids(&self) -> Vec<u64> {
        (0..64)
            .filter(|&w| self.proto.window_state(w).is_some())
            .collect()
    }

    /// A window enters stage `s`: its step fence goes to the stage's fences, and it may read
    /// what the stage's tables map now.
    fn entered(&mut self, w: u64, s: usize, t: GapTicket) {
        let ev = if self.cfg.rules.no_step_fence {
            Ev::Unfenced
        } else {
            Ev::Step(t)
        };
        self.fences[s].step_launched(ev);
        self.record_reads(w, s);
    }

    /// The loop advances stage `s`'s slot fences: copy issues and publishes.
    fn poll(&mut self, s: usize) {
        let mut io = StageIo {
            dev: &mut self.dev,
            stage: s,
            at_gap: self.proto.at_gap(s),
        };
        self.fences[s]
            .poll(&mut self.tables[s], &mut io, |_| ())
            .unwrap();
        self.fences[s].take_changes();
    }

    fn record_reads(&mut self, w: u64, s: usize) {
        let mut r = Reads::default();
        for slot in 0..SLOTS as u32 {
            if let Some((_, e)) = self.tables[s].owner(slot) {
                if self.dev.slot[s][slot as usize] != Bytes::Expert(e) {
                    self.dev.violations.push(format!(
                        "stage {s}: window {w} reads slot {slot} before expert {e} landed"
                    ));
                }
                r.slots.push((slot, e));
            }
        }
        for (&e, &pl) in &self.ram[s] {
            if self.dev.place[s][pl] != Bytes::Expert(e) {
                self.dev.violations.push(format!(
                    "stage {s}: window {w} reads RAM place {pl} before expert {e} is there"
                ));
            }
            r.places.push((pl, e));
        }
        self.dev.reads.insert((w, s), r);
    }

    fn apply(&mut self, a: Act) {
        // a tier event is news for every stage's next gap (a window's leave takes its own)
        if matches!(
            a,
            Act::CopyDone(_) | Act::JobTick | Act::JobReturn | Act::JobRam
        ) {
            self.since_gap.iter_mut().for_each(|g| *g = true);
        }
        match a {
            Act::Launch => {
                let (w, t) = self.proto.launch().unwrap();
                self.entered(w, 0, t);
            }
            Act::Enter(w, s) => {
                let t = self.proto.enter(w, s).unwrap();
                self.entered(w, s, t);
            }
            Act::Leave(w, s) => {
                // the loop's next step on the stage it left is that stage's gap
                self.proto.leave(w, s).unwrap();
                self.dev.reads.remove(&(w, s));
                self.gap(s);
            }
            Act::Verdict(w) => {
                // every second verdict is a forced miss: the speculative window is discarded
                let ok = self.verdicts.is_multiple_of(2);
                self.verdicts += 1;
                self.accepted += ok as u32;
                self.proto.finish(w, ok).unwrap();
            }
            Act::Gap(s) => self.gap(s),
            Act::CopyDone(i) => {
                let (s, slot, e, ev) = &self.dev.copies[i];
                self.dev.slot[*s][*slot as usize] = Bytes::Expert(*e);
                ev.0.store(true, Ordering::Release);
            }
            Act::JobTick => {
                if self.cfg.rules.job_device_call {
                    let card = self.proto.card(self.n() - 1);
                    if self.proto.windows_in_flight() > 0 {
                        self.dev
                            .violations
                            .push("a device call from the job thread while a window waits".into());
                    }
                    self.job = Job::Tick(Some(card));
                } else {
                    self.job_choose();
                }
            }
            Act::JobReturn => self.job_choose(),
            Act::JobRam => {
                // host work only: the evicted experts' bytes into the places the incoming
                // ones leave
                for sw in &self.swaps {
                    for ((w, st), r) in &self.dev.reads {
                        if *st == sw.stage && r.places.iter().any(|&(p, _)| p == sw.place) {
                            self.dev.violations.push(format!(
                                "stage {st}: RAM move into place {} while window {w} may read it",
                                sw.place
                            ));
                        }
                    }
                    self.dev.place[sw.stage][sw.place] = Bytes::Expert(sw.out);
                }
                self.job = Job::Idle;
                self.round = Round::Moved;
            }
        }
    }

    /// The job thread's choice (host work: the routing counts, the bounce copies): on every
    /// stage, the resident expert out, the lowest expert in RAM in.
    fn job_choose(&mut self) {
        self.swaps = (0..self.n())
            .map(|s| {
                let out = self.tables[s].owner(0).expect("slot 0 is resident").1;
                let (&into, &place) = self.ram[s].iter().next().expect("an expert in RAM");
                SwapM {
                    stage: s,
                    slot: 0,
                    out,
                    into,
                    place,
                }
            })
            .collect();
        self.job = Job::Idle;
        self.round = Round::Chosen;
    }

    /// The loop's thread at a gap of stage `s`: the stage's fences advance (the only device
    /// calls), then the round's host steps.
    fn gap(&mut self, s: usize) {
        self.proto.gap(s).unwrap();
        self.since_gap[s] = false;
        if self.round == Round::Chosen {
            // step 2 at any tick: every stage's victim is unmapped now, also on a stage that
            // has a window in flight (its copy waits in that stage's queue for its gap)
            for sw in &self.swaps {
                let (st, key) = (sw.stage, (0, sw.into));
                self.fences[st]
                    .retire(&mut self.tables[st], sw.slot, key, sw.into)
                    .unwrap();
            }
            self.round = Round::Copying;
        }
        self.poll(s);
        if self.cfg.rules.poll_card {
            let card = self.proto.card(s);
            let others: Vec<usize> = (0..self.n())
                .filter(|&o| o != s && self.proto.card(o) == card)
                .collect();
            for o in others {
                self.poll(o);
            }
        }
        if self.round == Round::Copying
            && self
                .swaps
                .iter()
                .all(|sw| self.tables[sw.stage].slot(0, sw.into) == Some(sw.slot))
        {
            // step 3: the incoming experts are read from VRAM from now on; their RAM places
            // go to the evicted ones once every stage that exchanged has passed a gap
            for sw in &self.swaps {
                self.ram[sw.stage].remove(&sw.into);
            }
            let stages: Vec<usize> = if self.cfg.rules.no_ram_fence {
                Vec::new()
            } else {
                self.swaps.iter().map(|sw| sw.stage).collect()
            };
            self.round = Round::Fenced(self.proto.ram_fence(&stages).unwrap());
        }
        if let Round::Fenced(id) = self.round {
            if self.proto.take_ram_ready().contains(&id) {
                self.round = Round::Moving;
                self.job = Job::Ram;
            }
        }
        if self.round == Round::Moved {
            for sw in &self.swaps {
                self.ram[sw.stage].insert(sw.out, sw.place);
            }
            self.rounds_done += 1;
            self.round = Round::Idle;
        }
        if self.round == Round::Idle && self.rounds_done < self.cfg.rounds {
            self.round = Round::Asked;
            self.job = Job::Tick(None);
        }
    }

    fn finished(&self) -> bool {
        self.accepted == self.cfg.accept
            && self.proto.windows_in_flight() == 0
            && self.rounds_done == self.cfg.rounds
            && self.fences.iter().all(|f| f.settled())
    }

    fn digest(&self) -> u64 {
        let mut h = DefaultHasher::new();
        format!("{:?}", self.proto).hash(&mut h);
        for f in &self.fences {
            format!("{f:?}").hash(&mut h);
        }
        format!("{:?}", self.tables).hash(&mut h);
        format!("{:?}", self.ram).hash(&mut h);
        self.dev.slot.hash(&mut h);
        self.dev.place.hash(&mut h);
        for c in &self.dev.copies {
            (c.0, c.1, c.2, c.3 .0.load(Ordering::Acquire)).hash(&mut h);
        }
        for (k, r) in &self.dev.reads {
            (k, r).hash(&mut h);
        }
        (&self.job, &self.round, self.rounds_done).hash(&mut h);
        (self.verdicts, self.accepted, &self.since_gap).hash(&mut h);
        h.finish()
    }
}

#[derive(Debug, Default)]
struct Report {
    states: usize,
    /// The first violation found and the actions that lead to it.
    violation: Option<(String, Vec<Act>)>,
    /// A reachable state with no action that is not the finished state.
    stuck: Option<Vec<Act>>,
    /// States from which the finished state cannot be reached.
    no_finish: usize,
    finished: usize,
}

fn replay(cfg: &Cfg, path: &[Act]) -> Sys {
    let mut s = Sys::new(cfg);
    for &a in path {
        s.apply(a);
    }
    s
}

/// Every interleaving, depth-first; a state seen before is not expanded again. Stops at the
/// first violation (a state that breaks a rule is not expanded); violations containing one of
/// `ignore` are not counted.
fn explore(cfg: &Cfg, limit: usize, ignore: &[&str]) -> Report {
    let mut rep = Report::default();
    let mut ids: HashMap<u64, usize> = HashMap::new();
    let mut succ: Vec<Vec<usize>> = Vec::new();
    let mut done: Vec<bool> = Vec::new();
    let start = Sys::new(cfg);
    ids.insert(start.digest(), 0);
    succ.push(Vec::new());
    done.push(start.finished());
    let mut stack: Vec<(usize, Vec<Act>)> = vec![(0, Vec::new())];
    while let Some((id, path)) = stack.pop() {
        let sys = replay(cfg, &path);
        let acts = sys.enabled();
        if acts.is_empty() && !sys.finished() && rep.stuck.is_none() {
            rep.stuck = Some(path.clone());
        }
        for a in acts {
            let mut next = replay(cfg, &path);
            next.apply(a);
            let mut p2 = path.clone();
            p2.push(a);
            let counted = next
                .dev
                .violations
                .iter()
                .find(|v| !ignore.iter().any(|i| v.contains(i)));
            if let Some(v) = counted {
                rep.violation = Some((v.clone(), p2));
                rep.states = succ.len();
                return rep;
            }
            let d = next.digest();
            let nid = match ids.get(&d) {
                Some(&n) => n,
                None => {
                    let n = succ.len();
                    ids.insert(d, n);
                    succ.push(Vec::new());
                    done.push(next.finished());
                    stack.push((n, p2));
                    n
                }
            };
            succ[id].push(nid);
        }
        assert!(succ.len() <= limit, "more than {limit} states");
    }
    // backwards from the finished states
    let mut pred: Vec<Vec<usize>> = vec![Vec::new(); succ.len()];
    for (a, bs) in succ.iter().enumerate() {
        for &b in bs {
            pred[b].push(a);
        }
    }
    let mut reach = done.clone();
    let mut work: Vec<usize> = (0..done.len()).filter(|&i| done[i]).collect();
    while let Some(b) = work.pop() {
        for &a in &pred[b] {
            if !reach[a] {
                reach[a] = true;
                work.push(a);
            }
        }
    }
    rep.states = succ.len();
    rep.finished = done.iter().filter(|&&d| d).count();
    rep.no_finish = reach.iter().filter(|&&r| !r).count();
    rep
}

fn cfg(cards: &[usize], windows: usize, rules: Rules) -> Cfg {
    Cfg {
        stage_card: cards.to_vec(),
        windows,
        accept: 2,
        rounds: 2,
        rules,
    }
}

const LIMIT: usize = 3_000_000;

fn assert_sound(c: &Cfg) -> Report {
    let r = explore(c, LIMIT, &[]);
    assert!(r.violation.is_none(), "{c:?}: {:?}", r.violation);
    assert!(r.stuck.is_none(), "{c:?}: stuck after {:?}", r.stuck);
    assert_eq!(r.no_finish, 0, "{c:?}: states that cannot finish");
    assert!(r.finished > 0 && r.states > 100, "{c:?}: {r:?}");
    r
}

fn sound(cards: &[usize], windows: usize, rounds: u32) {
    let t = std::time::Instant::now();
    let mut c = cfg(cards, windows, Rules::default());
    c.rounds = rounds;
    let r = assert_sound(&c);
    eprintln!(
        "cards {cards:?} windows {windows} rounds {rounds}: {} states, {} finished, {:.1} s",
        r.states,
        r.finished,
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn protocol_holds_for_every_interleaving() {
    // one GPU as two stages with two windows in flight; one stage
    sound(&[0, 0], 2, 2);
    sound(&[0], 1, 2);
}

// Longer runs (tens of seconds each in release): `cargo test --release
// --no-default-features tests_protocol -- --ignored`.
#[test]
#[ignore = "long: run with --ignored"]
fn protocol_holds_on_two_cards_and_with_one_window() {
    sound(&[0, 1], 2, 2);
    sound(&[0, 0], 1, 2);
}

#[test]
#[ignore = "long: run with --ignored"]
fn three_stages_two_windows() {
    sound(&[0, 0, 1], 2, 1);
}

/// What rule 1 says about the variant below (ignored there, to look at the slots alone).
const QUEUED_IN_FLIGHT: &str = "copy queued with a window in flight";

#[test]
fn gap_tickets_hold_copies_back_even_when_polled_beside_a_window() {
    // a gap of one stage also polls the other stage on its card, whose window may be in
    // flight: the gap tickets keep every copy back until that stage's own gap
    let c = cfg(
        &[0, 0],
        2,
        Rules {
            poll_card: true,
            ..Rules::default()
        },
    );
    let r = explore(&c, LIMIT, &[]);
    assert!(r.violation.is_none(), "{:?}", r.violation);
    assert!(r.stuck.is_none() && r.no_finish == 0, "{r:?}");
}

/// The first violation found in the variant `rules` on `cards` (two windows), past those
/// containing one of `ignore`: it must contain `needle`.
fn caught(cards: &[usize], rules: Rules, ignore: &[&str], needle: &str) {
    let (v, path) = explore(&cfg(cards, 2, rules), LIMIT, ignore)
        .violation
        .unwrap_or_else(|| panic!("{rules:?} on {cards:?}: no violation found"));
    assert!(v.contains(needle), "{v} after {path:?}");
}

#[test]
fn checker_catches_a_copy_without_the_gap_fence() {
    let rules = Rules {
        poll_card: true,
        no_step_fence: true,
        ..Rules::default()
    };
    // rule 1 is what the gap tickets stood for: the first thing caught; past it, the copy
    // under a reader
    caught(&[0, 0], rules, &[], QUEUED_IN_FLIGHT);
    caught(&[0, 0], rules, &[QUEUED_IN_FLIGHT], "copy into slot");
}

#[test]
fn checker_catches_a_ram_move_without_the_fence() {
    let rules = Rules {
        no_ram_fence: true,
        ..Rules::default()
    };
    caught(&[0, 1], rules, &[], "RAM move");
}

#[test]
fn checker_catches_a_device_call_from_the_job_thread() {
    let rules = Rules {
        job_device_call: true,
        ..Rules::default()
    };
    caught(&[0, 1], rules, &[], "job thread");
}

#[test]
fn checker_catches_the_stall_of_a_loop_waiting_on_a_blocked_job() {
    // issue #31's freeze: the job blocks in the driver behind a window, the loop waits for
    // the job, and the window needs the loop. Violations are not reported here; the stall is.
    let c = cfg(
        &[0, 1],
        2,
        Rules {
            job_device_call: true,
            loop_waits_for_job: true,
            ..Rules::default()
        },
    );
    let mut rep = Report::default();
    // explore without stopping at the rule-1 violation
    let mut stack = vec![Vec::<Act>::new()];
    let mut seen = std::collections::HashSet::new();
    while let Some(path) = stack.pop() {
        let sys = replay(&c, &path);
        if !seen.insert(sys.digest()) {
            continue;
        }
        let acts = sys.enabled();
        if acts.is_empty() && !sys.finished() {
            rep.stuck = Some(path);
            break;
        }
        for a in acts {
            let mut p = path.clone();
            p.push(a);
            stack.push(p);
        }
    }
    let path = rep.stuck.expect("the stall must be found");
    let sys = replay(&c, &path);
    assert!(
        sys.loop_blocked() && sys.proto.windows_in_flight() > 0,
        "{path:?}"
    );
}
