//! Device memory (`DevBuf`), page-locked host memory (`PinnedBuf`) and host memory registered
//! with the driver (`HostRegistration`). Every copy is
//! bounds-checked on the host and fails with `Error::Shape` before the driver is called.

use super::ctx::Ctx;
use super::ffi::{cu, CUdeviceptr};
use super::stream::Stream;
use super::{as_bytes, as_bytes_mut, Pod};
use crate::error::{Error, Result};
use std::ffi::c_void;
use std::sync::Arc;

/// `off + len <= cap` without overflow, or `Error::Shape` naming `what`.
fn span(what: &str, off: usize, len: usize, cap: usize) -> Result<()> {
    match off.checked_add(len) {
        Some(end) if end <= cap => Ok(()),
        _ => Err(Error::Shape(format!(
            "{what}: bytes [{off}, {off}+{len}) outside a buffer of {cap} bytes"
        ))),
    }
}

fn elems_to_bytes<T>(what: &str, n: usize) -> Result<usize> {
    n.checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| Error::Shape(format!("{what}: {n} elements overflow usize")))
}

/// Owned device memory; `Drop` frees it. Send + Sync (the handle is a plain address).
pub struct DevBuf {
    ctx: Arc<Ctx>,
    ptr: CUdeviceptr,
    len: usize,
}

impl DevBuf {
    pub(crate) fn alloc(ctx: &Arc<Ctx>, bytes: usize) -> Result<DevBuf> {
        let mut ptr: CUdeviceptr = 0;
        if bytes > 0 {
            ctx.bind()?;
            let drv = ctx.drv;
            cu!(drv.cuMemAlloc(&mut ptr, bytes))?;
        }
        Ok(DevBuf {
            ctx: ctx.clone(),
            ptr,
            len: bytes,
        })
    }

    /// The device address (0 for an empty buffer).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address `byte_off` bytes in (`byte_off == len` allowed: the end).
    pub fn slice_ptr(&self, byte_off: usize) -> Result<u64> {
        span("DevBuf::slice_ptr", byte_off, 0, self.len)?;
        Ok(self.ptr + byte_off as u64)
    }

    /// Host → device copy of `src` at `byte_off`; when it returns the data is on the device,
    /// visible to work queued afterwards on any stream.
    pub fn copy_from_host(&self, byte_off: usize, src: &[u8]) -> Result<()> {
        span("DevBuf::copy_from_host", byte_off, src.len(), self.len)?;
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        // SAFETY: the range is inside this allocation and `src` is valid for its length.
        cu!(drv.cuMemcpyHtoD(self.ptr + byte_off as u64, src.as_ptr().cast(), src.len()))?;
        // From pageable memory the copy returns once `src` is staged, its DMA to the device
        // possibly still running on the legacy stream, which the non-blocking streams do not
        // wait for: a read queued on one right after could see the old bytes (seen on the
        // device: test_upload_download_round_trip). Wait for the DMA here.
        // SAFETY: the null stream is the context's legacy default stream.
        cu!(drv.cuStreamSynchronize(std::ptr::null_mut()))
    }

    /// Device → host copy into `dst` from `byte_off` (waits for the copy). It does NOT wait
    /// for work queued on your streams: sync the stream that wrote the data first, or use
    /// `read`/`read_into` with that stream.
    pub fn copy_to_host(&self, byte_off: usize, dst: &mut [u8]) -> Result<()> {
        span("DevBuf::copy_to_host", byte_off, dst.len(), self.len)?;
        if dst.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        // SAFETY: the range is inside this allocation and `dst` is valid for its length
        // until the copy stream has been synchronised below.
        cu!(drv.cuMemcpyDtoHAsync(
            dst.as_mut_ptr().cast(),
            self.ptr + byte_off as u64,
            dst.len(),
            self.ctx.copy
        ))?;
        cu!(drv.cuStreamSynchronize(self.ctx.copy))
    }

