//! One-token decode matvec speed, interleaved A/B in one process: the one-row kernel row by
//! row (`vec_dot`, the old decode path) against the grouped kernels (`vec_dot_rows`), on
//! matrices far larger than the caches, with 1 and 2 threads (each thread its own half), next
//! to a plain AVX2 streaming read of the same bytes (the ceiling). Reports wall GB/s and per
//! core GB/s (bytes over the slowest thread's CPU time), best of 5 interleaved passes:
//! `cargo test --no-default-features --release decode_rows_ab -- --ignored --nocapture`.

use super::tests::{random_act, random_row, thread_cpu_ns, Rng};
use super::{vec_dot, vec_dot_rows};
use crate::quant::GgmlType;
use std::arch::x86_64::*;

/// Sum of the bytes as u64 words, AVX2 loads, hints 2 KB ahead.
#[target_feature(enable = "avx2")]
unsafe fn stream(m: &[u8]) -> u64 {
    let mut acc = [_mm256_setzero_si256(); 4];
    let p = m.as_ptr();
    let mut i = 0;
    while i + 128 <= m.len() {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i + 2048) as *const i8);
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i + 2112) as *const i8);
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_add_epi64(*a, _mm256_loadu_si256(p.add(i + 32 * k) as *const __m256i));
        }
        i += 128;
    }
    let s = _mm256_add_epi64(
        _mm256_add_epi64(acc[0], acc[1]),
        _mm256_add_epi64(acc[2], acc[3]),
    );
    let mut o = [0u64; 4];
    _mm256_storeu_si256(o.as_mut_ptr() as *mut __m256i, s);
    o.iter().fold(0, |a, b| a.wrapping_add(*b))
}

