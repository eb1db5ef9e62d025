//! The compute seam: the heavy operations of the forward pass, matmul against a quantized
//! weight matrix and the routed-expert FFN, plus a parallel-for (attention's tasks).
//! `SerialCompute` is the single-threaded reference; the CPU expert pool implements the same
//! trait.
//!
//! Shapes (row-major, numpy order): T = tokens, H = hidden, F = expert FFN width,
//! E = experts, K = experts used per token.
//! Activations are quantized once per input row to `w.ty.vec_dot_type()`, exactly as ggml's
//! CPU backend does, and every output element is `vec_dot(weight row, quantized row)`.

use crate::error::Result;
use crate::pool::{
    reference, validate_matmul, validate_moe, validate_moe_masked, validate_segs, Pool,
};

// The matrix types and the MoE argument list are the pool's: one definition for both
// implementations of `Compute`.
pub use crate::pool::{ExpertLayer, MoeInput, QExperts, QMatrix};

pub trait Compute: Send + Sync {
    /// `y[t] = W·x[t]` for t < `t`: x is [T, cols], y is [T, rows] (overwritten).
    fn matmul(&self, w: &QMatrix<'_>, x: &[f32], t: usize, y: &mut [f32]) -> Result<()>;

    /// The routed SwiGLU experts: for each token t,
    /// `y[t] = Σ_j weights[t,j] · down_e(silu(gate_e·x[t]) ⊙ up_e·x[t])` with `e = ids[t,j]`,
    /// summed in slot order j = 0..k (`a` holds x [T, H], ids and weights [T, K]); y is
    /// [T, H] (overwritten).
    fn moe(&self, layer: &ExpertLayer<'_>, a: &MoeInput<'_>, y: &mut [f32]) -> Result<()>;

    /// `moe` over the pairs whose id is not `pool::SKIP` (the others are computed elsewhere,
    /// e.g. from VRAM); a token with no such pair gets zeros.
    fn moe_masked(&self, layer: &ExpertLayer<'_>, a: &MoeInput<'_>, y: &mut [f32]) -> Result<()>;

    /// Runs `f(i)` for every `i < n`, each exactly once, on any threads; returns when all
    /// have finished. Tasks write disjoint outputs, so the result does not depend on the
    /// schedule. `f` must not call back into this `Compute`.
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) -> Result<()>;

    /// Threads that run `for_each`'s tasks (callers size per-task scratch by it).
    fn threads(&self) -> usize {
        1
    }

    /// `matmul` over a batch: x is [T, cols] with T = Σ segs, rows grouped in consecutive
    /// segments (one per sequence of a batched step). Each segment's rows of y are bitwise
    /// what `matmul` on that segment alone writes. This default is that definition, one call
    /// per segment; the pool reads W once for all segments.
    fn matmul_segs(&self, w: &QMatrix<'_>, x: &[f32], segs: &[usize], y: &mut [f32]) -> Result<()> {
        let t: usize = segs.iter().sum();
        validate_matmul(w, x, t, y)?;
        let mut t0 = 0;
        for &n in segs {
            let (xs, ys) = (
                t0 * w.cols..(t0 + n) * w.cols,
                t0 * w.rows..(t0 + n) * w.rows,
            );
            self.matmul(w, &x[xs], n, &mut y[ys])?;
            t0 += n;
        }
        Ok(())
    }

    /// `moe` over a batch of segments (as `matmul_segs`): each segment's rows bitwise
    /// `moe` on that segment alone. Default: one call per segment; the pool groups the
    /// pairs of all segments by expert and reads each expert once.
    fn moe_segs(
        &self,
        layer: &ExpertLayer<'_>,
        a: &MoeInput<'_>,
        segs: &[usize],
        y: &mut [f32],
    ) -> Result<()> {
        validate_moe(layer, a, y)?;
        each_seg(layer, a, segs, y, |s, ys| self.moe(layer, s, ys))
    }

