//! The CUDA driver API, loaded at run time from `libcuda.so.1` with `libloading`.
//!
//! Why not `cudarc` (or another binding crate): we need (1) no link-time CUDA dependency and no
//! panic anywhere when the driver or a symbol is absent — the same wheel must import and say
//! "no GPU" cleanly on a machine without one; (2) typed errors that name the failing driver call
//! (`Error::Cuda { call, code, msg }`) so Python gets a `GpuError` naming it; (3) control over
//! exactly which symbol versions are bound (`_v2` where the driver exports them). That is ~45
//! function pointers, declared once below from `cuda.h` (CUDA 13.0) signatures.

#![allow(non_snake_case, non_camel_case_types)]

use crate::error::{Error, Result};
use libloading::Library;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::sync::OnceLock;

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = c_ulonglong;
pub type CUcontext = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;

pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
#[allow(dead_code)]
pub const CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: c_int = 38;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
pub const CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: c_int = 97;
pub const CU_FUNC_ATTRIBUTE_NUM_REGS: c_int = 4;
pub const CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: c_int = 8;
pub const CU_STREAM_NON_BLOCKING: c_uint = 0x1;
pub const CU_EVENT_DEFAULT: c_uint = 0x0;
pub const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
pub const CU_MEMHOSTALLOC_PORTABLE: c_uint = 0x1;
pub const CU_MEMHOSTALLOC_DEVICEMAP: c_uint = 0x2;
pub const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 0x1;
pub const CU_MEMHOSTREGISTER_DEVICEMAP: c_uint = 0x2;
pub const CU_MEMHOSTREGISTER_READ_ONLY: c_uint = 0x8;
pub const CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: c_int = 113;
pub const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: c_int = 1;
pub const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;

/// Declares the function table: `field: ["symbol", fallback..] fn(args)`. Every field is the
/// CUDA name (without the `_v2` suffix the symbol may carry), so `cu!(d.cuMemAlloc(..))`
/// reads like C and its error names the call.
macro_rules! driver_api {
    ($( $field:ident : [$($sym:literal),+] fn($($arg:ty),*); )*) => {
        /// The bound driver surface; a few entries have no caller yet but are part of the
        /// table so that launchers can use them without touching the loader.
        #[allow(dead_code)]
        pub struct Driver {
            _lib: Library,
            $( pub $field: unsafe extern "C" fn($($arg),*) -> CUresult, )*
            /// `cuFuncGetParamInfo` (CUDA ≥ 12.4): used to check launch arguments when present.
            pub cuFuncGetParamInfo:
                Option<unsafe extern "C" fn(CUfunction, usize, *mut usize, *mut usize) -> CUresult>,
        }

        impl Driver {
            /// # Safety
            /// `lib` must be the CUDA driver library; the signatures above are `cuda.h`'s.
            unsafe fn bind(lib: Library) -> std::result::Result<Driver, String> {
                $(
                    let $field = {
                        let mut found: *mut c_void = std::ptr::null_mut();
                        $(
                            if found.is_null() {
                                if let Ok(s) = lib.get::<*mut c_void>(concat!($sym, "\0").as_bytes()) {
                                    found = *s;
                                }
                            }
                        )+
                        if found.is_null() {
                            return Err(format!(
                                "the CUDA driver lacks {}", [$($sym),+].join(" / ")
                            ));
                        }
                        std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> CUresult>(
                            found,
                        )
                    };
                )*
                let cuFuncGetParamInfo = lib
                    .get::<unsafe extern "C" fn(CUfunction, usize, *mut usize, *mut usize) -> CUresult>(
                        b"cuFuncGetParamInfo\0",
                    )
                    .ok()
                    .map(|s| *s);
                Ok(Driver { _lib: lib, $($field,)* cuFuncGetParamInfo })
            }
        }
    };
}

