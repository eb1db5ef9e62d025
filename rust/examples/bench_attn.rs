//! Attention throughput of one prefill chunk over an f16 cache, at the Qwen3-30B-A3B shape
//! (32 q / 4 kv heads, head dim 128): ms per chunk of T positions at each start p0, on the
//! pool (threads − 1 workers plus the caller, as the engine runs) and per layer.
//!     cargo run --release --no-default-features --example bench_attn -- [--threads 2]
//!         [--t 512] [--ctx 2048] [--reps 3]
//! Prints one JSON object per line.

use std::time::Instant;
use strata_core::model::attention::AttnShape;
use strata_core::model::attn_par::{attend_chunk_units, AttnPar};
use strata_core::model::kv::KvCache;
use strata_core::model::{Compute, KvType};
use strata_core::pool::{Pool, PoolConfig};

fn arg(args: &[String], key: &str, def: usize) -> usize {
    args.iter()
        .position(|a| a == key)
        .and_then(|i| args.get(i + 1))
        .map(|s| s.parse().expect("a number"))
        .unwrap_or(def)
}

/// CPU seconds of the whole process (all threads): on a shared machine, time per CPU second
/// is the figure that other processes do not disturb (with `--threads 1`).
fn cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads = arg(&args, "--threads", 2);
    let t = arg(&args, "--t", 512);
    let ctx = arg(&args, "--ctx", 2048);
    let reps = arg(&args, "--reps", 3);
    let (nh, nkv, d) = (32, 4, 128);
    let pool = Pool::new(PoolConfig {
        workers: threads.saturating_sub(1),
        host_participates: true,
        pipelined: false,
        pin: false,
        spin_us: 50,
        balanced: true,
    });
    let mut kv = KvCache::new(KvType::F16, 1, ctx, nkv, d, 1).unwrap();
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    for p in 0..ctx {
        let k: Vec<f32> = (0..nkv * d).map(|_| 4.0 * rnd()).collect();
        let v: Vec<f32> = (0..nkv * d).map(|_| rnd()).collect();
        kv.write(0, 0, p, &k, &v).unwrap();
    }
    let shape = AttnShape::of(&kv, nh, nkv, d);
    let q: Vec<f32> = (0..t * nh * d).map(|_| rnd()).collect();
    let par = AttnPar::new(ctx, KvType::F16, d, pool.threads_total());
    let mut total = [0.0f64; 2];
    for p0 in (0..ctx).step_by(t) {
        let (kc, vc) = kv.layer(0, 0, p0 + t);
        let mut best = [f64::MAX; 2];
        let mut cpu = [f64::MAX; 2];
        let mut outs = [vec![0f32; t * nh * d], vec![0f32; t * nh * d]];
        for _ in 0..reps {
            // interleaved: per-head units, then grouped units
            for (g, o) in outs.iter_mut().enumerate() {
                let (t0, c0) = (Instant::now(), cpu_s());
                let c = &pool as &dyn Compute;
                attend_chunk_units(&shape, kc, vc, p0, t, &q, o, &par, c, g == 1, t).unwrap();
                best[g] = best[g].min(t0.elapsed().as_secs_f64());
                cpu[g] = cpu[g].min(cpu_s() - c0);
            }
        }
        let same = outs[0]
            .iter()
            .zip(&outs[1])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let pairs = (t * (2 * p0 + t + 1) / 2 * nh) as f64; // (query, key, head) triples
        for (g, name) in ["per_head", "grouped"].iter().enumerate() {
            total[g] += best[g];
            println!(
                "{{\"units\": \"{name}\", \"threads\": {threads}, \"t\": {t}, \"p0\": {p0}, \"ms\": {:.2}, \"gmac_s\": {:.2}, \"cpu_ms\": {:.2}, \"gmac_cpu_s\": {:.2}, \"cum_ms\": {:.2}, \"bitwise_equal\": {same}}}",
                best[g] * 1e3,
                2.0 * pairs * d as f64 / best[g] / 1e9,
                cpu[g] * 1e3,
                2.0 * pairs * d as f64 / cpu[g] / 1e9,
                total[g] * 1e3
            );
        }
    }
}