    /// Writes `data` at element offset `off_elems` (in units of `T`), ordered on `s`; returns
    /// once the copy is done (so `data` may be freed).
    pub fn write<T: Pod>(&self, s: &Stream, off_elems: usize, data: &[T]) -> Result<()> {
        let off = elems_to_bytes::<T>("DevBuf::write", off_elems)?;
        let bytes = as_bytes(data);
        span("DevBuf::write", off, bytes.len(), self.len)?;
        if !bytes.is_empty() {
            self.ctx.bind()?;
            let drv = self.ctx.drv;
            // SAFETY: in bounds; `bytes` outlives the copy because we sync before returning.
            cu!(drv.cuMemcpyHtoDAsync(
                self.ptr + off as u64,
                bytes.as_ptr().cast(),
                bytes.len(),
                s.raw()
            ))?;
        }
        s.sync()
    }

    /// Reads `n` elements of `T` from element offset `off_elems`, ordered on `s` (waits).
    pub fn read<T: Pod>(&self, s: &Stream, off_elems: usize, n: usize) -> Result<Vec<T>> {
        // Bounds first: a wild `n` must be an error, not a huge allocation.
        let off = elems_to_bytes::<T>("DevBuf::read", off_elems)?;
        span(
            "DevBuf::read",
            off,
            elems_to_bytes::<T>("DevBuf::read", n)?,
            self.len,
        )?;
        let mut out = vec![T::zeroed(); n];
        self.read_into(s, off_elems, &mut out)?;
        Ok(out)
    }

    /// Reads `out.len()` elements of `T` from element offset `off_elems`, ordered on `s` (waits).
    pub fn read_into<T: Pod>(&self, s: &Stream, off_elems: usize, out: &mut [T]) -> Result<()> {
        let off = elems_to_bytes::<T>("DevBuf::read", off_elems)?;
        let bytes = as_bytes_mut(out);
        span("DevBuf::read", off, bytes.len(), self.len)?;
        if !bytes.is_empty() {
            self.ctx.bind()?;
            let drv = self.ctx.drv;
            // SAFETY: in bounds; `bytes` outlives the copy because we sync before returning.
            cu!(drv.cuMemcpyDtoHAsync(
                bytes.as_mut_ptr().cast(),
                self.ptr + off as u64,
                bytes.len(),
                s.raw()
            ))?;
        }
        s.sync()
    }

    /// Asynchronous copy of `bytes` from pinned `src[src_off..]` to `self[dst_off..]` on `s`.
    /// `src` must stay alive (and unchanged) until `s` has passed this point.
    pub fn write_async(
        &self,
        s: &Stream,
        dst_off: usize,
        src: &PinnedBuf,
        src_off: usize,
        bytes: usize,
    ) -> Result<()> {
        span("DevBuf::write_async (device)", dst_off, bytes, self.len)?;
        span("DevBuf::write_async (pinned)", src_off, bytes, src.len())?;
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        // SAFETY: both ranges are in bounds; `src` is page-locked memory (see the contract).
        cu!(drv.cuMemcpyHtoDAsync(
            self.ptr + dst_off as u64,
            src.as_ptr().add(src_off).cast(),
            bytes,
            s.raw()
        ))
    }

    /// Copy of host memory that need not be page-locked (e.g. a file mapping) to
    /// `self[dst_off..]`, ordered on `s`. From pageable memory the driver stages the bytes
    /// and the call returns once `src` may be reused (it may wait for `s` to reach the copy);
    /// it never waits for the whole stream as `write` does.
    ///
    /// # Safety
    /// If `src` is page-locked (registered) memory the copy runs asynchronously: `src` must
    /// then stay alive and unchanged until `s` has passed this point.
    pub unsafe fn write_host_async(&self, s: &Stream, dst_off: usize, src: &[u8]) -> Result<()> {
        span("DevBuf::write_host_async", dst_off, src.len(), self.len)?;
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        cu!(drv.cuMemcpyHtoDAsync(
            self.ptr + dst_off as u64,
            src.as_ptr().cast(),
            src.len(),
            s.raw()
        ))
    }

