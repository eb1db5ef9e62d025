//! The CPU expert pool (docs/POOL.md): pinned worker threads plus
//! the calling thread compute one MoE layer (or one dense projection) per call, as tiles
//! claimed lock-free from one epoch-tagged counter.
//!
//! - `protocol.rs`: publication, claims, retirement, spin-then-park (loom-checked).
//! - `plan.rs`: validation, jobs, tile geometry, scratch memory.
//! - `exec.rs`: what each tile computes.
//! - `reference.rs`: the independent serial reference the pool must match bitwise.
//! - `topology.rs`: physical cores and pinning.

mod atomics;
mod exec;
pub mod membench;
mod plan;
mod protocol;
pub mod reference;
mod topology;
pub use topology::physical_cores;

#[cfg(test)]
mod loom_check;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_masked;
#[cfg(test)]
mod tests_multi;
#[cfg(test)]
mod tests_segs;

use crate::error::{Error, Result};
use crate::quant::GgmlType;
use atomics::SpinClock;
pub use plan::{validate_matmul, validate_moe, validate_moe_masked, validate_segs};
use plan::{Plan, Scratch};
use protocol::Protocol;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// One quantized matrix `W[rows, cols]` (numpy order): `rows` rows of `ty` blocks.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

/// One expert tensor, numpy shape `(n_expert, rows, cols)`: expert `e` is the contiguous slab
/// `data[e·rows·row_bytes(cols) ..][.. rows·row_bytes(cols)]`, unless `slabs` is set: then
/// expert `e` is `slabs[e]` (`n_expert` slabs of `rows·row_bytes(cols)` bytes each, wherever
/// the RAM tier keeps them) and `data` is not read.
#[derive(Clone, Copy, Debug)]
pub struct QExperts<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub n_expert: usize,
    pub rows: usize,
    pub cols: usize,
    pub slabs: Option<&'a [&'a [u8]]>,
}

impl<'a> QExperts<'a> {
    /// Expert `e`'s `rows·row_bytes` bytes (`eb`), from `slabs` when set.
    #[inline]
    pub fn expert_data(&self, e: usize, eb: usize) -> &'a [u8] {
        match self.slabs {
            Some(s) => s[e],
            None => &self.data[e * eb..(e + 1) * eb],
        }
    }
}

/// A MoE layer's experts: gate and up are `(E, I, H)`, down is `(E, H, I)`.
#[derive(Clone, Copy, Debug)]
pub struct ExpertLayer<'a> {
    pub gate: QExperts<'a>,
    pub up: QExperts<'a>,
    pub down: QExperts<'a>,
}

/// The routed pairs of a MoE call: tokens `x` [T, H] and, per token, `k` (expert id, weight)
/// pairs `ids`, `weights` [T, k], row-major. Every MoE entry point (the pool, the serial
/// reference, `model::Compute`, their validation) takes this one argument list.
#[derive(Clone, Copy, Debug)]
pub struct MoeInput<'a> {
    pub x: &'a [f32],
    pub ids: &'a [u32],
    pub weights: &'a [f32],
    pub k: usize,
}

impl<'a> MoeInput<'a> {
    pub fn new(x: &'a [f32], ids: &'a [u32], weights: &'a [f32], k: usize) -> MoeInput<'a> {
        MoeInput { x, ids, weights, k }
    }
}

/// An expert id of a masked call (`Pool::moe_masked`, `reference::moe_serial`) meaning "this
/// (token, slot) pair is computed elsewhere" (a VRAM-resident expert of the hybrid step): it
/// gets no job and adds nothing to y.
pub const SKIP: u32 = u32::MAX;

/// How a pool is built. Read once by `Pool::new`; a running pool never re-reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Worker threads besides the caller (0: the caller alone computes everything).
    pub workers: usize,
    /// The calling thread takes tiles too. Forced on when `workers == 0`.
    pub host_participates: bool,
    /// Pipelined schedule (per-expert readiness) instead of phase barriers.
    pub pipelined: bool,
    /// Pin each worker to its own physical core (when there are enough cores).
    pub pin: bool,
    /// Microseconds an idle worker spins before it parks.
    pub spin_us: u32,
    /// Calls of one pair per expert (decode) cut their tiles to the thread count
    /// (`plan::balanced_tiles`) instead of ~3 per thread; off only to measure the difference.
    pub balanced: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            workers: topology::physical_cores().len().saturating_sub(1),
            host_participates: true,
            // per-expert readiness: measured faster than the barriers (docs/POOL.md)
            pipelined: true,
            pin: true,
            spin_us: 2000,
            balanced: true,
        }
    }
}

impl PoolConfig {
    /// `threads`, 0 meaning one per physical core.
    pub fn resolve_threads(threads: usize) -> usize {
        match threads {
            0 => topology::physical_cores().len().max(1),
            n => n,
        }
    }

