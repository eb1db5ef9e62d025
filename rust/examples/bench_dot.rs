//! Dot-kernel throughput: weight GB/s per type at 1 thread and at N threads, beside the
//! machine's read bandwidth measured in the same run. Driven by bench/bench_dot.py:
//!     cargo run --release --no-default-features --example bench_dot -- [--threads 1,2]
//!         [--seconds 0.3] [--kib 65536] [--n 2048] [--isa auto] [--types Q4_K,Q6_K]
//! Prints one JSON object per line.

use std::hint::black_box;
use std::time::Instant;
use strata_core::quant::dot::{self, Isa};
use strata_core::quant::GgmlType;

fn arg<'a>(args: &'a [String], key: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == key)
        .and_then(|i| args.get(i + 1))
        .map(|s| s.as_str())
}

/// Fill `buf` with xorshift bytes.
fn fill(buf: &mut [u8], mut s: u64) {
    for c in buf.chunks_mut(8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let b = s.to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
}

/// Offsets of f16 scales per block (set to a normal value so no subnormal slows the run).
fn scale_offsets(w: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match w {
        Q4_0 | Q5_0 | Q8_0 | IQ4NL | Q2_0 | IQ2XXS | IQ2XS | IQ2S | IQ3XXS | IQ3S | IQ1S
        | IQ4XS | Q4_1 | Q5_1 | Q4K | Q5K => &[0, 2],
        Q2K => &[80, 82],
        Q3K => &[108],
        Q6K => &[208],
        TQ1_0 => &[52],
        TQ2_0 => &[64],
        _ => &[],
    }
}

fn weights(w: GgmlType, bytes: usize) -> Vec<u8> {
    let mut v = vec![0u8; bytes];
    fill(&mut v, 0x1234_5678 + w.id() as u64);
    let ts = w.type_size();
    let one = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    match w {
        GgmlType::F32 => v
            .chunks_exact_mut(4)
            .for_each(|c| c.copy_from_slice(&0.5f32.to_le_bytes())),
        GgmlType::F16 | GgmlType::BF16 => v.chunks_exact_mut(2).for_each(|c| {
            c.copy_from_slice(&[0, 0x3c]);
        }),
        GgmlType::MXFP4 => v.chunks_exact_mut(ts).for_each(|b| b[0] = 120),
        _ => {
            for b in v.chunks_exact_mut(ts) {
                for &o in scale_offsets(w) {
                    b[o..o + 2].copy_from_slice(&one);
                }
            }
        }
    }
    v
}

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// CPU seconds of the calling thread (Linux CLOCK_THREAD_CPUTIME_ID): unlike wall time it
/// does not count the time other processes hold the core.
fn thread_cpu() -> f64 {
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: a valid out-pointer; clock 3 is CLOCK_THREAD_CPUTIME_ID on Linux.
    unsafe { clock_gettime(3, &mut ts) };
    ts.sec as f64 + ts.nsec as f64 * 1e-9
}

/// Run `f(thread, n_threads)` on `threads` threads, `reps` times each; return (wall
/// seconds, the largest per-thread CPU seconds).
fn timed(threads: usize, reps: usize, f: &(impl Fn(usize, usize) + Sync)) -> (f64, f64) {
    let t0 = Instant::now();
    let cpu = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let c0 = thread_cpu();
                    for _ in 0..reps {
                        f(t, threads);
                    }
                    thread_cpu() - c0
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .fold(0.0, f64::max)
    });
    (t0.elapsed().as_secs_f64(), cpu)
}

