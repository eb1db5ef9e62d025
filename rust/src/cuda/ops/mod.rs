//! Kernel launchers: one file per `cuda/<family>.cu`, each checking shapes and buffer sizes
//! (`Error::Shape` / `Error::Config`) before it launches (GPU_SPEC.md §3).

pub mod smoke;
