//! One call's plan: input validation, grouping (token, slot) pairs into per-expert jobs, the
//! tile geometry, and the scratch buffers the tiles write. Runs on the calling thread before
//! the call is published; allocates only when a call needs more scratch than any before it.
//!
//! Legend: T tokens, H hidden (gate/up cols, down rows), I intermediate (gate/up rows, down
//! cols), k slots per token, P = T·k pairs, J jobs (distinct experts, ascending).
//!
//! Tiles, in claim order (one global index, phases A..E):
//! - A: quantize token ranges of `x[T,H]` to the gate (and up) activation type → `xq`.
//! - B: one job's Gate+Up rows `[i0,i1)` for all its pairs → `h[P,I]` = silu(g)·u.
//! - C (barrier schedule only): quantize one job's `h` rows → `hq[P, act(I)]`. In the
//!   pipelined schedule the worker that finishes a job's last B tile does this at once.
//! - D: one job's Down rows `[r0,r1)` for all its pairs → `dout[P,H]`.
//! - E: ranges of (token, 256-wide H chunk) units: `y[t,h] = Σ_j w[t,j]·dout[pair(t,j),h]`.
//!
//! Dense matmul uses A (quantize x) and D (rows of W for all tokens, written straight to y).

use super::protocol::{Padded, MAX_TILES};
use super::{ExpertLayer, MoeInput, QExperts, QMatrix, SKIP};
use crate::error::{Error, Result};
use crate::quant::dot::{order_id, order_t, supports, Order};
use crate::quant::GgmlType;
use std::sync::atomic::AtomicU32;

pub const PH_A: usize = 0;
pub const PH_B: usize = 1;
pub const PH_C: usize = 2;
pub const PH_D: usize = 3;
pub const PH_E: usize = 4;
pub const N_PHASES: usize = 5;

/// `Plan::orders` bits: gate, up, down take `Order::Many`.
pub const ORDER_G: u8 = 1;
pub const ORDER_U: u8 = 2;
pub const ORDER_D: u8 = 4;

/// The `Plan::orders` bit of `bit` when `o` is `Order::Many`.
fn many_bit(o: Order, bit: u8) -> u8 {
    if o == Order::Many {
        bit
    } else {
        0
    }
}

/// Checks that the segment lengths of a call add up to its `t` rows.
pub fn validate_segs(segs: &[usize], t: usize) -> Result<()> {
    let sum: usize = segs.iter().sum();
    if sum != t {
        return Err(shape(format!(
            "segments cover {sum} rows, the call has {t}"
        )));
    }
    Ok(())
}

/// Rows per tile never go below this (a tile's fixed cost stays small against its work).
const MIN_TILE_ROWS: usize = 16;
/// Tiles per thread per phase (about 3: docs/POOL.md "Tiles").
const TILES_PER_THREAD: usize = 3;
/// H elements per reduction unit.
pub const E_CHUNK: usize = 256;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Moe,
    Dense,
    /// `Pool::for_each`: D tiles run `func(n)`.
    Func,
}

