//! Thin, safe wrappers over the few system calls the tier needs: `madvise`, `mlock`,
//! `mincore`, `posix_fadvise` and the memory-lock limit. Every wrapper takes a byte range of
//! memory this process owns (a map or the arena) and widens it to whole pages itself.

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::Path;

pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p <= 0 {
        4096
    } else {
        p as usize
    }
}

/// `[ptr, ptr+len)` widened to page boundaries: `(aligned start, aligned length)`.
fn page_span(ptr: *const u8, len: usize) -> (*mut libc::c_void, usize) {
    let ps = page_size();
    let start = (ptr as usize) & !(ps - 1);
    let end = (ptr as usize + len).div_ceil(ps) * ps;
    (start as *mut libc::c_void, end - start)
}

fn madvise(bytes: &[u8], advice: libc::c_int) -> std::io::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    let (p, n) = page_span(bytes.as_ptr(), bytes.len());
    // SAFETY: the span covers pages of a live mapping that `bytes` borrows; these advices do
    // not change the contents of the memory.
    let rc = unsafe { libc::madvise(p, n, advice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Ask the kernel to start reading the pages in (asynchronous readahead of a file map).
pub fn will_need(bytes: &[u8]) {
    // Advice only: a kernel that refuses it changes nothing but speed.
    let _ = madvise(bytes, libc::MADV_WILLNEED);
}

/// Hint that the arena would like huge pages (a hint; ignored where unsupported).
pub fn huge_pages(bytes: &[u8]) {
    let _ = madvise(bytes, libc::MADV_HUGEPAGE);
}

/// Fault every page of `bytes` in, waiting for the reads: `MADV_POPULATE_READ` (Linux 5.14+)
/// where the kernel has it, else one read per page.
pub fn populate(bytes: &[u8]) {
    if bytes.is_empty() || madvise(bytes, libc::MADV_POPULATE_READ).is_ok() {
        return;
    }
    touch(bytes);
}

/// Read one byte of every page (the portable pre-fault).
pub fn touch(bytes: &[u8]) {
    let ps = page_size();
    let mut acc = 0u8;
    let mut i = 0;
    while i < bytes.len() {
        // SAFETY: `i` is inside `bytes`; a volatile read keeps the load from being removed.
        acc ^= unsafe { std::ptr::read_volatile(bytes.as_ptr().add(i)) };
        i += ps;
    }
    if let Some(last) = bytes.last() {
        // SAFETY: as above, the last byte of the slice.
        acc ^= unsafe { std::ptr::read_volatile(last) };
    }
    std::hint::black_box(acc);
}

/// Fraction of the pages under `bytes` that are in memory (page cache for a file map).
pub fn resident_fraction(bytes: &[u8]) -> std::io::Result<f64> {
    if bytes.is_empty() {
        return Ok(1.0);
    }
    let (p, n) = page_span(bytes.as_ptr(), bytes.len());
    let pages = n / page_size();
    let mut vec = vec![0u8; pages];
    // SAFETY: `vec` has one byte per page of the span, which lies in a live mapping.
    let rc = unsafe { libc::mincore(p, n, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let hit = vec.iter().filter(|&&b| b & 1 != 0).count();
    Ok(hit as f64 / pages as f64)
}

/// Whether every page under `bytes` is in memory (`mincore` in steps of 512 pages on the
/// stack: no allocation). An error reads as "not cached".
pub fn fully_cached(bytes: &[u8]) -> bool {
    if bytes.is_empty() {
        return true;
    }
    let ps = page_size();
    let (p, n) = page_span(bytes.as_ptr(), bytes.len());
    let mut vec = [0u8; 512];
    let mut at = 0;
    while at < n {
        let len = (n - at).min(vec.len() * ps);
        // SAFETY: `vec` has a byte for each of the `len / ps` pages, which lie in the span
        // of a live mapping.
        let rc = unsafe {
            libc::mincore(
                (p as usize + at) as *mut libc::c_void,
                len,
                vec.as_mut_ptr(),
            )
        };
        if rc != 0 || vec[..len / ps].iter().any(|&b| b & 1 == 0) {
            return false;
        }
        at += len;
    }
    true
}

/// The soft `RLIMIT_MEMLOCK` in bytes (`None`: unlimited).
pub fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid out-parameter.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) };
    if rc != 0 || r.rlim_cur == libc::RLIM_INFINITY {
        None
    } else {
        #[allow(clippy::unnecessary_cast)]
        Some(r.rlim_cur as u64)
    }
}

/// Lock the pages of `bytes` in RAM as they are faulted in (`mlock2(MLOCK_ONFAULT)`, so an
/// empty arena is not populated up front); plain `mlock` where the kernel lacks `mlock2`.
pub fn mlock_on_fault(bytes: &[u8]) -> std::io::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    let (p, n) = page_span(bytes.as_ptr(), bytes.len());
    // SAFETY: the span lies in a live mapping; locking does not touch its contents.
    let rc = unsafe { libc::mlock2(p, n, libc::MLOCK_ONFAULT) };
    if rc == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EINVAL)) {
        return Err(e);
    }
    // SAFETY: as above.
    let rc = unsafe { libc::mlock(p, n) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `MemAvailable` from /proc/meminfo in bytes (`None` where it cannot be read).
pub fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Drop a file's clean pages from the page cache (`posix_fadvise(POSIX_FADV_DONTNEED)`).
/// Pages that some process still has mapped and faulted in may stay.
pub fn evict_file(path: &Path) -> std::io::Result<()> {
    let f = File::open(path)?;
    // SAFETY: a valid descriptor; fadvise only advises the kernel.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}

/// Drop the pages of a read-only file map from this process's page tables
/// (`MADV_DONTNEED`), so that `posix_fadvise(DONTNEED)` can evict them from the page cache.
/// The next touch faults the same bytes back in from the file.
///
/// # Safety
/// `bytes` must lie in a read-only map of a file (never anonymous memory or a written
/// private map: those would read back as zeros).
pub unsafe fn drop_file_map_pages(bytes: &[u8]) -> std::io::Result<()> {
    madvise(bytes, libc::MADV_DONTNEED)
}

/// `posix_fadvise(POSIX_FADV_DONTNEED)` over `[offset, offset+len)` of an open file.
pub fn evict_range(f: &File, offset: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: a valid descriptor; fadvise only advises the kernel.
    let rc = unsafe {
        libc::posix_fadvise(
            f.as_raw_fd(),
            offset as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}
