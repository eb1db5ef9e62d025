//! The per-row work of the batched step and of the MTP layer on the compute's threads: the
//! embedding lookup (the step's), RMSNorms, q/k norms with RoPE, KV stores, residual adds and
//! routing. Each row is computed by the same code in the same float order whichever thread
//! takes it (the norms keep ggml's sequential f64 sum), so results are bitwise those of the
//! serial loop; only the schedule changes.
//!
//! Why: a 512-token prompt on 16 threads spent ~40% of its wall time in these loops on the
//! calling thread while the pool's workers waited (py-spy of the main thread on the GPU
//! host's Xeon, docs/BENCHMARKS.md); the matmuls around them had already scaled.
//!
//! Steps of fewer than `2 · GRAIN` rows (decode, short windows) run on the calling thread:
//! a pool dispatch costs more than their rows.
//!
//! Legend: T = rows, H = hidden, Nh / Nkv = query / KV heads, D = head dim, E = experts,
//! K = experts used.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Mutex;

use super::arch::Routing;
use super::compute::Compute;
use super::kv::{store_kv, KvType};
use super::ops::{rms_norm, rms_norm_rows_inplace, Rope};
use super::weights::Weights;
use crate::error::{Error, Result};

/// Rows per task.
const GRAIN: usize = 16;

/// Runs `f` over row ranges covering `0..n` (`GRAIN` rows each) on `compute`'s threads, or
/// on this thread when `n < 2 · GRAIN`. Returns the first error a task returned.
fn par_rows(
    compute: &dyn Compute,
    n: usize,
    f: &(dyn Fn(Range<usize>) -> Result<()> + Sync),
) -> Result<()> {
    if n < 2 * GRAIN {
        return f(0..n);
    }
    let err: Mutex<Option<Error>> = Mutex::new(None);
    compute.for_each(n.div_ceil(GRAIN), &|i| {
        if let Err(e) = f(i * GRAIN..((i + 1) * GRAIN).min(n)) {
            err.lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
        }
    })?;
    match err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// A buffer of `width`-element rows lent to `par_rows`' tasks, each writing its own rows.
struct RowsMut<'a, T> {
    ptr: *mut T,
    rows: usize,
    width: usize,
    _buf: PhantomData<&'a mut [T]>,
}

// SAFETY: tasks take disjoint row ranges (`par_rows` hands each range out once), and the
// buffer's borrow outlives `for_each`, which returns after every task has finished.
unsafe impl<T: Send> Sync for RowsMut<'_, T> {}

impl<'a, T> RowsMut<'a, T> {
    fn new(buf: &'a mut [T], width: usize) -> Self {
        RowsMut {
            ptr: buf.as_mut_ptr(),
            // zero-width rows (e.g. a RoPE table with nothing rotated): any row is empty
            rows: buf.len().checked_div(width).unwrap_or(usize::MAX),
            width,
            _buf: PhantomData,
        }
    }

    /// Rows `r` (a task's own: no other live borrow overlaps them).
    #[allow(clippy::mut_from_ref)]
    fn rows(&self, r: Range<usize>) -> &mut [T] {
        assert!(r.start <= r.end && r.end <= self.rows);
        if self.width == 0 {
            return &mut [];
        }
        // SAFETY: in bounds (checked); disjoint from every other task's rows (type doc).
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr.add(r.start * self.width), r.len() * self.width)
        }
    }
}

/// `x[i] = token_embd[tokens[i]]` [T, H] and row i's RoPE table at position `p0 + i`
/// (`cos`, `sin`: [T, n_rot/2]).
pub fn embed_rows(
    compute: &dyn Compute,
    (w, rope): (&Weights, &Rope),
    tokens: &[u32],
    p0: usize,
    x: &mut [f32],
    (cos, sin): (&mut [f32], &mut [f32]),
) -> Result<()> {
    let (hd, half) = (
        x.len() / tokens.len().max(1),
        cos.len() / tokens.len().max(1),
    );
    let (x, cos, sin) = (
        RowsMut::new(x, hd),
        RowsMut::new(cos, half),
        RowsMut::new(sin, half),
    );
    par_rows(compute, tokens.len(), &|r| {
        for i in r {
            w.embed(tokens[i] as usize, x.rows(i..i + 1))?;
            rope.table(p0 + i, cos.rows(i..i + 1), sin.rows(i..i + 1));
        }
        Ok(())
    })
}