/// (wall GB/s, per-core GB/s) of `f` over `threads` equal parts of `m` (cut at `rb` rows).
fn run(threads: usize, m: &[u8], rb: usize, f: &(dyn Fn(&[u8]) -> u64 + Sync)) -> (f64, f64) {
    let part = m.len() / rb / threads * rb;
    let t0 = std::time::Instant::now();
    let cpu: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|k| {
                let c = &m[k * part..(k + 1) * part];
                s.spawn(move || {
                    let c0 = thread_cpu_ns();
                    std::hint::black_box(f(c));
                    thread_cpu_ns() - c0
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let wall = t0.elapsed().as_secs_f64();
    let slow = *cpu.iter().max().unwrap() as f64;
    ((part * threads) as f64 / wall / 1e9, part as f64 / slow)
}

/// One rows × tokens call: `(rows, nr, out)`.
type RowsCall<'a> = dyn Fn(&[u8], usize, &mut [f32]) + 'a;

/// A kernel pass over a matrix, named for the report.
type Named<'a> = (&'static str, &'a dyn Fn(&[u8]) -> u64);

/// Best of 5 interleaved passes: each kernel's CPU time (ns, this thread) for `reps` runs
/// over `data`.
fn best_cpu_ns(fs: &[Named<'_>], data: &[u8], reps: usize) -> Vec<u64> {
    let mut best = vec![u64::MAX; fs.len()];
    for _ in 0..5 {
        for (b, (_, f)) in best.iter_mut().zip(fs) {
            let c0 = thread_cpu_ns();
            for _ in 0..reps {
                std::hint::black_box(f(data));
            }
            *b = (*b).min(thread_cpu_ns() - c0);
        }
    }
    best
}

#[test]
#[ignore]
fn decode_rows_ab() {
    // (type, row length, rows): an expert gate/up (768 × 2048) and down (2048 × 768) over 128
    // experts, from RAM.
    let shapes = [
        (GgmlType::IQ3S, 2048usize, 768 * 128usize),
        (GgmlType::IQ3S, 768, 2048 * 128),
        (GgmlType::Q4K, 2048usize, 768 * 128usize),
        (GgmlType::Q4K, 768, 2048 * 128),
        (GgmlType::Q6K, 768, 2048 * 128),
        (GgmlType::Q6K, 2048, 768 * 128),
        (GgmlType::Q8_0, 2880, 201088 / 8), // an eighth of gpt-oss's output head
    ];
    for (w, n, rows) in shapes {
        let mut rng = Rng::new(11 + w.id() as u64);
        let rb = w.row_bytes(n).unwrap();
        let proto: Vec<u8> = (0..64).flat_map(|_| random_row(w, n, &mut rng)).collect();
        let m: Vec<u8> = proto.iter().copied().cycle().take(rows * rb).collect();
        let act = random_act(w, n, &mut rng);
        let old = |c: &[u8]| {
            let mut x = 0f32;
            for row in c.chunks_exact(rb) {
                x += vec_dot(w, n, row, &act);
            }
            x.to_bits() as u64
        };
        let new = |c: &[u8]| {
            let mut out = [0f32; 64];
            let mut x = 0f32;
            for g in c.chunks(64 * rb) {
                let o = &mut out[..g.len() / rb];
                vec_dot_rows(w, n, g, &act, o);
                x += o.iter().sum::<f32>();
            }
            x.to_bits() as u64
        };
        // the same values in the same order: the sums agree bitwise
        assert_eq!(old(&m[..64 * rb]), new(&m[..64 * rb]));
        // compute-bound: 384 KB (L2-resident) passed over 300 times, one thread, CPU time
        let small = &m[..384 * 1024 / rb * rb];
        let mut l2 = [u64::MAX; 2];
        for _ in 0..5 {
            for (k, f) in [&old as &dyn Fn(&[u8]) -> u64, &new].iter().enumerate() {
                let c0 = thread_cpu_ns();
                for _ in 0..300 {
                    std::hint::black_box(f(small));
                }
                l2[k] = l2[k].min(thread_cpu_ns() - c0);
            }
        }
        let gb = |t: u64| (small.len() * 300) as f64 / t as f64;
        println!(
            "{} n={n} L2-resident 1 thr: one-row {:.2}, grouped {:.2} GB/s ({:.3}x)",
            w.name(),
            gb(l2[0]),
            gb(l2[1]),
            l2[0] as f64 / l2[1] as f64
        );
        let names = ["stream", "one-row", "grouped"];
        for threads in [1usize, 2] {
            let mut best = [(0f64, 0f64); 3];
            for _ in 0..5 {
                let r = [
                    run(threads, &m, rb, &|c| unsafe { stream(c) }),
                    run(threads, &m, rb, &old),
                    run(threads, &m, rb, &new),
                ];
                for (b, x) in best.iter_mut().zip(r) {
                    *b = (b.0.max(x.0), b.1.max(x.1));
                }
            }
            let line: Vec<String> = names
                .iter()
                .zip(best)
                .map(|(nm, (wall, core))| format!("{nm} {wall:.2} ({core:.2}/core)"))
                .collect();
            println!(
                "{} n={n} {:.0} MB, {threads} thr: {}; grouped/one-row {:.3}x",
                w.name(),
                m.len() as f64 / 1e6,
                line.join(", "),
                best[2].0 / best[1].0
            );
        }
    }
}

/// MXFP4 decode kernels side by side (gpt-oss's expert rows, n = 2880), interleaved, one
/// thread, CPU time: the scalar and AVX2 one-row kernels and the AVX2 grouped kernel, on an
/// L2-resident slice (compute) and on 32 experts' rows from RAM:
/// `cargo test --no-default-features --release mxfp4_kernels_ab -- --ignored --nocapture`.
#[test]
#[ignore]
fn mxfp4_kernels_ab() {
    use super::{kernel_for, rows_kernel_for, Isa};
    let (w, n) = (GgmlType::MXFP4, 2880usize);
    let rb = w.row_bytes(n).unwrap();
    let mut rng = Rng::new(29);
    let proto: Vec<u8> = (0..64).flat_map(|_| random_row(w, n, &mut rng)).collect();
    let m: Vec<u8> = proto.iter().copied().cycle().take(2880 * 32 * rb).collect();
    let act = random_act(w, n, &mut rng);
    let act = &act[..];
    let one = |isa: Isa| {
        let k = kernel_for(isa, w).unwrap();
        move |c: &[u8]| {
            let mut x = 0f32;
            for row in c.chunks_exact(rb) {
                x += k(n, row, act);
            }
            x.to_bits() as u64
        }
    };
    let g = rows_kernel_for(Isa::Avx2, w).unwrap();
    let grouped = |c: &[u8]| {
        let mut out = [0f32; 64];
        let mut x = 0f32;
        for r in c.chunks(64 * rb) {
            let o = &mut out[..r.len() / rb];
            g(n, r, act, o);
            x += o.iter().sum::<f32>();
        }
        x.to_bits() as u64
    };
    let (a2, sc) = (one(Isa::Avx2), one(Isa::Scalar));
    let fs: [Named<'_>; 3] = [
        ("scalar", &sc),
        ("avx2 one-row", &a2),
        ("avx2 grouped", &grouped),
    ];
    let small = &m[..384 * 1024 / rb * rb];
    for (what, data, reps) in [("L2", small, 300), ("RAM", &m[..], 3)] {
        let best = best_cpu_ns(&fs, data, reps);
        let line: Vec<String> = fs
            .iter()
            .zip(best)
            .map(|((nm, _), t)| format!("{nm} {:.2}", (data.len() * reps) as f64 / t as f64))
            .collect();
        println!("MXFP4 n={n} {what}, GB/s per core: {}", line.join(", "));
    }
}

/// The repacked Q6_K head's kernels for a batched step's decode rows, one thread, CPU time:
/// one activation (`dot`), four through one decode (`rows_single`, a call per row and a call
/// per chunk of rows) and four one by one, on an L2-resident slice (compute) and on 255 MB of
/// rows from RAM (the bench model's head):
/// `cargo test --no-default-features --release head_rows_ab -- --ignored --nocapture`.
#[test]
#[ignore]
fn head_rows_ab() {
    use super::q6k_repack::{dot, permute_act, repack, rows_single, BLOCK_BYTES};
    use super::Order;
    let (w, n) = (GgmlType::Q6K, 2048usize);
    let rb = n / 256 * BLOCK_BYTES;
    let mut rng = Rng::new(31);
    let proto: Vec<u8> = (0..64)
        .flat_map(|_| repack(&random_row(w, n, &mut rng)).unwrap())
        .collect();
    let m: Vec<u8> = proto.iter().copied().cycle().take(151_936 * rb).collect();
    let acts: Vec<Vec<u8>> = (0..4)
        .map(|_| {
            let a = random_act(w, n, &mut rng);
            let mut p = vec![0u8; a.len()];
            permute_act(&a, &mut p).unwrap();
            p
        })
        .collect();
    let four = [&acts[0][..], &acts[1][..], &acts[2][..], &acts[3][..]];
    let one = |c: &[u8]| {
        let mut x = 0f32;
        for row in c.chunks_exact(rb) {
            x += dot(n, row, four[0], Order::Single, true);
        }
        x.to_bits() as u64
    };
    // one call per row (the per-row call overhead beside `rows4`'s one call per chunk)
    let shared = |c: &[u8]| {
        let mut x = 0f32;
        for r in 0..c.len() / rb {
            rows_single(n, c, r..r + 1, four, true, |_, v| {
                for v in v {
                    x += v;
                }
            });
        }
        x.to_bits() as u64
    };
    let apart = |c: &[u8]| {
        let mut x = 0f32;
        for row in c.chunks_exact(rb) {
            for a in four {
                x += dot(n, row, a, Order::Single, true);
            }
        }
        x.to_bits() as u64
    };
    let rows1 = |c: &[u8]| {
        let mut x = 0f32;
        rows_single(n, c, 0..c.len() / rb, [four[0]], true, |_, v| x += v[0]);
        x.to_bits() as u64
    };
    let rows4 = |c: &[u8]| {
        let mut x = 0f32;
        rows_single(n, c, 0..c.len() / rb, four, true, |_, v| {
            for v in v {
                x += v;
            }
        });
        x.to_bits() as u64
    };
    assert_eq!(shared(&m[..64 * rb]), apart(&m[..64 * rb]));
    assert_eq!(rows4(&m[..64 * rb]), apart(&m[..64 * rb]));
    assert_eq!(rows1(&m[..64 * rb]), one(&m[..64 * rb]));
    let fs: [Named<'_>; 5] = [
        ("1 act", &one),
        ("1 act rows", &rows1),
        ("4 acts shared", &shared),
        ("4 acts rows", &rows4),
        ("4 acts apart", &apart),
    ];
    let small = &m[..384 * 1024 / rb * rb];
    for (what, data, reps) in [("L2", small, 100), ("RAM", &m[..], 2)] {
        let best = best_cpu_ns(&fs, data, reps);
        let line: Vec<String> = fs
            .iter()
            .zip(best)
            .map(|((nm, _), t)| {
                format!(
                    "{nm} {:.2} GB/s ({:.2} ms per head)",
                    (data.len() * reps) as f64 / t as f64,
                    t as f64 / reps as f64 / 1e6 * (m.len() as f64 / data.len() as f64)
                )
            })
            .collect();
        println!("Q6_K-R n={n} {what}, one core: {}", line.join(", "));
    }
    for threads in [1usize, 2] {
        let mut best = [(0f64, 0f64); 5];
        for _ in 0..3 {
            let r = [
                run(threads, &m, rb, &|c| unsafe { stream(c) }),
                run(threads, &m, rb, &one),
                run(threads, &m, rb, &rows1),
                run(threads, &m, rb, &shared),
                run(threads, &m, rb, &rows4),
            ];
            for (b, x) in best.iter_mut().zip(r) {
                *b = (b.0.max(x.0), b.1.max(x.1));
            }
        }
        println!(
            "Q6_K-R RAM {threads} thr, wall GB/s: stream {:.2}, 1 act {:.2}, 1 act rows {:.2}, \
             4 shared {:.2}, 4 rows {:.2}",
            best[0].0, best[1].0, best[2].0, best[3].0, best[4].0
        );
    }
}

/// Q4_K `Order::Single` at 2–32 tokens (a batched step's dense projections, experts with
/// several tokens, prefill tiles): the rows × tokens kernels (`MultiDot::rows_plain`: from
/// `IL_MIN_T` tokens the interleaved kernel; below it the narrow one, and the interleaved
/// one beside it) against the multi-token kernel row by row (`MultiDot::call`), one thread,
/// CPU time, on an L2-resident slice (compute) and from RAM:
/// `cargo test --no-default-features --release q4k_rows_tokens_ab -- --ignored --nocapture`.
#[test]
#[ignore]
fn q4k_rows_tokens_ab() {
    use super::gemm::{q4_k_rows_il, MAX_T};
    use super::{MultiDot, Order};
    let (w, n) = (GgmlType::Q4K, 2048usize);
    let rb = w.row_bytes(n).unwrap();
    let mut rng = Rng::new(37);
    let proto: Vec<u8> = (0..64).flat_map(|_| random_row(w, n, &mut rng)).collect();
    let m: Vec<u8> = proto.iter().copied().cycle().take(4096 * 16 * rb).collect();
    let acts: Vec<Vec<u8>> = (0..32).map(|_| random_act(w, n, &mut rng)).collect();
    let md = MultiDot::new(w, n, Order::Single);
    for nt in [2usize, 3, 4, 5, 6, 8, 12, 16, 32] {
        let refs: Vec<&[u8]> = acts[..nt].iter().map(|a| &a[..]).collect();
        let refs = &refs[..];
        let tiles = |c: &[u8], f: &RowsCall<'_>| {
            let mut out = [0f32; 64 * MAX_T];
            let mut x = 0f32;
            for g in c.chunks(64 * rb) {
                let nr = g.len() / rb;
                f(g, nr, &mut out[..nr * nt]);
                x += out[..nr * nt].iter().sum::<f32>();
            }
            x.to_bits() as u64
        };
        let plain = |c: &[u8]| tiles(c, &|g, nr, o| md.rows_plain(g, nr, refs, o));
        // SAFETY: `MultiDot::new` ran on this CPU; the benchmark needs AVX2 (asserted by
        // `rows_plain`'s dispatch having taken a kernel: the results are compared below).
        let il = |c: &[u8]| {
            tiles(c, &|g, nr, o| unsafe {
                q4_k_rows_il::<false>(n, g, nr, refs, o)
            })
        };
        let per_row = |c: &[u8]| {
            tiles(c, &|g, _, o| {
                for (r, o) in o.chunks_exact_mut(nt).enumerate() {
                    md.call(&g[r * rb..(r + 1) * rb], refs, o);
                }
            })
        };
        assert_eq!(plain(&m[..256 * rb]), per_row(&m[..256 * rb]));
        assert_eq!(il(&m[..256 * rb]), per_row(&m[..256 * rb]));
        let fs: [Named<'_>; 3] = [
            ("rows_plain", &plain),
            ("interleaved", &il),
            ("per row", &per_row),
        ];
        let small = &m[..256 * 1024 / rb / 4 * 4 * rb];
        for (what, data, reps) in [("L2", small, 200 / nt.max(4) * 4), ("RAM", &m[..], 3)] {
            let best = best_cpu_ns(&fs, data, reps);
            let gbs = |i: usize| (data.len() * reps) as f64 / best[i] as f64;
            println!(
                "Q4_K n={n} {nt:2} tokens {what:3}, one core GB/s: rows_plain {:.2}, interleaved {:.2}, per row {:.2} ({:.2}x, {:.2}x); ns per (row, token, block) {:.2}",
                gbs(0),
                gbs(1),
                gbs(2),
                best[2] as f64 / best[0] as f64,
                best[2] as f64 / best[1] as f64,
                best[0] as f64 / (data.len() / 144 * nt * reps) as f64,
            );
        }
    }
}

/// Q4_K one-row order at 1 and 4 tokens: the 16-row repacked kernel (`q4k_r16`) against the
/// rows × tokens kernel (`MultiDot::rows_plain`) and the one-token grouped rows
/// (`vec_dot_rows`), one core L2-resident and two threads from RAM:
/// `cargo test --release --lib q4k_r16_ab -- --ignored --nocapture`.
#[test]
#[ignore]
fn q4k_r16_ab() {
    use super::q4k_r16::{repack_group, rows_single, rows_single_avx2, Kernel, GROUP, GROUP_BLOCK};
    use super::{MultiDot, Order};
    let Some(k) = super::q4k_r16::kernel() else {
        return;
    };
    println!("r16 kernel: {k:?}");
    // SAFETY (both): `k` is the kernel `q4k_r16::kernel()` found for this CPU.
    unsafe fn rs<const N: usize>(
        k: Kernel,
        nb: usize,
        g: &[u8],
        a: [&[u8]; N],
        o: &mut [[f32; GROUP]; N],
    ) {
        match k {
            Kernel::Vnni => rows_single::<N>(nb, g, a, o),
            Kernel::Avx2 => rows_single_avx2::<N>(nb, g, a, o),
        }
    }
    let (w, n) = (GgmlType::Q4K, 2048usize);
    let (rb, nb) = (w.row_bytes(n).unwrap(), n / 256);
    let mut rng = Rng::new(41);
    let proto: Vec<u8> = (0..64).flat_map(|_| random_row(w, n, &mut rng)).collect();
    let m: Vec<u8> = proto.iter().copied().cycle().take(204_800 * rb).collect();
    let mut rp = vec![0u8; m.len() / rb / GROUP * nb * GROUP_BLOCK];
    for (src, dst) in m
        .chunks_exact(GROUP * rb)
        .zip(rp.chunks_exact_mut(nb * GROUP_BLOCK))
    {
        repack_group(src, nb, dst);
    }
    let acts: Vec<Vec<u8>> = (0..4).map(|_| random_act(w, n, &mut rng)).collect();
    let md = MultiDot::new(w, n, Order::Single);
    let gb = nb * GROUP_BLOCK;
    let r16_1 = |c: &[u8]| {
        let mut o = [[0f32; GROUP]; 1];
        let mut x = 0f32;
        for g in c.chunks_exact(gb) {
            // SAFETY: `k` is this CPU's kernel.
            unsafe { rs::<1>(k, nb, g, [&acts[0]], &mut o) };
            x += o[0][0];
        }
        x.to_bits() as u64
    };
    let r16_4 = |c: &[u8]| {
        let mut o = [[0f32; GROUP]; 4];
        let mut x = 0f32;
        for g in c.chunks_exact(gb) {
            // SAFETY: as above.
            unsafe { rs::<4>(k, nb, g, [&acts[0], &acts[1], &acts[2], &acts[3]], &mut o) };
            x += o[3][0];
        }
        x.to_bits() as u64
    };
    let plain_4 = |c: &[u8]| {
        let a: Vec<&[u8]> = acts.iter().map(|x| &x[..]).collect();
        let mut out = [0f32; 16 * 4];
        let mut x = 0f32;
        for ch in c.chunks_exact(16 * rb) {
            md.rows_plain(ch, 16, &a, &mut out);
            x += out[0];
        }
        x.to_bits() as u64
    };
    let rows_1 = |c: &[u8]| {
        let mut out = [0f32; 16];
        let mut x = 0f32;
        for ch in c.chunks_exact(16 * rb) {
            vec_dot_rows(w, n, ch, &acts[0], &mut out);
            x += out[0];
        }
        x.to_bits() as u64
    };
    let (sm, sr) = (&m[..512 * rb], &rp[..512 / GROUP * gb]);
    for (name, f, data, bytes) in [
        (
            "one token, grouped rows",
            &rows_1 as &(dyn Fn(&[u8]) -> u64 + Sync),
            sm,
            sm.len(),
        ),
        ("one token, r16", &r16_1, sr, sm.len()),
        ("4 tokens, rows_plain", &plain_4, sm, sm.len()),
        ("4 tokens, r16", &r16_4, sr, sm.len()),
    ] {
        let best = best_cpu_ns(&[(name, f)], data, 40)[0];
        let (wall, _) = run(
            2,
            if data.len() == sm.len() { &m } else { &rp },
            if data.len() == sm.len() { rb } else { gb },
            f,
        );
        println!(
            "Q4_K n={n} {name}: L2 one core {:.2} GB/s (Q4_K bytes), RAM 2 threads {wall:.2} GB/s",
            (bytes * 40) as f64 / best as f64
        );
    }
}
