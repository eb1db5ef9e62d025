//! `strata._core` VRAM tier pieces: `HybridCounters` (the hybrid step's hit/miss/swap
//! counters, read by `/metrics` and `/v1/status`) and `vram_plan` (the slot budget).

use crate::tier::vram::{self, BudgetInputs, ExpertShape};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;

/// Hits, misses (by CPU and by PCIe), swaps and bytes moved of the VRAM expert tier. The
/// hybrid step records; anyone may read.
#[pyclass(frozen)]
pub struct HybridCounters {
    pub inner: Arc<vram::HybridCounters>,
}

#[pymethods]
impl HybridCounters {
    #[new]
    #[pyo3(signature = (n_layer, n_slots = 0))]
    fn new(n_layer: usize, n_slots: usize) -> PyResult<Self> {
        if n_layer == 0 || n_layer > 4096 {
            return Err(PyValueError::new_err(format!(
                "n_layer must be in 1..=4096 (got {n_layer})"
            )));
        }
        Ok(HybridCounters {
            inner: Arc::new(vram::HybridCounters::with_slots(n_layer, n_slots)),
        })
    }

    #[getter]
    fn n_layer(&self) -> usize {
        self.inner.n_layer()
    }

    /// One layer of one step: routed pairs served from VRAM, by the CPU, over PCIe.
    fn record_layer(&self, layer: usize, hits: u64, miss_cpu: u64, miss_pcie: u64) {
        self.inner.record_layer(layer, hits, miss_cpu, miss_pcie);
    }

    /// Pairs of rows that KV slot `slot`'s sequence fed (slots out of range are ignored).
    fn record_slot(&self, slot: usize, hits: u64, miss_cpu: u64, miss_pcie: u64) {
        self.inner.record_slot(slot, hits, miss_cpu, miss_pcie);
    }

    fn record_swaps(&self, n: u64, bytes: u64) {
        self.inner.record_swaps(n, bytes);
    }

    fn record_fill(&self, bytes: u64) {
        self.inner.record_fill(bytes);
    }

    fn record_pcie(&self, bytes: u64) {
        self.inner.record_pcie(bytes);
    }

    fn record_handoff(&self, bytes: u64) {
        self.inner.record_handoff(bytes);
    }

    /// `(hits, miss_cpu, miss_pcie)` over all layers.
    fn totals(&self) -> (u64, u64, u64) {
        let s = self.inner.snapshot();
        (s.total_hits(), s.total_miss_cpu(), s.total_miss_pcie())
    }

    /// `(hits, miss_cpu, miss_pcie)` of the pairs of the rows KV slot `slot`'s sequences
    /// fed, since load (a request's own share: the difference over its life in its slot).
    fn slot_totals(&self, slot: usize) -> PyResult<(u64, u64, u64)> {
        self.inner.slot_totals(slot).ok_or_else(|| {
            PyValueError::new_err(format!("slot {slot} is not one of the model's KV slots"))
        })
    }

    /// Host time of the layers whose misses ran on the CPU: `layers` (how many) and the ns
    /// summed over them per phase (`between`, `queue`, `wait`, `cpu`, `tail`; rust
    /// `tier::vram::stats::PHASES` says what each covers).
    fn layer_times(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.inner.times().into_iter().collect()
    }

    /// The GPU's part of the CPU-path layers after a hand-off, by CUDA timing events (ns
    /// summed): `layers`, `add`, `attention` (all 0 unless the model was opened with
    /// `set_hybrid_chain_timing(True)`).
    fn chain_times(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.inner.chain_times().into_iter().collect()
    }

    /// Per-layer lists `hits`, `miss_cpu`, `miss_pcie`, and `swaps`, `fill_bytes`,
    /// `pcie_bytes`, `handoff_bytes`.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.snapshot();
        let d = PyDict::new(py);
        d.set_item("hits", s.hits)?;
        d.set_item("miss_cpu", s.miss_cpu)?;
        d.set_item("miss_pcie", s.miss_pcie)?;
        d.set_item("swaps", s.swaps)?;
        d.set_item("fill_bytes", s.fill_bytes)?;
        d.set_item("pcie_bytes", s.pcie_bytes)?;
        d.set_item("handoff_bytes", s.handoff_bytes)?;
        Ok(d)
    }
}

