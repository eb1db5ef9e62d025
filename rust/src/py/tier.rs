//! `strata._core` tier classes: `RoutingCounters`, `Profile`, `ExpertTier`, `FillHandle`.
//! Thin wrappers over `crate::tier`; heavy calls release the GIL.

use crate::gguf::Gguf;
use crate::tier::{
    self, fill, model_id, ExpertLayout, Fill, FillOptions, FillProgress, Place, Prefetcher,
    RamMode, Residency,
};
use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn open_model(py: Python<'_>, path: &PathBuf) -> PyResult<(Arc<Gguf>, ExpertLayout)> {
    let g = py.detach(|| Gguf::open(path))?;
    let layout = ExpertLayout::from_gguf(&g)?;
    Ok((Arc::new(g), layout))
}

fn grid<'py, T: numpy::Element>(
    py: Python<'py>,
    v: Vec<T>,
    rows: usize,
    cols: usize,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(PyArray1::from_vec(py, v).reshape([rows, cols])?.into_any())
}

/// Per (layer, expert) routing counts with exponential decay. `observe` is meant for one
/// writer per layer (the forward pass); reads from other threads are fine.
#[pyclass(frozen)]
pub struct RoutingCounters {
    pub inner: Arc<tier::RoutingCounters>,
}

#[pymethods]
impl RoutingCounters {
    #[new]
    #[pyo3(signature = (n_layer, n_expert, half_life_steps = 0.0))]
    fn new(n_layer: usize, n_expert: usize, half_life_steps: f64) -> PyResult<Self> {
        if n_layer == 0 || n_expert == 0 || n_layer * n_expert > (1 << 24) {
            return Err(PyValueError::new_err(format!(
                "n_layer and n_expert must be >= 1 with at most 2^24 cells (got {n_layer} × {n_expert})"
            )));
        }
        if !half_life_steps.is_finite() {
            return Err(PyValueError::new_err("half_life_steps must be finite"));
        }
        Ok(RoutingCounters {
            inner: Arc::new(tier::RoutingCounters::new(
                n_layer,
                n_expert,
                half_life_steps,
            )),
        })
    }

    #[getter]
    fn n_layer(&self) -> usize {
        self.inner.n_layer()
    }

    #[getter]
    fn n_expert(&self) -> usize {
        self.inner.n_expert()
    }

    #[getter]
    fn steps(&self) -> u64 {
        self.inner.steps()
    }

    fn observe(&self, layer: usize, ids: Vec<u32>) {
        self.inner.observe(layer, &ids);
    }

    fn end_step(&self) {
        self.inner.end_step();
    }

    fn hits(&self, layer: usize) -> u64 {
        self.inner.hits(layer)
    }

    fn reset(&self) {
        self.inner.reset();
    }

    /// Counts as `float32 [n_layer, n_expert]`.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        grid(
            py,
            self.inner.snapshot(),
            self.inner.n_layer(),
            self.inner.n_expert(),
        )
    }

    fn top_k(&self, layer: usize, k: usize) -> Vec<(u32, f32)> {
        self.inner.top_k(layer, k)
    }
}

/// A hotness profile: routing counts per layer and expert for one model (by fingerprint).
#[pyclass(frozen)]
pub struct Profile {
    pub inner: tier::Profile,
}

#[pymethods]
impl Profile {
    /// A profile of `model` from `counts` (`[n_layer, n_expert]`, finite, >= 0).
    #[staticmethod]
    #[pyo3(signature = (model, counts, tokens, source = ""))]
    fn from_counts(
        py: Python<'_>,
        model: PathBuf,
        counts: PyReadonlyArray2<'_, f32>,
        tokens: u64,
        source: &str,
    ) -> PyResult<Self> {
        let (g, layout) = open_model(py, &model)?;
        let shape = counts.shape().to_vec();
        if shape != [layout.n_layer(), layout.n_expert] {
            return Err(PyValueError::new_err(format!(
                "counts has shape {shape:?}; the model has {} layers × {} experts",
                layout.n_layer(),
                layout.n_expert
            )));
        }
        let v: Vec<f32> = counts.as_array().iter().copied().collect();
        let id = model_id(&g, &layout);
        Ok(Profile {
            inner: tier::Profile::new(&id, layout.n_layer(), layout.n_expert, tokens, source, v)?,
        })
    }

