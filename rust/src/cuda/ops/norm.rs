//! Launchers of `cuda/norm.cu`: RMSNorm over rows, and the residual add fused with it; the
//! `_q8` forms also write the output as q8_1 blocks for the next quantized matmul.

use super::view::{bytes, grid_dim, i32_of, launch, prod, Dv, GRID_X};
use crate::cuda::{Arg, Gpu, Stream};
use crate::error::{Error, Result};

const THREADS: u32 = 512; // the kernels' NORM_THREADS
/// Bytes of one q8_1 block (32 values).
const Q8_1_BYTES: usize = 36;

fn check(rows: usize, n: usize, eps: f32) -> Result<usize> {
    if n == 0 {
        return Err(Error::Shape("rms norm: rows of 0 elements".into()));
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::Config(format!("rms norm: eps {eps} must be >= 0")));
    }
    bytes(prod(&[rows, n])?, 4)
}

/// The q8_1 output's checks: n a multiple of 32, xq ≥ rows·n/32 blocks, 4-byte aligned.
fn check_q8(xq: Dv, rows: usize, n: usize) -> Result<()> {
    if !n.is_multiple_of(32) || !xq.ptr.is_multiple_of(4) {
        return Err(Error::Shape(format!(
            "rms norm q8_1 output: n {n} must be a multiple of 32 and the buffer 4-byte aligned"
        )));
    }
    xq.need("rms norm q8_1 out", prod(&[rows, n / 32, Q8_1_BYTES])?)
}

#[allow(clippy::too_many_arguments)]
fn run(
    gpu: &Gpu,
    s: &Stream,
    name: &str,
    head: &[Arg],
    xq: Option<Dv>,
    rows: usize,
    n: usize,
    eps: f32,
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let mut args = head.to_vec();
    let name = match xq {
        Some(q) => {
            args.push(q.arg());
            format!("{name}_q8")
        }
        None => name.to_string(),
    };
    args.extend([Arg::I32(i32_of("n", n)?), Arg::F32(eps)]);
    launch(
        gpu,
        s,
        &name,
        (grid_dim("rows", rows, GRID_X)?, 1, 1),
        THREADS,
        &args,
    )
}

/// out[r] = x[r] / sqrt(mean(x[r]²) + eps) · w for r < rows.
/// x, out: f32 [rows, n] (out may be x); w: f32 [n].
#[allow(clippy::too_many_arguments)]
pub fn rms(
    gpu: &Gpu,
    s: &Stream,
    x: Dv,
    w: Dv,
    out: Dv,
    rows: usize,
    n: usize,
    eps: f32,
) -> Result<()> {
    rms_to(gpu, s, x, w, out, None, rows, n, eps)
}

/// `rms`, and out as q8_1 blocks [rows, n/32] into xq (what `quant::matmul` would make of
/// it: bit-identical), for a following matmul that takes x already quantized.
#[allow(clippy::too_many_arguments)]
pub fn rms_to(
    gpu: &Gpu,
    s: &Stream,
    x: Dv,
    w: Dv,
    out: Dv,
    xq: Option<Dv>,
    rows: usize,
    n: usize,
    eps: f32,
) -> Result<()> {
    let b = check(rows, n, eps)?;
    x.need("rms norm x", b)?;
    out.need("rms norm out", b)?;
    w.need("rms norm w", bytes(n, 4)?)?;
    if let Some(q) = xq {
        check_q8(q, rows, n)?;
    }
    let head = [x.arg(), w.arg(), out.arg()];
    run(gpu, s, "strata_norm_rms", &head, xq, rows, n, eps)
}

/// x += y, then out = RMSNorm(x) · w, per row. x, y, out: f32 [rows, n]; w: f32 [n].
#[allow(clippy::too_many_arguments)]
pub fn add_rms(
    gpu: &Gpu,
    s: &Stream,
    x: Dv,
    y: Dv,
    w: Dv,
    out: Dv,
    rows: usize,
    n: usize,
    eps: f32,
) -> Result<()> {
    add_rms_to(gpu, s, x, y, w, out, None, rows, n, eps)
}

/// `add_rms`, and out as q8_1 blocks [rows, n/32] into xq (as `rms_to`).
#[allow(clippy::too_many_arguments)]
pub fn add_rms_to(
    gpu: &Gpu,
    s: &Stream,
    x: Dv,
    y: Dv,
    w: Dv,
    out: Dv,
    xq: Option<Dv>,
    rows: usize,
    n: usize,
    eps: f32,
) -> Result<()> {
    let b = check(rows, n, eps)?;
    x.need("add+norm x", b)?;
    y.need("add+norm y", b)?;
    out.need("add+norm out", b)?;
    w.need("add+norm w", bytes(n, 4)?)?;
    if let Some(q) = xq {
        check_q8(q, rows, n)?;
    }
    let head = [x.arg(), y.arg(), w.arg(), out.arg()];
    run(gpu, s, "strata_norm_add_rms", &head, xq, rows, n, eps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_output_checks() {
        let big = Dv {
            ptr: 256,
            len: 1 << 20,
        };
        assert!(check_q8(big, 2, 2048).is_ok());
        assert!(matches!(check_q8(big, 2, 2040), Err(Error::Shape(_))));
        let odd = Dv {
            ptr: 258,
            len: 1 << 20,
        };
        assert!(matches!(check_q8(odd, 2, 2048), Err(Error::Shape(_))));
        let small = Dv {
            ptr: 256,
            len: 2 * 64 * 36 - 1,
        };
        assert!(matches!(check_q8(small, 2, 2048), Err(Error::Shape(_))));
    }
}
