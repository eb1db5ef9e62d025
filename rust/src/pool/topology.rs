//! Which CPUs the workers are pinned to: one per physical core (SMT siblings skipped), among
//! the CPUs this process may run on. Read once when a pool is built.

use std::collections::BTreeSet;

/// CPUs this process may run on (sched_getaffinity), ascending.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// The first CPU of each physical core, ascending (all allowed CPUs if sysfs says nothing).
pub fn physical_cores() -> Vec<usize> {
    let allowed = allowed_cpus();
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for &c in &allowed {
        let path = format!("/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list");
        let key = std::fs::read_to_string(path).unwrap_or_else(|_| c.to_string());
        if seen.insert(key.trim().to_string()) {
            out.push(c);
        }
    }
    if out.is_empty() {
        out.push(0);
    }
    out
}

/// Pin the calling thread to `cpu`; false if the kernel refused.
pub fn pin_current(cpu: usize) -> bool {
    // SAFETY: as above; the set holds one valid CPU index.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu % libc::CPU_SETSIZE as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}
