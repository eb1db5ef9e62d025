//! What `Model.open` builds from its keywords before the model: the CPU compute, and the
//! settings object's defaults of the keywords left out.

use crate::model::{Compute, SerialCompute};
use crate::pool::{Pool, PoolConfig};
use pyo3::prelude::*;
use std::sync::Arc;

/// The CPU compute of the CPU path and of the hybrid mode's misses: the pool with `threads`
/// compute threads in all, the caller included when it participates, as llama.cpp's `-t`
/// (0: one per physical core; `PoolConfig::for_threads`), or the serial reference
/// (`threads` < 0); `pool` = (host participates, pipelined schedule, balanced decode tiles:
/// `PoolConfig`). With `loop_core` the pool takes one thread fewer (at least one), leaving
/// that core to the thread that drives the GPU while the pool runs on another
/// (`defer_experts`).
pub(super) fn make_compute(
    threads: i64,
    (host_participates, pool_pipeline, pool_balanced): (bool, bool, bool),
    loop_core: bool,
) -> Arc<dyn Compute> {
    if threads < 0 {
        return Arc::new(SerialCompute::new());
    }
    let mut n = PoolConfig::resolve_threads(threads as usize);
    if loop_core {
        n = n.saturating_sub(1).max(1);
    }
    let mut pc = PoolConfig::for_threads(n, host_participates, pool_pipeline);
    pc.balanced = pool_balanced;
    Arc::new(Pool::new(pc))
}

/// The settings object's default of `name` (`strata.config.Config.default`: the one place a
/// setting's default is named).
pub(super) fn config_default<T>(py: Python<'_>, name: &str) -> PyResult<T>
where
    T: for<'a, 'py> FromPyObject<'a, 'py>,
{
    let v = py
        .import("strata.config")?
        .getattr("Config")?
        .call_method1("default", (name,))?;
    v.extract::<T>().map_err(Into::into)
}