    /// A pool of `threads` compute threads in all, the caller included when it participates,
    /// as llama.cpp's `-t` counts them (0: one per physical core): `threads − 1` workers
    /// besides a participating caller, `threads` besides one that only waits.
    pub fn for_threads(threads: usize, host_participates: bool, pipelined: bool) -> PoolConfig {
        let threads = PoolConfig::resolve_threads(threads);
        PoolConfig {
            workers: threads - usize::from(host_participates),
            host_participates,
            pipelined,
            ..PoolConfig::default()
        }
    }
}

/// State shared by the host and the workers.
struct Shared {
    proto: Protocol,
    /// The live call's plan: written by the host only between calls, read by a worker only
    /// after it has claimed a tile of that call.
    plan: UnsafeCell<Option<Plan>>,
    /// Host-only between calls; tiles reach it through the plan's pointers during a call.
    scratch: UnsafeCell<Scratch>,
    /// Workers that have started (pinned, thread-local state set up).
    started: std::sync::atomic::AtomicUsize,
}

// SAFETY: access to the cells follows the protocol described on the fields (docs/POOL.md).
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// The CPU expert pool. One call at a time: a call made while another thread's call is
/// running returns `Error::Config` rather than waiting.
pub struct Pool {
    shared: Arc<Shared>,
    threads: Vec<std::thread::Thread>,
    handles: Vec<std::thread::JoinHandle<()>>,
    cfg: PoolConfig,
    busy: AtomicBool,
    epoch: AtomicU32,
}

fn worker_main(shared: Arc<Shared>, cpu: Option<usize>, spin_us: u32) {
    if let Some(c) = cpu {
        topology::pin_current(c);
    }
    shared.started.fetch_add(1, Ordering::Release);
    let mut clock = SpinClock::new(spin_us);
    let mut seen = 0u32;
    while let Some(e) = shared
        .proto
        .wait_new_epoch(seen, &mut clock, std::thread::park)
    {
        seen = e;
        drain(&shared, e);
    }
}

/// Claim and run tiles of call `epoch` until none is left.
fn drain(shared: &Shared, epoch: u32) {
    while let Some(i) = shared.proto.claim(epoch) {
        // SAFETY: the claim (Acquire) happens-after the host wrote this call's plan, and the
        // host does not write it again before this tile retires.
        let plan = unsafe { (*shared.plan.get()).expect("a claimed call has a plan") };
        unsafe { exec::run_tile(&plan, i) };
        shared.proto.retire();
    }
}

struct BusyGuard<'a>(&'a AtomicBool);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Pool {
    pub fn new(cfg: PoolConfig) -> Pool {
        let mut cfg = cfg;
        if cfg.workers == 0 {
            cfg.host_participates = true;
        }
        let shared = Arc::new(Shared {
            proto: Protocol::new(),
            plan: UnsafeCell::new(None),
            scratch: UnsafeCell::new(Scratch::default()),
            started: std::sync::atomic::AtomicUsize::new(0),
        });
        let cores = topology::physical_cores();
        // The host keeps the first core when it takes work; workers get the next ones.
        let skip = usize::from(cfg.host_participates);
        let pin = cfg.pin && cfg.workers + skip <= cores.len();
        let mut handles = Vec::with_capacity(cfg.workers);
        for w in 0..cfg.workers {
            let sh = shared.clone();
            let cpu = pin.then(|| cores[w + skip]);
            let spin = cfg.spin_us;
            match std::thread::Builder::new()
                .name(format!("strata-pool-{w}"))
                .spawn(move || worker_main(sh, cpu, spin))
            {
                Ok(h) => handles.push(h),
                Err(_) => break, // run with the workers we have
            }
        }
        cfg.workers = handles.len();
        // Return a pool whose workers are all running: their start-up (allocations included)
        // never lands inside a call.
        while shared.started.load(Ordering::Acquire) < cfg.workers {
            std::thread::yield_now();
        }
        if cfg.workers == 0 {
            cfg.host_participates = true;
        }
        Pool {
            threads: handles.iter().map(|h| h.thread().clone()).collect(),
            handles,
            shared,
            cfg,
            busy: AtomicBool::new(false),
            epoch: AtomicU32::new(0),
        }
    }

    /// Worker threads (not counting the caller).
    pub fn workers(&self) -> usize {
        self.cfg.workers
    }

    pub fn config(&self) -> PoolConfig {
        self.cfg
    }

    pub fn threads_total(&self) -> usize {
        self.cfg.workers + usize::from(self.cfg.host_participates)
    }

    /// Grow the scratch memory for calls of up to `tokens` tokens with `k` slots, hidden size
    /// `hidden`, intermediate `inter` and `n_expert` experts, so that such calls allocate
    /// nothing. Calls beyond these sizes grow it themselves (once).
    pub fn reserve(&self, tokens: usize, k: usize, hidden: usize, inter: usize, n_expert: usize) {
        let Some(_g) = self.enter() else { return };
        // SAFETY: the busy flag gives this thread the scratch; no call is live.
        let s = unsafe { &mut *self.shared.scratch.get() };
        s.reserve(tokens, k, hidden, inter, n_expert);
    }

