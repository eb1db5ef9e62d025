//! Launchers of `cuda/norm.cu`: RMSNorm over rows, the residual add fused with it, and the
//! norm that also quantizes its rows for the matmuls that read them.

use super::act::ActOut;
use super::view::{bytes, grid_dim, i32_of, launch, prod, Dv, GRID_X};
use crate::cuda::{Arg, Gpu, Stream};
use crate::error::{Error, Result};

const THREADS: u32 = 512; // the kernels' NORM_THREADS

fn check(rows: usize, n: usize, eps: f32) -> Result<usize> {
    if n == 0 {
        return Err(Error::Shape("rms norm: rows of 0 elements".into()));
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::Config(format!("rms norm: eps {eps} must be >= 0")));
    }
    bytes(prod(&[rows, n])?, 4)
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
    let b = check(rows, n, eps)?;
    x.need("rms norm x", b)?;
    out.need("rms norm out", b)?;
    w.need("rms norm w", bytes(n, 4)?)?;
    if rows == 0 {
        return Ok(());
    }
    launch(
        gpu,
        s,
        "strata_norm_rms",
        (grid_dim("rows", rows, GRID_X)?, 1, 1),
        THREADS,
        &[
            x.arg(),
            w.arg(),
            out.arg(),
            Arg::I32(i32_of("n", n)?),
            Arg::F32(eps),
        ],
    )
}

/// x += y, then out = RMSNorm(x) · w, per row. x, y, out: f32 [rows, n]; w: f32 [n];
/// `copy` f32 [rows, n]: the same rows again (a hybrid layer's FFN input in mapped host
/// memory), or None.
#[allow(clippy::too_many_arguments)]
pub fn add_rms(
    gpu: &Gpu,
    s: &Stream,
    x: Dv,
    y: Dv,
    w: Dv,
    out: Dv,
    copy: Option<Dv>,
    rows: usize,
    n: usize,
    eps: f32,
) -> Result<()> {
    let b = check(rows, n, eps)?;
    x.need("add+norm x", b)?;
    y.need("add+norm y", b)?;
    out.need("add+norm out", b)?;
    if let Some(c) = copy {
        c.need("add+norm copy", b)?;
    }
    w.need("add+norm w", bytes(n, 4)?)?;
    if rows == 0 {
        return Ok(());
    }
    launch(
        gpu,
        s,
        "strata_norm_add_rms",
        (grid_dim("rows", rows, GRID_X)?, 1, 1),
        THREADS,
        &[
            x.arg(),
            y.arg(),
            w.arg(),
            out.arg(),
            Arg::Ptr(copy.map_or(0, |c| c.ptr)),
            Arg::I32(i32_of("n", n)?),
            Arg::F32(eps),
        ],
    )
}

/// x (+= y, written back, when y is given), out = RMSNorm(x) · w, and out's rows quantized into
/// `act.out` as `QuantOps::quantize_act` would quantize them for `act.act`'s weights, in one
/// launch (a layer's attention norm before its Q/K/V products). x, y, out: f32 [rows, n];
/// w: f32 [n]; act.out: block_q8a [rows, n / 32].
#[allow(clippy::too_many_arguments)]
pub fn rms_act(
    gpu: &Gpu,
    s: &Stream,
    x: Dv,
    y: Option<Dv>,
    w: Dv,
    out: Dv,
    act: ActOut,
    rows: usize,
    n: usize,
    eps: f32,
) -> Result<()> {
    let b = check(rows, n, eps)?;
    x.need("norm+quantize x", b)?;
    if let Some(y) = y {
        y.need("norm+quantize y", b)?;
    }
    out.need("norm+quantize out", b)?;
    w.need("norm+quantize w", bytes(n, 4)?)?;
    let [qout, kind] = ActOut::args(Some(act), rows, n, n, "norm+quantize activations")?;
    if rows == 0 {
        return Ok(());
    }
    launch(
        gpu,
        s,
        "strata_norm_rms_act",
        (grid_dim("rows", rows, GRID_X)?, 1, 1),
        THREADS,
        &[
            x.arg(),
            Arg::Ptr(y.map_or(0, |y| y.ptr)),
            w.arg(),
            out.arg(),
            qout,
            Arg::I32(i32_of("n", n)?),
            Arg::F32(eps),
            kind,
        ],
    )
}
