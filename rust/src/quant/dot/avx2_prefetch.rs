//! Software prefetch for the single-token (decode) kernels, which stream each weight row once:
//! a hint per cache line a fixed distance ahead of the block being decoded. Prefetching never
//! changes a value, so the kernels' results stay bitwise as before. On Zen 1 the hardware
//! prefetcher alone left one core at ~6 GB/s on weights coming from RAM (bench below).

use std::arch::x86_64::*;

/// Bytes ahead of the block being decoded (past a row's end this is the next row: the
/// matvecs walk rows back to back).
pub(in super::super) const DISTANCE: usize = 2048;

/// A prefetch distance in bytes that kernels read once per call (0: no hints). Relaxed
/// atomics: a hint changes no value, so a change racing a call changes only its speed.
pub(in super::super) struct Knob(std::sync::atomic::AtomicUsize);

impl Knob {
    pub(in super::super) const fn new(bytes: usize) -> Knob {
        Knob(std::sync::atomic::AtomicUsize::new(bytes))
    }

    #[inline(always)]
    pub(in super::super) fn get(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets the distance for every later call; returns the previous one.
    pub(in super::super) fn set(&self, bytes: usize) -> usize {
        self.0.swap(bytes, std::sync::atomic::Ordering::Relaxed)
    }
}

/// The output head's distance (the repacked Q6_K head, `q6k_repack`): about the next
/// block's first lines. The head is the largest matrix of a decode step (151,936 × 2,048 for
/// Qwen3, 255 MB) and sits in huge pages; on Zen 4 (AVX-512 VM, 2 threads, 4-layer
/// Qwen3-30B-A3B width, Q4_K_M, `forward_batch` decode, paired rounds: docs/BENCHMARKS.md)
/// 64-384 bytes ahead decoded one stream 3-10% faster than 2048 and four streams 1-4%
/// faster; no hints at all lost a quarter. The start value: `pf_tune` times the candidates on
/// the CPU it runs on and keeps the fastest (`set_head_prefetch` pins a value).
pub(super) const HEAD_DISTANCE: usize = 128;

/// The knobs: `DIST` for the one-token kernels (`set_dot_prefetch`, `bench/bench_hybrid.py
/// --dot-prefetch`), `HEAD` for the head's (`set_head_prefetch`); tuning knobs for
/// benchmarks, the results bitwise whatever they hold.
pub(in super::super) mod knob {
    pub static DIST: super::Knob = super::Knob::new(super::DISTANCE);
    pub static HEAD: super::Knob = super::Knob::new(super::HEAD_DISTANCE);
}

/// The one-token kernels' distance (`DISTANCE` unless set), read once per kernel call.
#[inline(always)]
pub(in super::super) fn distance() -> usize {
    knob::DIST.get()
}

/// Prefetch (into L1) the `bs` bytes `dist` past offset `off` of `w`, one hint per 64 bytes,
/// so the hints of consecutive blocks leave no line out. `dist` = 0 does nothing. The
/// addresses may lie past `w` (the next rows, or past the matrix): a prefetch never faults.
#[inline(always)]
pub(in super::super) fn ahead(w: &[u8], off: usize, dist: usize, bs: usize) {
    if dist == 0 {
        return;
    }
    let p = w.as_ptr().wrapping_add(off + dist);
    let mut l = 0;
    while l < bs {
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(l) as *const i8) };
        l += 64;
    }
}