/// `out[i] = rms_norm(x[i]) · g` over the rows of x [T, g.len()].
pub fn norm_rows(
    compute: &dyn Compute,
    x: &[f32],
    g: &[f32],
    eps: f32,
    out: &mut [f32],
) -> Result<()> {
    let n = g.len();
    let out = RowsMut::new(out, n);
    par_rows(compute, x.len() / n.max(1), &|r| {
        let o = out.rows(r.clone());
        for (xr, or) in x[r.start * n..r.end * n]
            .chunks_exact(n)
            .zip(o.chunks_exact_mut(n))
        {
            rms_norm(xr, g, eps, or);
        }
        Ok(())
    })
}

/// `x += o` over [T, H] rows of width `width`.
pub fn add_rows(compute: &dyn Compute, x: &mut [f32], o: &[f32], width: usize) -> Result<()> {
    let n = x.len().checked_div(width).unwrap_or(0);
    let x = RowsMut::new(x, width);
    par_rows(compute, n, &|r| {
        let o = &o[r.start * width..r.end * width];
        for (x, o) in x.rows(r).iter_mut().zip(o) {
            *x += o;
        }
        Ok(())
    })
}

/// Per row: the per-head q/k RMSNorms (where `qk_norm` is given) then RoPE of q [T, Nh·D]
/// and k [T, Nkv·D] with the row's table (`cos`, `sin`: [T, n_rot/2]).
#[allow(clippy::too_many_arguments)]
pub fn qk_norm_rope(
    compute: &dyn Compute,
    rope: &Rope,
    (q, k): (&mut [f32], &mut [f32]),
    d: usize,
    qk_norm: Option<(&[f32], &[f32])>,
    eps: f32,
    (cos, sin): (&[f32], &[f32]),
    t: usize,
) -> Result<()> {
    let (qd, kvd, half) = (q.len() / t.max(1), k.len() / t.max(1), rope.n_rot / 2);
    let (q, k) = (RowsMut::new(q, qd), RowsMut::new(k, kvd));
    par_rows(compute, t, &|r| {
        for i in r {
            let (qr, kr) = (q.rows(i..i + 1), k.rows(i..i + 1));
            if let Some((qn, kn)) = qk_norm {
                rms_norm_rows_inplace(qr, qn, eps); // per head [D]
                rms_norm_rows_inplace(kr, kn, eps);
            }
            let (c, s) = (
                &cos[i * half..(i + 1) * half],
                &sin[i * half..(i + 1) * half],
            );
            rope.apply(qr, d, c, s);
            rope.apply(kr, d, c, s);
        }
        Ok(())
    })
}

/// Stores rows k, v [T, Nkv·D] (D = `d`) as `ty` into `kc`, `vc` ([T, rb] bytes each),
/// rotated first where the cache type is (`kv::store_kv`).
pub fn store_kv_rows(
    compute: &dyn Compute,
    ty: KvType,
    (k, v): (&[f32], &[f32]),
    (kvd, d): (usize, usize),
    (kc, vc): (&mut [u8], &mut [u8]),
) -> Result<()> {
    let t = k.len() / kvd.max(1);
    let rb = kc.len() / t.max(1);
    let (kc, vc) = (RowsMut::new(kc, rb), RowsMut::new(vc, rb));
    par_rows(compute, t, &|r| {
        for i in r {
            let x = i * kvd..(i + 1) * kvd;
            let rows = (&k[x.clone()], &v[x]);
            store_kv(ty, d, rows, (kc.rows(i..i + 1), vc.rows(i..i + 1)))?;
        }
        Ok(())
    })
}