/// The VRAM slot plan. `layers`: per layer `(gate, up, down)` bytes of one expert, or None
/// for a layer without experts. `budget_mib` ≤ 0: free − reserve. Raises ConfigError when the
/// budget exceeds free − reserve or the fixed part does not fit.
#[pyfunction]
#[pyo3(signature = (free_bytes, reserve_mib, budget_mib, dense_bytes, kv_bytes, buffer_bytes, n_expert, layers))]
#[allow(clippy::too_many_arguments)]
fn vram_plan<'py>(
    py: Python<'py>,
    free_bytes: u64,
    reserve_mib: u64,
    budget_mib: i64,
    dense_bytes: u64,
    kv_bytes: u64,
    buffer_bytes: u64,
    n_expert: usize,
    layers: Vec<Option<(u64, u64, u64)>>,
) -> PyResult<Bound<'py, PyDict>> {
    let inp = BudgetInputs {
        free_bytes,
        reserve_mib,
        budget_mib: (budget_mib > 0).then_some(budget_mib as u64),
        dense_bytes,
        kv_bytes,
        buffer_bytes,
        n_expert,
        layers: layers
            .into_iter()
            .map(|l| l.map(|(gate, up, down)| ExpertShape { gate, up, down }))
            .collect(),
    };
    let p = vram::plan(&inp)?;
    let d = PyDict::new(py);
    d.set_item("budget_bytes", p.budget_bytes)?;
    d.set_item("fixed_bytes", p.fixed_bytes)?;
    d.set_item("slot_bytes", p.slot_bytes)?;
    d.set_item("n_slots", p.n_slots)?;
    d.set_item("n_experts", p.n_experts)?;
    d.set_item("expert_bytes_total", p.expert_bytes_total)?;
    d.set_item("resident_share", p.resident_share())?;
    Ok(d)
}

/// Host→device bandwidth of device 0's link in GB/s (pinned copies of `mib` MiB timed with
/// events, best of three): what `pcie_frac`'s default is made from. GpuError without a GPU.
#[pyfunction]
#[pyo3(signature = (mib = 64))]
fn pcie_probe_gbps(py: Python<'_>, mib: usize) -> PyResult<f64> {
    if mib == 0 || mib > 4096 {
        return Err(PyValueError::new_err(format!(
            "mib must be in 1..=4096 (got {mib})"
        )));
    }
    Ok(py.detach(|| {
        let gpu = crate::cuda::Gpu::open(0)?;
        vram::probe_pcie_gbps(&gpu, mib)
    })?)
}

/// `pcie_frac`'s default from the link (`pcie_probe_gbps`) and the CPU pool's RAM bandwidth
/// (`ram_read_gbps`): the share of missed bytes that makes both legs finish together.
#[pyfunction]
fn default_pcie_frac(link_gbps: f64, cpu_gbps: f64) -> f64 {
    vram::default_pcie_frac(link_gbps, cpu_gbps)
}

/// Whether hybrid models opened from now on time their CPU-path layers' GPU part with CUDA
/// events (`HybridCounters.chain_times`; a diagnostic, off by default: three more events per
/// layer); returns the previous setting.
#[pyfunction]
fn set_hybrid_chain_timing(on: bool) -> bool {
    crate::gpu::set_hybrid_chain_timing(on)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<HybridCounters>()?;
    m.add_function(wrap_pyfunction!(set_hybrid_chain_timing, m)?)?;
    m.add_function(wrap_pyfunction!(vram_plan, m)?)?;
    m.add_function(wrap_pyfunction!(pcie_probe_gbps, m)?)?;
    m.add_function(wrap_pyfunction!(default_pcie_frac, m)?)?;
    Ok(())
}
