//! Tile execution: what one claimed tile computes, and the dependency waits in front of it.
//! Every output element is written by exactly one tile, from full-row dots, so the result does
//! not depend on which thread runs a tile, when, or how rows are split into tiles.
//!
//! Safety: a tile dereferences the plan's raw pointers only while its call is live (the host
//! returns after every tile has retired). Writes go to regions no other tile of the call
//! touches; reads of other tiles' output happen after an Acquire wait on the counter those
//! tiles released (phase counter or job counter).

use super::plan::{
    Kind, Plan, WPtr, E_CHUNK, N_PHASES, ORDER_D, ORDER_G, ORDER_U, PH_A, PH_B, PH_C, PH_D, PH_E,
};
use super::protocol::{wait_at_least, wait_zero};
use super::SKIP;
use crate::quant::dot::{quantize_act, vec_dot_rows, MultiDot, Order, TILE_MAX_T as MAX_T};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::quant::vexp::silu_mul_in_place;
/// ggml's SwiGLU for one element (`vexp::silu_mul`).
use crate::quant::vexp::silu_mul_one as silu_mul;

/// Part `n` of `parts` equal splits of `len`: `[n·len/parts, (n+1)·len/parts)`.
#[inline]
fn split(len: usize, parts: usize, n: usize) -> (usize, usize) {
    (n * len / parts, (n + 1) * len / parts)
}

/// Weight bytes of one row block: the block stays in L2 while every token group runs over
/// it (prefill's weight reuse; a group of 8 tokens' activations stays in L1, IQ3_S's 32 in
/// L2 beside the block).
const ROW_BLOCK_BYTES: usize = 96 * 1024;

/// Rows per block for rows of `rb` bytes (all matrices read per row together), a multiple of
/// the AMX tiles' 16 rows (the VNNI register tiles' 8), so that the tile kernels' row tiles
/// are whole: blocks of 42 Gate + Up rows of a Qwen3-30B-A3B expert had left every third tile
/// 10 rows of 16.
#[inline]
fn row_block(rb: usize) -> usize {
    (ROW_BLOCK_BYTES / rb.max(1)).max(1).next_multiple_of(16)
}

/// Rows per `blocked` run: the rows one `MultiDot::rows_call` takes together (its tiles
/// lay out the group's activations once per run), and the bound of the runs' output buffers.
const RUN_ROWS: usize = 64;

/// Rows per `vec_dot_rows` call of the one-token (decode) path.
const DECODE_ROWS: usize = 64;

/// The one-token (decode) path: `f(r, k)` for runs `[r, r+k)` of at most `DECODE_ROWS` rows
/// covering `[r0,r1)`; the callers dot each run with `vec_dot_rows` (grouped kernels, bitwise
/// `vec_dot` per row, which is ggml's order for one activation row).
#[inline]
fn decode_runs((r0, r1): (usize, usize), mut f: impl FnMut(usize, usize)) {
    let mut r = r0;
    while r < r1 {
        let k = (r1 - r).min(DECODE_ROWS);
        f(r, k);
        r += k;
    }
}