/// Per row of the router's logits [T, E]: the strategy's top-K ids and weights [T, K].
pub fn route_rows(
    compute: &dyn Compute,
    strategy: Routing,
    bias: Option<&[f32]>,
    logits: &mut [f32],
    (ids, wts): (&mut [u32], &mut [f32]),
    e: usize,
) -> Result<()> {
    let t = logits.len() / e.max(1);
    let k = ids.len() / t.max(1);
    let (p, ids, wts) = (
        RowsMut::new(logits, e),
        RowsMut::new(ids, k),
        RowsMut::new(wts, k),
    );
    par_rows(compute, t, &|r| {
        for i in r {
            strategy.route(
                p.rows(i..i + 1),
                bias,
                ids.rows(i..i + 1),
                wts.rows(i..i + 1),
            );
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kv::store_row;
    use crate::model::SerialCompute;
    use crate::pool::tests::{bits, cfg as pool_cfg};
    use crate::pool::Pool;

    fn val(i: usize) -> f32 {
        ((i * 7919 + 13) % 1013) as f32 / 253.0 - 2.0
    }

    /// Each helper on a pool with workers equals its serial row loop bit for bit, below and
    /// above the pooled threshold (7 and 45 rows: a last task of 13 rows).
    #[test]
    fn rows_equal_the_serial_loops_bitwise() {
        let pool = Pool::new(pool_cfg(2, true, false));
        let serial = SerialCompute::new();
        let (h, e, k, eps) = (96, 16, 4, 1e-6f32);
        let g: Vec<f32> = (0..h).map(|i| 1.0 + val(i) / 8.0).collect();
        for t in [7usize, 45] {
            let x: Vec<f32> = (0..t * h).map(val).collect();
            let o: Vec<f32> = (0..t * h).map(|i| val(i + 5)).collect();
            for c in [&pool as &dyn Compute, &serial] {
                // RMSNorm
                let mut want = vec![0f32; t * h];
                for (xr, wr) in x.chunks(h).zip(want.chunks_mut(h)) {
                    rms_norm(xr, &g, eps, wr);
                }
                let mut got = vec![f32::NAN; t * h];
                norm_rows(c, &x, &g, eps, &mut got).unwrap();
                assert_eq!(bits(&got), bits(&want), "norm t={t}");
                // residual add
                let mut got = x.clone();
                add_rows(c, &mut got, &o, h).unwrap();
                let want: Vec<f32> = x.iter().zip(&o).map(|(a, b)| a + b).collect();
                assert_eq!(bits(&got), bits(&want), "add t={t}");
                // routing
                let r = Routing::Softmax { norm: true };
                let logits: Vec<f32> = (0..t * e).map(|i| val(3 * i)).collect();
                let (mut p, mut ids, mut wts) =
                    (logits.clone(), vec![0u32; t * k], vec![0f32; t * k]);
                route_rows(c, r, None, &mut p, (&mut ids, &mut wts), e).unwrap();
                for i in 0..t {
                    let (mut p1, mut i1, mut w1) = (
                        logits[i * e..(i + 1) * e].to_vec(),
                        vec![0u32; k],
                        vec![0f32; k],
                    );
                    r.route(&mut p1, None, &mut i1, &mut w1);
                    assert_eq!(&ids[i * k..(i + 1) * k], &i1[..], "ids t={t} row {i}");
                    assert_eq!(
                        bits(&wts[i * k..(i + 1) * k]),
                        bits(&w1),
                        "wts t={t} row {i}"
                    );
                }
                // KV stores, f16
                let rb = 2 * h;
                let (mut kc, mut vc) = (vec![0u8; t * rb], vec![0u8; t * rb]);
                store_kv_rows(c, KvType::F16, (&x, &o), (h, h), (&mut kc, &mut vc)).unwrap();
                for i in 0..t {
                    let mut row = vec![0u8; rb];
                    store_row(KvType::F16, &x[i * h..(i + 1) * h], &mut row).unwrap();
                    assert_eq!(&kc[i * rb..(i + 1) * rb], &row[..], "k t={t} row {i}");
                    store_row(KvType::F16, &o[i * h..(i + 1) * h], &mut row).unwrap();
                    assert_eq!(&vc[i * rb..(i + 1) * rb], &row[..], "v t={t} row {i}");
                }
            }
        }
    }

    /// A task's error reaches the caller: Q8_0 rows of 40 values are not whole 32-value
    /// blocks, so every task's store fails (40 rows: three pooled tasks).
    #[test]
    fn a_task_error_is_returned() {
        let pool = Pool::new(pool_cfg(1, true, false));
        let (t, w) = (40usize, 40usize);
        let x: Vec<f32> = (0..t * w).map(val).collect();
        let (mut kc, mut vc) = (vec![0u8; t * 64], vec![0u8; t * 64]);
        let r = store_kv_rows(&pool, KvType::Q8_0, (&x, &x), (w, w), (&mut kc, &mut vc));
        assert!(r.is_err());
    }
}
