//! Timing of the AMX IQ3_S tile path's parts on a CPU that has AMX (an ignored test, run by
//! hand: `cargo test --release amx_iq3s_timing -- --ignored --nocapture`, or on the GPU host
//! through `scripts/isa_tests_device`'s binary): the A operands' decode alone, then whole
//! `rows` calls as the pool makes them (64 rows × the token group), per (row, block).

use super::*;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// A `rows_kernel` instance.
type Kernel = unsafe fn(usize, &[u8], usize, &[&[u8]], &mut [f32], bool);

/// `rows_kernel` packs a step ahead (the timing test compares both ways).
pub(super) static LOOKAHEAD: AtomicBool = AtomicBool::new(true);

/// xorshift64 bytes.
fn fill(buf: &mut [u8], seed: u64) {
    let mut s = seed | 1;
    for b in buf.iter_mut() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        *b = s as u8;
    }
}

#[test]
#[ignore = "timing, by hand on an AMX CPU"]
fn amx_iq3s_timing() {
    if !available() {
        println!("this CPU has no AMX tiles: nothing timed");
        return;
    }
    // one Qwen3-30B-A3B expert gate/up matrix: 768 rows of 2048 IQ3_S weights
    let (n, nr) = (2048usize, 768usize);
    let nb = n / 256;
    let row_len = IQ3S_WB * nb;
    let mut rows = vec![0u8; nr * row_len];
    fill(&mut rows, 7);
    for blk in rows.chunks_exact_mut(IQ3S_WB) {
        blk[..2].copy_from_slice(&0x3c00u16.to_le_bytes()); // d = 1
    }
    let mut acts = vec![vec![0u8; AB * nb]; 64];
    for (t, a) in acts.iter_mut().enumerate() {
        fill(a, 100 + t as u64);
        for blk in a.chunks_exact_mut(AB) {
            blk[..4].copy_from_slice(&1f32.to_le_bytes());
        }
    }
    let reps = 20;
    let mut a = [Line([0; 64]); 4 * OPS * TILE];
    {
        let mut best = f64::MAX;
        for _ in 0..reps {
            let t0 = Instant::now();
            for r0 in (0..nr).step_by(TILE) {
                for blk in 0..nb {
                    // SAFETY: AVX-512 with AMX (checked); the rows hold nr rows of nb blocks.
                    black_box(unsafe { pack_a_iq3s(&rows, row_len, r0, TILE, blk, &mut a) });
                }
            }
            best = best.min(t0.elapsed().as_secs_f64());
        }
        println!(
            "pack_a_iq3s: {:.1} ns per (row, block)",
            best * 1e9 / (nr * nb) as f64
        );
    }
    for nt in [16usize, 32, 64] {
        let k = rows_kernel::<IQ3S_MANY> as Kernel;
        let best = ab_lookahead(k, n, &rows, row_len, &acts[..nt], reps);
        report(&format!("IQ3_S many, {nt} tokens"), best, nr * nb);
    }
    // Q4_K (144-byte blocks, d and dmin = 1), both orders, 32 tokens
    let q4_len = WB * nb;
    let mut q4 = vec![0u8; nr * q4_len];
    fill(&mut q4, 9);
    for blk in q4.chunks_exact_mut(WB) {
        blk[..2].copy_from_slice(&0x3c00u16.to_le_bytes());
        blk[2..4].copy_from_slice(&0x3c00u16.to_le_bytes());
    }
    for (name, k) in [
        ("Q4_K single", rows_kernel::<K4_SINGLE> as Kernel),
        ("Q4_K many", rows_kernel::<K4_MANY>),
    ] {
        let best = ab_lookahead(k, n, &q4, q4_len, &acts[..32], reps);
        report(&format!("{name}, 32 tokens"), best, nr * nb);
    }
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