/// Repeat for about `secs`; return the best of 3 (wall, CPU-time) bytes/s for `bytes` per rep.
fn rate(threads: usize, secs: f64, bytes: usize, f: &(impl Fn(usize, usize) + Sync)) -> (f64, f64) {
    let once = timed(threads, 1, f).0.max(1e-6);
    let reps = ((secs / 3.0 / once).ceil() as usize).max(1);
    (0..3).fold((0.0, 0.0), |(bw, bc), _| {
        let (w, c) = timed(threads, reps, f);
        let b = (reps * bytes) as f64;
        (f64::max(bw, b / w), f64::max(bc, b / c.max(1e-9)))
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: f64 = arg(&args, "--seconds").map_or(0.3, |s| s.parse().unwrap());
    let kib: usize = arg(&args, "--kib").map_or(64 << 10, |s| s.parse().unwrap());
    let n: usize = arg(&args, "--n").map_or(2048, |s| s.parse().unwrap());
    let threads: Vec<usize> = arg(&args, "--threads")
        .map(|s| s.split(',').map(|t| t.parse().unwrap()).collect())
        .unwrap_or_else(|| {
            let all = std::thread::available_parallelism().map_or(1, |p| p.get());
            if all > 1 {
                vec![1, all]
            } else {
                vec![1]
            }
        });
    let isa = match arg(&args, "--isa") {
        None | Some("auto") => dot::active_isa(),
        Some(s) => Isa::from_name(s).expect("isa: scalar|avx2|avx512"),
    };
    let types: Vec<GgmlType> = match arg(&args, "--types") {
        Some(s) => s
            .split(',')
            .map(|t| GgmlType::from_name(t).expect("type"))
            .collect(),
        None => GgmlType::ALL
            .into_iter()
            .filter(|&w| dot::supports(w))
            .collect(),
    };
    println!(
        "{{\"kind\":\"machine\",\"isa\":\"{}\",\"features\":\"{}\",\"buffer_kib\":{kib},\"n\":{n}}}",
        isa.name(),
        dot::cpu_features().join(" ")
    );

    // Read bandwidth: sum u64 words of a buffer several times the L3, split by thread.
    let buf = {
        let mut b = vec![0u8; kib << 10];
        fill(&mut b, 7);
        b
    };
    let words: &[u64] =
        unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u64, buf.len() / 8) };
    for &t in &threads {
        let r = rate(t, secs, buf.len(), &|i, nt| {
            let c = words.len() / nt;
            let s = &words[i * c..(i + 1) * c];
            let (mut a, mut b, mut x, mut y) = (0u64, 0u64, 0u64, 0u64);
            for q in s.chunks_exact(4) {
                a = a.wrapping_add(q[0]);
                b = b.wrapping_add(q[1]);
                x = x.wrapping_add(q[2]);
                y = y.wrapping_add(q[3]);
            }
            black_box(a ^ b ^ x ^ y);
        });
        println!(
            "{{\"kind\":\"membw\",\"threads\":{t},\"gbs\":{:.3},\"gbs_cpu\":{:.3}}}",
            r.0 / 1e9,
            r.1 / 1e9
        );
    }
    drop(buf);

    for w in types {
        let Some(k) = dot::kernel_for(isa, w) else {
            continue;
        };
        let rb = w.row_bytes(n).unwrap();
        let rows = ((kib << 10) / rb).max(1);
        let wts = weights(w, rows * rb);
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let mut act = vec![0u8; dot::act_bytes(w, n).unwrap()];
        dot::quantize_act(w.vec_dot_type(), &x, &mut act).unwrap();
        let native = dot::has_native_kernel(isa, w);
        for &t in &threads {
            let r = rate(t, secs, rows * rb, &|i, nt| {
                let (r0, r1) = (rows * i / nt, rows * (i + 1) / nt);
                let mut s = 0f32;
                for row in wts[r0 * rb..r1 * rb].chunks_exact(rb) {
                    s += k(n, row, &act);
                }
                black_box(s);
            });
            println!(
                "{{\"kind\":\"dot\",\"type\":\"{}\",\"threads\":{t},\"gbs\":{:.3},\"gbs_cpu\":{:.3},\"native\":{native}}}",
                w.name(),
                r.0 / 1e9,
                r.1 / 1e9
            );
        }
    }
}
