//! `Ctx`: one device's primary context, its loaded modules and its private copy stream — the
//! handle every GPU object (`DevBuf`, `PinnedBuf`, `Stream`, `Event`, `Kernel`) keeps alive.
//! A leaf: `gpu` builds it, the objects hold it.

use super::ffi::{cu, CUcontext, CUdevice, CUmodule, CUstream, Driver};
use crate::error::Result;

/// The context every object of one `Gpu` keeps alive (`DevBuf`, `Stream`, `Kernel`, ...):
/// the primary context is released, and the modules unloaded, when the last one drops.
pub(crate) struct Ctx {
    pub(crate) drv: &'static Driver,
    pub(crate) ctx: CUcontext,
    pub(crate) dev: CUdevice,
    pub(crate) modules: Vec<(&'static str, CUmodule)>,
    /// A private non-blocking stream for the synchronous copies (`DevBuf::copy_from_host`,
    /// `copy_to_host`, `Gpu::upload`): each waits on it, so the data has fully landed when
    /// the call returns and any stream may use it (a legacy cuMemcpyHtoD may return before
    /// its DMA ends, unordered with non-blocking streams).
    pub(crate) copy: CUstream,
}

// SAFETY: a CUDA context and its modules may be used from any thread once made current there
// (every entry point calls `Ctx::bind`); the handles are immutable after creation.
unsafe impl Send for Ctx {}
unsafe impl Sync for Ctx {}

impl Ctx {
    /// Makes this context current on the calling thread (cheap: a thread-local store).
    pub(crate) fn bind(&self) -> Result<()> {
        let drv = self.drv;
        cu!(drv.cuCtxSetCurrent(self.ctx))
    }

    /// A device attribute of this context's device.
    pub(crate) fn attr(&self, a: i32) -> Result<i32> {
        attr(self.drv, self.dev, a)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        let drv = self.drv;
        // Errors on teardown cannot be reported; the process keeps running either way.
        let _ = cu!(drv.cuCtxSetCurrent(self.ctx));
        if !self.copy.is_null() {
            let _ = cu!(drv.cuStreamDestroy(self.copy));
        }
        for &(_, m) in &self.modules {
            let _ = cu!(drv.cuModuleUnload(m));
        }
        let _ = cu!(drv.cuDevicePrimaryCtxRelease(self.dev));
    }
}

pub(crate) fn attr(drv: &'static Driver, dev: CUdevice, a: i32) -> Result<i32> {
    let mut v = 0;
    cu!(drv.cuDeviceGetAttribute(&mut v, a, dev))?;
    Ok(v)
}
