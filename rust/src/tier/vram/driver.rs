//! The adaptive tier's driver: when to choose swaps, who stages the bytes, and when copies are
//! issued. Two variants:
//!
//! - **sync** (`tier_async = false`): at a gap after every `adapt_every`-th step the step
//!   thread chooses, stages the bytes into pinned buffers itself (a RAM memcpy) and retires the
//!   victims; copies are issued by `poll` at this and later gaps.
//! - **async** (`tier_async = true`): a helper thread chooses and stages (host work only: it
//!   reads the routing counters and RAM, writes pinned host buffers, and never calls the
//!   device); the step thread, at each gap, picks up what is ready with a non-blocking
//!   `try_recv`, retires and polls. So every device call (copy issue, event query) comes from
//!   the step thread at a gap, never from a thread that runs beside a step in flight (seed
//!   003's rule), and the step thread never waits on the helper.
//!
//! A gap is a moment the step thread has no host-side wait open for the GPU (between steps);
//! a step in flight on the GPU is fine, the fences keep its slots intact.

use super::adapt::{choose, AdaptConfig, Swap};
use super::fence::{Fence, SlotFences, SlotIo, SlotState};
use super::stats::HybridCounters;
use super::table::{Key, VramTable};
use crate::error::{Error, Result};
use crate::tier::counters::RoutingCounters;
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;

/// Host-only work of a swap: put expert `key`'s bytes (the slot record layout) into a staging
/// buffer. Runs on the helper thread in the async variant, so it must not call the device.
pub trait Stager: Send + 'static {
    type Buf: Send + 'static;
    /// Returns the bytes staged (counted as moved once the copy is issued).
    fn stage(&mut self, key: Key, buf: &mut Self::Buf) -> Result<u64>;
}

/// A staged swap, ready to retire its victim.
pub struct Prepared<B> {
    pub swap: Swap,
    pub buf: B,
    pub bytes: u64,
}

/// What the helper needs to choose: the table and slot states as of the request.
struct Tick {
    table: VramTable,
    evictable: Vec<(u32, Option<Key>)>,
    pending: Vec<Key>,
}

enum Msg<B> {
    Tick(Tick),
    Recycle(B),
}

/// Choose and stage, limited by the free staging buffers. Shared by both variants.
#[allow(clippy::too_many_arguments)]
fn prepare<S: Stager>(
    stager: &mut S,
    free: &mut Vec<S::Buf>,
    counters: &RoutingCounters,
    has_experts: &[bool],
    cfg: &AdaptConfig,
    tick: &Tick,
) -> Vec<Prepared<S::Buf>> {
    let mut c = *cfg;
    c.swaps = c.swaps.min(free.len() as u32);
    let counts = counters.snapshot();
    let swaps = choose(
        &tick.table,
        &counts,
        &tick.evictable,
        &tick.pending,
        |l| has_experts.get(l).copied().unwrap_or(false),
        &c,
    );
    let mut out = Vec::with_capacity(swaps.len());
    for swap in swaps {
        let mut buf = free.pop().expect("swaps are capped by the free buffers");
        match stager.stage(swap.into, &mut buf) {
            Ok(bytes) => out.push(Prepared { swap, buf, bytes }),
            Err(_) => free.push(buf), // a failed read skips this swap; the next tick may retry
        }
    }
    out
}

enum Engine<S: Stager> {
    Inline {
        stager: S,
        free: Vec<S::Buf>,
    },
    Thread {
        tx: Sender<Msg<S::Buf>>,
        rx: Receiver<Vec<Prepared<S::Buf>>>,
        handle: Option<std::thread::JoinHandle<()>>,
        outstanding: bool,
    },
}

/// What one gap did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GapOutcome {
    /// Victims retired (swaps started).
    pub retired: usize,
    /// Prepared swaps dropped because the table moved on meanwhile (async only).
    pub stale: usize,
    pub issued: usize,
    pub filled: usize,
}

pub struct TierDriver<S: Stager> {
    engine: Engine<S>,
    counters: Arc<RoutingCounters>,
    has_experts: Vec<bool>,
    cfg: AdaptConfig,
    stats: Option<Arc<HybridCounters>>,
}

