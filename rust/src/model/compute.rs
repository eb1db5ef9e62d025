//! The compute seam: the two heavy operations of the forward pass, matmul against a quantized
//! weight matrix and the routed-expert FFN. `SerialCompute` is the single-threaded reference;
//! the CPU expert pool implements the same trait.
//!
//! Shapes (row-major, numpy order): T = tokens, H = hidden, F = expert FFN width,
//! E = experts, K = experts used per token.
//! Activations are quantized once per input row to `w.ty.vec_dot_type()`, exactly as ggml's
//! CPU backend does, and every output element is `vec_dot(weight row, quantized row)`.

use crate::error::{Error, Result};
use crate::quant::dot::{act_bytes, quantize_act, vec_dot};
use crate::quant::GgmlType;
use std::sync::Mutex;

// The matrix types are the pool's: one definition for both implementations of `Compute`.
use crate::pool::Pool;
pub use crate::pool::{ExpertLayer, QExperts, QMatrix};

impl QMatrix<'_> {
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.cols).unwrap_or(0)
    }
}

impl<'a> QExperts<'a> {
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.cols).unwrap_or(0)
    }

    /// Expert e as a matrix (rows, cols): a zero-copy slice of the stack.
    pub fn expert(&self, e: usize) -> QMatrix<'a> {
        let n = self.rows * self.row_bytes();
        QMatrix {
            ty: self.ty,
            data: self.expert_data(e, n),
            rows: self.rows,
            cols: self.cols,
        }
    }
}

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
}

/// Checks a matrix's bytes against its shape and type.
pub fn check_matrix(
    what: &str,
    ty: GgmlType,
    data_len: usize,
    n: usize,
    cols: usize,
) -> Result<()> {
    let rb = ty.row_bytes(cols).ok_or_else(|| {
        Error::Quant(format!(
            "{what}: rows of {cols} elements are not whole {} blocks",
            ty.name()
        ))
    })?;
    if n.checked_mul(rb) != Some(data_len) {
        return Err(Error::Quant(format!(
            "{what}: {data_len} bytes for {n} rows of {cols} {} elements",
            ty.name()
        )));
    }
    Ok(())
}

fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::Quant(format!(
            "{what} has {got} elements, expected {want}"
        )));
    }
    Ok(())
}

/// Grow-only scratch: allocates on the first calls, never on later calls of the same shapes.
#[derive(Default)]
struct Scratch {
    act: Vec<u8>,
    act2: Vec<u8>,
    act3: Vec<u8>,
    gate: Vec<f32>,
    up: Vec<f32>,
}

fn grow<T: Default + Clone>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.resize(n, T::default());
    }
    &mut v[..n]
}

/// Single-threaded reference implementation of `Compute`.
#[derive(Default)]
pub struct SerialCompute {
    scratch: Mutex<Scratch>,
}

impl SerialCompute {
    pub fn new() -> SerialCompute {
        SerialCompute::default()
    }
}

/// `y[r] = dot(W[r], a)` for every row r of w, a quantized to `w.ty.vec_dot_type()`.
fn gemv(w: &QMatrix<'_>, a: &[u8], y: &mut [f32]) {
    let rb = w.row_bytes();
    for (r, out) in w.data.chunks_exact(rb).zip(y.iter_mut()) {
        *out = vec_dot(w.ty, w.cols, r, a);
    }
}

#[inline]
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

impl Compute for SerialCompute {
    fn matmul(&self, w: &QMatrix<'_>, x: &[f32], t: usize, y: &mut [f32]) -> Result<()> {
        check_matrix("matmul weight", w.ty, w.data.len(), w.rows, w.cols)?;
        check_len("matmul input", x.len(), t * w.cols)?;
        check_len("matmul output", y.len(), t * w.rows)?;
        let vt = w.ty.vec_dot_type();
        let ab = act_bytes(w.ty, w.cols).unwrap_or(0);
        let mut s = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let act = grow(&mut s.act, ab);
        for (xr, yr) in x.chunks_exact(w.cols).zip(y.chunks_exact_mut(w.rows)) {
            quantize_act(vt, xr, act)?;
            gemv(w, act, yr);
        }
        Ok(())
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
        let (g, u, d) = (&layer.gate, &layer.up, &layer.down);
        let h = g.cols;
        let f = g.rows;
        for (name, m, rows, cols) in [("gate", g, f, h), ("up", u, f, h), ("down", d, h, f)] {
            if m.rows != rows || m.cols != cols || m.n_expert != g.n_expert {
                return Err(Error::Quant(format!(
                    "moe {name}: shape ({}, {}, {}) does not match ({}, {rows}, {cols})",
                    m.n_expert, m.rows, m.cols, g.n_expert
                )));
            }
            check_matrix(name, m.ty, m.data.len(), m.n_expert * m.rows, m.cols)?;
        }
        if k == 0 || h == 0 {
            return Err(Error::Quant("moe: k and H must be > 0".into()));
        }
        let t = x.len() / h;
        check_len("moe input", x.len(), t * h)?;
        check_len("moe ids", ids.len(), t * k)?;
        check_len("moe weights", weights.len(), t * k)?;
        check_len("moe output", y.len(), t * h)?;
        if let Some(&bad) = ids.iter().find(|&&e| e as usize >= g.n_expert) {
            return Err(Error::Quant(format!(
                "moe: expert id {bad} is not below {}",
                g.n_expert
            )));
        }
        let (gt, ut, dt) = (
            g.ty.vec_dot_type(),
            u.ty.vec_dot_type(),
            d.ty.vec_dot_type(),
        );
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let s = &mut *guard;
        let xg = grow(&mut s.act, act_bytes(g.ty, h).unwrap_or(0));
        let xu = grow(&mut s.act2, act_bytes(u.ty, h).unwrap_or(0));
        let ad = grow(&mut s.act3, act_bytes(d.ty, f).unwrap_or(0));
        let gate = grow(&mut s.gate, f);
        let up = grow(&mut s.up, f);
        for ((xr, yr), (tid, tw)) in x
            .chunks_exact(h)
            .zip(y.chunks_exact_mut(h))
            .zip(ids.chunks_exact(k).zip(weights.chunks_exact(k)))
        {
            // x[t] quantized once for gate and once for up (the same bytes when the types agree).
            quantize_act(gt, xr, xg)?;
            quantize_act(ut, xr, xu)?;
            yr.fill(0.0);
            for (&e, &wj) in tid.iter().zip(tw) {
                let e = e as usize;
                gemv(&g.expert(e), xg, gate);
                gemv(&u.expert(e), xu, up);
                // a = silu(gate) ⊙ up  [F], quantized for down.
                for (gv, uv) in gate.iter_mut().zip(up.iter()) {
                    *gv = silu(*gv) * uv;
                }
                quantize_act(dt, gate, ad)?;
                // y[t] += w · down_e·a  [H]
                let dm = d.expert(e);
                for (row, out) in dm.data.chunks_exact(dm.row_bytes()).zip(yr.iter_mut()) {
                    *out += wj * vec_dot(dm.ty, f, row, ad);
                }
            }
        }
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
}
