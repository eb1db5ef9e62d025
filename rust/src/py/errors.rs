//! Rust `Error` → Python exception classes (`strata.errors` re-exports them).

use crate::error::Error;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyOSError, PyValueError};
use pyo3::prelude::*;

create_exception!(
    _core,
    StrataError,
    PyException,
    "Base class of every Strata error."
);
create_exception!(
    _core,
    GGUFError,
    StrataError,
    "A GGUF file that cannot be read."
);
create_exception!(
    _core,
    QuantError,
    StrataError,
    "A tensor type or layout the kernels cannot handle."
);
create_exception!(
    _core,
    ConfigError,
    StrataError,
    "An impossible or inconsistent configuration."
);
create_exception!(
    _core,
    ShapeError,
    StrataError,
    "An argument whose shape, length or index does not fit."
);
create_exception!(
    _core,
    ModelError,
    StrataError,
    "A model the engine cannot run."
);

create_exception!(
    _core,
    ProfileError,
    StrataError,
    "A hotness profile that cannot be read."
);
create_exception!(
    _core,
    ProfileMismatchError,
    ProfileError,
    "A hotness profile made for another model."
);

create_exception!(
    _core,
    GpuError,
    StrataError,
    "No usable GPU (why), or a CUDA driver call that failed (which call, and the driver's words)."
);

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        let msg = e.to_string();
        match e {
            Error::Gguf { .. } => GGUFError::new_err(msg),
            Error::Quant(_) => QuantError::new_err(msg),
            Error::Config(_) => ConfigError::new_err(msg),
            Error::Shape(_) => ShapeError::new_err(msg),
            Error::Model(_) => ModelError::new_err(msg),
            Error::Input(_) => PyValueError::new_err(msg),

            Error::Profile(_) => ProfileError::new_err(msg),
            Error::ProfileMismatch(_) => ProfileMismatchError::new_err(msg),
            Error::Io { .. } => PyOSError::new_err(msg),
            Error::Cuda { .. } | Error::NoGpu(_) => GpuError::new_err(msg),
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("StrataError", py.get_type::<StrataError>())?;
    m.add("GGUFError", py.get_type::<GGUFError>())?;
    m.add("QuantError", py.get_type::<QuantError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("ShapeError", py.get_type::<ShapeError>())?;
    m.add("ModelError", py.get_type::<ModelError>())?;
    m.add("GpuError", py.get_type::<GpuError>())?;
    m.add("ProfileError", py.get_type::<ProfileError>())?;
    m.add(
        "ProfileMismatchError",
        py.get_type::<ProfileMismatchError>(),
    )?;
    Ok(())
}