    /// Asynchronous copy of `bytes` from `self[src_off..]` into pinned `dst[dst_off..]` on `s`;
    /// read `dst` only after `s.sync()` (or an event recorded after this).
    pub fn read_async(
        &self,
        s: &Stream,
        src_off: usize,
        dst: &mut PinnedBuf,
        dst_off: usize,
        bytes: usize,
    ) -> Result<()> {
        span("DevBuf::read_async (device)", src_off, bytes, self.len)?;
        span("DevBuf::read_async (pinned)", dst_off, bytes, dst.len())?;
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        // SAFETY: both ranges are in bounds; `dst` is page-locked memory.
        cu!(drv.cuMemcpyDtoHAsync(
            dst.as_mut_ptr().add(dst_off).cast(),
            self.ptr + src_off as u64,
            bytes,
            s.raw()
        ))
    }

    /// Asynchronous device → device copy of `bytes` from `src[src_off..]` to `self[dst_off..]`.
    pub fn copy_from(
        &self,
        s: &Stream,
        dst_off: usize,
        src: &DevBuf,
        src_off: usize,
        bytes: usize,
    ) -> Result<()> {
        span("DevBuf::copy_from (dst)", dst_off, bytes, self.len)?;
        span("DevBuf::copy_from (src)", src_off, bytes, src.len)?;
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        cu!(drv.cuMemcpyDtoDAsync(
            self.ptr + dst_off as u64,
            src.ptr + src_off as u64,
            bytes,
            s.raw()
        ))
    }

    /// Sets every byte to 0, asynchronously on `s`.
    pub fn zero(&self, s: &Stream) -> Result<()> {
        self.fill_u8(s, 0)
    }

    /// Sets every byte to `byte`, asynchronously on `s`.
    pub fn fill_u8(&self, s: &Stream, byte: u8) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        cu!(drv.cuMemsetD8Async(self.ptr, byte, self.len, s.raw()))
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.ptr != 0 && self.ctx.bind().is_ok() {
            let drv = self.ctx.drv;
            let _ = cu!(drv.cuMemFree(self.ptr));
        }
    }
}

impl std::fmt::Debug for DevBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevBuf({:#x}, {} bytes)", self.ptr, self.len)
    }
}

/// Page-locked host memory (cuMemHostAlloc, portable, mapped), for asynchronous copies and
/// for kernels that read or write it over the link (`dev_ptr`); `Drop` frees.
pub struct PinnedBuf {
    ctx: Arc<Ctx>,
    ptr: *mut u8,
    len: usize,
    /// The device's address of the buffer (0 when empty).
    dev: CUdeviceptr,
}

// SAFETY: the buffer is plain host memory owned by this value; `&mut` guards writes.
unsafe impl Send for PinnedBuf {}
unsafe impl Sync for PinnedBuf {}