    /// Read a profile; with `model`, refuse one made for another model (`ProfileMismatchError`).
    #[staticmethod]
    #[pyo3(signature = (path, model = None))]
    fn load(py: Python<'_>, path: PathBuf, model: Option<PathBuf>) -> PyResult<Self> {
        let p = tier::Profile::load(&path)?;
        if let Some(m) = model {
            let (g, layout) = open_model(py, &m)?;
            p.check(&path, &model_id(&g, &layout), &layout)?;
        }
        Ok(Profile { inner: p })
    }

    fn save(&self, path: PathBuf) -> PyResult<()> {
        Ok(self.inner.save(&path)?)
    }

    /// Raise `ProfileMismatchError` unless the profile was made for `model`.
    fn check(&self, py: Python<'_>, model: PathBuf) -> PyResult<()> {
        let (g, layout) = open_model(py, &model)?;
        Ok(self
            .inner
            .check(&PathBuf::from("profile"), &model_id(&g, &layout), &layout)?)
    }

    #[getter]
    fn n_layer(&self) -> usize {
        self.inner.n_layer
    }

    #[getter]
    fn n_expert(&self) -> usize {
        self.inner.n_expert
    }

    #[getter]
    fn tokens(&self) -> u64 {
        self.inner.tokens
    }

    #[getter]
    fn fingerprint(&self) -> String {
        format!("{:016x}", self.inner.fingerprint)
    }

    #[getter]
    fn model(&self) -> String {
        self.inner.model.clone()
    }

    #[getter]
    fn source(&self) -> String {
        self.inner.source.clone()
    }

    /// Counts as `float32 [n_layer, n_expert]`.
    fn counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        grid(
            py,
            self.inner.counts.clone(),
            self.inner.n_layer,
            self.inner.n_expert,
        )
    }

    /// Every (layer, expert), hottest first.
    fn order(&self) -> Vec<(u32, u32)> {
        self.inner.order()
    }
}

/// `(fingerprint hex, description)` of a model file.
#[pyfunction]
fn model_fingerprint(py: Python<'_>, model: PathBuf) -> PyResult<(String, String)> {
    let (g, layout) = open_model(py, &model)?;
    let id = model_id(&g, &layout);
    Ok((format!("{:016x}", id.fingerprint), id.description))
}

/// Drop a file's clean pages from the page cache (`posix_fadvise(DONTNEED)`).
#[pyfunction]
fn evict_page_cache(path: PathBuf) -> PyResult<()> {
    tier::sys::evict_file(&path).map_err(|e| crate::Error::Io { path, source: e })?;
    Ok(())
}

/// `{queued, dropped, cancelled, done, bytes, hits, late, misses}`.
pub(crate) fn prefetch_dict<'py>(
    py: Python<'py>,
    s: &tier::PrefetchStats,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("queued", s.queued)?;
    d.set_item("dropped", s.dropped)?;
    d.set_item("cancelled", s.cancelled)?;
    d.set_item("done", s.done)?;
    d.set_item("bytes", s.bytes)?;
    d.set_item("hits", s.hits)?;
    d.set_item("late", s.late)?;
    d.set_item("misses", s.misses)?;
    Ok(d)
}

fn progress_dict<'py>(
    py: Python<'py>,
    p: &FillProgress,
    kind: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kind", kind)?;
    d.set_item("done_bytes", p.done_bytes)?;
    d.set_item("total_bytes", p.total_bytes)?;
    d.set_item("done_experts", p.done_experts)?;
    d.set_item("total_experts", p.total_experts)?;
    d.set_item("finished", p.finished)?;
    d.set_item("cancelled", p.cancelled)?;
    d.set_item("seconds", p.seconds)?;
    Ok(d)
}

/// A running fill. Dropping it cancels the fill.
#[pyclass(frozen)]
pub struct FillHandle {
    fill: Mutex<Option<Fill>>,
    state: Arc<fill::FillState>,
}

impl FillHandle {
    fn kind(&self) -> &'static str {
        match self.state.kind {
            tier::FillKind::Copy => "copy",
            tier::FillKind::Prefault => "prefault",
        }
    }
}