    fn enter(&self) -> Option<BusyGuard<'_>> {
        self.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| BusyGuard(&self.busy))
    }

    fn run(&self, build: impl FnOnce(&mut Scratch, usize) -> Result<Option<Plan>>) -> Result<()> {
        let _guard = self.enter().ok_or_else(|| {
            Error::Config("the pool is running another thread's call; calls do not overlap".into())
        })?;
        // SAFETY: we hold the busy flag and no call is live, so nothing else reads the
        // scratch or the plan until `publish`.
        let plan = {
            let scratch = unsafe { &mut *self.shared.scratch.get() };
            match build(scratch, self.threads_total())? {
                Some(p) => p,
                None => return Ok(()),
            }
        };
        unsafe { *self.shared.plan.get() = Some(plan) };
        let mut epoch = self.epoch.load(Ordering::Relaxed).wrapping_add(1);
        if epoch == 0 {
            epoch = 1;
        }
        self.epoch.store(epoch, Ordering::Relaxed);
        let total = plan.total();
        if self.shared.proto.publish(epoch, total) {
            for t in &self.threads {
                t.unpark();
            }
        }
        if self.cfg.host_participates {
            drain(&self.shared, epoch);
        }
        self.shared.proto.wait_retired(total);
        Ok(())
    }

    /// `y[T,H] = Σ_j w[t,j]·down_e(silu(gate_e·x_t) ⊙ up_e·x_t)` with `e = ids[t,j]`;
    /// `y` is `[T,H]` (`MoeInput` for the rest). Bad shapes, types or ids give a typed error
    /// and leave `y` untouched.
    pub fn moe(&self, layer: &ExpertLayer<'_>, a: &MoeInput<'_>, y: &mut [f32]) -> Result<()> {
        self.moe_segs(layer, a, &[a.x.len() / layer.gate.cols.max(1)], y)
    }

    /// `moe` over a subset of the pairs: ids equal to `SKIP` are computed elsewhere and add
    /// nothing, so `y[t] = Σ_{j: ids[t,j] ≠ SKIP} w[t,j]·expert(x_t)`, summed in slot order
    /// (a token whose slots are all `SKIP` gets zeros). The hybrid step computes its missed
    /// experts with it. Bitwise equal to `moe` on the kept pairs alone.
    pub fn moe_masked(
        &self,
        layer: &ExpertLayer<'_>,
        a: &MoeInput<'_>,
        y: &mut [f32],
    ) -> Result<()> {
        self.moe_masked_segs(layer, a, &[a.x.len() / layer.gate.cols.max(1)], y)
    }

    /// `moe` over a batch of segments (consecutive token runs of `segs` lengths, one per
    /// sequence of a batched step): every pair's float order is the one its segment alone
    /// would get, so each segment's rows are bitwise those of a `moe` call on it alone, while
    /// each expert's weights are read once for the pairs of all segments.
    pub fn moe_segs(
        &self,
        layer: &ExpertLayer<'_>,
        a: &MoeInput<'_>,
        segs: &[usize],
        y: &mut [f32],
    ) -> Result<()> {
        self.moe_run(layer, a, segs, y, false)
    }

    /// `moe_masked` over a batch of segments (`moe_segs`).
    pub fn moe_masked_segs(
        &self,
        layer: &ExpertLayer<'_>,
        a: &MoeInput<'_>,
        segs: &[usize],
        y: &mut [f32],
    ) -> Result<()> {
        self.moe_run(layer, a, segs, y, true)
    }

    fn moe_run(
        &self,
        layer: &ExpertLayer<'_>,
        a: &MoeInput<'_>,
        segs: &[usize],
        y: &mut [f32],
        masked: bool,
    ) -> Result<()> {
        let (pipelined, balanced) = (self.cfg.pipelined, self.cfg.balanced);
        self.run(|s, threads| s.plan_moe(layer, a, y, segs, threads, (pipelined, balanced), masked))
    }

    /// Runs `f(i)` for every `i < n` on the pool's threads (each index exactly once, in any
    /// order and on any thread); returns when all have finished. `f` must not call the pool.
    pub fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) -> Result<()> {
        // SAFETY: only the lifetime is erased; `run` returns after every tile has retired,
        // so no tile calls `f` after this borrow ends.
        let fp: plan::FuncPtr =
            unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), plan::FuncPtr>(f) };
        self.run(|s, _| s.plan_func(n, fp))
    }

    /// Dense: `y[T,rows] = x[T,cols]·Wᵀ`.
    pub fn matmul(&self, w: &QMatrix<'_>, x: &[f32], t: usize, y: &mut [f32]) -> Result<()> {
        self.matmul_segs(w, x, &[t], y)
    }

    /// `matmul` over a batch of segments (`moe_segs`): each row's float order is the one its
    /// segment alone would get; W is read once for all rows.
    pub fn matmul_segs(
        &self,
        w: &QMatrix<'_>,
        x: &[f32],
        segs: &[usize],
        y: &mut [f32],
    ) -> Result<()> {
        self.run(|s, threads| s.plan_dense(w, x, segs, y, threads))
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.shared.proto.shut_down() {
            for t in &self.threads {
                t.unpark();
            }
        }
        // Unpark unconditionally too: a worker between its check and park() keeps the token.
        for t in &self.threads {
            t.unpark();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}