impl<S: Stager> TierDriver<S> {
    /// `bufs`: the pinned staging buffers (their number caps the swaps in flight).
    /// `has_experts[l]`: layer `l` has routed experts.
    pub fn new(
        stager: S,
        bufs: Vec<S::Buf>,
        counters: Arc<RoutingCounters>,
        has_experts: Vec<bool>,
        cfg: AdaptConfig,
        async_tier: bool,
        stats: Option<Arc<HybridCounters>>,
    ) -> Result<Self> {
        let engine = if async_tier {
            let (tx, hrx) = channel::<Msg<S::Buf>>();
            let (htx, rx) = channel();
            let (c2, he2) = (counters.clone(), has_experts.clone());
            let mut stager = stager;
            let mut free = bufs;
            let handle = std::thread::Builder::new()
                .name("strata-tier".into())
                .spawn(move || {
                    while let Ok(m) = hrx.recv() {
                        match m {
                            Msg::Recycle(b) => free.push(b),
                            Msg::Tick(t) => {
                                let p = prepare(&mut stager, &mut free, &c2, &he2, &cfg, &t);
                                if htx.send(p).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                })
                .map_err(|e| Error::Config(format!("cannot start the tier thread: {e}")))?;
            Engine::Thread {
                tx,
                rx,
                handle: Some(handle),
                outstanding: false,
            }
        } else {
            Engine::Inline { stager, free: bufs }
        };
        Ok(TierDriver {
            engine,
            counters,
            has_experts,
            cfg,
            stats,
        })
    }

    pub fn is_async(&self) -> bool {
        matches!(self.engine, Engine::Thread { .. })
    }

    pub fn config(&self) -> &AdaptConfig {
        &self.cfg
    }

    /// Retire the victims of `ready` whose choice still holds; the others' buffers go back.
    fn apply<E: Fence>(
        ready: Vec<Prepared<S::Buf>>,
        fences: &mut SlotFences<E, S::Buf>,
        table: &mut VramTable,
        stats: &Option<Arc<HybridCounters>>,
        mut give_back: impl FnMut(S::Buf),
        out: &mut GapOutcome,
    ) -> Result<()> {
        for p in ready {
            let still = match fences.state(p.swap.slot) {
                Some(SlotState::Ready(k)) => Some(*k) == p.swap.out,
                Some(SlotState::Free) => p.swap.out.is_none(),
                _ => false,
            };
            let into = p.swap.into;
            let fresh = table.slot(into.0 as usize, into.1).is_none() && !fences.pending(into);
            if still && fresh {
                fences.retire(table, p.swap.slot, into, p.buf)?;
                out.retired += 1;
                if let Some(s) = stats {
                    s.record_swaps(1, p.bytes);
                }
            } else {
                out.stale += 1;
                give_back(p.buf);
            }
        }
        Ok(())
    }

    /// Call at every gap, after step number `step` (1-based) was launched or finished.
    /// Never blocks: a non-blocking receive, event queries, and copy issues.
    pub fn at_gap<Io: SlotIo<S::Buf>>(
        &mut self,
        step: u64,
        fences: &mut SlotFences<Io::Event, S::Buf>,
        table: &mut VramTable,
        io: &mut Io,
    ) -> Result<GapOutcome> {
        let mut out = GapOutcome::default();
        let due = self.cfg.due(step);
        fn tick<E: Fence, B>(t: &VramTable, f: &SlotFences<E, B>) -> Tick {
            Tick {
                table: t.clone(),
                evictable: f.evictable(),
                pending: f.pending_keys(),
            }
        }
        match &mut self.engine {
            Engine::Inline { stager, free } => {
                if due {
                    let t = tick(table, fences);
                    let ready = prepare(
                        stager,
                        free,
                        &self.counters,
                        &self.has_experts,
                        &self.cfg,
                        &t,
                    );
                    Self::apply(
                        ready,
                        fences,
                        table,
                        &self.stats,
                        |b| free.push(b),
                        &mut out,
                    )?;
                }
                let p = fences.poll(table, io, |b| free.push(b))?;
                out.issued = p.issued;
                out.filled = p.filled;
            }
            Engine::Thread {
                tx,
                rx,
                outstanding,
                ..
            } => {
                match rx.try_recv() {
                    Ok(ready) => {
                        *outstanding = false;
                        let tx2 = tx.clone();
                        Self::apply(
                            ready,
                            fences,
                            table,
                            &self.stats,
                            |b| {
                                let _ = tx2.send(Msg::Recycle(b));
                            },
                            &mut out,
                        )?;
                    }
                    Err(TryRecvError::Empty) => {}
                    Err(TryRecvError::Disconnected) => {
                        return Err(Error::Config("the tier thread has stopped".into()))
                    }
                }
                let tx2 = tx.clone();
                let p = fences.poll(table, io, |b| {
                    let _ = tx2.send(Msg::Recycle(b));
                })?;
                out.issued = p.issued;
                out.filled = p.filled;
                if due && !*outstanding {
                    // An unbounded channel: `send` never waits.
                    if tx.send(Msg::Tick(tick(table, fences))).is_ok() {
                        *outstanding = true;
                    }
                }
            }
        }
        Ok(out)
    }
}

impl<S: Stager> Drop for TierDriver<S> {
    fn drop(&mut self) {
        if let Engine::Thread { tx, handle, .. } = &mut self.engine {
            // Closing the channel ends the helper's loop.
            let (dead, _) = channel();
            drop(std::mem::replace(tx, dead));
            if let Some(h) = handle.take() {
                let _ = h.join();
            }
        }
    }
}

/// Fill slots at start (no step in flight): `assignment` (slot, key) in profile order,
/// staged by `stager` through `bufs`, issued and published through `fences`. `idle` is
/// called whenever nothing could advance (sleep or yield; a real device copy takes time).
#[allow(clippy::too_many_arguments)]
pub fn start_fill<S: Stager, Io: SlotIo<S::Buf>>(
    stager: &mut S,
    bufs: &mut Vec<S::Buf>,
    assignment: &[(u32, Key)],
    fences: &mut SlotFences<Io::Event, S::Buf>,
    table: &mut VramTable,
    io: &mut Io,
    stats: Option<&HybridCounters>,
    mut idle: impl FnMut(),
) -> Result<()> {
    if bufs.is_empty() && !assignment.is_empty() {
        return Err(Error::Config(
            "start fill needs at least one staging buffer".into(),
        ));
    }
    let mut next = 0;
    loop {
        let mut progressed = false;
        while next < assignment.len() {
            let Some(mut buf) = bufs.pop() else { break };
            let (slot, key) = assignment[next];
            let bytes = stager.stage(key, &mut buf)?;
            fences.retire(table, slot, key, buf)?;
            if let Some(s) = stats {
                s.record_fill(bytes);
            }
            next += 1;
            progressed = true;
        }
        let p = fences.poll(table, io, |b| bufs.push(b))?;
        progressed |= p.issued + p.filled > 0;
        if next == assignment.len() && fences.settled() {
            return Ok(());
        }
        if !progressed {
            idle();
        }
    }
}
