//! `Gpu`: one device's primary context with every embedded kernel module loaded.

use super::ctx::{attr, Ctx};
use super::fatbin;
use super::ffi::{self, cu, CUcontext, CUdevice, CUmodule};
use super::kernel::Kernel;
use super::mem::{DevBuf, HostRegistration, PinnedBuf};
use super::stream::{Event, Stream};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::sync::{Arc, Mutex, Weak};

/// One GPU: the primary context of one device, with every `cuda/*.cu` module loaded.
/// Send + Sync: any thread may use it (each call makes the context current there).
pub struct Gpu {
    pub(crate) ctx: Arc<Ctx>,
    ordinal: usize,
    name: String,
    cc: (i32, i32),
    sm_count: u32,
    max_shmem_optin: u32,
    kernels: Mutex<HashMap<String, Kernel>>,
}

static OPEN: Mutex<Vec<(usize, Weak<Gpu>)>> = Mutex::new(Vec::new());

impl Gpu {
    /// Opens device `ordinal` (the same `Arc` while one is alive). `Error::NoGpu` when there is
    /// no driver, no such device, or this binary was built without kernels.
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>> {
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|(_, w)| w.strong_count() > 0);
        if let Some(g) = open
            .iter()
            .find(|(o, _)| *o == ordinal)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(g);
        }
        let g = Arc::new(Self::open_new(ordinal)?);
        open.push((ordinal, Arc::downgrade(&g)));
        Ok(g)
    }

    fn open_new(ordinal: usize) -> Result<Gpu> {
        if !fatbin::BUILT {
            return Err(Error::NoGpu(format!(
                "this build has no CUDA kernels: {}",
                fatbin::WHY
            )));
        }
        let drv = ffi::driver()?;
        let mut count = 0;
        cu!(drv.cuDeviceGetCount(&mut count))?;
        if ordinal >= count.max(0) as usize {
            return Err(Error::NoGpu(format!(
                "no CUDA device {ordinal} ({count} present)"
            )));
        }
        let mut dev: CUdevice = 0;
        cu!(drv.cuDeviceGet(&mut dev, ordinal as i32))?;
        let mut name_buf = [0 as c_char; 256];
        cu!(drv.cuDeviceGetName(name_buf.as_mut_ptr(), name_buf.len() as i32, dev))?;
        // SAFETY: the driver wrote a NUL-terminated string into the buffer (its last byte is 0).
        name_buf[255] = 0;
        let name = unsafe { std::ffi::CStr::from_ptr(name_buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let cc = (
            attr(drv, dev, ffi::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(drv, dev, ffi::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let sm_count = attr(drv, dev, ffi::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let max_shmem_optin = attr(
            drv,
            dev,
            ffi::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )? as u32;

        let mut raw: CUcontext = std::ptr::null_mut();
        cu!(drv.cuDevicePrimaryCtxRetain(&mut raw, dev))?;
        // From here `ctx`'s Drop releases the context (and unloads what was loaded) on error.
        let mut ctx = Ctx {
            drv,
            ctx: raw,
            dev,
            modules: Vec::new(),
            copy: std::ptr::null_mut(),
        };
        ctx.bind()?;
        cu!(drv.cuStreamCreate(&mut ctx.copy, ffi::CU_STREAM_NON_BLOCKING))?;
        for &(stem, image) in fatbin::FATBINS {
            let mut m: CUmodule = std::ptr::null_mut();
            // SAFETY: `image` is a complete fatbin embedded in the binary, 16-byte aligned.
            let r = unsafe { (drv.cuModuleLoadData)(&mut m, image.as_ptr().cast()) };
            if r != ffi::CUDA_SUCCESS {
                return Err(Error::Cuda {
                    call: "cuModuleLoadData",
                    code: r,
                    msg: format!(
                        "cuda/{stem}.cu on {name} (sm_{}{}): {} (built for {})",
                        cc.0,
                        cc.1,
                        ffi::describe(drv, r),
                        fatbin::INFO
                    ),
                });
            }
            ctx.modules.push((stem, m));
        }
        Ok(Gpu {
            ctx: Arc::new(ctx),
            ordinal,
            name,
            cc,
            sm_count,
            max_shmem_optin,
            kernels: Mutex::new(HashMap::new()),
        })
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's name, e.g. "NVIDIA H200".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability (major, minor), e.g. (9, 0).
    pub fn cc(&self) -> (i32, i32) {
        self.cc
    }

    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// The most dynamic shared memory one block may opt into (`Kernel::set_max_dynamic_shmem`).
    pub fn max_shmem_optin(&self) -> u32 {
        self.max_shmem_optin
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        let (mut free, mut total) = (0usize, 0usize);
        cu!(drv.cuMemGetInfo(&mut free, &mut total))?;
        Ok((free, total))
    }

    /// The `extern "C" __global__` function `name`, searched in every loaded module; cached.
    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        let mut cache = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = cache.get(name) {
            return Ok(k.clone());
        }
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        let cname = CString::new(name).map_err(|_| Error::Cuda {
            call: "cuModuleGetFunction",
            code: ffi::CUDA_ERROR_NOT_FOUND,
            msg: format!("kernel name {name:?} contains a NUL byte"),
        })?;
        for &(_, m) in &self.ctx.modules {
            let mut f = std::ptr::null_mut();
            // SAFETY: `m` is a loaded module of this context; `cname` is NUL-terminated.
            let r = unsafe { (drv.cuModuleGetFunction)(&mut f, m, cname.as_ptr()) };
            if r == ffi::CUDA_SUCCESS {
                let k = Kernel::new(&self.ctx, f, name)?;
                cache.insert(name.to_string(), k.clone());
                return Ok(k);
            }
            if r != ffi::CUDA_ERROR_NOT_FOUND {
                ffi::check(drv, "cuModuleGetFunction", r)?;
            }
        }
        let files: Vec<&str> = self.ctx.modules.iter().map(|(s, _)| *s).collect();
        Err(Error::Cuda {
            call: "cuModuleGetFunction",
            code: ffi::CUDA_ERROR_NOT_FOUND,
            msg: format!(
                "no kernel named {name:?} in the loaded modules ({})",
                files.join(", ")
            ),
        })
    }

    /// `bytes` of device memory (uninitialised). Zero bytes is allowed (pointer 0).
    pub fn alloc(&self, bytes: usize) -> Result<DevBuf> {
        DevBuf::alloc(&self.ctx, bytes)
    }

    /// A device copy of `host` (synchronous).
    pub fn upload(&self, host: &[u8]) -> Result<DevBuf> {
        let b = self.alloc(host.len())?;
        b.copy_from_host(0, host)?;
        Ok(b)
    }

    /// A device copy of a typed slice (synchronous).
    pub fn upload_pod<T: super::Pod>(&self, host: &[T]) -> Result<DevBuf> {
        self.upload(super::as_bytes(host))
    }

    /// A new non-blocking stream.
    pub fn stream(&self) -> Result<Stream> {
        Stream::new(&self.ctx)
    }

    /// A timing event (`record`, `sync`, `elapsed_ms`).
    pub fn event(&self) -> Result<Event> {
        Event::new(&self.ctx, true)
    }

    /// An event without timing (cheaper; for `Stream::wait`).
    pub fn event_no_timing(&self) -> Result<Event> {
        Event::new(&self.ctx, false)
    }

    /// `bytes` of page-locked host memory, usable by every context (cuMemHostAlloc PORTABLE).
    pub fn host_alloc(&self, bytes: usize) -> Result<PinnedBuf> {
        PinnedBuf::alloc(&self.ctx, bytes)
    }

    /// Pins `[ptr, ptr + len)` (host memory the caller keeps mapped, page aligned) and maps it
    /// for the device's kernels (`HostRegistration::dev_ptr`).
    ///
    /// # Safety
    /// The range must stay mapped until the registration drops.
    pub unsafe fn register_host(&self, ptr: *const u8, len: usize) -> Result<HostRegistration> {
        // SAFETY: the caller's contract.
        unsafe { HostRegistration::new(&self.ctx, ptr, len) }
    }

    /// Waits for all work on this device.
    pub fn sync(&self) -> Result<()> {
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        cu!(drv.cuCtxSynchronize())
    }
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Gpu({}: {}, sm_{}{}, {} SMs)",
            self.ordinal, self.name, self.cc.0, self.cc.1, self.sm_count
        )
    }
}
