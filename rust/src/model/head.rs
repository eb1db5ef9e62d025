//! The output head on a load-time repacked copy of a Q6_K `output.weight`
//! (`quant::dot::q6k_repack`, ModelConfig::cpu_repack): the same 210 bytes per block, fewer
//! instructions per block in decode, and logits bitwise `Compute::matmul`'s on the original
//! matrix (same activation quantization, same float order per activation row: `order_t`).
//!
//! Shapes: x [T, H] (normed rows), y [T, V]; the matrix is (V, H), rows of H/256 blocks.

use super::compute::{Compute, QMatrix};
use super::huge_buf::HugeBuf;
use crate::error::{Error, Result};
use crate::quant::dot::{self, pf_tune, q6k_repack, Isa, Order};
use crate::quant::GgmlType;

/// Vocabulary rows per task (≈ 430 KB of weights at H = 2048).
const ROWS_PER_TASK: usize = 256;

pub struct RepackedHead {
    data: HugeBuf, // [V, H/256 blocks of 210 bytes], repacked
    rows: usize,   // V
    cols: usize,   // H
    act_rb: usize, // bytes of one Q8_K activation row of H
    act: Vec<u8>,  // [T, act_rb] quantized rows
    perm: Vec<u8>, // [T, act_rb] the same, permuted for the repacked dot
}

/// A buffer shared by the tasks; each task writes its own rows (also `dense_r16`'s).
pub(super) struct OutPtr<T>(pub(super) *mut T);
// SAFETY: tasks write disjoint elements (their own rows), and `for_each` returns only after
// every task has finished.
unsafe impl<T> Sync for OutPtr<T> {}

impl<T> OutPtr<T> {
    /// Element `i` (callers keep it inside the buffer and theirs alone).
    pub(super) fn at(&self, i: usize) -> *mut T {
        self.0.wrapping_add(i)
    }
}

impl RepackedHead {
    /// The repacked copy of `w` (done on the compute's threads) with scratch for `max_t`
    /// activation rows; `None` when `w` is not Q6_K.
    pub fn new(w: &QMatrix<'_>, max_t: usize, compute: &dyn Compute) -> Result<Option<Self>> {
        if !q6k_repack::repackable(w.ty) {
            return Ok(None);
        }
        let rb = w.ty.row_bytes(w.cols);
        let act_rb = dot::act_bytes(w.ty, w.cols);
        let (Some(rb), Some(act_rb)) = (rb, act_rb) else {
            return Err(Error::Shape(format!(
                "head rows of {} are not whole Q6_K blocks",
                w.cols
            )));
        };
        if w.data.len() != w.rows * rb {
            return Err(Error::Shape(format!(
                "head: {} bytes for ({}, {}) Q6_K",
                w.data.len(),
                w.rows,
                w.cols
            )));
        }
        let mut data = HugeBuf::zeroed(w.data.len());
        let tasks = w.rows.div_ceil(ROWS_PER_TASK);
        let out = OutPtr(data.as_mut_ptr());
        compute.for_each(tasks, &|k| {
            let (r0, r1) = (k * ROWS_PER_TASK, ((k + 1) * ROWS_PER_TASK).min(w.rows));
            // SAFETY: task k alone writes rows [r0, r1) of `data` (w.rows · rb bytes).
            let dst = unsafe { std::slice::from_raw_parts_mut(out.at(r0 * rb), (r1 - r0) * rb) };
            for (s, d) in w.data[r0 * rb..r1 * rb]
                .chunks_exact(q6k_repack::BLOCK_BYTES)
                .zip(dst.chunks_exact_mut(q6k_repack::BLOCK_BYTES))
            {
                q6k_repack::repack_block(s, d);
            }
        })?;
        Ok(Some(RepackedHead {
            data,
            rows: w.rows,
            cols: w.cols,
            act_rb,
            act: vec![0u8; max_t * act_rb],
            perm: vec![0u8; max_t * act_rb],
        }))
    }

    /// Bytes of the repacked copy (the RAM it adds; the original's pages go cold).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// `y[t] = W·x[t]` for t < `t`, bitwise `compute.matmul` on the original matrix.
    pub fn matmul(
        &mut self,
        compute: &dyn Compute,
        x: &[f32],
        t: usize,
        y: &mut [f32],
    ) -> Result<()> {
        self.matmul_segs(compute, x, &[t], y)
    }

