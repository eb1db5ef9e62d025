//! Tile execution: what one claimed tile computes, and the dependency waits in front of it.
//! Every output element is written by exactly one tile, from full-row dots, so the result does
//! not depend on which thread runs a tile, when, or how rows are split into tiles.
//!
//! Safety: a tile dereferences the plan's raw pointers only while its call is live (the host
//! returns after every tile has retired). Writes go to regions no other tile of the call
//! touches; reads of other tiles' output happen after an Acquire wait on the counter those
//! tiles released (phase counter or job counter).

use super::plan::{Kind, Plan, WPtr, E_CHUNK, N_PHASES, PH_A, PH_B, PH_C, PH_D, PH_E};
use super::protocol::{wait_at_least, wait_zero};
use super::SKIP;
use crate::quant::dot::{quantize_act, vec_dot_id, vec_dot_t};
use std::sync::atomic::{AtomicU32, Ordering};

/// ggml's SwiGLU for one element (`vexp::silu_mul`).
use crate::quant::vexp::silu_mul_one as silu_mul;

/// Part `n` of `parts` equal splits of `len`: `[n·len/parts, (n+1)·len/parts)`.
#[inline]
fn split(len: usize, parts: usize, n: usize) -> (usize, usize) {
    (n * len / parts, (n + 1) * len / parts)
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
                (Kind::Dense, _) => p.wait_phase(PH_A),
                (Kind::Moe, false) => p.wait_phase(PH_C),
                (Kind::Moe, true) => wait_zero(p.job_ctr(n / p.nd)),
            }
            match p.kind {
                Kind::Moe => tile_down(p, n),
                Kind::Dense => tile_dense(p, n),
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
        Kind::Dense => p.i,
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
unsafe fn tile_gate_up(p: &Plan, n: usize) {
    let j = n / p.nb;
    let job = *p.jobs.add(j);
    let e = job.expert as usize;
    let (i0, i1) = split(p.i, p.nb, n % p.nb);
    let pairs = job.start as usize..(job.start + job.n) as usize;
    for i in i0..i1 {
        let grow = p.row(&p.gate, e, i);
        let urow = p.row(&p.up, e, i);
        for q in pairs.clone() {
            let t = *p.pair_token.add(q) as usize;
            let xg = std::slice::from_raw_parts(p.xq_g.add(t * p.xq_g_rb), p.xq_g_rb);
            let xu = std::slice::from_raw_parts(p.xq_u.add(t * p.xq_u_rb), p.xq_u_rb);
            // ggml's order depends on the rows routed to the expert (`vec_dot_id`).
            let g = vec_dot_id(p.gate.ty, p.h, grow, xg, job.n as usize);
            let u = vec_dot_id(p.up.ty, p.h, urow, xu, job.n as usize);
            *p.h_buf.add(q * p.i + i) = silu_mul(g, u);
        }
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
    let (r0, r1) = split(p.h, p.nd, n % p.nd);
    let pairs = job.start as usize..(job.start + job.n) as usize;
    for r in r0..r1 {
        let drow = p.row(&p.down, e, r);
        for q in pairs.clone() {
            let a = std::slice::from_raw_parts(p.hq.add(q * p.hq_rb), p.hq_rb);
            *p.dout.add(q * p.h + r) = vec_dot_id(p.down.ty, p.i, drow, a, job.n as usize);
        }
    }
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

/// Dense D: rows `[r0,r1)` of W for every token, straight into y[T, rows].
unsafe fn tile_dense(p: &Plan, n: usize) {
    let (r0, r1) = split(p.h, p.nd, n);
    for r in r0..r1 {
        let wrow = p.row(&p.down, 0, r);
        for t in 0..p.t {
            let a = std::slice::from_raw_parts(p.xq_g.add(t * p.xq_g_rb), p.xq_g_rb);
            // ggml's order depends on the number of activation rows (`vec_dot_t`).
            *p.y.add(t * p.h + r) = vec_dot_t(p.down.ty, p.i, wrow, a, p.t, t);
        }
    }
}
