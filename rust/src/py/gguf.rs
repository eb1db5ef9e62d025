//! `strata._core.GGUFReader`: the reader's Python face. Tensor views borrow the mapped file;
//! each view holds a reference to the map, so closing the reader never invalidates them.

use crate::gguf::{Gguf, Value};
use crate::quant::{self, GgmlType};
use numpy::ndarray::ArrayView1;
use numpy::{PyArray1, PyReadonlyArrayDyn};
use pyo3::exceptions::{PyKeyError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use std::sync::Arc;

/// Keeps a shard's map alive for as long as any numpy view of it lives.
#[pyclass(frozen)]
struct MapOwner {
    _map: Arc<crate::gguf::ShardBytes>,
}

#[pyclass(frozen)]
pub struct GGUFReader {
    inner: std::sync::RwLock<Option<Arc<Gguf>>>,
}

fn value_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::U8(x) => x.into_pyobject(py)?.into_any(),
        Value::I8(x) => x.into_pyobject(py)?.into_any(),
        Value::U16(x) => x.into_pyobject(py)?.into_any(),
        Value::I16(x) => x.into_pyobject(py)?.into_any(),
        Value::U32(x) => x.into_pyobject(py)?.into_any(),
        Value::I32(x) => x.into_pyobject(py)?.into_any(),
        Value::U64(x) => x.into_pyobject(py)?.into_any(),
        Value::I64(x) => x.into_pyobject(py)?.into_any(),
        Value::F32(x) => x.into_pyobject(py)?.into_any(),
        Value::F64(x) => x.into_pyobject(py)?.into_any(),
        Value::Bool(x) => x.into_pyobject(py)?.to_owned().into_any(),
        Value::Str(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for it in items {
                list.append(value_to_py(py, it)?)?;
            }
            list.into_any()
        }
    })
}

impl GGUFReader {
    fn get(&self) -> PyResult<Arc<Gguf>> {
        self.inner
            .read()
            .unwrap()
            .clone()
            .ok_or_else(|| PyValueError::new_err("the GGUF file is closed"))
    }
}

#[pymethods]
impl GGUFReader {
    #[new]
    fn new(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Self> {
        let g = py.detach(|| Gguf::open(&path))?;
        Ok(GGUFReader {
            inner: std::sync::RwLock::new(Some(Arc::new(g))),
        })
    }

    /// Metadata of the model (shard 0) as a dict, arrays as lists.
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let g = self.get()?;
        let d = PyDict::new(py);
        for (k, v) in g.metadata() {
            d.set_item(k, value_to_py(py, v)?)?;
        }
        Ok(d)
    }

    /// `[(name, type name, numpy shape, nbytes, shard, offset)]` in file order.
    #[allow(clippy::type_complexity)]
    fn tensor_infos(&self) -> PyResult<Vec<(String, String, Vec<usize>, usize, usize, usize)>> {
        let g = self.get()?;
        Ok(g.tensors()
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    t.ty.name().to_string(),
                    t.shape(),
                    t.nbytes,
                    t.shard,
                    t.offset,
                )
            })
            .collect())
    }

    fn shard_paths(&self) -> PyResult<Vec<std::path::PathBuf>> {
        Ok(self.get()?.shards.iter().map(|s| s.path.clone()).collect())
    }

    /// Zero-copy read-only `np.uint8` view of the tensor's bytes.
    fn raw<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let g = self.get()?;
        let t = g
            .tensor(name)
            .ok_or_else(|| PyKeyError::new_err(name.to_string()))?;
        let map = g.map_of(t).clone();
        let owner = Bound::new(py, MapOwner { _map: map.clone() })?;
        let bytes: &[u8] = &map[t.offset..t.offset + t.nbytes];
        let view = ArrayView1::from(bytes);
        // SAFETY: the view points into the map, which `owner` keeps alive as the array's base.
        let arr = unsafe { PyArray1::borrow_from_array(&view, owner.into_any()) };
        arr.getattr("flags")?.setattr("writeable", false)?;
        Ok(arr)
    }

    /// The tensor dequantized to a flat `np.float32` array (the caller reshapes).
    fn dequantize<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let g = self.get()?;
        let t = g
            .tensor(name)
            .ok_or_else(|| PyKeyError::new_err(name.to_string()))?
            .clone();
        let n = t.n_elements() as usize;
        let out = py.detach(|| -> crate::Result<Vec<f32>> {
            let mut out = vec![0f32; n];
            quant::dequantize(t.ty, g.data(&t), &mut out)?;
            Ok(out)
        })?;
        Ok(PyArray1::from_vec(py, out))
    }

    fn close(&self) {
        *self.inner.write().unwrap() = None;
    }
}

/// Dequantize raw blocks of a named type: the kernel test entry point. `data` is `bytes` or a
/// C-contiguous `np.uint8` array (any shape); `n` is the element count.
#[pyfunction]
fn dequantize_bytes<'py>(
    py: Python<'py>,
    type_name: &str,
    data: &Bound<'py, PyAny>,
    n: usize,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let ty = GgmlType::from_name(type_name)
        .ok_or_else(|| PyValueError::new_err(format!("unknown ggml type {type_name:?}")))?;
    let run = |bytes: &[u8]| -> PyResult<Vec<f32>> {
        // Check the size before allocating `n` floats: a wrong `n` is a QuantError, not an abort.
        if ty.row_bytes(n) != Some(bytes.len()) {
            return Err(crate::Error::Quant(format!(
                "{}: {} bytes given for {n} elements, expected {}",
                ty.name(),
                bytes.len(),
                ty.row_bytes(n)
                    .map_or("a whole number of blocks".to_string(), |b| b.to_string())
            ))
            .into());
        }
        py.detach(|| {
            let mut out = vec![0f32; n];
            quant::dequantize(ty, bytes, &mut out).map(|()| out)
        })
        .map_err(Into::into)
    };
    let out = if let Ok(b) = data.cast::<PyBytes>() {
        run(b.as_bytes())?
    } else if let Ok(a) = data.extract::<PyReadonlyArrayDyn<'py, u8>>() {
        let bytes = a
            .as_slice()
            .map_err(|_| PyValueError::new_err("data must be a C-contiguous np.uint8 array"))?;
        run(bytes)?
    } else {
        return Err(PyTypeError::new_err(
            "data must be bytes or a C-contiguous np.uint8 array",
        ));
    };
    Ok(PyArray1::from_vec(py, out))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<GGUFReader>()?;
    m.add_class::<MapOwner>()?;
    m.add_function(wrap_pyfunction!(dequantize_bytes, m)?)?;
    Ok(())
}
