//! Attention of a chunk on the compute's threads: the units of a chunk are spread over
//! `ATT_TASKS` tasks (`Compute::for_each`), each with its own scratch. A unit is (query
//! position, KV group) where the grouped kernels serve the chunk (`attn_gqa::serves`: all the
//! group's query heads in one pass over its K/V rows, bitwise `attend_head` per head), and
//! (query position, query head) running `attention::attend_head` otherwise. Every unit writes
//! its own outputs, so the result is bit for bit the serial loop's whatever the schedule.
//!
//! Shapes: T query positions at p0.., Nh query heads of D; q and out are [T, Nh·D]; the
//! cache layer holds positions [0, p0 + T); position p0 + i sees keys [0, p0 + i + 1), or
//! only the last W of them with a window (`AttnShape::window`).

use super::attention::{attend_head, AttnScratch, AttnShape};
use super::attn_gqa::{attend_group_rows, serves, GroupScratch, MAX_ROWS};
use super::compute::Compute;
use super::kv::KvType;
use crate::error::{Error, Result};
use std::sync::Mutex;

/// Fewest tasks per chunk and layer (each has its own scratch; a model takes one per compute
/// thread where it has more). Units are dealt out round robin, so the causal work
/// (∝ p0 + i + 1) is spread evenly across tasks.
pub const ATT_TASKS: usize = 8;

/// Most tasks (scratch is per task and grows with `n_ctx`).
const MAX_TASKS: usize = 64;

/// One task's scratch: the per-head path's and the grouped kernels'.
struct TaskScratch {
    head: AttnScratch,
    group: GroupScratch,
}

/// One scratch per task, sized at load.
pub struct AttnPar {
    scratch: Vec<Mutex<TaskScratch>>,
}

impl AttnPar {
    /// Scratch for `threads.clamp(ATT_TASKS, 64)` tasks: every compute thread gets attention
    /// units (with 8 tasks on 16 threads, half the threads waited out each layer's attention
    /// in a 512-token prompt).
    pub fn new(n_ctx: usize, ty: KvType, head_dim: usize, threads: usize) -> AttnPar {
        AttnPar {
            scratch: (0..threads.clamp(ATT_TASKS, MAX_TASKS))
                .map(|_| {
                    Mutex::new(TaskScratch {
                        head: AttnScratch::new(n_ctx, ty, head_dim),
                        group: GroupScratch::new(n_ctx, ty, head_dim),
                    })
                })
                .collect(),
        }
    }
}

/// The output buffer shared by the tasks; each unit writes a disjoint [D] slice.
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint ranges (one per (position, head) unit), and the call returns
// only after every task has finished.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    fn at(&self, r: usize) -> *mut f32 {
        // SAFETY (of the callers' use): r + D ≤ out.len(), checked by `attend_chunk`.
        self.0.wrapping_add(r)
    }
}

/// Attention of the chunk's `t` positions (q, out: [T, Nh·D]) over the layer's cache.
#[allow(clippy::too_many_arguments)]
pub fn attend_chunk(
    s: &AttnShape,
    k_cache: &[u8],
    v_cache: &[u8],
    p0: usize,
    t: usize,
    q: &[f32],
    out: &mut [f32],
    par: &AttnPar,
    compute: &dyn Compute,
) -> Result<()> {
    let grouped = serves(s, t);
    attend_chunk_units(s, k_cache, v_cache, p0, t, q, out, par, compute, grouped, t)
}