    /// `moe_masked` over a batch of segments (as `moe_segs`).
    fn moe_masked_segs(
        &self,
        layer: &ExpertLayer<'_>,
        a: &MoeInput<'_>,
        segs: &[usize],
        y: &mut [f32],
    ) -> Result<()> {
        validate_moe_masked(layer, a, y)?;
        each_seg(layer, a, segs, y, |s, ys| self.moe_masked(layer, s, ys))
    }
}

/// Calls `f(segment's input, segment's rows of y)` per segment of a MoE batch.
fn each_seg(
    layer: &ExpertLayer<'_>,
    a: &MoeInput<'_>,
    segs: &[usize],
    y: &mut [f32],
    mut f: impl FnMut(&MoeInput<'_>, &mut [f32]) -> Result<()>,
) -> Result<()> {
    let (h, k) = (layer.gate.cols, a.k);
    validate_segs(segs, a.x.len() / h.max(1))?;
    let mut t0 = 0;
    for &n in segs {
        let (xs, ps) = (t0 * h..(t0 + n) * h, t0 * k..(t0 + n) * k);
        let seg = MoeInput::new(&a.x[xs.clone()], &a.ids[ps.clone()], &a.weights[ps], k);
        f(&seg, &mut y[xs])?;
        t0 += n;
    }
    Ok(())
}

/// Single-threaded reference implementation of `Compute`: the pool's serial reference
/// (`pool::reference`, written independently of the tiled code) behind the pool's own shape
/// checks, so the two implementations share one validation and one definition of the math.
#[derive(Default)]
pub struct SerialCompute;

impl SerialCompute {
    pub fn new() -> SerialCompute {
        SerialCompute
    }
}

impl Compute for SerialCompute {
    fn matmul(&self, w: &QMatrix<'_>, x: &[f32], t: usize, y: &mut [f32]) -> Result<()> {
        validate_matmul(w, x, t, y)?;
        reference::matmul_serial(w, x, t, y)
    }

    fn moe(&self, layer: &ExpertLayer<'_>, a: &MoeInput<'_>, y: &mut [f32]) -> Result<()> {
        validate_moe(layer, a, y)?;
        reference::moe_serial(layer, a, y)
    }

    fn moe_masked(&self, layer: &ExpertLayer<'_>, a: &MoeInput<'_>, y: &mut [f32]) -> Result<()> {
        validate_moe_masked(layer, a, y)?;
        reference::moe_serial(layer, a, y)
    }

    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) -> Result<()> {
        (0..n).for_each(f);
        Ok(())
    }
}

/// The CPU expert pool runs both operations on its threads (same tiles and arithmetic as the
/// serial reference: `tests` compare them bitwise).
impl Compute for Pool {
    fn matmul(&self, w: &QMatrix<'_>, x: &[f32], t: usize, y: &mut [f32]) -> Result<()> {
        Pool::matmul(self, w, x, t, y)
    }

    fn moe(&self, layer: &ExpertLayer<'_>, a: &MoeInput<'_>, y: &mut [f32]) -> Result<()> {
        Pool::moe(self, layer, a, y)
    }

    fn moe_masked(&self, layer: &ExpertLayer<'_>, a: &MoeInput<'_>, y: &mut [f32]) -> Result<()> {
        Pool::moe_masked(self, layer, a, y)
    }

    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) -> Result<()> {
        Pool::for_each(self, n, f)
    }

    fn threads(&self) -> usize {
        self.threads_total()
    }

    fn matmul_segs(&self, w: &QMatrix<'_>, x: &[f32], segs: &[usize], y: &mut [f32]) -> Result<()> {
        Pool::matmul_segs(self, w, x, segs, y)
    }

    fn moe_segs(
        &self,
        layer: &ExpertLayer<'_>,
        a: &MoeInput<'_>,
        segs: &[usize],
        y: &mut [f32],
    ) -> Result<()> {
        Pool::moe_segs(self, layer, a, segs, y)
    }

    fn moe_masked_segs(
        &self,
        layer: &ExpertLayer<'_>,
        a: &MoeInput<'_>,
        segs: &[usize],
        y: &mut [f32],
    ) -> Result<()> {
        Pool::moe_masked_segs(self, layer, a, segs, y)
    }
}
