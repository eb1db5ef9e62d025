//! Timing of the AMX tile path's parts on a CPU that has AMX (an ignored test, run by hand:
//! `cargo test --release amx_iq3s_timing -- --ignored --nocapture`, or on the GPU host through
//! `scripts/isa_tests_device`'s binary): IQ3_S's A operands packed alone, then whole
//! `rows_kernel` calls as the pool makes them (64 rows × the token group) for IQ3_S and Q4_K,
//! the A operands packed when used and a step ahead (`lookahead`), per (row, block); and
//! Q4_K over weights read from RAM (`amx_q4k_cold_timing`).
//! (`gemm::tests::amx_rows_throughput` compares the tiles with the multi-token kernel.)

use super::super::super::tests::{random_act, random_row, Rng};
use super::*;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// A `rows_kernel` instance.
type Kernel = unsafe fn(usize, &[u8], usize, &[&[u8]], &mut [f32], bool);

/// `rows_kernel` packs a step ahead (the timing test compares both ways).
pub(super) static LOOKAHEAD: AtomicBool = AtomicBool::new(true);

#[test]
#[ignore = "timing, by hand on an AMX CPU"]
fn amx_iq3s_timing() {
    if !available() {
        println!("this CPU has no AMX tiles: nothing timed");
        return;
    }
    // one Qwen3-30B-A3B expert gate/up matrix: 768 rows of 2048 weights
    let (n, nr) = (2048usize, 768usize);
    let nb = n / 256;
    let mut rng = Rng::new(7);
    let matrix = |w: GgmlType, rng: &mut Rng| -> Vec<u8> {
        (0..nr).flat_map(|_| random_row(w, n, rng)).collect()
    };
    let row_len = IQ3S_WB * nb;
    let rows = matrix(GgmlType::IQ3S, &mut rng);
    let acts: Vec<Vec<u8>> = (0..64)
        .map(|_| random_act(GgmlType::IQ3S, n, &mut rng))
        .collect();
    let reps = 20;
    let mut a = [Line([0; 64]); 4 * OPS * TILE];
    // SAFETY: AVX-512 with AMX (checked); the rows hold nr rows of nb blocks.
    time_pack("pack_a_iq3s", (nr, nb), reps, |r0, blk| unsafe {
        black_box(pack_a_iq3s(&rows, row_len, r0, TILE, blk, &mut a));
    });
    for nt in [16usize, 32, 64] {
        let k = rows_kernel::<IQ3S_MANY> as Kernel;
        let best = ab_lookahead(k, n, &rows, row_len, &acts[..nt], reps);
        report(&format!("IQ3_S many, {nt} tokens"), best, nr * nb);
    }
    // Q4_K, both orders, 16 to 64 tokens
    let q4_len = WB * nb;
    let q4 = matrix(GgmlType::Q4K, &mut rng);
    // SAFETY: as above
    time_pack("pack_a (Q4_K)", (nr, nb), reps, |r0, blk| unsafe {
        black_box(pack_a(&q4, q4_len, r0, TILE, blk, &mut a));
    });
    for (name, k) in [
        ("Q4_K single", rows_kernel::<K4_SINGLE> as Kernel),
        ("Q4_K many", rows_kernel::<K4_MANY>),
    ] {
        for nt in [16usize, 32, 48, 64] {
            let best = ab_lookahead(k, n, &q4, q4_len, &acts[..nt], reps);
            report(&format!("{name}, {nt} tokens"), best, nr * nb);
        }
    }
}

/// Q4_K `Order::Single` over weights read from RAM, as a prompt's experts are: `COPIES`
/// (default 700) copies of one expert matrix, more bytes than the last-level cache, called
/// once per pass as the pool's runs of 64 rows, per (row, block).
#[test]
#[ignore = "timing, by hand on an AMX CPU"]
fn amx_q4k_cold_timing() {
    if !available() {
        println!("this CPU has no AMX tiles: nothing timed");
        return;
    }
    let (n, nr) = (2048usize, 768usize);
    let copies: usize = std::env::var("COPIES").map_or(700, |v| v.parse().unwrap());
    let nb = n / 256;
    let mut rng = Rng::new(11);
    let one: Vec<u8> = (0..nr)
        .flat_map(|_| random_row(GgmlType::Q4K, n, &mut rng))
        .collect();
    let all = one.repeat(copies);
    let acts: Vec<Vec<u8>> = (0..32)
        .map(|_| random_act(GgmlType::Q4K, n, &mut rng))
        .collect();
    let refs: Vec<&[u8]> = acts.iter().map(|v| &v[..]).collect();
    let mut out = vec![0f32; 64 * refs.len()];
    for nt in [16usize, 32] {
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t0 = Instant::now();
            for (i, rs) in all.chunks_exact(64 * WB * nb).enumerate() {
                let o = &mut out[..64 * nt];
                // SAFETY: AVX-512 with AMX (checked); o holds 64 × tokens.
                unsafe { rows_kernel::<K4_SINGLE>(n, rs, 64, &refs[..nt], o, i > 0) };
            }
            best = best.min(t0.elapsed().as_secs_f64());
        }
        println!(
            "rows Q4_K single, {copies} matrices, {nt} tokens: {:.1} ns per (row, block), {:.1} GB/s",
            best * 1e9 / (nr * copies * nb) as f64,
            all.len() as f64 / best / 1e9
        );
    }
}

/// Best time of `pack(r0, blk)` over every (row tile, block) of `nr` rows of `nb` blocks,
/// printed per (row, block).
fn time_pack(
    what: &str,
    (nr, nb): (usize, usize),
    reps: usize,
    mut pack: impl FnMut(usize, usize),
) {
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t0 = Instant::now();
        for r0 in (0..nr).step_by(TILE) {
            for blk in 0..nb {
                pack(r0, blk);
            }
        }
        best = best.min(t0.elapsed().as_secs_f64());
    }
    println!(
        "{what}: {:.1} ns per (row, block)",
        best * 1e9 / (nr * nb) as f64
    );
}

/// Best seconds of `kernel` over `rows` (runs of 64 rows, as the pool calls it) against
/// `acts`, packing when used and a step ahead, interleaved `reps` times.
fn ab_lookahead(
    kernel: Kernel,
    n: usize,
    rows: &[u8],
    row_len: usize,
    acts: &[Vec<u8>],
    reps: usize,
) -> [f64; 2] {
    let refs: Vec<&[u8]> = acts.iter().map(|v| &v[..]).collect();
    let mut out = vec![0f32; 64 * refs.len()];
    let mut best = [f64::MAX; 2];
    for _ in 0..reps {
        for (k, ahead) in [false, true].into_iter().enumerate() {
            LOOKAHEAD.store(ahead, Ordering::Relaxed);
            let t0 = Instant::now();
            for (i, rs) in rows.chunks_exact(64 * row_len).enumerate() {
                // SAFETY: AVX-512 with AMX (checked by the caller); out holds 64 × tokens.
                unsafe { kernel(n, rs, 64, &refs, &mut out, i > 0) };
            }
            best[k] = best[k].min(t0.elapsed().as_secs_f64());
        }
    }
    LOOKAHEAD.store(true, Ordering::Relaxed);
    best
}

fn report(what: &str, best: [f64; 2], row_blocks: usize) {
    let per = |s: f64| s * 1e9 / row_blocks as f64;
    println!(
        "rows {what}, ns per (row, block): packed when used {:.1}, a step ahead {:.1}",
        per(best[0]),
        per(best[1])
    );
}