/// `attend_chunk` with the unit kind chosen: grouped units (only where `serves` holds) or
/// per-head units. Both give the same bits; benchmarks compare their speed. `order` is the
/// row count whose kernel order the rows follow (`t`; 1: each row in the one-row order of a
/// decode step, bitwise what a one-token call gives at its position).
#[allow(clippy::too_many_arguments)]
pub fn attend_chunk_units(
    s: &AttnShape,
    k_cache: &[u8],
    v_cache: &[u8],
    p0: usize,
    t: usize,
    q: &[f32],
    out: &mut [f32],
    par: &AttnPar,
    compute: &dyn Compute,
    grouped: bool,
    order: usize,
) -> Result<()> {
    let (nh, d) = (s.n_head, s.head_dim);
    let qd = nh * d;
    if q.len() != t * qd || out.len() != t * qd {
        return Err(Error::Shape(format!(
            "attention: q has {} and out {} values, expected T·Nh·D = {t}·{qd}",
            q.len(),
            out.len()
        )));
    }
    // units per position: KV groups of G heads, or single heads
    let grouped = grouped && serves(s, order);
    let (per, width) = if grouped {
        (s.n_head_kv, nh / s.n_head_kv)
    } else {
        (nh, 1)
    };
    // grouped rows of a long chunk go MAX_ROWS to a unit (they share each widened block of V
    // rows; a sliding window would give them different first keys); short chunks keep a
    // row per unit, for the tasks' balance
    let rows = if grouped && s.window.is_none() && t >= MAX_ROWS * ATT_TASKS {
        MAX_ROWS
    } else {
        1
    };
    let units = t.div_ceil(rows) * per;
    let tasks = units.min(par.scratch.len());
    let o = OutPtr(out.as_mut_ptr());
    let failed: Mutex<Option<Error>> = Mutex::new(None);
    let task = |k: usize| {
        let Ok(mut scratch) = par.scratch[k].lock() else {
            return;
        };
        let TaskScratch { head, group } = &mut *scratch;
        for u in (k..units).step_by(tasks) {
            let (i0, h) = ((u / per) * rows, u % per);
            let (len, r) = (width * d, rows.min(t - i0));
            // row i's heads of this unit: [G, D] (a head's [D] ungrouped) at i·Nh·D + h·G·D
            let at = |j: usize| (i0 + j) * qd + h * len;
            // the unit's rows share their first key (several rows a unit only without a
            // window): row j sees keys [lo, p0 + i0 + j + 1)
            let lo = s.first_key(p0 + i0 + 1);
            let (kc, vc) = (&k_cache[lo * s.row_bytes..], &v_cache[lo * s.row_bytes..]);
            let ns: [usize; MAX_ROWS] = std::array::from_fn(|j| p0 + i0 + j + 1 - lo);
            let qs: [&[f32]; MAX_ROWS] =
                std::array::from_fn(|j| if j < r { &q[at(j)..at(j) + len] } else { &[] });
            let mut outs: [&mut [f32]; MAX_ROWS] = std::array::from_fn(|j| {
                if j < r {
                    // SAFETY: unit (rows, h) alone writes out[at(j)..at(j) + len] of each of
                    // its rows, inside out (checked above); alive for this iteration.
                    unsafe { std::slice::from_raw_parts_mut(o.at(at(j)), len) }
                } else {
                    &mut []
                }
            });
            let res = if grouped {
                attend_group_rows(
                    s,
                    kc,
                    vc,
                    &ns[..r],
                    h,
                    &qs[..r],
                    &mut outs[..r],
                    group,
                    head,
                    order,
                )
            } else {
                attend_head(s, kc, vc, ns[0], h, qs[0], outs[0], head, order)
            };
            if let Err(e) = res {
                if let Ok(mut f) = failed.lock() {
                    f.get_or_insert(e);
                }
                return;
            }
        }
    };
    compute.for_each(tasks, &task)?;
    match failed.into_inner() {
        Ok(Some(e)) => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attention::attend;
    use crate::model::compute::SerialCompute;
    use crate::model::kv::KvCache;
    use crate::pool::tests::{bits, cfg as pool_cfg};
    use crate::pool::Pool;

    /// The threaded chunk equals the serial per-position loop bit for bit, for f16 and f32
    /// caches, one and several query rows, on a pool with workers and on the serial compute.
    #[test]
    fn chunk_equals_the_serial_loop_bitwise() {
        let (d, p0, ctx) = (64, 5, 320);
        let val = |i: usize| ((i * 7919 + 13) % 1013) as f32 / 253.0 - 2.0;
        let pool = Pool::new(pool_cfg(2, true, false));
        // t ≥ 32 takes the grouped rows path (MAX_ROWS rows a unit; 37: a last unit of one
        // row; 300: two P·V blocks), groups of 4 and of 8 heads
        for (ty, nh, nkv, t) in [
            (KvType::F16, 8, 2, 1usize),
            (KvType::F16, 8, 2, 7),
            (KvType::F16, 8, 2, 37),
            (KvType::F16, 16, 2, 37),
            (KvType::F16, 16, 2, 300),
            (KvType::F32, 8, 2, 1),
            (KvType::F32, 8, 2, 7),
            (KvType::F32, 8, 2, 37),
        ] {
            {
                let n = p0 + t;
                let mut kv = KvCache::new(ty, 1, ctx, nkv, d, 1).unwrap();
                for p in 0..n {
                    let k: Vec<f32> = (0..nkv * d).map(|i| val(i + 31 * p)).collect();
                    let v: Vec<f32> = (0..nkv * d).map(|i| val(i * 3 + 17 * p + 5)).collect();
                    kv.write(0, 0, p, &k, &v).unwrap();
                }
                let shape = AttnShape::of(&kv, nh, nkv, d);
                let q: Vec<f32> = (0..t * nh * d).map(|i| val(i * 5 + 1) * 0.3).collect();
                let (kc, vc) = kv.layer(0, 0, n);
                let mut want = vec![0f32; t * nh * d];
                let mut s = AttnScratch::new(ctx, ty, d);
                for i in 0..t {
                    let r = i * nh * d..(i + 1) * nh * d;
                    attend(
                        &shape,
                        kc,
                        vc,
                        p0 + i + 1,
                        &q[r.clone()],
                        &mut want[r],
                        &mut s,
                        t,
                    )
                    .unwrap();
                }
                let serial = SerialCompute::new();
                // the default task count and more tasks than threads: the same bits
                for (c, tasks) in [
                    (&pool as &dyn Compute, ATT_TASKS),
                    (&pool, 24),
                    (&serial, 1),
                ] {
                    let par = AttnPar::new(ctx, ty, d, tasks);
                    let mut out = vec![f32::NAN; t * nh * d];
                    attend_chunk(&shape, kc, vc, p0, t, &q, &mut out, &par, c).unwrap();
                    assert_eq!(bits(&out), bits(&want), "{ty:?} t={t}");
                }
                let mut short = vec![0f32; 3];
                let par = AttnPar::new(ctx, ty, d, ATT_TASKS);
                assert!(attend_chunk(&shape, kc, vc, p0, t, &q, &mut short, &par, &pool).is_err());
            }
        }
    }
}
