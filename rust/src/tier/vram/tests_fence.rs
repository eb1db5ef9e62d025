//! The fence protocol under a fake device: swaps forced on every step, step and copy events
//! completing in random order, and a checker that fails the test if any step in flight could
//! read a slot being overwritten or a slot whose copy has not landed. Then the driver (sync and
//! async) on the same fake, including seed 003's rule: no device call off the step thread, and
//! the step thread never waits for the helper.

use super::*;
use crate::tier::counters::RoutingCounters;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::ThreadId;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

#[derive(Clone)]
struct Ev(Arc<AtomicBool>);
impl Ev {
    fn new() -> Ev {
        Ev(Arc::new(AtomicBool::new(false)))
    }
    fn fire(&self) {
        self.0.store(true, Ordering::Release);
    }
}
impl Fence for Ev {
    fn done(&self) -> crate::error::Result<bool> {
        Ok(self.0.load(Ordering::Acquire))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Content {
    Empty,
    /// A copy is writing the slot.
    Garbage,
    Expert(Key),
}

/// A staging buffer: which expert's bytes it holds.
#[derive(Debug)]
struct Staged(Option<Key>);

/// The fake device: slot memory, copies and steps in flight, and the checker.
struct Device {
    content: Vec<Content>,
    copies: Vec<(Ev, u32, Key)>,
    /// Steps in flight: their event and the (slot, expert) pairs they read.
    steps: Vec<(Ev, Vec<(u32, Key)>)>,
    violations: Vec<String>,
    step_thread: ThreadId,
    fills: usize,
    /// Copies land as soon as they are issued (the start fill, where no step runs).
    instant: bool,
}

impl Device {
    fn new(n_slots: usize) -> Device {
        Device {
            content: vec![Content::Empty; n_slots],
            copies: Vec::new(),
            steps: Vec::new(),
            violations: Vec::new(),
            step_thread: std::thread::current().id(),
            fills: 0,
            instant: false,
        }
    }

    /// Launch a step that routes to `routed`: it reads the slots the table says hold them.
    fn launch(&mut self, table: &VramTable, routed: &[Key]) -> Ev {
        let mut reads = Vec::new();
        for &(l, e) in routed {
            if let Some(s) = table.slot(l as usize, e) {
                if self.content[s as usize] != Content::Expert((l, e)) {
                    self.violations.push(format!(
                        "step launched reading slot {s} for {:?} but it holds {:?}",
                        (l, e),
                        self.content[s as usize]
                    ));
                }
                reads.push((s, (l, e)));
            }
        }
        let ev = Ev::new();
        self.steps.push((ev.clone(), reads));
        ev
    }

    /// Every step in flight still sees what it planned with.
    fn check(&mut self) {
        for (_, reads) in &self.steps {
            for &(s, k) in reads {
                if self.content[s as usize] != Content::Expert(k) {
                    self.violations.push(format!(
                        "slot {s} changed under a step in flight: expected {k:?}, holds {:?}",
                        self.content[s as usize]
                    ));
                }
            }
        }
    }

    /// Complete a random subset of steps and copies (any order).
    fn advance(&mut self, rng: &mut Rng, p_step: f64, p_copy: f64, in_order_steps: bool) {
        self.check();
        let mut i = 0;
        while i < self.steps.len() {
            if rng.chance(p_step) {
                self.steps.remove(i).0.fire();
            } else if in_order_steps {
                break;
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.copies.len() {
            if rng.chance(p_copy) {
                let (ev, s, k) = self.copies.remove(i);
                self.content[s as usize] = Content::Expert(k);
                ev.fire();
            } else {
                i += 1;
            }
        }
    }
}

impl SlotIo<Staged> for Device {
    type Event = Ev;
    fn issue_fill(&mut self, slot: u32, key: Key, payload: &Staged) -> crate::error::Result<Ev> {
        if std::thread::current().id() != self.step_thread {
            self.violations
                .push("a device call came from a thread other than the step thread".into());
        }
        if payload.0 != Some(key) {
            self.violations.push(format!(
                "slot {slot} filled for {key:?} from a buffer staged with {:?}",
                payload.0
            ));
        }
        for (_, reads) in &self.steps {
            if reads.iter().any(|&(s, _)| s == slot) {
                self.violations.push(format!(
                    "copy into slot {slot} issued while a step in flight reads it"
                ));
            }
        }
        let ev = Ev::new();
        self.fills += 1;
        if self.instant {
            self.content[slot as usize] = Content::Expert(key);
            ev.fire();
            return Ok(ev);
        }
        self.content[slot as usize] = Content::Garbage;
        self.copies.push((ev.clone(), slot, key));
        Ok(ev)
    }
}

const NL: usize = 3;
const NE: usize = 12;

fn random_keys(rng: &mut Rng, n: usize) -> Vec<Key> {
    (0..n)
        .map(|_| (rng.below(NL) as u32, rng.below(NE) as u32))
        .collect()
}

/// Swaps forced on EVERY step (as many as there are evictable slots, up to 3), steps and
/// copies completing at random in any order, 40 seeds × 300 steps. The checker sees every
/// step's reads at launch and at every tick until it completes.
fn forced_swaps(seed: u64, in_order_steps: bool) -> (usize, usize) {
    let mut rng = Rng(seed * 0x9e37_79b9 + 1);
    let n_slots = 5;
    let mut table = VramTable::new(NL, NE, n_slots);
    let mut fences: SlotFences<Ev, Staged> = SlotFences::new(n_slots);
    let mut dev = Device::new(n_slots);
    let mut swaps = 0;
    for _ in 0..300 {
        // Retire up to 3 evictable slots towards random experts neither resident nor pending
        // (36 experts, 5 slots: there is always one).
        let mut ev = fences.evictable();
        let had = !ev.is_empty();
        let mut retired = 0;
        for _ in 0..3 {
            if ev.is_empty() {
                break;
            }
            let (slot, _) = ev.swap_remove(rng.below(ev.len()));
            let key = loop {
                let k = (rng.below(NL) as u32, rng.below(NE) as u32);
                if table.slot(k.0 as usize, k.1).is_none() && !fences.pending(k) {
                    break k;
                }
            };
            fences
                .retire(&mut table, slot, key, Staged(Some(key)))
                .unwrap();
            retired += 1;
        }
        assert!(!had || retired > 0);
        swaps += retired;
        fences.poll(&mut table, &mut dev, drop).unwrap();
        let routed = random_keys(&mut rng, 8);
        let sev = dev.launch(&table, &routed);
        fences.step_launched(sev);
        for _ in 0..rng.below(3) {
            dev.advance(&mut rng, 0.3, 0.4, in_order_steps);
            fences.poll(&mut table, &mut dev, drop).unwrap();
        }
    }
    // Drain: everything completes and settles.
    for _ in 0..10_000 {
        if fences.settled() && dev.steps.is_empty() {
            break;
        }
        dev.advance(&mut rng, 0.5, 0.5, in_order_steps);
        fences.poll(&mut table, &mut dev, drop).unwrap();
    }
    assert!(fences.settled(), "seed {seed}: slots never settled");
    assert!(
        dev.violations.is_empty(),
        "seed {seed}: {:?}",
        &dev.violations[..3.min(dev.violations.len())]
    );
    // The host table agrees with the device memory.
    for s in 0..n_slots as u32 {
        match table.owner(s) {
            Some(k) => assert_eq!(dev.content[s as usize], Content::Expert(k)),
            None => assert!(matches!(fences.state(s), Some(SlotState::Free))),
        }
    }
    (swaps, dev.fills)
}

#[test]
fn fence_holds_with_swaps_on_every_step_and_random_completion() {
    let mut total = 0;
    for seed in 0..40 {
        let (swaps, fills) = forced_swaps(seed, seed % 2 == 0);
        assert_eq!(swaps, fills, "seed {seed}: every retire leads to one copy");
        total += swaps;
    }
    assert!(total > 40 * 100, "too few swaps exercised: {total}");
}

/// The checker can fail: a copy issued into a slot that a step in flight reads is caught.
#[test]
fn checker_catches_an_unfenced_copy() {
    let mut table = VramTable::new(NL, NE, 2);
    let mut dev = Device::new(2);
    table.map((0, 1), 0).unwrap();
    dev.content[0] = Content::Expert((0, 1));
    let _ev = dev.launch(&table, &[(0, 1)]);
    assert!(dev.violations.is_empty());
    dev.issue_fill(0, (1, 1), &Staged(Some((1, 1)))).unwrap();
    dev.check();
    assert!(dev.violations.len() >= 2, "{:?}", dev.violations);
}

/// The copy waits for every step launched before the retire — also when a later step
/// completes first — and the new expert is published only when its copy has landed.
#[test]
fn fence_waits_for_earlier_steps_in_any_order() {
    let mut table = VramTable::new(NL, NE, 1);
    let mut fences: SlotFences<Ev, Staged> = SlotFences::new(1);
    let mut dev = Device::new(1);
    fences
        .retire(&mut table, 0, (0, 0), Staged(Some((0, 0))))
        .unwrap();
    fences.poll(&mut table, &mut dev, drop).unwrap();
    assert_eq!(
        dev.fills, 1,
        "a free slot with no step in flight fills at once"
    );
    let (ev, _, _) = dev.copies.remove(0);
    dev.content[0] = Content::Expert((0, 0));
    assert_eq!(
        table.slot(0, 0),
        None,
        "not published before the copy lands"
    );
    ev.fire();
    let o = fences.poll(&mut table, &mut dev, drop).unwrap();
    assert_eq!((o.filled, table.slot(0, 0)), (1, Some(0)));
    assert_eq!(fences.take_changes(), vec![((0, 0), Some(0))]);

    let s0 = dev.launch(&table, &[(0, 0)]);
    fences.step_launched(s0.clone());
    let s1 = dev.launch(&table, &[(0, 0)]);
    fences.step_launched(s1.clone());
    assert_eq!(
        fences
            .retire(&mut table, 0, (2, 5), Staged(Some((2, 5))))
            .unwrap(),
        Some((0, 0))
    );
    assert_eq!(table.slot(0, 0), None, "unmapped at retire");
    assert_eq!(fences.take_changes(), vec![((0, 0), None)]);
    let s2 = dev.launch(&table, &[(0, 0)]);
    fences.step_launched(s2.clone());
    s2.fire();
    s1.fire();
    fences.poll(&mut table, &mut dev, drop).unwrap();
    assert_eq!(dev.fills, 1, "step 0 is still in flight");
    s0.fire();
    dev.steps.clear();
    let o = fences.poll(&mut table, &mut dev, drop).unwrap();
    assert_eq!(o.issued, 1);
    // Retiring a slot that is changing, or towards a pending/resident key, is refused.
    assert!(fences.retire(&mut table, 0, (1, 1), Staged(None)).is_err());
    let mut f2: SlotFences<Ev, Staged> = SlotFences::new(2);
    assert!(f2.retire(&mut table, 1, (2, 5), Staged(None)).is_ok());
    assert!(f2.retire(&mut table, 0, (2, 5), Staged(None)).is_err());
    assert!(f2.retire(&mut table, 9, (1, 1), Staged(None)).is_err());
}

/// Stages on whatever thread runs it; records the threads and can be held (to prove the step
/// thread does not wait for it).
struct FakeStager {
    threads: Arc<std::sync::Mutex<Vec<ThreadId>>>,
    hold: Option<mpsc::Receiver<()>>,
}

impl Stager for FakeStager {
    type Buf = Staged;
    fn stage(&mut self, key: Key, buf: &mut Staged) -> crate::error::Result<u64> {
        self.threads
            .lock()
            .unwrap()
            .push(std::thread::current().id());
        if let Some(h) = &self.hold {
            // Held until the test releases it (bounded, so a bug fails instead of hanging).
            let _ = h.recv_timeout(std::time::Duration::from_secs(20));
        }
        buf.0 = Some(key);
        Ok(1000)
    }
}

/// Run the driver for `steps` steps with routing concentrated on a hot set; returns the
/// device (for its checks) and the final table.
fn drive(
    async_tier: bool,
    seed: u64,
    steps: u64,
) -> (Device, VramTable, Arc<HybridCounters>, Vec<ThreadId>) {
    let mut rng = Rng(seed);
    let n_slots = 6;
    let counters = Arc::new(RoutingCounters::new(NL, NE, 32.0));
    let stats = Arc::new(HybridCounters::new(NL));
    let threads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stager = FakeStager {
        threads: threads.clone(),
        hold: None,
    };
    let bufs = (0..4).map(|_| Staged(None)).collect();
    let cfg = AdaptConfig {
        every: 2,
        swaps: 2,
        ratio: 1.5,
        margin: 2.0,
    };
    let mut drv = TierDriver::new(
        stager,
        bufs,
        counters.clone(),
        vec![true; NL],
        cfg,
        async_tier,
        Some(stats.clone()),
    )
    .unwrap();
    assert_eq!(drv.is_async(), async_tier);
    let mut table = VramTable::new(NL, NE, n_slots);
    let mut fences: SlotFences<Ev, Staged> = SlotFences::new(n_slots);
    let mut dev = Device::new(n_slots);
    // Start: uniform fill of the 6 slots.
    let order = fill_order(
        &[Some(ExpertShape {
            gate: 1,
            up: 1,
            down: 1,
        }); NL],
        NE,
        None,
    );
    let mut st = FakeStager {
        threads: threads.clone(),
        hold: None,
    };
    let mut sbufs: Vec<Staged> = (0..2).map(|_| Staged(None)).collect();
    dev.instant = true;
    start_fill(
        &mut st,
        &mut sbufs,
        &initial_assignment(&order, n_slots),
        &mut fences,
        &mut table,
        &mut dev,
        Some(&stats),
        std::thread::yield_now,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    dev.instant = false;
    assert_eq!(table.resident(), n_slots);
    assert_eq!(stats.snapshot().fill_bytes, 1000 * n_slots as u64);
    assert_eq!(sbufs.len(), 2, "staging buffers come back");
    threads.lock().unwrap().clear();
    // Hot set: experts 7..9 of every layer (9 experts for 6 slots, so swaps never stop).
    for step in 1..=steps {
        let routed: Vec<Key> = (0..6)
            .map(|_| {
                let l = rng.below(NL) as u32;
                let e = if rng.chance(0.8) {
                    7 + rng.below(3)
                } else {
                    rng.below(NE)
                } as u32;
                (l, e)
            })
            .collect();
        for &(l, e) in &routed {
            counters.observe(l as usize, &[e]);
        }
        let ev = dev.launch(&table, &routed);
        fences.step_launched(ev);
        counters.end_step();
        let g = drv.at_gap(step, &mut fences, &mut table, &mut dev).unwrap();
        assert!(g.issued <= n_slots);
        dev.advance(&mut rng, 0.5, 0.5, false);
        if async_tier {
            // A step takes time; the helper runs meanwhile (on a loaded machine it may still
            // lag: its replies then land at later gaps, which is the design).
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
    for step in steps + 1..steps + 2000 {
        if fences.settled() && dev.steps.is_empty() {
            break;
        }
        dev.advance(&mut rng, 0.5, 0.5, false);
        drv.at_gap(step * 2 + 1, &mut fences, &mut table, &mut dev)
            .unwrap();
    }
    let th = threads.lock().unwrap().clone();
    (dev, table, stats, th)
}

#[test]
fn driver_sync_and_async_keep_the_fence_and_find_the_hot_set() {
    for async_tier in [false, true] {
        for seed in 1..4 {
            let (dev, table, stats, stage_threads) = drive(async_tier, seed, 400);
            assert!(
                dev.violations.is_empty(),
                "async={async_tier}: {:?}",
                dev.violations
            );
            let snap = stats.snapshot();
            assert!(snap.swaps > 0, "async={async_tier}: no swap");
            // Most resident experts are from the hot set (7..9).
            let hot = (0..6u32)
                .filter_map(|s| table.owner(s))
                .filter(|&(_, e)| (7..10).contains(&e))
                .count();
            assert!(
                hot >= 5,
                "async={async_tier} seed {seed}: {hot} hot residents"
            );
            let me = std::thread::current().id();
            if async_tier {
                assert!(
                    stage_threads.iter().all(|&t| t != me),
                    "staged on the step thread"
                );
            } else {
                assert!(stage_threads.iter().all(|&t| t == me));
            }
        }
    }
}

/// Seed 003's rule, async variant: while the helper is stuck staging, the step thread's gaps
/// return at once (they never wait on it); the swap lands once the helper is released.
#[test]
fn async_gaps_never_wait_for_the_helper() {
    let counters = Arc::new(RoutingCounters::new(1, 4, 0.0));
    let (release, hold) = mpsc::channel();
    let threads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stager = FakeStager {
        threads: threads.clone(),
        hold: Some(hold),
    };
    let cfg = AdaptConfig {
        every: 1,
        swaps: 1,
        ratio: 1.5,
        margin: 2.0,
    };
    let mut drv = TierDriver::new(
        stager,
        vec![Staged(None)],
        counters.clone(),
        vec![true],
        cfg,
        true,
        None,
    )
    .unwrap();
    let mut table = VramTable::new(1, 4, 1);
    let mut fences: SlotFences<Ev, Staged> = SlotFences::new(1);
    let mut dev = Device::new(1);
    dev.instant = true;
    fences
        .retire(&mut table, 0, (0, 0), Staged(Some((0, 0))))
        .unwrap();
    fences.poll(&mut table, &mut dev, drop).unwrap();
    assert_eq!(table.slot(0, 0), Some(0));
    counters.observe(0, &[3; 50]);
    let t0 = std::time::Instant::now();
    for step in 1..=200 {
        let ev = dev.launch(&table, &[(0, 3), (0, 0)]);
        fences.step_launched(ev.clone());
        let g = drv.at_gap(step, &mut fences, &mut table, &mut dev).unwrap();
        assert_eq!(
            g.retired, 0,
            "nothing can be ready while the helper is held"
        );
        ev.fire();
        dev.steps.clear();
    }
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(10),
        "the step thread waited for the helper"
    );
    release.send(()).unwrap();
    let mut step = 200;
    while table.slot(0, 3).is_none() {
        step += 1;
        assert!(step < 200_000, "the swap never landed");
        drv.at_gap(step, &mut fences, &mut table, &mut dev).unwrap();
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    assert!(dev.violations.is_empty(), "{:?}", dev.violations);
    assert_eq!(table.slot(0, 0), None);
}
