//! Zeroed byte buffers for load-time weight copies (the repacked head and projections), in
//! transparent huge pages where the kernel gives them.
//!
//! The GGUF's own pages come from the page cache, which maps a large file in huge folios; a
//! plain `Vec` copy sits in 4 KiB pages when THP is in `madvise` mode (the common default),
//! and streaming it missed the TLB every 4 KiB: the repacked q/o projections read at ~23 GB/s
//! against the original's ~29 GB/s in the same decode step (Zen 4 VM, THP `madvise`). An
//! anonymous mapping with `MADV_HUGEPAGE` asks for 2 MiB pages.

use std::ops::{Deref, DerefMut};

/// A zeroed, page-aligned byte buffer; on Linux an anonymous mapping advised for huge pages.
pub struct HugeBuf {
    ptr: *mut u8,
    len: usize,
    #[cfg(not(target_os = "linux"))]
    vec: Vec<u8>,
}

// SAFETY: HugeBuf owns its bytes exclusively, as a Vec<u8> would.
unsafe impl Send for HugeBuf {}
// SAFETY: shared references only read.
unsafe impl Sync for HugeBuf {}

impl HugeBuf {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> HugeBuf {
        #[cfg(target_os = "linux")]
        {
            if len == 0 {
                return HugeBuf {
                    ptr: std::ptr::NonNull::dangling().as_ptr(),
                    len,
                };
            }
            // SAFETY: a fresh private anonymous mapping (no file, no fixed address); checked.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert!(p != libc::MAP_FAILED, "mmap of {len} bytes failed");
            let buf = HugeBuf {
                ptr: p as *mut u8,
                len,
            };
            // advice (as the RAM tier's arena gets): without THP the pages stay 4 KiB
            crate::tier::sys::huge_pages(&buf);
            buf
        }
        #[cfg(not(target_os = "linux"))]
        {
            let mut vec = vec![0u8; len];
            HugeBuf {
                ptr: vec.as_mut_ptr(),
                len,
                vec,
            }
        }
    }
}

impl Deref for HugeBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialised (zeroed) bytes for the buffer's life.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for HugeBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `deref`, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for HugeBuf {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if self.len > 0 {
            // SAFETY: our own mapping of `len` bytes, unmapped once.
            unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
        }
    }
}
