//! The attention projections (q, k, v, o) on load-time copies repacked sixteen rows at a time
//! (`quant::dot::q4k_r16`, ModelConfig::cpu_repack, Q4_K matrices; the VNNI kernel where
//! AVX-512 with VNNI is the active ISA, the AVX2 one where AVX2 is):
//! a decode step's one-token rows (two to four of them, every row in the one-row order) run
//! there, bitwise `Compute::matmul_segs` on the original matrix (same activation quantization,
//! same float order per row); any other call runs on the original.
//!
//! Shapes: x [T, H_in] activation rows, y [T, H_out]; a matrix is (H_out, H_in), H_out a
//! multiple of 16, H_in of 256.

use super::compute::{Compute, QMatrix};
use super::head::OutPtr;
use super::huge_buf::HugeBuf;
use crate::error::Result;
use crate::quant::dot::{self, q4k_r16, Order};
use crate::quant::GgmlType;

/// Groups of 16 rows per repacking task at load (128 rows: ≈ 147 KB of weights at H_in = 2048).
const GROUPS_PER_TASK: usize = 8;

/// Fewest and most activation rows a call takes on the repacked copy.
const MIN_T: usize = 2;
const MAX_T: usize = 4;

/// One matrix's repacked copy.
pub struct R16 {
    data: HugeBuf, // [H_out / 16 groups, H_in / 256 blocks of GROUP_BLOCK bytes]
    rows: usize,   // H_out
    cols: usize,   // H_in
    kernel: q4k_r16::Kernel,
}

impl R16 {
    /// The repacked copy of `w` (on the compute's threads); `None` where it does not apply:
    /// not Q4_K, rows not a multiple of 16, or no kernel for the active ISA (`q4k_r16::kernel`:
    /// none on the scalar ISA).
    pub fn new(w: &QMatrix<'_>, compute: &dyn Compute) -> Result<Option<R16>> {
        let rb = w.ty.row_bytes(w.cols);
        let fits = w.ty == GgmlType::Q4K
            && w.rows.is_multiple_of(q4k_r16::GROUP)
            && w.cols.is_multiple_of(256)
            && rb.is_some_and(|rb| w.data.len() == w.rows * rb);
        let Some(kernel) = q4k_r16::kernel().filter(|_| fits) else {
            return Ok(None);
        };
        let (rb, nb) = (w.data.len() / w.rows, w.cols / 256);
        let gb = nb * q4k_r16::GROUP_BLOCK;
        let groups = w.rows / q4k_r16::GROUP;
        let mut data = HugeBuf::zeroed(groups * gb);
        let out = OutPtr(data.as_mut_ptr());
        compute.for_each(groups.div_ceil(GROUPS_PER_TASK), &|k| {
            let g1 = ((k + 1) * GROUPS_PER_TASK).min(groups);
            for g in k * GROUPS_PER_TASK..g1 {
                // SAFETY: group g's bytes of `data` are written by this task alone.
                let dst = unsafe { std::slice::from_raw_parts_mut(out.at(g * gb), gb) };
                let src = &w.data[g * q4k_r16::GROUP * rb..(g + 1) * q4k_r16::GROUP * rb];
                q4k_r16::repack_group(src, nb, dst);
            }
        })?;
        Ok(Some(R16 {
            data,
            rows: w.rows,
            cols: w.cols,
            kernel,
        }))
    }

    /// Bytes of the copy (the RAM it adds).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Whether a call over `segs` runs here: two to four rows, each in the one-row order. One
    /// row stays on the original matrix: read at the RAM rate either way, and the original's
    /// pages measured no slower (a batch of several rows is where the repacked kernel gains:
    /// 2.3× the rows × tokens kernel's rate at four tokens on one core).
    pub fn serves(segs: &[usize]) -> bool {
        let t: usize = segs.iter().sum();
        (MIN_T..=MAX_T).contains(&t)
            && segs
                .iter()
                .all(|&len| (0..len).all(|i| dot::order_t(GgmlType::Q4K, len, i) == Order::Single))
    }

