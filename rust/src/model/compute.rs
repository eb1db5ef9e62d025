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

// The matrix types are the pool's: one definition for both implementations of `Compute`.
pub use crate::pool::{ExpertLayer, QExperts, QMatrix};

pub trait Compute: Send + Sync {
    /// `y[t] = W·x[t]` for t < `t`: x is [T, cols], y is [T, rows] (overwritten).
    fn matmul(&self, w: &QMatrix<'_>, x: &[f32], t: usize, y: &mut [f32]) -> Result<()>;

    /// The routed SwiGLU experts: for each token t,
    /// `y[t] = Σ_j weights[t,j] · down_e(silu(gate_e·x[t]) ⊙ up_e·x[t])` with `e = ids[t,j]`,
    /// summed in slot order j = 0..k. x is [T, H], ids and weights are [T, K], y is [T, H]
    /// (overwritten).
    fn moe(
        &self,
        layer: &ExpertLayer<'_>,
        x: &[f32],
        ids: &[u32],
        weights: &[f32],
        k: usize,
        y: &mut [f32],
    ) -> Result<()>;

    /// `moe` over the pairs whose id is not `pool::SKIP` (the others are computed elsewhere,
    /// e.g. from VRAM); a token with no such pair gets zeros.
    fn moe_masked(
        &self,
        layer: &ExpertLayer<'_>,
        x: &[f32],
        ids: &[u32],
        weights: &[f32],
        k: usize,
        y: &mut [f32],
    ) -> Result<()>;

    /// Runs `f(i)` for every `i < n`, each exactly once, on any threads; returns when all
    /// have finished. Tasks write disjoint outputs, so the result does not depend on the
    /// schedule. `f` must not call back into this `Compute`.
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) -> Result<()>;

    /// The caller will not call for a while: threads waiting for work may sleep now.
    fn rest(&self) {}

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
    #[allow(clippy::too_many_arguments)]
    fn moe_segs(
        &self,
        layer: &ExpertLayer<'_>,
        x: &[f32],
        ids: &[u32],
        weights: &[f32],
        k: usize,
        segs: &[usize],
        y: &mut [f32],
    ) -> Result<()> {
        validate_moe(layer, x, ids, weights, k, y)?;
        each_seg(layer.gate.cols, k, segs, x.len(), |xs, ps| {
            self.moe(
                layer,
                &x[xs.clone()],
                &ids[ps.clone()],
                &weights[ps],
                k,
                &mut y[xs],
            )
        })
    }

    /// `moe_masked` over a batch of segments (as `moe_segs`).
    #[allow(clippy::too_many_arguments)]
    fn moe_masked_segs(
        &self,
        layer: &ExpertLayer<'_>,
        x: &[f32],
        ids: &[u32],
        weights: &[f32],
        k: usize,
        segs: &[usize],
        y: &mut [f32],
    ) -> Result<()> {
        validate_moe_masked(layer, x, ids, weights, k, y)?;
        each_seg(layer.gate.cols, k, segs, x.len(), |xs, ps| {
            let (i, w) = (&ids[ps.clone()], &weights[ps]);
            self.moe_masked(layer, &x[xs.clone()], i, w, k, &mut y[xs])
        })
    }
}

type Span = std::ops::Range<usize>;

/// Calls `f(rows of x/y, pairs of ids/weights)` per segment of a MoE batch (H = `h`).
fn each_seg(
    h: usize,
    k: usize,
    segs: &[usize],
    x_len: usize,
    mut f: impl FnMut(Span, Span) -> Result<()>,
) -> Result<()> {
    validate_segs(segs, x_len / h.max(1))?;
    let mut t0 = 0;
    for &n in segs {
        f(t0 * h..(t0 + n) * h, t0 * k..(t0 + n) * k)?;
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

    fn moe(
        &self,
        layer: &ExpertLayer<'_>,
        x: &[f32],
        ids: &[u32],
        weights: &[f32],
        k: usize,
        y: &mut [f32],
    ) -> Result<()> {
        validate_moe(layer, x, ids, weights, k, y)?;
        reference::moe_serial(layer, x, ids, weights, k, y)
    }

    fn moe_masked(
        &self,
        layer: &ExpertLayer<'_>,
        x: &[f32],
        ids: &[u32],
        weights: &[f32],
        k: usize,
        y: &mut [f32],
    ) -> Result<()> {
        validate_moe_masked(layer, x, ids, weights, k, y)?;
        reference::moe_serial(layer, x, ids, weights, k, y)
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

    fn moe(
        &self,
        layer: &ExpertLayer<'_>,
        x: &[f32],
        ids: &[u32],
        weights: &[f32],
        k: usize,
        y: &mut [f32],
    ) -> Result<()> {
        Pool::moe(self, layer, x, ids, weights, k, y)
    }

    fn moe_masked(
        &self,
        layer: &ExpertLayer<'_>,
        x: &[f32],
        ids: &[u32],
        weights: &[f32],
        k: usize,
        y: &mut [f32],
    ) -> Result<()> {
        Pool::moe_masked(self, layer, x, ids, weights, k, y)
    }

    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) -> Result<()> {
        Pool::for_each(self, n, f)
    }

    fn rest(&self) {
        Pool::rest(self)
    }

    fn matmul_segs(&self, w: &QMatrix<'_>, x: &[f32], segs: &[usize], y: &mut [f32]) -> Result<()> {
        Pool::matmul_segs(self, w, x, segs, y)
    }

    fn moe_segs(
        &self,
        layer: &ExpertLayer<'_>,
        x: &[f32],
        ids: &[u32],
        weights: &[f32],
        k: usize,
        segs: &[usize],
        y: &mut [f32],
    ) -> Result<()> {
        Pool::moe_segs(self, layer, x, ids, weights, k, segs, y)
    }

    fn moe_masked_segs(
        &self,
        layer: &ExpertLayer<'_>,
        x: &[f32],
        ids: &[u32],
        weights: &[f32],
        k: usize,
        segs: &[usize],
        y: &mut [f32],
    ) -> Result<()> {
        Pool::moe_masked_segs(self, layer, x, ids, weights, k, segs, y)
    }
}