impl PinnedBuf {
    pub(crate) fn alloc(ctx: &Arc<Ctx>, bytes: usize) -> Result<PinnedBuf> {
        use super::ffi::{CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_PORTABLE};
        let mut p: *mut c_void = std::ptr::null_mut();
        let mut dev: CUdeviceptr = 0;
        if bytes > 0 {
            ctx.bind()?;
            let drv = ctx.drv;
            let flags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP;
            cu!(drv.cuMemHostAlloc(&mut p, bytes, flags))?;
            // SAFETY: fresh allocation of `bytes` bytes; zero it so reads are defined.
            unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
            if let Err(e) = cu!(drv.cuMemHostGetDevicePointer(&mut dev, p, 0)) {
                let _ = cu!(drv.cuMemFreeHost(p));
                return Err(e);
            }
        }
        Ok(PinnedBuf {
            dev,
            ctx: ctx.clone(),
            ptr: if bytes > 0 {
                p.cast()
            } else {
                std::ptr::NonNull::dangling().as_ptr()
            },
            len: bytes,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// The buffer's address for kernels (reads and writes cross the link; the host's view is
    /// coherent once the stream has passed the kernel).
    pub fn dev_ptr(&self) -> CUdeviceptr {
        self.dev
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes (zeroed at allocation).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        if self.len > 0 && self.ctx.bind().is_ok() {
            let drv = self.ctx.drv;
            let _ = cu!(drv.cuMemFreeHost(self.ptr.cast()));
        }
    }
}

/// Host memory the caller owns, page-locked and mapped into the device's address space
/// (cuMemHostRegister, read-only where the device supports it): kernels read it over the link
/// through `dev_ptr`. `Drop` unregisters; the memory must outlive this value.
pub struct HostRegistration {
    ctx: Arc<Ctx>,
    ptr: *mut c_void,
    len: usize,
    dev: CUdeviceptr,
    read_only: bool,
}

// SAFETY: the registration is a handle to memory the driver pinned; it is never written
// through here.
unsafe impl Send for HostRegistration {}
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// # Safety
    /// `[ptr, ptr + len)` must be mapped host memory, page aligned, that stays mapped until
    /// this value drops.
    pub(crate) unsafe fn new(ctx: &Arc<Ctx>, ptr: *const u8, len: usize) -> Result<Self> {
        use super::ffi::{
            CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED as RO_ATTR,
            CU_MEMHOSTREGISTER_DEVICEMAP as MAP, CU_MEMHOSTREGISTER_PORTABLE as PORT,
            CU_MEMHOSTREGISTER_READ_ONLY as RO,
        };
        if len == 0 || !(ptr as usize).is_multiple_of(4096) {
            return Err(Error::Shape(format!(
                "host registration of {len} bytes at {ptr:p}: must be non-empty and page aligned"
            )));
        }
        ctx.bind()?;
        let drv = ctx.drv;
        let read_only = ctx.attr(RO_ATTR).is_ok_and(|v| v == 1);
        let flags = PORT | MAP | if read_only { RO } else { 0 };
        let p = ptr as *mut c_void;
        cu!(drv.cuMemHostRegister(p, len, flags))?;
        let mut dev: CUdeviceptr = 0;
        if let Err(e) = cu!(drv.cuMemHostGetDevicePointer(&mut dev, p, 0)) {
            let _ = cu!(drv.cuMemHostUnregister(p));
            return Err(e);
        }
        Ok(HostRegistration {
            ctx: ctx.clone(),
            ptr: p,
            len,
            dev,
            read_only,
        })
    }

    /// The device address of the registered range's first byte.
    pub fn dev_ptr(&self) -> u64 {
        self.dev
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Registered read-only (the device supports it); else read-write.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// The host address of the first byte.
    pub fn host_ptr(&self) -> *const u8 {
        self.ptr.cast()
    }

    /// Asynchronous DMA of `bytes` from `self[src_off..]` to `dst[dst_off..]` on `s` (the
    /// registered memory is page-locked: the copy engine reads it directly).
    pub fn copy_to_async(
        &self,
        s: &Stream,
        dst: &DevBuf,
        dst_off: usize,
        src_off: usize,
        bytes: usize,
    ) -> Result<()> {
        span(
            "HostRegistration::copy_to_async (device)",
            dst_off,
            bytes,
            dst.len,
        )?;
        span(
            "HostRegistration::copy_to_async (host)",
            src_off,
            bytes,
            self.len,
        )?;
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        // SAFETY: both ranges are in bounds; the source stays registered (and mapped, the
        // owner's contract) while `self` lives.
        cu!(drv.cuMemcpyHtoDAsync(
            dst.ptr + dst_off as u64,
            self.ptr.cast::<u8>().add(src_off).cast(),
            bytes,
            s.raw()
        ))
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            let drv = self.ctx.drv;
            let _ = cu!(drv.cuMemHostUnregister(self.ptr));
        }
    }
}
