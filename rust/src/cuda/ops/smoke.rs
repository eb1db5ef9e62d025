//! Launcher of `cuda/smoke.cu`: y = a·x + b, the pipeline's end-to-end check.

use crate::cuda::{Arg, DevBuf, Gpu, Stream};
use crate::error::{Error, Result};

/// y[i] = a·x[i] + b for i < n; x, y: device f32 [n]. Queued on `s`.
pub fn axpb(gpu: &Gpu, s: &Stream, x: &DevBuf, y: &DevBuf, a: f32, b: f32, n: usize) -> Result<()> {
    let bytes = n
        .checked_mul(4)
        .ok_or_else(|| Error::Shape(format!("smoke: n = {n} too large")))?;
    if x.len() < bytes || y.len() < bytes {
        return Err(Error::Shape(format!(
            "smoke: n = {n} f32 needs {bytes} bytes; x has {}, y has {}",
            x.len(),
            y.len()
        )));
    }
    let n32 = u32::try_from(n).map_err(|_| Error::Shape(format!("smoke: n = {n} > u32")))?;
    if n == 0 {
        return Ok(());
    }
    let k = gpu.kernel("strata_smoke_axpb")?;
    let block = 256u32;
    let grid = n32.div_ceil(block).min(gpu.sm_count().max(1) * 8);
    k.launch(
        s,
        (grid, 1, 1),
        (block, 1, 1),
        0,
        &[
            Arg::Ptr(x.ptr()),
            Arg::Ptr(y.ptr()),
            Arg::F32(a),
            Arg::F32(b),
            Arg::U32(n32),
        ],
    )
}