/// Runs `f(ra, rb, g0, acts, first)` over runs of rows `[ra,rb)` (at most `RUN_ROWS`)
/// covering `[r0,r1)` × tokens `0..count` in groups of at most `group` (≤ `MAX_T`) tokens
/// (`acts` = the activations of tokens `g0..g0 + acts.len()`), row blocks outermost; no
/// group straddles a change of `key(token)` (the float order, which is ggml's per row and
/// may change between tokens). `first`: the group's first run in the first row block (the
/// later runs' `acts` are unchanged since: `MultiDot::rows_call_keep`, whose layout is reused
/// where its addresses are those it was made from).
#[inline]
fn blocked<'a>(
    (r0, r1): (usize, usize),
    count: usize,
    key: impl Fn(usize) -> u8,
    group: impl Fn(u8) -> usize,
    rows_per_block: usize,
    act: impl Fn(usize) -> &'a [u8],
    mut f: impl FnMut(usize, usize, usize, &[&'a [u8]], bool),
) {
    let mut b0 = r0;
    while b0 < r1 {
        let b1 = (b0 + rows_per_block).min(r1);
        let mut g0 = 0;
        while g0 < count {
            let k0 = key(g0);
            let max = group(k0).min(MAX_T).min(count - g0);
            let n = (1..max).find(|&j| key(g0 + j) != k0).unwrap_or(max);
            let mut acts: [&[u8]; MAX_T] = [&[]; MAX_T];
            for (j, a) in acts[..n].iter_mut().enumerate() {
                *a = act(g0 + j);
            }
            let mut ra = b0;
            while ra < b1 {
                let rb = (ra + RUN_ROWS).min(b1);
                f(ra, rb, g0, &acts[..n], ra == r0);
                ra = rb;
            }
            g0 += n;
        }
        b0 = b1;
    }
}

/// The two orders' multi-token dots of `ty` over `n` columns: [Single, Many].
fn dots(ty: crate::quant::GgmlType, n: usize) -> [MultiDot; 2] {
    [
        MultiDot::new(ty, n, Order::Single),
        MultiDot::new(ty, n, Order::Many),
    ]
}

/// Index into `dots` for the `bit` of an orders byte.
#[inline]
fn pick(key: u8, bit: u8) -> usize {
    usize::from(key & bit != 0)
}

impl Plan {
    #[inline]
    fn done(&self, phase: usize) -> &AtomicU32 {
        // SAFETY: `phase_done` has N_PHASES counters, alive for the call.
        unsafe { &(*self.phase_done.add(phase)).0 }
    }

    #[inline]
    fn job_ctr(&self, j: usize) -> &AtomicU32 {
        // SAFETY: `job_ctr` has n_jobs counters, alive for the call.
        unsafe { &(*self.job_ctr.add(j)).0 }
    }

    #[inline]
    fn wait_phase(&self, phase: usize) {
        wait_at_least(self.done(phase), self.phase_len(phase));
    }

    #[inline]
    fn finish(&self, phase: usize) {
        self.done(phase).fetch_add(1, Ordering::Release);
    }

    /// The orders byte of pair (MoE) or token (dense) `i`.
    #[inline]
    fn order(&self, i: usize) -> u8 {
        // SAFETY: `orders` holds one byte per pair / token of the call, alive for the call.
        unsafe { *self.orders.add(i) }
    }

    /// Row `r` of expert `e` of `w`.
    #[inline]
    unsafe fn row(&self, w: &WPtr, e: usize, r: usize) -> &[u8] {
        let start = if w.table.is_null() {
            w.base.add(e * w.expert_bytes)
        } else {
            (*w.table.add(e)).as_ptr()
        };
        std::slice::from_raw_parts(start.add(r * w.row_bytes), w.row_bytes)
    }

    /// Rows `[r, r+k)` of expert `e` of `w`, back to back.
    #[inline]
    unsafe fn rows(&self, w: &WPtr, e: usize, r: usize, k: usize) -> &[u8] {
        let first = self.row(w, e, r).as_ptr();
        std::slice::from_raw_parts(first, k * w.row_bytes)
    }
}

/// Run tile `idx` of the call described by `p`.
///
/// # Safety
/// `p` is the plan of the live call and `idx` was claimed by this thread for it.
pub unsafe fn run_tile(p: &Plan, idx: u32) {
    // The phase whose range [starts[ph], starts[ph+1]) holds idx (empty phases are skipped).
    let phase = (0..N_PHASES)
        .find(|&ph| idx < p.starts[ph + 1])
        .unwrap_or(PH_E);
    let n = (idx - p.starts[phase]) as usize;
    match phase {
        PH_A => tile_quantize_x(p, n),
        PH_B => {
            p.wait_phase(PH_A);
            tile_gate_up(p, n);
        }
        PH_C => {
            p.wait_phase(PH_B);
            quantize_job(p, n);
            p.finish(PH_C);
        }
        PH_D => {
            match (p.kind, p.pipelined) {
                (Kind::Func, _) => {}
                (Kind::Dense, _) => p.wait_phase(PH_A),
                (Kind::Moe, false) => p.wait_phase(PH_C),
                (Kind::Moe, true) => wait_zero(p.job_ctr(n / p.nd)),
            }
            match p.kind {
                Kind::Moe => tile_down(p, n),
                Kind::Dense => tile_dense(p, n),
                Kind::Func => {
                    if let Some(f) = p.func {
                        (*f)(n);
                    }
                }
            }
            p.finish(PH_D);
        }
        _ => {
            p.wait_phase(PH_D);
            tile_reduce(p, n);
            p.finish(PH_E);
        }
    }
}

/// A: quantize tokens of x to the gate (and, if different, up) activation type.
unsafe fn tile_quantize_x(p: &Plan, n: usize) {
    let (t0, t1) = split(p.t, p.phase_len(PH_A) as usize, n);
    let cols = match p.kind {
        Kind::Moe => p.h,
        Kind::Dense | Kind::Func => p.i,
    };
    for t in t0..t1 {
        let x = std::slice::from_raw_parts(p.x.add(t * cols), cols);
        let g = std::slice::from_raw_parts_mut(p.xq_g.add(t * p.xq_g_rb), p.xq_g_rb);
        // Validated at plan time: the buffer sizes match, so this cannot fail.
        let _ = quantize_act(p.gate.ty.vec_dot_type(), x, g);
        if p.xq_u != p.xq_g {
            let u = std::slice::from_raw_parts_mut(p.xq_u.add(t * p.xq_u_rb), p.xq_u_rb);
            let _ = quantize_act(p.up.ty.vec_dot_type(), x, u);
        }
    }
    p.finish(PH_A);
}

/// B: Gate and Up rows `[i0,i1)` of job `n / nb` for all its pairs, then SwiGLU into h.
/// ggml's order depends on the rows routed to the expert (`order_id`), counted per segment
/// of the call (`Plan::orders`).
unsafe fn tile_gate_up(p: &Plan, n: usize) {
    let j = n / p.nb;
    let job = *p.jobs.add(j);
    let e = job.expert as usize;
    let rows = split(p.i, p.nb, n % p.nb);
    let (q0, np) = (job.start as usize, job.n as usize);
    if np == 1 {
        let t = *p.pair_token.add(q0) as usize;
        let xg = std::slice::from_raw_parts(p.xq_g.add(t * p.xq_g_rb), p.xq_g_rb);
        let xu = std::slice::from_raw_parts(p.xq_u.add(t * p.xq_u_rb), p.xq_u_rb);
        let (mut g, mut u) = ([0f32; DECODE_ROWS], [0f32; DECODE_ROWS]);
        decode_runs(rows, |i, k| {
            vec_dot_rows(p.gate.ty, p.h, p.rows(&p.gate, e, i, k), xg, &mut g[..k]);
            vec_dot_rows(p.up.ty, p.h, p.rows(&p.up, e, i, k), xu, &mut u[..k]);
            for jj in 0..k {
                *p.h_buf.add(q0 * p.i + i + jj) = silu_mul(g[jj], u[jj]);
            }
        });
    } else {
        gate_up_multi(p, e, rows, q0, np);
    }
    p.finish(PH_B);
    if p.pipelined {
        // The last B tile of the job quantizes its intermediate and publishes its D tiles.
        if p.job_ctr(j).fetch_sub(1, Ordering::AcqRel) == 2 {
            quantize_job(p, j);
            p.job_ctr(j).store(0, Ordering::Release);
        }
    }
}

/// Gate and Up rows `rows` of expert `e` for the `np` > 1 pairs from `q0`, token groups
/// decoded once per weight block (`MultiDot`), then SwiGLU into h.
unsafe fn gate_up_multi(p: &Plan, e: usize, rows: (usize, usize), q0: usize, np: usize) {
    let act = |base: *mut u8, rb: usize, j: usize| {
        let t = *p.pair_token.add(q0 + j) as usize;
        std::slice::from_raw_parts(base.add(t * rb), rb)
    };
    let same = p.xq_u == p.xq_g;
    let (gd, ud) = (dots(p.gate.ty, p.h), dots(p.up.ty, p.h));
    let rpb = row_block(p.gate.row_bytes + p.up.row_bytes);
    let xg = |j| act(p.xq_g, p.xq_g_rb, j);
    let key = |j: usize| p.order(q0 + j) & (ORDER_G | ORDER_U);
    let group = |k: u8| {
        gd[pick(k, ORDER_G)]
            .group()
            .min(ud[pick(k, ORDER_U)].group())
    };
    let (mut gr, mut ur) = ([0f32; RUN_ROWS * MAX_T], [0f32; RUN_ROWS * MAX_T]);
    blocked(rows, np, key, group, rpb, xg, |ra, rb, g0, xg, first| {
        let (m, nr) = (xg.len(), rb - ra);
        let kk = key(g0);
        let (gdot, udot) = (&gd[pick(kk, ORDER_G)], &ud[pick(kk, ORDER_U)]);
        let mut xu: [&[u8]; MAX_T] = [&[]; MAX_T];
        let xu = if same {
            xg
        } else {
            for (j, a) in xu[..m].iter_mut().enumerate() {
                *a = act(p.xq_u, p.xq_u_rb, g0 + j);
            }
            &xu[..m]
        };
        if gdot.uses_tiles(m) && udot.uses_tiles(m) {
            let (go, uo) = (&mut gr[..nr * m], &mut ur[..nr * m]);
            // the tiles' activation layout: built by the group's first run, Up reusing Gate's
            // when both take the same activations
            gdot.rows_call_keep(p.rows(&p.gate, e, ra, nr), nr, xg, go, !first);
            udot.rows_call_keep(p.rows(&p.up, e, ra, nr), nr, xu, uo, same);
            silu_mul_in_place(go, uo);
            let h = p.h_buf.add((q0 + g0) * p.i + ra);
            store_token_major(nr, m, h, p.i, |x| go[x]);
            return;
        }
        gdot.rows_plain(p.rows(&p.gate, e, ra, nr), nr, xg, &mut gr[..nr * m]);
        udot.rows_plain(p.rows(&p.up, e, ra, nr), nr, xu, &mut ur[..nr * m]);
        silu_mul_in_place(&mut gr[..nr * m], &ur[..nr * m]);
        let h = p.h_buf.add((q0 + g0) * p.i + ra);
        store_token_major(nr, m, h, p.i, |x| gr[x]);
    });
}

/// A run's results, `value(k·m + jj)` for row k < nr and token jj < m (row-major, as the
/// tile kernels leave them), into `dst[jj·stride + k]`: token by token, so each token's nr
/// values are stored contiguously (row by row, every store would land `stride` floats from
/// the last: a cache line and often a page per value).
#[inline(always)]
unsafe fn store_token_major(
    nr: usize,
    m: usize,
    dst: *mut f32,
    stride: usize,
    value: impl Fn(usize) -> f32,
) {
    for jj in 0..m {
        let d = dst.add(jj * stride);
        for k in 0..nr {
            *d.add(k) = value(k * m + jj);
        }
    }
}

/// C: quantize job `j`'s intermediate rows to the Down activation type.
unsafe fn quantize_job(p: &Plan, j: usize) {
    let job = *p.jobs.add(j);
    let act = p.down.ty.vec_dot_type();
    for q in job.start as usize..(job.start + job.n) as usize {
        let h = std::slice::from_raw_parts(p.h_buf.add(q * p.i), p.i);
        let out = std::slice::from_raw_parts_mut(p.hq.add(q * p.hq_rb), p.hq_rb);
        let _ = quantize_act(act, h, out);
    }
}

/// D: Down rows `[r0,r1)` of job `n / nd` for all its pairs → dout.
unsafe fn tile_down(p: &Plan, n: usize) {
    let job = *p.jobs.add(n / p.nd);
    let e = job.expert as usize;
    let rows = split(p.h, p.nd, n % p.nd);
    let (q0, np) = (job.start as usize, job.n as usize);
    let act = |j: usize| std::slice::from_raw_parts(p.hq.add((q0 + j) * p.hq_rb), p.hq_rb);
    if np == 1 {
        let mut out = [0f32; DECODE_ROWS];
        decode_runs(rows, |r, k| {
            vec_dot_rows(
                p.down.ty,
                p.i,
                p.rows(&p.down, e, r, k),
                act(0),
                &mut out[..k],
            );
            std::ptr::copy_nonoverlapping(out.as_ptr(), p.dout.add(q0 * p.h + r), k);
        });
        return;
    }
    let dd = dots(p.down.ty, p.i);
    let mut run = [0f32; RUN_ROWS * MAX_T];
    let key = |j: usize| p.order(q0 + j) & ORDER_D;
    blocked(
        rows,
        np,
        key,
        |k| dd[pick(k, ORDER_D)].group(),
        row_block(p.down.row_bytes),
        act,
        |ra, rb, g0, a, first| {
            let m = a.len();
            let dot = &dd[pick(key(g0), ORDER_D)];
            // the tiles (reusing the group's activation layout after its first run) or
            // the rows × tokens kernels
            let o = &mut run[..(rb - ra) * m];
            dot.rows_call_keep(p.rows(&p.down, e, ra, rb - ra), rb - ra, a, o, !first);
            let d = p.dout.add((q0 + g0) * p.h + ra);
            store_token_major(rb - ra, m, d, p.h, |x| o[x]);
        },
    );
}

/// E: y over a range of (token, H chunk) units, slots summed left to right. The first
/// computed slot assigns, later ones add; `SKIP` slots (masked calls) are passed over, and a
/// token whose slots are all skipped gets zeros.
unsafe fn tile_reduce(p: &Plan, n: usize) {
    let (u0, u1) = split(p.e_units, p.phase_len(PH_E) as usize, n);
    for unit in u0..u1 {
        let t = unit / p.e_chunks;
        let c = unit % p.e_chunks;
        let h0 = c * E_CHUNK;
        let h1 = (h0 + E_CHUNK).min(p.h);
        let y = p.y.add(t * p.h);
        let mut first = true;
        for j in 0..p.k {
            let q = *p.slot_pair.add(t * p.k + j);
            if q == SKIP {
                continue;
            }
            let q = q as usize;
            let w = *p.weights.add(t * p.k + j);
            if first {
                for hh in h0..h1 {
                    *y.add(hh) = w * *p.dout.add(q * p.h + hh);
                }
                first = false;
            } else {
                for hh in h0..h1 {
                    *y.add(hh) += w * *p.dout.add(q * p.h + hh);
                }
            }
        }
        if first {
            for hh in h0..h1 {
                *y.add(hh) = 0.0;
            }
        }
    }
}

/// Dense D: rows `[r0,r1)` of W for every token, straight into y[T, rows]. ggml's order
/// depends on the number of activation rows (`many_rows`: the first ones may take the
/// multi-row order), counted per segment of the call (`Plan::orders`).
unsafe fn tile_dense(p: &Plan, n: usize) {
    let rows = split(p.h, p.nd, n);
    let act = |t: usize| std::slice::from_raw_parts(p.xq_g.add(t * p.xq_g_rb), p.xq_g_rb);
    if p.t == 1 {
        let mut out = [0f32; DECODE_ROWS];
        decode_runs(rows, |r, k| {
            vec_dot_rows(
                p.down.ty,
                p.i,
                p.rows(&p.down, 0, r, k),
                act(0),
                &mut out[..k],
            );
            std::ptr::copy_nonoverlapping(out.as_ptr(), p.y.add(r), k);
        });
        return;
    }
    let dd = dots(p.down.ty, p.i);
    let mut run = [0f32; RUN_ROWS * MAX_T];
    let key = |t: usize| p.order(t) & ORDER_D;
    blocked(
        rows,
        p.t,
        key,
        |k| dd[pick(k, ORDER_D)].group(),
        row_block(p.down.row_bytes),
        act,
        |ra, rb, g0, a, first| {
            let m = a.len();
            let dot = &dd[pick(key(g0), ORDER_D)];
            // as in `tile_down`
            let o = &mut run[..(rb - ra) * m];
            dot.rows_call_keep(p.rows(&p.down, 0, ra, rb - ra), rb - ra, a, o, !first);
            store_token_major(rb - ra, m, p.y.add(g0 * p.h + ra), p.h, |x| o[x]);
        },
    );
}
