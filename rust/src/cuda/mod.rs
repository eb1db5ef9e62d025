//! The GPU runtime: the CUDA driver API loaded at run time (`ffi`), devices and kernel modules
//! (`Gpu`), memory (`DevBuf`, `PinnedBuf`), `Stream`, `Event`, `Graph`, `Kernel` + `Arg`, and
//! the kernel launchers (`ops`). No link-time CUDA dependency: without a driver, a device or
//! built kernels every entry point returns `Error::NoGpu` saying why; a failing driver call is
//! `Error::Cuda { call, .. }` naming it. Contract: docs/GPU.md; guide: docs/GPU.md.

mod ctx;
mod fatbin;
pub(crate) mod ffi;
mod gpu;
mod kernel;
mod mem;
pub mod ops;
mod stream;

pub use ffi::CUstream;
pub use gpu::Gpu;
pub use kernel::{Arg, Kernel, MAX_ARGS};
pub use mem::{DevBuf, HostRegistration, PinnedBuf};
pub use stream::{Event, Graph, Stream};

/// Whether nvcc built the kernels into this binary, and if not, why.
pub fn kernels_built() -> std::result::Result<&'static str, &'static str> {
    if fatbin::BUILT {
        Ok(fatbin::INFO)
    } else {
        Err(fatbin::WHY)
    }
}

/// The kernel files embedded in this binary (stems of `cuda/*.cu`).
pub fn kernel_files() -> Vec<&'static str> {
    fatbin::FATBINS.iter().map(|(s, _)| *s).collect()
}

/// `Ok("NVIDIA H200, sm_90, 139 GiB")` when device 0 is usable (driver, device, kernels
/// built and loadable), else `Err(why not)`. Never panics.
pub fn status() -> std::result::Result<String, String> {
    let gpu = Gpu::open(0).map_err(|e| e.to_string())?;
    let (_, total) = gpu.mem_info().map_err(|e| e.to_string())?;
    let (major, minor) = gpu.cc();
    Ok(format!(
        "{}, sm_{major}{minor}, {} GiB",
        gpu.name(),
        total >> 30
    ))
}

/// Plain data that may be copied to and from the device byte for byte: every bit pattern is
/// a valid value and there is no padding.
///
/// # Safety
/// Implement only for such types.
pub unsafe trait Pod: Copy + Send + Sync + 'static {
    fn zeroed() -> Self;
}

macro_rules! pod {
    ($($t:ty = $z:expr),*) => { $( unsafe impl Pod for $t { fn zeroed() -> Self { $z } } )* };
}
pod!(
    u8 = 0,
    i8 = 0,
    u16 = 0,
    i16 = 0,
    u32 = 0,
    i32 = 0,
    u64 = 0,
    i64 = 0,
    f32 = 0.0,
    f64 = 0.0,
    half::f16 = half::f16::ZERO,
    half::bf16 = half::bf16::ZERO
);

/// The bytes of a `Pod` slice.
pub fn as_bytes<T: Pod>(s: &[T]) -> &[u8] {
    // SAFETY: `T: Pod` has no padding; the length is the slice's size in bytes.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), std::mem::size_of_val(s)) }
}

/// The bytes of a mutable `Pod` slice (every byte pattern is a valid `T`).
pub fn as_bytes_mut<T: Pod>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as above, and any bytes written form valid `T`s.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), std::mem::size_of_val(s)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn status_never_panics_and_agrees_with_open() {
        match status() {
            Ok(s) => assert!(s.contains("sm_"), "{s}"),
            Err(why) => {
                assert!(!why.is_empty());
                match Gpu::open(0) {
                    Err(Error::NoGpu(w)) => assert!(!w.is_empty()),
                    Err(Error::Cuda { call, .. }) => assert!(!call.is_empty()),
                    other => panic!("status said no GPU but open gave {other:?}"),
                }
            }
        }
    }

    #[test]
    fn embedded_fatbins_are_fatbins() {
        // The fatbin container's magic number (little-endian 0xBA55ED50) opens every file.
        for (stem, bytes) in fatbin::FATBINS {
            assert_eq!(&bytes[..4], &[0x50, 0xed, 0x55, 0xba], "{stem}");
            assert_eq!(
                bytes.as_ptr() as usize % 16,
                0,
                "{stem} not 16-byte aligned"
            );
        }
        if fatbin::BUILT {
            assert!(kernel_files().contains(&"smoke"));
        } else {
            assert!(!fatbin::WHY.is_empty());
        }
    }

    #[test]
    fn handles_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Gpu>();
        check::<DevBuf>();
        check::<PinnedBuf>();
        check::<Kernel>();
        check::<Stream>();
        check::<Event>();
        check::<Graph>();
    }

    #[test]
    fn pod_bytes_round_trip() {
        let mut v = [1.5f32, -2.0];
        assert_eq!(as_bytes(&v).len(), 8);
        as_bytes_mut(&mut v)[..4].copy_from_slice(&3.0f32.to_ne_bytes());
        assert_eq!(v, [3.0, -2.0]);
    }
}