    /// `matmul` over consecutive segments of rows (`Compute::matmul_segs`): each row's float
    /// order is the one its segment alone gets, so each segment's logits are bitwise those
    /// of `matmul` on it alone; the head is read once for all rows.
    pub fn matmul_segs(
        &mut self,
        compute: &dyn Compute,
        x: &[f32],
        segs: &[usize],
        y: &mut [f32],
    ) -> Result<()> {
        let (rows, cols, arb) = (self.rows, self.cols, self.act_rb);
        let t: usize = segs.iter().sum();
        if x.len() != t * cols || y.len() != t * rows {
            return Err(Error::Shape(format!(
                "head: x has {} and y {} values, expected T·H = {t}·{cols} and T·V = {t}·{rows}",
                x.len(),
                y.len()
            )));
        }
        if t * arb > self.act.len() {
            self.act.resize(t * arb, 0);
            self.perm.resize(t * arb, 0);
        }
        for i in 0..t {
            let a = &mut self.act[i * arb..(i + 1) * arb];
            dot::quantize_act(
                GgmlType::Q6K.vec_dot_type(),
                &x[i * cols..(i + 1) * cols],
                a,
            )?;
            q6k_repack::permute_act(a, &mut self.perm[i * arb..(i + 1) * arb])?;
        }
        let simd = dot::active_isa() != Isa::Scalar;
        let rb = self.data.len() / rows;
        let (data, perm) = (&self.data, &self.perm);
        let out = OutPtr(y.as_mut_ptr());
        // one activation row (a decode step's): a sample for the prefetch distance's tuning
        let trial = if t == 1 && simd {
            pf_tune::HEAD_TUNER.begin()
        } else {
            None
        };
        let done = compute.for_each(rows.div_ceil(ROWS_PER_TASK), &|k| {
            let (r0, r1) = (k * ROWS_PER_TASK, ((k + 1) * ROWS_PER_TASK).min(rows));
            let act = |i: usize| &perm[i * arb..(i + 1) * arb];
            // SAFETY: element (i, r) is written by this task alone; i < t, r < rows.
            let put = |i: usize, r: usize, v: f32| unsafe { *out.at(i * rows + r) = v };
            // The task's rows against activation rows of the single-token order four at a
            // time (each block decoded once for the four; bitwise each one's own dot), the
            // others row by row.
            let single = |idx: &[usize]| {
                let (act, put, rows) = (&act, &put, r0..r1);
                match *idx {
                    [a] => single_rows(cols, data, rows, [a], act, put, simd),
                    [a, b] => single_rows(cols, data, rows, [a, b], act, put, simd),
                    [a, b, c] => single_rows(cols, data, rows, [a, b, c], act, put, simd),
                    [a, b, c, d] => single_rows(cols, data, rows, [a, b, c, d], act, put, simd),
                    _ => {}
                }
            };
            let mut four = [0usize; 4];
            let mut n4 = 0;
            let mut i = 0; // activation row
            for &len in segs {
                for j in 0..len {
                    match dot::order_t(GgmlType::Q6K, len, j) {
                        Order::Single => {
                            four[n4] = i;
                            n4 += 1;
                            if n4 == 4 {
                                single(&four);
                                n4 = 0;
                            }
                        }
                        order => {
                            for r in r0..r1 {
                                let row = &data[r * rb..(r + 1) * rb];
                                put(i, r, q6k_repack::dot(cols, row, act(i), order, simd));
                            }
                        }
                    }
                    i += 1;
                }
            }
            single(&four[..n4]);
        });
        if let (Some(trial), Ok(())) = (trial, &done) {
            pf_tune::HEAD_TUNER.end(trial);
        }
        done
    }
}