driver_api! {
    cuInit: ["cuInit"] fn(c_uint);
    cuDriverGetVersion: ["cuDriverGetVersion"] fn(*mut c_int);
    cuGetErrorName: ["cuGetErrorName"] fn(CUresult, *mut *const c_char);
    cuGetErrorString: ["cuGetErrorString"] fn(CUresult, *mut *const c_char);
    cuDeviceGetCount: ["cuDeviceGetCount"] fn(*mut c_int);
    cuDeviceGet: ["cuDeviceGet"] fn(*mut CUdevice, c_int);
    cuDeviceGetName: ["cuDeviceGetName"] fn(*mut c_char, c_int, CUdevice);
    cuDeviceGetAttribute: ["cuDeviceGetAttribute"] fn(*mut c_int, c_int, CUdevice);
    cuDeviceTotalMem: ["cuDeviceTotalMem_v2"] fn(*mut usize, CUdevice);
    cuDevicePrimaryCtxRetain: ["cuDevicePrimaryCtxRetain"] fn(*mut CUcontext, CUdevice);
    cuDevicePrimaryCtxRelease: ["cuDevicePrimaryCtxRelease_v2"] fn(CUdevice);
    cuCtxSetCurrent: ["cuCtxSetCurrent"] fn(CUcontext);
    cuCtxGetCurrent: ["cuCtxGetCurrent"] fn(*mut CUcontext);
    cuCtxPushCurrent: ["cuCtxPushCurrent_v2"] fn(CUcontext);
    cuCtxPopCurrent: ["cuCtxPopCurrent_v2"] fn(*mut CUcontext);
    cuCtxSynchronize: ["cuCtxSynchronize"] fn();
    cuModuleLoadData: ["cuModuleLoadData"] fn(*mut CUmodule, *const c_void);
    cuModuleUnload: ["cuModuleUnload"] fn(CUmodule);
    cuModuleGetFunction: ["cuModuleGetFunction"] fn(*mut CUfunction, CUmodule, *const c_char);
    cuFuncSetAttribute: ["cuFuncSetAttribute"] fn(CUfunction, c_int, c_int);
    cuFuncGetAttribute: ["cuFuncGetAttribute"] fn(*mut c_int, c_int, CUfunction);
    cuLaunchKernel: ["cuLaunchKernel"] fn(
        CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream,
        *mut *mut c_void, *mut *mut c_void);
    cuMemGetInfo: ["cuMemGetInfo_v2"] fn(*mut usize, *mut usize);
    cuMemAlloc: ["cuMemAlloc_v2"] fn(*mut CUdeviceptr, usize);
    cuMemFree: ["cuMemFree_v2"] fn(CUdeviceptr);
    cuMemHostAlloc: ["cuMemHostAlloc"] fn(*mut *mut c_void, usize, c_uint);
    cuMemFreeHost: ["cuMemFreeHost"] fn(*mut c_void);
    cuMemHostRegister: ["cuMemHostRegister_v2", "cuMemHostRegister"] fn(*mut c_void, usize, c_uint);
    cuMemHostUnregister: ["cuMemHostUnregister"] fn(*mut c_void);
    cuMemHostGetDevicePointer: ["cuMemHostGetDevicePointer_v2"] fn(
        *mut CUdeviceptr, *mut c_void, c_uint);
    cuMemcpyHtoD: ["cuMemcpyHtoD_v2"] fn(CUdeviceptr, *const c_void, usize);
    cuMemcpyDtoH: ["cuMemcpyDtoH_v2"] fn(*mut c_void, CUdeviceptr, usize);
    cuMemcpyDtoD: ["cuMemcpyDtoD_v2"] fn(CUdeviceptr, CUdeviceptr, usize);
    cuMemcpyHtoDAsync: ["cuMemcpyHtoDAsync_v2"] fn(CUdeviceptr, *const c_void, usize, CUstream);
    cuMemcpyDtoHAsync: ["cuMemcpyDtoHAsync_v2"] fn(*mut c_void, CUdeviceptr, usize, CUstream);
    cuMemcpyDtoDAsync: ["cuMemcpyDtoDAsync_v2"] fn(CUdeviceptr, CUdeviceptr, usize, CUstream);
    cuMemsetD8: ["cuMemsetD8_v2"] fn(CUdeviceptr, u8, usize);
    cuMemsetD8Async: ["cuMemsetD8Async"] fn(CUdeviceptr, u8, usize, CUstream);
    cuStreamCreate: ["cuStreamCreate"] fn(*mut CUstream, c_uint);
    cuStreamDestroy: ["cuStreamDestroy_v2"] fn(CUstream);
    cuStreamSynchronize: ["cuStreamSynchronize"] fn(CUstream);
    cuStreamQuery: ["cuStreamQuery"] fn(CUstream);
    cuStreamWaitEvent: ["cuStreamWaitEvent"] fn(CUstream, CUevent, c_uint);
    cuStreamBeginCapture: ["cuStreamBeginCapture_v2"] fn(CUstream, c_int);
    cuStreamEndCapture: ["cuStreamEndCapture"] fn(CUstream, *mut CUgraph);
    cuStreamIsCapturing: ["cuStreamIsCapturing"] fn(CUstream, *mut c_int);
    cuGraphInstantiateWithFlags: ["cuGraphInstantiateWithFlags"] fn(
        *mut CUgraphExec, CUgraph, c_ulonglong);
    cuGraphUpload: ["cuGraphUpload"] fn(CUgraphExec, CUstream);
    cuGraphLaunch: ["cuGraphLaunch"] fn(CUgraphExec, CUstream);
    cuGraphExecDestroy: ["cuGraphExecDestroy"] fn(CUgraphExec);
    cuGraphDestroy: ["cuGraphDestroy"] fn(CUgraph);
    cuEventCreate: ["cuEventCreate"] fn(*mut CUevent, c_uint);
    cuEventRecord: ["cuEventRecord"] fn(CUevent, CUstream);
    cuEventQuery: ["cuEventQuery"] fn(CUevent);
    cuEventSynchronize: ["cuEventSynchronize"] fn(CUevent);
    cuEventElapsedTime: ["cuEventElapsedTime_v2", "cuEventElapsedTime"] fn(
        *mut f32, CUevent, CUevent);
    cuEventDestroy: ["cuEventDestroy_v2"] fn(CUevent);
}