    /// `y[i] = W·x[i]` for the `t ≤ 4` rows of x (`serves` holds), quantizing them into
    /// `act` first; bitwise `compute.matmul_segs` on the original matrix.
    pub fn matmul(
        &self,
        compute: &dyn Compute,
        x: &[f32],
        y: &mut [f32],
        act: &mut Vec<u8>,
    ) -> Result<()> {
        let (rows, cols) = (self.rows, self.cols);
        let t = x.len() / cols;
        let arb = dot::act_bytes(GgmlType::Q4K, cols).unwrap_or(0);
        assert!(
            (1..=MAX_T).contains(&t) && x.len() == t * cols && y.len() == t * rows,
            "r16 matmul: x {} and y {} values for ({rows}, {cols})",
            x.len(),
            y.len()
        );
        act.resize(t * arb, 0);
        for (xi, a) in x.chunks_exact(cols).zip(act.chunks_exact_mut(arb)) {
            dot::quantize_act(GgmlType::Q4K.vec_dot_type(), xi, a)?;
        }
        let (act, nb) = (&act[..], cols / 256);
        let gb = nb * q4k_r16::GROUP_BLOCK;
        let groups = rows / q4k_r16::GROUP;
        let out = OutPtr(y.as_mut_ptr());
        // one contiguous run of groups per thread: each streams its rows front to back, as
        // the pool's balanced decode tiles do
        let tasks = compute.threads().clamp(1, groups);
        compute.for_each(tasks, &|k| {
            let a = |i: usize| &act[i * arb..(i + 1) * arb];
            for g in k * groups / tasks..(k + 1) * groups / tasks {
                let grp = &self.data[g * gb..(g + 1) * gb];
                let r0 = g * q4k_r16::GROUP;
                // SAFETY: elements (i, r0..r0 + 16) of y are written by this task alone.
                let put = |i: usize, v: &[f32; q4k_r16::GROUP]| unsafe {
                    std::ptr::copy_nonoverlapping(v.as_ptr(), out.at(i * rows + r0), v.len())
                };
                let k = self.kernel;
                // SAFETY: `new` took `k` from `q4k_r16::kernel()`; the lengths are whole blocks.
                unsafe {
                    match t {
                        1 => each(k, nb, grp, [a(0)], &put),
                        2 => each(k, nb, grp, [a(0), a(1)], &put),
                        3 => each(k, nb, grp, [a(0), a(1), a(2)], &put),
                        _ => each(k, nb, grp, [a(0), a(1), a(2), a(3)], &put),
                    }
                }
            }
        })
    }
}