/// `q6k_repack::rows_single` of vocabulary rows `rows` against the activation rows `idx`,
/// each logit put at (activation row, vocabulary row).
fn single_rows<'a, const N: usize>(
    cols: usize,
    data: &[u8],
    rows: std::ops::Range<usize>,
    idx: [usize; N],
    act: &impl Fn(usize) -> &'a [u8],
    put: &impl Fn(usize, usize, f32),
    simd: bool,
) {
    q6k_repack::rows_single(cols, data, rows, idx.map(act), simd, |r, v| {
        for (&i, v) in idx.iter().zip(v) {
            put(i, r, v);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::compute::SerialCompute;
    use crate::pool::tests::cfg as pool_cfg;
    use crate::pool::Pool;
    use crate::quant::dot::q6k_repack::BLOCK_BYTES;

    /// The repacked head equals `Compute::matmul` on the original Q6_K matrix bitwise, for
    /// one token (decode: `vec_dot`'s order), a few, and ≥ 8 (ggml's tiled order), on the
    /// pool and the serial compute, with rows not a multiple of the task size.
    #[test]
    fn repacked_head_equals_matmul_bitwise() {
        let (rows, cols) = (ROWS_PER_TASK + 37, 512);
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut data: Vec<u8> = (0..rows * cols / 256 * BLOCK_BYTES)
            .map(|_| next() as u8)
            .collect();
        for b in data.chunks_exact_mut(BLOCK_BYTES) {
            let d = half::f16::from_f32((next() % 1000) as f32 * 1e-5 - 5e-3);
            b[208..210].copy_from_slice(&d.to_le_bytes());
        }
        let w = QMatrix {
            ty: GgmlType::Q6K,
            data: &data,
            rows,
            cols,
        };
        let pool = Pool::new(pool_cfg(1, true, false));
        let serial = SerialCompute::new();
        for c in [&pool as &dyn Compute, &serial] {
            let mut head = RepackedHead::new(&w, 2, c).unwrap().unwrap();
            assert_eq!(head.bytes(), data.len());
            for t in [1usize, 3, 8, 10] {
                let x: Vec<f32> = (0..t * cols)
                    .map(|_| (next() % 20001) as f32 / 5000.0 - 2.0)
                    .collect();
                let mut want = vec![0f32; t * rows];
                serial.matmul(&w, &x, t, &mut want).unwrap();
                let mut got = vec![f32::NAN; t * rows];
                head.matmul(c, &x, t, &mut got).unwrap();
                let b = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(b(&got), b(&want), "t={t}");
            }
            // segments (a batched step): each one bitwise the matmul of its rows alone, with
            // single-order rows in groups of one to four and past them
            for segs in [
                &[1usize, 9, 1, 3][..],
                &[1, 1, 1, 1, 1, 1, 1],
                &[2, 1, 1, 9, 1, 1, 1],
            ] {
                check_segs(&mut head, c, &w, segs, &mut next);
            }
            let mut short = vec![0f32; 5];
            assert!(head.matmul(c, &[0.0; 512], 1, &mut short).is_err());
        }
        let q8 = QMatrix {
            ty: GgmlType::Q8_0,
            data: &data[..rows * 34 * 2],
            rows,
            cols: 64,
        };
        assert!(RepackedHead::new(&q8, 1, &serial).unwrap().is_none());
    }

    /// `matmul_segs` over `segs` equals each segment's own `Compute::matmul`, bitwise.
    fn check_segs(
        head: &mut RepackedHead,
        c: &dyn Compute,
        w: &QMatrix<'_>,
        segs: &[usize],
        next: &mut impl FnMut() -> u64,
    ) {
        let (rows, cols) = (w.rows, w.cols);
        let serial = SerialCompute::new();
        let t: usize = segs.iter().sum();
        let x: Vec<f32> = (0..t * cols)
            .map(|_| (next() % 20001) as f32 / 5000.0 - 2.0)
            .collect();
        let mut want = vec![0f32; t * rows];
        let mut t0 = 0;
        for &n in segs {
            let (xs, ys) = (t0 * cols..(t0 + n) * cols, t0 * rows..(t0 + n) * rows);
            serial.matmul(w, &x[xs], n, &mut want[ys]).unwrap();
            t0 += n;
        }
        let mut got = vec![f32::NAN; t * rows];
        head.matmul_segs(c, &x, segs, &mut got).unwrap();
        let b = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(b(&got), b(&want), "segs {segs:?}");
    }
}
