//! Measured RAM read bandwidth, the yardstick for the pool's weight GB/s (bench/bench_pool.py):
//! `threads` threads each stream their slice of a buffer far larger than the caches.

/// Best-of-`reps` read bandwidth in GB/s (1e9 bytes/s) over a `bytes`-byte buffer.
pub fn read_gbps(bytes: usize, threads: usize, reps: usize) -> f64 {
    let threads = threads.max(1);
    let words = (bytes / 8).max(threads * 1024);
    let buf: Vec<u64> = (0..words as u64).collect();
    let chunk = words.div_ceil(threads);
    let mut best = f64::INFINITY;
    let mut sink = 0u64;
    for _ in 0..reps.max(1) {
        let t0 = std::time::Instant::now();
        sink ^= std::thread::scope(|s| {
            let hs: Vec<_> = buf.chunks(chunk).map(|c| s.spawn(move || sum(c))).collect();
            hs.into_iter().fold(0u64, |a, h| a ^ h.join().unwrap_or(0))
        });
        best = best.min(t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink);
    (words * 8) as f64 / best / 1e9
}

/// Eight independent lanes so the loop vectorizes and is bound by memory, not by an add chain.
fn sum(c: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut it = c.chunks_exact(8);
    for b in &mut it {
        for (a, v) in acc.iter_mut().zip(b) {
            *a = a.wrapping_add(*v);
        }
    }
    acc.iter()
        .chain(it.remainder())
        .fold(0, |a, v| a.wrapping_add(*v))
}