/// Kernel `k`'s rows of one group against N activation rows, each row's 16 outputs put.
///
/// # Safety
/// `k` came from `q4k_r16::kernel()` (its ISA runs here).
#[cfg(target_arch = "x86_64")]
unsafe fn each<const N: usize>(
    k: q4k_r16::Kernel,
    nb: usize,
    grp: &[u8],
    acts: [&[u8]; N],
    put: &impl Fn(usize, &[f32; q4k_r16::GROUP]),
) {
    let mut o = [[0f32; q4k_r16::GROUP]; N];
    match k {
        q4k_r16::Kernel::Vnni => q4k_r16::rows_single::<N>(nb, grp, acts, &mut o),
        q4k_r16::Kernel::Avx2 => q4k_r16::rows_single_avx2::<N>(nb, grp, acts, &mut o),
    }
    for (i, v) in o.iter().enumerate() {
        put(i, v);
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn each<const N: usize>(
    _: q4k_r16::Kernel,
    _: usize,
    _: &[u8],
    _: [&[u8]; N],
    _: &impl Fn(usize, &[f32; q4k_r16::GROUP]),
) {
    unreachable!("no repacked rows on this architecture: `q4k_r16::kernel()` is None")
}

/// Each layer's repacked q, k, v and o projections (those that apply) and the activation
/// scratch of a call.
#[derive(Default)]
pub struct DenseR16 {
    layers: Vec<[Option<R16>; 4]>,
    act: Vec<u8>,
}

/// Which projection of a layer.
#[derive(Clone, Copy)]
pub enum Proj {
    Q = 0,
    K = 1,
    V = 2,
    O = 3,
}

impl DenseR16 {
    /// Copies of every layer's `mats(l)` (q, k, v, o; None where a layer has no such matrix)
    /// that `R16::new` takes.
    pub fn new<'a>(
        n_layer: usize,
        mats: impl Fn(usize) -> [Option<QMatrix<'a>>; 4],
        compute: &dyn Compute,
    ) -> Result<DenseR16> {
        let mut layers = Vec::with_capacity(n_layer);
        for l in 0..n_layer {
            let [a, b, c, d] = mats(l);
            let one = |m: Option<QMatrix<'a>>| match m {
                Some(m) => R16::new(&m, compute),
                None => Ok(None),
            };
            layers.push([one(a)?, one(b)?, one(c)?, one(d)?]);
        }
        Ok(DenseR16 {
            layers,
            act: Vec::new(),
        })
    }

    /// Bytes of all the copies.
    pub fn bytes(&self) -> usize {
        self.layers.iter().flatten().flatten().map(R16::bytes).sum()
    }

    /// `compute.matmul_segs(w, x, segs, y)`, on layer `l`'s repacked copy of projection `p`
    /// where there is one and it serves the call.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_segs(
        this: Option<&mut DenseR16>,
        compute: &dyn Compute,
        l: usize,
        p: Proj,
        w: &QMatrix<'_>,
        x: &[f32],
        segs: &[usize],
        y: &mut [f32],
    ) -> Result<()> {
        if let Some(d) = this {
            if let Some(Some(r)) = d.layers.get(l).map(|m| &m[p as usize]) {
                if R16::serves(segs) && r.rows == w.rows && r.cols == w.cols {
                    return r.matmul(compute, x, y, &mut d.act);
                }
            }
        }
        compute.matmul_segs(w, x, segs, y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::compute::SerialCompute;
    use crate::pool::tests::cfg;
    use crate::pool::Pool;
    use crate::quant::dot::tests::{random_row, Rng};

    /// The repacked projection equals the pool's and the serial compute's `matmul_segs` on the
    /// original matrix bit for bit, one to four one-token rows; it declines single rows,
    /// windows and prompt chunks (`serves`) and other types.
    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx2"]
    fn r16_projection_equals_matmul_segs_bitwise() {
        dot::require_isa(dot::Isa::Avx2, "r16_projection_equals_matmul_segs_bitwise");
        let (rows, cols) = (96usize, 512usize);
        let mut rng = Rng::new(9);
        let data: Vec<u8> = (0..rows)
            .flat_map(|_| random_row(GgmlType::Q4K, cols, &mut rng))
            .collect();
        let w = QMatrix {
            ty: GgmlType::Q4K,
            data: &data,
            rows,
            cols,
        };
        let pool = Pool::new(cfg(2, true, false));
        let serial = SerialCompute::new();
        let Some(r) = R16::new(&w, &pool).unwrap() else {
            // `STRATA_ISA` capped the dot kernels at scalar: the copy is declined
            assert_eq!(
                dot::active_isa(),
                dot::Isa::Scalar,
                "Q4_K repacks on AVX2 and up"
            );
            return;
        };
        let mut act = Vec::new();
        for t in 1..=4 {
            let x: Vec<f32> = (0..t * cols)
                .map(|i| ((i * 7919 + 13) % 1013) as f32 / 101.0 - 5.0)
                .collect();
            let segs = vec![1usize; t];
            assert_eq!(R16::serves(&segs), t >= MIN_T);
            let mut got = vec![f32::NAN; t * rows];
            r.matmul(&pool, &x, &mut got, &mut act).unwrap();
            for c in [&pool as &dyn Compute, &serial] {
                let mut want = vec![0f32; t * rows];
                c.matmul_segs(&w, &x, &segs, &mut want).unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "t = {t}");
            }
        }
        assert!(!R16::serves(&[]) && !R16::serves(&[1, 1, 1, 1, 1]));
        assert!(
            !R16::serves(&[64]),
            "a prompt chunk's rows take ggml's tiled order"
        );
        let q8 = QMatrix {
            ty: GgmlType::Q8_0,
            ..w
        };
        assert!(R16::new(&q8, &pool).unwrap().is_none());
    }
}