#[pymethods]
impl FillHandle {
    /// `{kind, done_bytes, total_bytes, done_experts, total_experts, finished, cancelled,
    /// seconds}`.
    fn progress<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        progress_dict(py, &self.state.progress(), self.kind())
    }

    /// Stop after the experts in flight; the residency table stays consistent.
    fn cancel(&self) {
        if let Some(f) = self.fill.lock().unwrap().as_ref() {
            f.cancel();
        }
    }

    #[getter]
    fn done(&self) -> bool {
        self.state.progress().finished
    }

    /// Wait up to `timeout` seconds (None: until done). True when the fill has finished.
    /// Ctrl-C raises KeyboardInterrupt and leaves the fill running (cancel it).
    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let deadline = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.max(0.0)));
        loop {
            let finished = py.detach(|| {
                let slice = Instant::now() + Duration::from_millis(100);
                loop {
                    if self.state.progress().finished {
                        return true;
                    }
                    let now = Instant::now();
                    if now >= slice || deadline.is_some_and(|d| now >= d) {
                        return false;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            });
            if finished {
                if let Some(f) = self.fill.lock().unwrap().take() {
                    py.detach(|| f.wait());
                }
                return Ok(true);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
            py.check_signals()?;
        }
    }
}

/// The RAM tier of one model: residency table, arena, fill threads and read-ahead.
#[pyclass(frozen)]
pub struct ExpertTier {
    pub(crate) res: Arc<Residency>,
    prefetcher: Mutex<Option<Prefetcher>>,
}

impl ExpertTier {
    fn layer_expert(&self, layer: usize, expert: usize) -> PyResult<()> {
        let l = self.res.layout();
        if layer >= l.n_layer() || expert >= l.n_expert {
            return Err(PyIndexError::new_err(format!(
                "(layer {layer}, expert {expert}) outside {} layers × {} experts",
                l.n_layer(),
                l.n_expert
            )));
        }
        Ok(())
    }
}

#[pymethods]
impl ExpertTier {
    /// `mode`: mmap, resident or budget (with `budget_gib` > 0). A profile made for another
    /// model raises `ProfileMismatchError`. `lock`: try to mlock the arena (a warning in
    /// `warnings` says how to raise the limit when refused).
    #[new]
    #[pyo3(signature = (model, mode = "mmap", budget_gib = 0.0, profile = None, lock = true))]
    fn new(
        py: Python<'_>,
        model: PathBuf,
        mode: &str,
        budget_gib: f64,
        profile: Option<&Profile>,
        lock: bool,
    ) -> PyResult<Self> {
        let mode = RamMode::parse(mode, budget_gib)?;
        let g = Arc::new(py.detach(|| Gguf::open(&model))?);
        let prof = profile.map(|p| &p.inner);
        let res = py.detach(|| Residency::new(g, mode, prof, lock))?;
        Ok(ExpertTier {
            res,
            prefetcher: Mutex::new(None),
        })
    }

    #[getter]
    fn mode(&self) -> &'static str {
        self.res.mode().name()
    }

    #[getter]
    fn n_layer(&self) -> usize {
        self.res.layout().n_layer()
    }

    #[getter]
    fn n_expert(&self) -> usize {
        self.res.layout().n_expert
    }

    /// Bytes of every expert of every layer (gate + up + down).
    #[getter]
    fn total_bytes(&self) -> u64 {
        self.res.layout().total_bytes()
    }

    #[getter]
    fn arena_bytes(&self) -> u64 {
        self.res.arena_bytes()
    }

    #[getter]
    fn locked(&self) -> bool {
        self.res.locked()
    }

    #[getter]
    fn warnings(&self) -> Vec<String> {
        self.res.warnings().to_vec()
    }

    #[getter]
    fn fingerprint(&self) -> String {
        format!("{:016x}", self.res.model_id().fingerprint)
    }

    /// `(experts, bytes)` resident in the arena now.
    fn resident(&self) -> (usize, u64) {
        self.res.resident()
    }

    /// `uint8 [n_layer, n_expert]`: 1 resident, 0 mapped, 255 a layer without experts.
    fn table<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let l = self.res.layout();
        grid(py, self.res.table(), l.n_layer(), l.n_expert)
    }

    /// Arena offset of a resident expert, None for a mapped one.
    fn place(&self, layer: usize, expert: usize) -> PyResult<Option<u64>> {
        self.layer_expert(layer, expert)?;
        match self.res.place(layer, expert) {
            Some(Place::Resident(off)) => Ok(Some(off)),
            Some(Place::Mapped) => Ok(None),
            None => Err(PyIndexError::new_err(format!(
                "layer {layer} has no experts"
            ))),
        }
    }

    /// Copies of the expert's `(gate, up, down)` slabs, read from wherever it lives.
    fn expert_bytes<'py>(
        &self,
        py: Python<'py>,
        layer: usize,
        expert: usize,
    ) -> PyResult<(
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
    )> {
        self.layer_expert(layer, expert)?;
        let b = self
            .res
            .expert_bytes(layer, expert)
            .ok_or_else(|| PyIndexError::new_err(format!("layer {layer} has no experts")))?;
        Ok((
            PyBytes::new(py, b.gate),
            PyBytes::new(py, b.up),
            PyBytes::new(py, b.down),
        ))
    }

    /// Start the fill threads: copy the planned experts into the arena (resident, budget) or
    /// prefault every expert into the page cache (mmap), hottest first. `limit_bytes` caps an
    /// mmap prefault (0: all); `max_bytes_per_s` throttles (0: no limit).
    #[pyo3(signature = (threads = 4, max_bytes_per_s = 0, limit_bytes = 0))]
    fn fill(&self, threads: usize, max_bytes_per_s: u64, limit_bytes: u64) -> PyResult<FillHandle> {
        let f = fill::start(
            &self.res,
            FillOptions {
                threads,
                max_bytes_per_s,
                limit_bytes,
            },
        )?;
        Ok(FillHandle {
            state: f.state().clone(),
            fill: Mutex::new(Some(f)),
        })
    }

    /// Queue read-ahead of the mapped experts among `ids` of `layer` (never blocks; starts
    /// the prefetch threads on first use).
    #[pyo3(signature = (layer, ids, threads = 2))]
    fn prefetch(&self, layer: usize, ids: Vec<u32>, threads: usize) -> PyResult<()> {
        let mut p = self.prefetcher.lock().unwrap();
        if p.is_none() {
            *p = Some(
                Prefetcher::start(self.res.clone(), threads, 1024).map_err(|e| {
                    crate::Error::Io {
                        path: "prefetch thread".into(),
                        source: e,
                    }
                })?,
            );
        }
        p.as_ref().unwrap().prefetch(layer, &ids);
        Ok(())
    }

    /// Wait for queued read-ahead, stop the prefetch threads; their counts.
    fn stop_prefetch<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let taken = self.prefetcher.lock().unwrap().take();
        let s = match taken {
            Some(mut p) => py.detach(|| {
                p.drain();
                p.stats()
            }),
            None => tier::PrefetchStats::default(),
        };
        prefetch_dict(py, &s)
    }

    /// Reads per tier so far: `{resident_hits, resident_bytes, mapped_hits, mapped_bytes}`.
    fn uses<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let u = self.res.uses();
        let d = PyDict::new(py);
        d.set_item("resident_hits", u.resident_hits)?;
        d.set_item("resident_bytes", u.resident_bytes)?;
        d.set_item("mapped_hits", u.mapped_hits)?;
        d.set_item("mapped_bytes", u.mapped_bytes)?;
        Ok(d)
    }

    /// Fault the tensors that are not experts (attention, norms, routers, embeddings,
    /// output: what every token reads) into the page cache on `threads` threads; blocks.
    /// Returns the bytes.
    #[pyo3(signature = (threads = 4))]
    fn prefault_dense(&self, py: Python<'_>, threads: usize) -> PyResult<u64> {
        if threads == 0 || threads > 1024 {
            return Err(PyValueError::new_err(format!(
                "threads must be in 1..=1024 (got {threads})"
            )));
        }
        Ok(py.detach(|| self.res.prefault_dense(threads)))
    }

    /// Drop the mapped experts' pages (every expert's with `all`) from this tier's map and
    /// the page cache, so their next read comes from the disk (benchmarks). Other maps of the
    /// file that hold the pages keep them. Returns the bytes advised.
    #[pyo3(signature = (all = false))]
    fn evict(&self, py: Python<'_>, all: bool) -> PyResult<u64> {
        Ok(py.detach(|| self.res.evict(all))?)
    }

    /// Fraction of the expert bytes of the map that are in the page cache (`mincore`).
    fn page_cache_fraction(&self, py: Python<'_>) -> f64 {
        py.detach(|| self.res.page_cache_fraction())
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RoutingCounters>()?;
    m.add_class::<Profile>()?;
    m.add_class::<ExpertTier>()?;
    m.add_class::<FillHandle>()?;
    m.add_function(wrap_pyfunction!(model_fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(evict_page_cache, m)?)?;
    Ok(())
}
