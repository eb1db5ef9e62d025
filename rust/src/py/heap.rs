//! The heap's trim policy in a process that steps a model.
//!
//! Every step hands its logits to Python as fresh numpy rows ([V] f32 each: 0.6 MB at a
//! 151,936 vocabulary), which the caller frees moments later. glibc's malloc gives the top of
//! its heap back to the kernel whenever more than its (adaptive) trim threshold is free there,
//! so each step grew the heap again and page-faulted its rows in afresh: 4 `brk` calls a step
//! at four decode streams (`strace -c`), ~1.5% of the step's CPU time in the kernel's page
//! faults and page clearing (`perf`). Fixed thresholds keep up to 64 MiB of freed heap for the
//! next step's rows; blocks from 32 MiB up (a long prompt's all-row logits) still come from and
//! go back to mmap. A process that sets `MALLOC_TRIM_THRESHOLD_` or `MALLOC_MMAP_THRESHOLD_`
//! keeps its own policy.

/// Sets the fixed thresholds once per process (glibc on Linux; elsewhere nothing).
pub fn keep_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let own = ["MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"];
            if own.iter().any(|v| std::env::var_os(v).is_some()) {
                return;
            }
            // SAFETY: mallopt only sets malloc's tunables (glibc serialises it with the arena
            // lock); the values are in range.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
            }
        });
    }
}