/// Calls a driver function and turns a failure into `Error::Cuda` naming it:
/// `cu!(drv.cuMemAlloc(&mut p, n))?`. The driver calls are `unsafe`; each use site states
/// why its pointers are valid.
macro_rules! cu {
    ($drv:ident . $f:ident ( $($a:expr),* $(,)? )) => {{
        #[allow(unused_unsafe)]
        let r = unsafe { ($drv.$f)($($a),*) };
        $crate::cuda::ffi::check($drv, stringify!($f), r)
    }};
}
pub(crate) use cu;

static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();

/// The driver, loaded and initialised once per process; `Err` says why there is none.
pub fn driver() -> Result<&'static Driver> {
    DRIVER
        .get_or_init(load)
        .as_ref()
        .map_err(|why| Error::NoGpu(why.clone()))
}

fn load() -> std::result::Result<Driver, String> {
    // SAFETY: loading the vendor's driver library runs its initialisers, which is what
    // every CUDA program does; the symbols are bound with cuda.h's signatures.
    let lib = unsafe { Library::new("libcuda.so.1") }
        .map_err(|e| format!("no CUDA driver (cannot load libcuda.so.1: {e})"))?;
    let drv = unsafe { Driver::bind(lib) }?;
    // SAFETY: cuInit takes a flags word that must be 0.
    let r = unsafe { (drv.cuInit)(0) };
    if r != CUDA_SUCCESS {
        return Err(format!(
            "the CUDA driver failed to initialise: cuInit: {}",
            describe(&drv, r)
        ));
    }
    Ok(drv)
}

/// "CUDA_ERROR_NAME: description" for a result code.
pub fn describe(drv: &Driver, code: CUresult) -> String {
    let text = |f: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult| {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: the driver writes a pointer to a static NUL-terminated string or fails.
        let r = unsafe { f(code, &mut p) };
        if r == CUDA_SUCCESS && !p.is_null() {
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        } else {
            String::new()
        }
    };
    let name = text(drv.cuGetErrorName);
    let desc = text(drv.cuGetErrorString);
    match (name.is_empty(), desc.is_empty()) {
        (true, _) => format!("unknown CUDA error {code}"),
        (false, true) => name,
        (false, false) => format!("{name}: {desc}"),
    }
}

/// `Ok` for `CUDA_SUCCESS`, else `Error::Cuda` naming `call`.
pub fn check(drv: &Driver, call: &'static str, code: CUresult) -> Result<()> {
    if code == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda {
            call,
            code,
            msg: describe(drv, code),
        })
    }
}