/// Prefetching changes no value: the AVX2 kernels at distances 0 (off), 64 and `DISTANCE`
/// equal the scalar kernel bitwise on consecutive rows of a matrix (the hints run past the
/// last row's end).
#[cfg(test)]
mod exact {
    use super::super::super::tests::{random_act, random_row, Rng};
    use super::super::super::{kernel_for, Isa};
    use super::knob::DIST;
    use crate::quant::GgmlType;

    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx2"]
    fn prefetch_keeps_results_bitwise() {
        crate::quant::dot::require_isa(Isa::Avx2, "prefetch_keeps_results_bitwise");
        for w in [
            GgmlType::Q4K,
            GgmlType::Q5K,
            GgmlType::Q6K,
            GgmlType::IQ3S,
            GgmlType::Q8_0,
        ] {
            let mut rng = Rng::new(7 + w.id() as u64);
            let n = 1024;
            let m: Vec<Vec<u8>> = (0..4).map(|_| random_row(w, n, &mut rng)).collect();
            let act = random_act(w, n, &mut rng);
            let m: Vec<u8> = m.concat();
            let rb = m.len() / 4;
            let scalar = kernel_for(Isa::Scalar, w).unwrap();
            let simd = kernel_for(Isa::Avx2, w).unwrap();
            for d in [0, 64, super::DISTANCE] {
                DIST.set(d);
                for row in m.chunks_exact(rb) {
                    let (a, b) = (simd(n, row, &act), scalar(n, row, &act));
                    assert_eq!(a.to_bits(), b.to_bits(), "{} prefetch {d}", w.name());
                }
            }
            DIST.set(super::DISTANCE);
        }
    }
}

/// Decode matvec speed from RAM, one thread: Q4_K / Q5_K / Q6_K / IQ3_S / Q8_0 matrices the
/// size of an expert's gate (768 × 2048) streamed over 256 experts (≥ 226 MB for Q4_K), each
/// row dotted once with one activation (`vec_dot`, the decode path). Per prefetch distance
/// (0 = off), the least thread CPU time of 5 interleaved passes:
/// `cargo test --no-default-features --release decode_prefetch_throughput -- --ignored --nocapture`.
#[cfg(test)]
mod bench {
    use super::super::super::tests::{random_act, random_row, thread_cpu_ns, Rng};
    use super::super::super::vec_dot;
    use super::knob::DIST;
    use crate::quant::GgmlType;

    #[test]
    #[ignore]
    fn decode_prefetch_throughput() {
        let (rows, n, experts) = (768usize, 2048usize, 256usize);
        let dists = [0usize, 1024, 2048, 4096];
        let types = [
            GgmlType::Q4K,
            GgmlType::Q5K,
            GgmlType::Q6K,
            GgmlType::IQ3S,
            GgmlType::Q8_0,
        ];
        for w in types {
            let mut rng = Rng::new(11 + w.id() as u64);
            let rb = w.row_bytes(n).unwrap();
            // 64 distinct random rows tiled over the matrix (random_row is slow for 200k rows).
            let proto: Vec<u8> = (0..64).flat_map(|_| random_row(w, n, &mut rng)).collect();
            let total = rows * experts * rb;
            let m: Vec<u8> = proto.iter().copied().cycle().take(total).collect();
            let act = random_act(w, n, &mut rng);
            let mut best = vec![u64::MAX; dists.len()];
            let mut sums = vec![0u32; dists.len()];
            for _ in 0..5 {
                for (k, &d) in dists.iter().enumerate() {
                    DIST.set(d);
                    let mut x = 0f32;
                    let t0 = thread_cpu_ns();
                    for row in m.chunks_exact(rb) {
                        x += vec_dot(w, n, row, &act);
                    }
                    best[k] = best[k].min(thread_cpu_ns() - t0);
                    sums[k] = x.to_bits();
                }
            }
            DIST.set(super::DISTANCE);
            // prefetching changes no value
            assert!(sums.iter().all(|&s| s == sums[0]), "{}", w.name());
            for (k, &d) in dists.iter().enumerate() {
                let t = best[k] as f64;
                println!(
                    "1 thread, {} {:.0} MB, prefetch {d:>4} B: {:.1} ms ({:.2} GB/s, {:.2}x off)",
                    w.name(),
                    total as f64 / 1e6,
                    t / 1e6,
                    total as f64 / t,
                    best[0] as f64 / t
                );
            }
        }
    }
}
