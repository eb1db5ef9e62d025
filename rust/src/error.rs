//! One error enum for the crate; `py` maps each variant to a class of `strata.errors`.

use std::fmt;
use std::path::PathBuf;

#[derive(Debug)]
pub enum Error {
    /// A GGUF file that cannot be read: which file, at which byte offset, and what is wrong.
    Gguf {
        path: PathBuf,
        offset: u64,
        msg: String,
    },
    /// A tensor type or layout the kernels cannot handle.
    Quant(String),
    /// An impossible or inconsistent configuration value.
    Config(String),
    /// An argument whose shape, length or index does not fit (e.g. an expert id out of range).
    Shape(String),
    /// A model the engine cannot run (architecture, missing tensor, unsupported type).
    Model(String),
    /// A bad argument to a call (slot, token id, length): Python's `ValueError`.
    Input(String),

    /// A hotness profile that cannot be read.
    Profile(String),
    /// A profile made for another model.
    ProfileMismatch(String),
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A CUDA driver call that failed: which call, its `CUresult` and the driver's words.
    Cuda {
        call: &'static str,
        code: i32,
        msg: String,
    },
    /// No usable GPU: no driver, no device, or a build without kernels (the reason).
    NoGpu(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn gguf(path: impl Into<PathBuf>, offset: u64, msg: impl Into<String>) -> Self {
        Error::Gguf {
            path: path.into(),
            offset,
            msg: msg.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Gguf { path, offset, msg } => {
                write!(f, "{}: at byte {}: {}", path.display(), offset, msg)
            }
            Error::Quant(m) => write!(f, "quant: {m}"),
            Error::Config(m) => write!(f, "config: {m}"),
            Error::Shape(m) => write!(f, "shape: {m}"),
            Error::Model(m) => write!(f, "model: {m}"),
            Error::Input(m) => write!(f, "{m}"),

            Error::Profile(m) => write!(f, "profile: {m}"),
            Error::ProfileMismatch(m) => write!(f, "profile: {m}"),
            Error::Io { path, source } => write!(f, "{}: {}", path.display(), source),
            Error::Cuda { call, code, msg } => write!(f, "CUDA {call} failed ({code}): {msg}"),
            Error::NoGpu(m) => write!(f, "no GPU: {m}"),
        }
    }
}

impl std::error::Error for Error {}
