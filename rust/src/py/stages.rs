//! The layer split's stages as Python values.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// `Model.stages()` / `hybrid_info()["stages"]`: one dict per stage.
pub fn stage_list<'py>(
    py: Python<'py>,
    info: &[crate::gpu::StageInfo],
) -> PyResult<Bound<'py, PyList>> {
    let stages = PyList::empty(py);
    for s in info {
        let sd = PyDict::new(py);
        sd.set_item("device", s.device)?;
        sd.set_item("layers", s.layers)?;
        sd.set_item("windows", s.windows)?;
        sd.set_item("beside", s.beside)?;
        sd.set_item("gaps", s.gaps)?;
        sd.set_item("busy", s.busy)?;
        sd.set_item("compute_s", s.compute_s)?;
        sd.set_item("waiting_s", s.waiting_s)?;
        sd.set_item("copying_s", s.copying_s)?;
        sd.set_item("windows_in_flight", s.windows_in_flight)?;
        sd.set_item("max_windows_in_flight", s.max_windows_in_flight)?;
        sd.set_item("n_slots", s.n_slots)?;
        sd.set_item("resident", s.resident)?;
        sd.set_item("swaps", s.swaps)?;
        sd.set_item("hop_bytes", s.hop_bytes)?;
        sd.set_item("swap_bytes", s.swap_bytes)?;
        stages.append(sd)?;
    }
    Ok(stages)
}
