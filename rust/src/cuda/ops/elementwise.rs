//! Launchers of `cuda/elementwise.cu`: residual add, bias rows, copy, argmax per row.

use super::view::{bytes, grid_dim, i32_of, launch, prod, Dv, GRID_X};
use crate::cuda::{Arg, Gpu, Stream};
use crate::error::Result;

const THREADS: usize = 256;

fn flat(gpu: &Gpu, s: &Stream, name: &str, a: Dv, b: Dv, n: usize) -> Result<()> {
    a.need(name, bytes(n, 4)?)?;
    b.need(name, bytes(n, 4)?)?;
    if n == 0 {
        return Ok(());
    }
    let grid = grid_dim("blocks", n.div_ceil(THREADS), GRID_X)?;
    launch(
        gpu,
        s,
        name,
        (grid, 1, 1),
        THREADS as u32,
        &[a.arg(), b.arg(), Arg::I32(i32_of("n", n)?)],
    )
}

/// x[i] += y[i] for i < n (f32).
pub fn add(gpu: &Gpu, s: &Stream, x: Dv, y: Dv, n: usize) -> Result<()> {
    flat(gpu, s, "strata_ew_add_f32", x, y, n)
}

/// x[r, c] += b[c] for the `rows` rows of x f32 [rows, cols]; b f32 [cols].
pub fn add_rows(gpu: &Gpu, s: &Stream, x: Dv, b: Dv, rows: usize, cols: usize) -> Result<()> {
    let n = prod(&[rows, cols])?;
    x.need("bias rows x", bytes(n, 4)?)?;
    b.need("bias row", bytes(cols, 4)?)?;
    if n == 0 {
        return Ok(());
    }
    launch(
        gpu,
        s,
        "strata_ew_add_rows_f32",
        (grid_dim("blocks", n.div_ceil(THREADS), GRID_X)?, 1, 1),
        THREADS as u32,
        &[
            x.arg(),
            b.arg(),
            Arg::I32(i32_of("n", n)?),
            Arg::I32(i32_of("cols", cols)?),
        ],
    )
}

/// dst[i] = src[i] for i < n (f32).
pub fn copy(gpu: &Gpu, s: &Stream, dst: Dv, src: Dv, n: usize) -> Result<()> {
    flat(gpu, s, "strata_ew_copy_f32", dst, src, n)
}

/// Three copies of 4-byte words in one launch: `dst[j][..n[j]] = src[j][..n[j]]` (either side
/// may be mapped host memory: `PinnedBuf::dev_ptr`).
pub fn copy3(gpu: &Gpu, s: &Stream, dst: [Dv; 3], src: [Dv; 3], n: [usize; 3]) -> Result<()> {
    for j in 0..3 {
        dst[j].need("copy3 destination", bytes(n[j], 4)?)?;
        src[j].need("copy3 source", bytes(n[j], 4)?)?;
    }
    let total = n.iter().sum::<usize>();
    if total == 0 {
        return Ok(());
    }
    let ni = |j: usize| i32_of("copy3 n", n[j]).map(Arg::I32);
    // a fixed array: this runs once per hybrid layer, on the step's path
    let args = [
        dst[0].arg(),
        src[0].arg(),
        ni(0)?,
        dst[1].arg(),
        src[1].arg(),
        ni(1)?,
        dst[2].arg(),
        src[2].arg(),
        ni(2)?,
    ];
    let grid = grid_dim("blocks", total.div_ceil(THREADS), GRID_X)?;
    launch(
        gpu,
        s,
        "strata_ew_copy3_u32",
        (grid, 1, 1),
        THREADS as u32,
        &args,
    )
}

/// out[r] = the first index of the largest value of row r; x: f32 [rows, n], out: i32 [rows].
pub fn argmax(gpu: &Gpu, s: &Stream, x: Dv, out: Dv, rows: usize, n: usize) -> Result<()> {
    x.need("argmax x", bytes(prod(&[rows, n])?, 4)?)?;
    out.need("argmax out", bytes(rows, 4)?)?;
    if rows == 0 || n == 0 {
        return Ok(());
    }
    launch(
        gpu,
        s,
        "strata_ew_argmax_f32",
        (grid_dim("rows", rows, GRID_X)?, 1, 1),
        THREADS as u32,
        &[x.arg(), out.arg(), Arg::I32(i32_of("n", n)?)],
    )
}