/// A borrowed task body with its lifetime erased: valid while its call is live (the host
/// returns only after every tile has retired).
pub type FuncPtr = *const (dyn Fn(usize) + Sync + 'static);

/// One job: an expert and the pairs routed to it (`pairs[start..start+n]`, token order).
#[derive(Clone, Copy, Default, Debug)]
pub struct Job {
    pub expert: u32,
    pub start: u32,
    pub n: u32,
}

/// A weight tensor as the tiles see it: base pointer, bytes per expert, bytes per row; with
/// `table` non-null, expert e starts at `table[e]` instead of `base + e·expert_bytes`.
#[derive(Clone, Copy)]
pub struct WPtr {
    pub ty: GgmlType,
    pub base: *const u8,
    pub table: *const &'static [u8],
    pub expert_bytes: usize,
    pub row_bytes: usize,
}

/// Everything a tile needs, copied by value (raw pointers into the caller's tensors and the
/// pool's scratch, valid until the call returns).
#[derive(Clone, Copy)]
pub struct Plan {
    pub kind: Kind,
    pub pipelined: bool,
    /// First tile index of each phase, and the total at `starts[N_PHASES]`.
    pub starts: [u32; N_PHASES + 1],
    pub t: usize,
    pub h: usize,
    pub i: usize,
    pub k: usize,
    /// B tiles per job, D tiles per job.
    pub nb: usize,
    pub nd: usize,
    /// E units (token × H chunk) and H chunks per token.
    pub e_units: usize,
    pub e_chunks: usize,
    pub gate: WPtr,
    pub up: WPtr,
    pub down: WPtr,
    pub x: *const f32,
    pub weights: *const f32,
    pub y: *mut f32,
    /// Quantized x for gate and for up (the same buffer when both use one activation type).
    pub xq_g: *mut u8,
    pub xq_u: *mut u8,
    pub xq_g_rb: usize,
    pub xq_u_rb: usize,
    pub h_buf: *mut f32,
    pub hq: *mut u8,
    pub hq_rb: usize,
    pub dout: *mut f32,
    pub jobs: *const Job,
    pub pair_token: *const u32,
    pub slot_pair: *const u32,
    /// Per pair (MoE) or per token (dense): which matrices take ggml's multi-row order
    /// (`ORDER_G | ORDER_U | ORDER_D` bits; dense reads `ORDER_D`), set from the call's
    /// segments so that a row's order never depends on the other segments.
    pub orders: *const u8,
    pub job_ctr: *const Padded<AtomicU32>,
    pub phase_done: *const Padded<AtomicU32>,
    /// `Kind::Func` only: the task body.
    pub func: Option<FuncPtr>,
}

impl Plan {
    pub fn total(&self) -> u32 {
        self.starts[N_PHASES]
    }
    pub fn phase_len(&self, p: usize) -> u32 {
        self.starts[p + 1] - self.starts[p]
    }
}

/// The pool's reusable per-call memory. Each buffer is grown (never shrunk) to the largest
/// call seen; `Pool::reserve` sizes them up front so steady-state calls never allocate.
#[derive(Default)]
pub struct Scratch {
    xq_g: Vec<u8>,
    xq_u: Vec<u8>,
    h: Vec<f32>,
    hq: Vec<u8>,
    dout: Vec<f32>,
    counts: Vec<u32>,
    jobs: Vec<Job>,
    pair_token: Vec<u32>,
    slot_pair: Vec<u32>,
    orders: Vec<u8>,
    seg_counts: Vec<u32>,
    job_ctr: Vec<Padded<AtomicU32>>,
    pub phase_done: Vec<Padded<AtomicU32>>,
    /// `balanced_tiles` results, `[rows, n_jobs, threads, tiles]` per slot (a decode step's
    /// calls repeat a few shapes; the search costs a few µs of integer divisions).
    geometry: [[usize; 4]; GEOMETRY_SLOTS],
}

/// Slots of `Scratch::geometry`.
const GEOMETRY_SLOTS: usize = 32;

fn grow<T: Clone + Default>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

fn grow_ctr(v: &mut Vec<Padded<AtomicU32>>, n: usize) {
    while v.len() < n {
        v.push(Padded(AtomicU32::new(0)));
    }
}

fn shape(msg: String) -> Error {
    Error::Shape(msg)
}

fn check_supported(what: &str, ty: GgmlType) -> Result<()> {
    if !supports(ty) {
        return Err(Error::Quant(format!(
            "{what}: no dot kernel for type {}",
            ty.name()
        )));
    }
    Ok(())
}

/// Row bytes of `ty` at `cols`, or a typed error.
fn row_bytes(what: &str, ty: GgmlType, cols: usize) -> Result<usize> {
    ty.row_bytes(cols).ok_or_else(|| {
        Error::Quant(format!(
            "{what}: {cols} columns is not whole {} blocks of {}",
            ty.name(),
            ty.block_size()
        ))
    })
}

fn check_experts(what: &str, m: &QExperts<'_>) -> Result<usize> {
    check_supported(what, m.ty)?;
    let rb = row_bytes(what, m.ty, m.cols)?;
    let need = m
        .n_expert
        .checked_mul(m.rows)
        .and_then(|v| v.checked_mul(rb))
        .ok_or_else(|| shape(format!("{what}: size overflows")))?;
    if let Some(s) = m.slabs {
        let eb = m.rows * rb;
        if s.len() != m.n_expert {
            return Err(shape(format!(
                "{what}: {} expert slabs, expected {}",
                s.len(),
                m.n_expert
            )));
        }
        if let Some((e, bad)) = s.iter().enumerate().find(|(_, b)| b.len() != eb) {
            return Err(shape(format!(
                "{what}: expert {e} slab holds {} bytes, expected {eb}",
                bad.len()
            )));
        }
        return Ok(rb);
    }
    if m.data.len() != need {
        return Err(shape(format!(
            "{what}: {} bytes for ({}, {}, {}) {}, expected {need}",
            m.data.len(),
            m.n_expert,
            m.rows,
            m.cols,
            m.ty.name()
        )));
    }
    Ok(rb)
}

/// Rows per tile for `rows` rows spread over `parts_hint` tiles.
fn tiles_for(rows: usize, parts_hint: usize) -> usize {
    parts_hint.clamp(1, (rows / MIN_TILE_ROWS).max(1))
}

/// Tiles per job for `n_jobs` jobs of equal work (`rows` rows each, one pair per job: a
/// decode step's experts) on `threads` threads: the count that gives the busiest thread the
/// fewest rows when every thread takes whole tiles in turn (`⌈n_jobs·nb / threads⌉ ·
/// ⌈rows / nb⌉`), of those the one nearest `TILES_PER_THREAD` per thread (then the fewest).
/// `tiles_for`'s ~3 per thread leave whole tiles on some threads only (5 jobs × 10 tiles on 16
/// threads: 4 tiles on 2 threads, 3 on the rest: the phase lasts 4 tiles, 25% over its
/// average); 5 × 16 tiles give every thread 5 tiles of a third less.
fn balanced_tiles(rows: usize, n_jobs: usize, threads: usize) -> usize {
    let (max, threads) = ((rows / MIN_TILE_ROWS).max(1), threads.max(1));
    let busiest = |nb: usize| (n_jobs * nb).div_ceil(threads) * rows.div_ceil(nb);
    let best = (1..=max).map(busiest).min().unwrap_or(rows);
    (1..=max)
        .filter(|&nb| busiest(nb) == best)
        .min_by_key(|&nb| ((n_jobs * nb).abs_diff(TILES_PER_THREAD * threads), nb))
        .unwrap_or(1)
}

fn wptr(m: &QExperts<'_>, rb: usize) -> WPtr {
    WPtr {
        ty: m.ty,
        base: m.data.as_ptr(),
        table: m
            .slabs
            .map_or(std::ptr::null(), |s| s.as_ptr().cast::<&'static [u8]>()),
        expert_bytes: m.rows * rb,
        row_bytes: rb,
    }
}

/// Check a MoE call's tensors, shapes and ids; returns the gate/up/down row bytes.
pub fn validate_moe(layer: &ExpertLayer<'_>, a: &MoeInput<'_>, y: &[f32]) -> Result<[usize; 3]> {
    validate_moe_ids(layer, a, y, false)
}

/// `validate_moe` for a masked call: ids may also be `SKIP` (a pair computed elsewhere).
pub fn validate_moe_masked(
    layer: &ExpertLayer<'_>,
    a: &MoeInput<'_>,
    y: &[f32],
) -> Result<[usize; 3]> {
    validate_moe_ids(layer, a, y, true)
}

fn validate_moe_ids(
    layer: &ExpertLayer<'_>,
    a: &MoeInput<'_>,
    y: &[f32],
    allow_skip: bool,
) -> Result<[usize; 3]> {
    let MoeInput { x, ids, weights, k } = *a;
    let (g, u, d) = (&layer.gate, &layer.up, &layer.down);
    let (hdim, idim, ne) = (g.cols, g.rows, g.n_expert);
    let grb = check_experts("gate", g)?;
    let urb = check_experts("up", u)?;
    let drb = check_experts("down", d)?;
    if u.rows != idim || u.cols != hdim || d.rows != hdim || d.cols != idim {
        return Err(shape(format!(
            "expert shapes disagree: gate ({idim}, {hdim}), up ({}, {}), down ({}, {}); \
                 expected up (I, H) and down (H, I)",
            u.rows, u.cols, d.rows, d.cols
        )));
    }
    if u.n_expert != ne || d.n_expert != ne {
        return Err(shape(format!(
            "expert counts disagree: gate {ne}, up {}, down {}",
            u.n_expert, d.n_expert
        )));
    }
    if hdim == 0 || idim == 0 {
        return Err(shape("empty expert matrices".into()));
    }
    if !x.len().is_multiple_of(hdim) {
        return Err(shape(format!(
            "x has {} values, not a multiple of H={hdim}",
            x.len()
        )));
    }
    let t = x.len() / hdim;
    if y.len() != t * hdim {
        return Err(shape(format!(
            "y has {} values, expected {}",
            y.len(),
            t * hdim
        )));
    }
    let p = t
        .checked_mul(k)
        .ok_or_else(|| shape("T·k overflows".into()))?;
    if ids.len() != p || weights.len() != p {
        return Err(shape(format!(
            "ids ({}) and weights ({}) must both hold T·k = {t}·{k} = {p} values",
            ids.len(),
            weights.len()
        )));
    }
    let bad_id = |e: u32| e as usize >= ne && !(allow_skip && e == SKIP);
    if let Some((n, &bad)) = ids.iter().enumerate().find(|(_, &e)| bad_id(e)) {
        return Err(shape(format!(
            "expert id {bad} at [{}, {}] is out of range (the layer has {ne} experts)",
            n / k,
            n % k
        )));
    }
    Ok([grb, urb, drb])
}

/// Check a dense call; returns the weight's row bytes.
pub fn validate_matmul(w: &QMatrix<'_>, x: &[f32], t: usize, y: &[f32]) -> Result<usize> {
    check_supported("matmul weight", w.ty)?;
    let rb = row_bytes("matmul weight", w.ty, w.cols)?;
    let need = w
        .rows
        .checked_mul(rb)
        .ok_or_else(|| shape("matmul weight size overflows".into()))?;
    if w.data.len() != need {
        return Err(shape(format!(
            "matmul weight: {} bytes for ({}, {}) {}, expected {need}",
            w.data.len(),
            w.rows,
            w.cols,
            w.ty.name()
        )));
    }
    if t.checked_mul(w.cols) != Some(x.len()) {
        return Err(shape(format!(
            "x has {} values, expected T·cols = {t}·{}",
            x.len(),
            w.cols
        )));
    }
    if t.checked_mul(w.rows) != Some(y.len()) {
        return Err(shape(format!(
            "y has {} values, expected T·rows = {t}·{}",
            y.len(),
            w.rows
        )));
    }
    Ok(rb)
}

impl Scratch {
    /// Grow every buffer for MoE calls up to these sizes (activation rows are sized for the
    /// widest format, F32, so any weight types fit).
    pub fn reserve(
        &mut self,
        tokens: usize,
        k: usize,
        hidden: usize,
        inter: usize,
        n_expert: usize,
    ) {
        let p = tokens * k;
        grow(&mut self.xq_g, tokens * hidden * 4);
        grow(&mut self.xq_u, tokens * hidden * 4);
        grow(&mut self.h, p * inter);
        grow(&mut self.hq, p * inter * 4);
        grow(&mut self.dout, p * hidden);
        grow(&mut self.counts, n_expert);
        grow(&mut self.jobs, p.min(n_expert));
        grow(&mut self.pair_token, p);
        grow(&mut self.slot_pair, p);
        grow(&mut self.orders, p.max(tokens));
        grow(&mut self.seg_counts, n_expert);
        grow_ctr(&mut self.job_ctr, p.min(n_expert));
        grow_ctr(&mut self.phase_done, N_PHASES);
    }

    fn phase_counters(&mut self) -> *const Padded<AtomicU32> {
        grow_ctr(&mut self.phase_done, N_PHASES);
        for c in &self.phase_done {
            c.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        self.phase_done.as_ptr()
    }

    /// `balanced_tiles`, remembered per shape.
    fn balanced(&mut self, rows: usize, n_jobs: usize, threads: usize) -> usize {
        let key = [rows, n_jobs, threads];
        let slot = &mut self.geometry[(n_jobs * 2 + rows % 7) % GEOMETRY_SLOTS];
        if slot[..3] != key {
            *slot = [rows, n_jobs, threads, balanced_tiles(rows, n_jobs, threads)];
        }
        slot[3]
    }

    /// Validate a MoE call and build its plan. `Ok(None)`: nothing to compute (y was zeroed).
    /// With `masked`, ids equal to `SKIP` are pairs computed elsewhere: they get no job and
    /// add nothing to y.
    #[allow(clippy::too_many_arguments)]
    pub fn plan_moe(
        &mut self,
        layer: &ExpertLayer<'_>,
        a: &MoeInput<'_>,
        y: &mut [f32],
        segs: &[usize],
        threads: usize,
        (pipelined, balanced): (bool, bool),
        masked: bool,
    ) -> Result<Option<Plan>> {
        let [grb, urb, drb] = validate_moe_ids(layer, a, y, masked)?;
        let MoeInput { x, ids, weights, k } = *a;
        let (g, u, d) = (&layer.gate, &layer.up, &layer.down);
        let (hdim, idim, ne) = (g.cols, g.rows, g.n_expert);
        let t = x.len() / hdim;
        validate_segs(segs, t)?;
        // Pairs computed here (all T·k unless masked).
        let p = ids.iter().filter(|&&e| e != SKIP).count();
        if p == 0 {
            y.fill(0.0);
            return Ok(None);
        }

        // Group pairs by expert: counting sort, jobs in ascending expert order, pairs of a
        // job in (token, slot) order.
        grow(&mut self.counts, ne);
        let counts = &mut self.counts[..ne];
        counts.fill(0);
        for &e in ids.iter().filter(|&&e| e != SKIP) {
            counts[e as usize] += 1;
        }
        let n_jobs = counts.iter().filter(|&&c| c > 0).count();
        grow(&mut self.jobs, n_jobs);
        let mut start = 0u32;
        let mut j = 0;
        for (e, c) in counts.iter_mut().enumerate() {
            if *c > 0 {
                self.jobs[j] = Job {
                    expert: e as u32,
                    start,
                    n: *c,
                };
                j += 1;
                let n = *c;
                *c = start; // now the cursor of expert e
                start += n;
            }
        }
        grow(&mut self.pair_token, p);
        grow(&mut self.slot_pair, t * k);
        for (n, &e) in ids.iter().enumerate() {
            if e == SKIP {
                self.slot_pair[n] = SKIP;
                continue;
            }
            let cur = &mut counts[e as usize];
            self.pair_token[*cur as usize] = (n / k) as u32;
            self.slot_pair[n] = *cur;
            *cur += 1;
        }
        // Each pair's order: ggml's for the pairs its segment alone routes to its expert.
        grow(&mut self.orders, p);
        grow(&mut self.seg_counts, ne);
        let seg_counts = &mut self.seg_counts[..ne];
        let mut t0 = 0;
        for &len in segs {
            let r = t0 * k..(t0 + len) * k;
            let kept = || ids[r.clone()].iter().filter(|&&e| e != SKIP);
            kept().for_each(|&e| seg_counts[e as usize] += 1);
            for (n, &e) in ids[r.clone()].iter().enumerate() {
                if e == SKIP {
                    continue;
                }
                let c = seg_counts[e as usize] as usize;
                self.orders[self.slot_pair[r.start + n] as usize] =
                    many_bit(order_id(g.ty, c), ORDER_G)
                        | many_bit(order_id(u.ty, c), ORDER_U)
                        | many_bit(order_id(d.ty, c), ORDER_D);
            }
            kept().for_each(|&e| seg_counts[e as usize] = 0);
            t0 += len;
        }

        // Activation buffers.
        let act_g = g.ty.vec_dot_type();
        let act_u = u.ty.vec_dot_type();
        let act_d = d.ty.vec_dot_type();
        let xq_g_rb = row_bytes("gate activation", act_g, hdim)?;
        let xq_u_rb = row_bytes("up activation", act_u, hdim)?;
        let hq_rb = row_bytes("down activation", act_d, idim)?;
        grow(&mut self.xq_g, t * xq_g_rb);
        let xq_g = self.xq_g.as_mut_ptr();
        let xq_u = if act_u == act_g {
            xq_g
        } else {
            grow(&mut self.xq_u, t * xq_u_rb);
            self.xq_u.as_mut_ptr()
        };
        grow(&mut self.h, p * idim);
        grow(&mut self.hq, p * hq_rb);
        grow(&mut self.dout, p * hdim);

        // Tile geometry.
        let (nb, nd) = if balanced && p == n_jobs {
            // one pair per job: equal work per job, so the tiles can be cut to the threads
            (
                self.balanced(idim, n_jobs, threads),
                self.balanced(hdim, n_jobs, threads),
            )
        } else {
            let hint = (TILES_PER_THREAD * threads).div_ceil(n_jobs);
            (tiles_for(idim, hint), tiles_for(hdim, hint))
        };
        let n_a = t.min(2 * threads).max(1);
        let e_chunks = hdim.div_ceil(E_CHUNK);
        let e_units = t * e_chunks;
        let n_e = e_units.min(2 * threads).max(1);
        let n_c = if pipelined { 0 } else { n_jobs };
        let lens = [n_a, n_jobs * nb, n_c, n_jobs * nd, n_e];
        let starts = prefix(lens)?;

        // Per-job readiness counters: B tiles + 1 for the quantization (pipelined schedule).
        grow_ctr(&mut self.job_ctr, n_jobs);
        for c in &self.job_ctr[..n_jobs] {
            c.store(nb as u32 + 1, std::sync::atomic::Ordering::Relaxed);
        }
        let phase_done = self.phase_counters();
        Ok(Some(Plan {
            kind: Kind::Moe,
            pipelined,
            starts,
            t,
            h: hdim,
            i: idim,
            k,
            nb,
            nd,
            e_units,
            e_chunks,
            gate: wptr(g, grb),
            up: wptr(u, urb),
            down: wptr(d, drb),
            x: x.as_ptr(),
            weights: weights.as_ptr(),
            y: y.as_mut_ptr(),
            xq_g,
            xq_u,
            xq_g_rb,
            xq_u_rb,
            h_buf: self.h.as_mut_ptr(),
            hq: self.hq.as_mut_ptr(),
            hq_rb,
            dout: self.dout.as_mut_ptr(),
            jobs: self.jobs.as_ptr(),
            pair_token: self.pair_token.as_ptr(),
            slot_pair: self.slot_pair.as_ptr(),
            orders: self.orders.as_ptr(),
            job_ctr: self.job_ctr.as_ptr(),
            phase_done,
            func: None,
        }))
    }

    /// Validate a dense call and build its plan. `Ok(None)`: nothing to compute.
    pub fn plan_dense(
        &mut self,
        w: &QMatrix<'_>,
        x: &[f32],
        segs: &[usize],
        y: &mut [f32],
        threads: usize,
    ) -> Result<Option<Plan>> {
        let t = segs.iter().sum();
        let rb = validate_matmul(w, x, t, y)?;
        let need = w.rows * rb;
        if t == 0 || w.rows == 0 {
            return Ok(None);
        }
        if w.cols == 0 {
            y.fill(0.0);
            return Ok(None);
        }
        let act = w.ty.vec_dot_type();
        let xq_rb = row_bytes("matmul activation", act, w.cols)?;
        grow(&mut self.xq_g, t * xq_rb);
        let xq = self.xq_g.as_mut_ptr();
        // Each row's order: ggml's for its place in its segment alone.
        grow(&mut self.orders, t);
        let mut t0 = 0;
        for &len in segs {
            for (i, o) in self.orders[t0..t0 + len].iter_mut().enumerate() {
                *o = many_bit(order_t(w.ty, len, i), ORDER_D);
            }
            t0 += len;
        }
        let n_a = t.min(2 * threads).max(1);
        let nd = tiles_for(w.rows, TILES_PER_THREAD * threads);
        let starts = prefix([n_a, 0, 0, nd, 0])?;
        let wp = WPtr {
            ty: w.ty,
            base: w.data.as_ptr(),
            table: std::ptr::null(),
            expert_bytes: need,
            row_bytes: rb,
        };
        let phase_done = self.phase_counters();
        Ok(Some(Plan {
            kind: Kind::Dense,
            pipelined: false,
            starts,
            t,
            h: w.rows,
            i: w.cols,
            k: 0,
            nb: 0,
            nd,
            e_units: 0,
            e_chunks: 0,
            gate: wp,
            up: wp,
            down: wp,
            x: x.as_ptr(),
            weights: std::ptr::null(),
            y: y.as_mut_ptr(),
            xq_g: xq,
            xq_u: xq,
            xq_g_rb: xq_rb,
            xq_u_rb: xq_rb,
            h_buf: std::ptr::null_mut(),
            hq: std::ptr::null_mut(),
            hq_rb: 0,
            dout: std::ptr::null_mut(),
            jobs: std::ptr::null(),
            pair_token: std::ptr::null(),
            slot_pair: std::ptr::null(),
            orders: self.orders.as_ptr(),
            job_ctr: std::ptr::null(),
            phase_done,
            func: None,
        }))
    }
}

impl Scratch {
    /// A `for_each` call: `n` tiles, tile i runs `f(i)`.
    pub fn plan_func(&mut self, n: usize, f: FuncPtr) -> Result<Option<Plan>> {
        if n == 0 {
            return Ok(None);
        }
        let starts = prefix([0, 0, 0, n, 0])?;
        let phase_done = self.phase_counters();
        let none = WPtr {
            ty: GgmlType::F32,
            base: std::ptr::null(),
            table: std::ptr::null(),
            expert_bytes: 0,
            row_bytes: 0,
        };
        Ok(Some(Plan {
            kind: Kind::Func,
            pipelined: false,
            starts,
            t: 0,
            h: 0,
            i: 0,
            k: 0,
            nb: 0,
            nd: n,
            e_units: 0,
            e_chunks: 0,
            gate: none,
            up: none,
            down: none,
            x: std::ptr::null(),
            weights: std::ptr::null(),
            y: std::ptr::null_mut(),
            xq_g: std::ptr::null_mut(),
            xq_u: std::ptr::null_mut(),
            xq_g_rb: 0,
            xq_u_rb: 0,
            h_buf: std::ptr::null_mut(),
            hq: std::ptr::null_mut(),
            hq_rb: 0,
            dout: std::ptr::null_mut(),
            jobs: std::ptr::null(),
            pair_token: std::ptr::null(),
            slot_pair: std::ptr::null(),
            orders: std::ptr::null(),
            job_ctr: std::ptr::null(),
            phase_done,
            func: Some(f),
        }))
    }
}

fn prefix(lens: [usize; N_PHASES]) -> Result<[u32; N_PHASES + 1]> {
    let mut starts = [0u32; N_PHASES + 1];
    let mut acc = 0usize;
    for (n, len) in lens.iter().enumerate() {
        starts[n] = acc as u32;
        acc += len;
        if acc > MAX_TILES as usize {
            return Err(shape(format!(
                "the call needs {acc}+ tiles, more than the pool's {MAX_TILES}"
            )));
        }
    }
    starts[N_PHASES] = acc as u32;
    Ok(starts)
}

#[cfg(test)]
mod geometry_tests {
    use super::{balanced_tiles, MIN_TILE_ROWS};

    /// Rows of the busiest thread when `n_jobs · nb` equal tiles go round `threads` threads.
    fn busiest(rows: usize, n_jobs: usize, nb: usize, threads: usize) -> usize {
        (n_jobs * nb).div_ceil(threads) * rows.div_ceil(nb)
    }

    /// Decode shapes (hybrid misses of Qwen3.5 / Qwen3-30B widths on 16 threads, the CPU path
    /// on 2): the busiest thread gets the fewest rows any tile count allows, and exactly its
    /// share where the rows divide evenly.
    #[test]
    fn decode_tiles_balance_the_threads() {
        for (rows, threads) in [
            (512, 16),
            (768, 16),
            (2048, 16),
            (768, 2),
            (2048, 2),
            (512, 15),
        ] {
            for n_jobs in 1..=8 {
                let nb = balanced_tiles(rows, n_jobs, threads);
                assert!(nb >= 1 && (nb == 1 || rows / nb >= MIN_TILE_ROWS));
                let got = busiest(rows, n_jobs, nb, threads);
                for other in 1..=rows / MIN_TILE_ROWS {
                    assert!(
                        got <= busiest(rows, n_jobs, other, threads),
                        "{rows} {n_jobs} {threads}"
                    );
                }
                let share = (rows * n_jobs).div_ceil(threads);
                if threads == 16 && rows % 16 == 0 && n_jobs <= 8 && rows / 16 >= MIN_TILE_ROWS {
                    assert_eq!(
                        got,
                        share.max(rows / (rows / MIN_TILE_ROWS)),
                        "{rows} {n_jobs}"
                    );
                }
            }
        }
        assert_eq!(balanced_tiles(512, 5, 16), 16);
        assert_eq!(balanced_tiles(768, 8, 2), 1);
    }
}
