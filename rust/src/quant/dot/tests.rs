//! Kernel tests: every SIMD path equals the scalar one bitwise on random blocks, and the
//! activation quantizers keep their invariants. Agreement with ggml itself (quantizers
//! byte-equal, dots within the stated bound) is tested from Python (tests/test_dot.py),
//! where llama.cpp's libraries and gguf-py are at hand.

use super::*;
use half::f16;

/// This thread's CPU time in ns (the throughput benches: preemption on a loaded machine does
/// not count).
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// xorshift64*: reproducible random bytes without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Roughly normal, with an occasional outlier as real activations have.
    pub fn act(&mut self) -> f32 {
        let v = (0..4).map(|_| self.f32()).sum::<f32>() - 2.0;
        if self.next().is_multiple_of(64) {
            v * 20.0
        } else {
            v
        }
    }
    /// A finite f16 scale of either sign, magnitude 2^-12 .. 2^2.
    pub fn scale(&mut self) -> [u8; 2] {
        let mag = 2f32.powf(-12.0 + 14.0 * self.f32());
        let s = if self.next() & 1 == 0 { mag } else { -mag };
        f16::from_f32(s).to_bits().to_le_bytes()
    }
}

/// Offsets of the f16 scale fields of a block of `w` (to be overwritten with finite ones).
pub fn scale_offsets(w: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match w {
        Q4_0 | Q5_0 | Q8_0 | IQ4NL | Q2_0 | IQ2XXS | IQ2XS | IQ2S | IQ3XXS | IQ3S | IQ1S
        | IQ4XS => &[0],
        Q4_1 | Q5_1 | Q4K | Q5K => &[0, 2],
        Q2K => &[80, 82],
        Q3K => &[108],
        Q6K => &[208],
        TQ1_0 => &[52],
        TQ2_0 => &[64],
        _ => &[],
    }
}

/// Rows (`rb` bytes each) of Q4_K or Q6_K at their extremes, in place: every quant bit set
/// (Q4_K nibbles 15, Q6_K values 63) and, for Q6_K, the scales at 127, −128, −1, 1 by row;
/// d and the other scale fields stay as they were (finite).
pub fn set_extreme_k_rows(w: GgmlType, m: &mut [u8], rb: usize) {
    for (k, row) in m.chunks_exact_mut(rb).enumerate() {
        for blk in row.chunks_exact_mut(w.block().1) {
            match w {
                GgmlType::Q4K => blk[16..144].fill(0xff),
                GgmlType::Q6K => {
                    blk[..192].fill(0xff);
                    blk[192..208].fill([127u8, 0x80, 0xff, 1][k % 4]);
                }
                _ => panic!("extreme rows of {w:?}: Q4_K or Q6_K only"),
            }
        }
    }
}

/// A Q8_K activation of `n` elements with every value `v` (d = 1; bsums = 16·v).
pub fn flat_q8k_act(n: usize, v: i8) -> Vec<u8> {
    let mut a = Vec::new();
    for _ in 0..n / 256 {
        a.extend_from_slice(&1f32.to_le_bytes());
        a.extend(std::iter::repeat_n(v as u8, 256));
        for _ in 0..16 {
            a.extend_from_slice(&(16 * v as i16).to_le_bytes());
        }
    }
    a
}

/// A random weight row of `n` elements with finite scales.
pub fn random_row(w: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut row: Vec<u8> = (0..w.row_bytes(n).unwrap())
        .map(|_| rng.next() as u8)
        .collect();
    let (bs, ts) = w.block();
    match w {
        GgmlType::F32 => {
            for c in row.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.act().to_le_bytes());
            }
        }
        GgmlType::F16 | GgmlType::BF16 => {
            let mut x = vec![0f32; n];
            x.iter_mut().for_each(|v| *v = rng.act());
            quantize_act(w, &x, &mut row).unwrap();
        }
        GgmlType::MXFP4 => {
            for b in row.chunks_exact_mut(ts) {
                b[0] = 110 + (rng.next() % 30) as u8;
            }
        }
        GgmlType::IQ1M => {
            for b in row.chunks_exact_mut(ts) {
                let d = u16::from_le_bytes(rng.scale());
                for i in 0..4 {
                    let o = 48 + 2 * i;
                    let word = (u16::from_le_bytes([b[o], b[o + 1]]) & 0x0fff)
                        | (((d >> (4 * i)) & 15) << 12);
                    b[o..o + 2].copy_from_slice(&word.to_le_bytes());
                }
            }
        }
        _ => {
            for b in row.chunks_exact_mut(ts) {
                for &o in scale_offsets(w) {
                    b[o..o + 2].copy_from_slice(&rng.scale());
                }
            }
        }
    }
    let _ = bs;
    row
}

pub fn random_act(w: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let x: Vec<f32> = (0..n).map(|_| rng.act()).collect();
    let mut a = vec![0u8; act_bytes(w, n).unwrap()];
    quantize_act(w.vec_dot_type(), &x, &mut a).unwrap();
    a
}

fn all_supported() -> Vec<GgmlType> {
    GgmlType::ALL.into_iter().filter(|&w| supports(w)).collect()
}

/// Compare `isa`'s kernels with scalar on random rows of several lengths; returns how
/// many native kernels were checked.
fn simd_equals_scalar(isa: Isa) -> usize {
    let mut checked = 0;
    for w in all_supported() {
        if !has_native_kernel(isa, w) {
            continue;
        }
        checked += 1;
        let k = kernel_for(isa, w).unwrap();
        let s = kernel_for(Isa::Scalar, w).unwrap();
        let mut rng = Rng::new(w.id() as u64 + 77);
        let bs = w.block_size().max(32);
        for nb in [1usize, 2, 3, 7, 8, 9, 16, 17, 40] {
            let n = (nb * bs).max(w.block_size());
            for _ in 0..8 {
                let row = random_row(w, n, &mut rng);
                let act = random_act(w, n, &mut rng);
                let (got, want) = (k(n, &row, &act), s(n, &row, &act));
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{} {} n={n}: {got} != scalar {want}",
                    isa.name(),
                    w.name()
                );
            }
        }
    }
    checked
}

#[test]
#[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx2"]
fn avx2_equals_scalar() {
    super::require_isa(Isa::Avx2, "avx2_equals_scalar");
    let n = simd_equals_scalar(Isa::Avx2);
    println!("avx2: {n} native kernels equal scalar");
    assert!(n >= 5);
}

#[test]
#[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx512"]
fn avx512_equals_scalar() {
    super::require_isa(Isa::Avx512, "avx512_equals_scalar");
    let n = simd_equals_scalar(Isa::Avx512);
    println!("avx512: {n} native kernels equal scalar");
    assert!(n >= 5);
    // On a VNNI CPU the table holds the VNNI variants; check the plain AVX-512BW ones too.
    let mut rng = Rng::new(3);
    for w in all_supported() {
        let Some(k) = avx512::kernel_with(w, false) else {
            continue;
        };
        let s = kernel_for(Isa::Scalar, w).unwrap();
        for nb in [1usize, 2, 3, 9] {
            let n = nb * w.block_size().max(32);
            let (row, act) = (random_row(w, n, &mut rng), random_act(w, n, &mut rng));
            assert_eq!(
                k(n, &row, &act).to_bits(),
                s(n, &row, &act).to_bits(),
                "{}",
                w.name()
            );
        }
    }
}

#[test]
fn q8_k_invariants() {
    let mut rng = Rng::new(5);
    let x: Vec<f32> = (0..1024).map(|_| rng.act()).collect();
    let mut out = vec![0u8; 4 * 292];
    quantize_act(GgmlType::Q8K, &x, &mut out).unwrap();
    for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact(292)) {
        let d = f32::from_le_bytes(ob[0..4].try_into().unwrap());
        let q: Vec<i32> = ob[4..260].iter().map(|&b| b as i8 as i32).collect();
        assert!(q.iter().all(|v| (-127..=127).contains(v)));
        for k in 0..16 {
            let bs = i16::from_le_bytes([ob[260 + 2 * k], ob[261 + 2 * k]]) as i32;
            assert_eq!(bs, q[16 * k..16 * k + 16].iter().sum::<i32>());
        }
        for (v, qv) in xb.iter().zip(&q) {
            assert!((v - d * *qv as f32).abs() <= d.abs() * 0.5001);
        }
    }
    // An all-zero block: zero scale, quants and sums.
    let mut z = vec![1u8; 292];
    quantize_act(GgmlType::Q8K, &[0f32; 256], &mut z).unwrap();
    assert!(z.iter().all(|&b| b == 0));
}

/// The AVX-512 Q8_K block equals the element loop bit for bit (`q8_k_block_equals_scalar`).
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx512"]
fn q8_k_avx512_equals_scalar_bitwise() {
    super::require_isa(Isa::Avx512, "q8_k_avx512_equals_scalar_bitwise");
    q8_k_block_equals_scalar("avx512", super::act::q8_k512::block);
}

/// The AVX2 Q8_K block equals the element loop bit for bit (`q8_k_block_equals_scalar`).
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx2"]
fn q8_k_avx2_equals_scalar_bitwise() {
    super::require_isa(Isa::Avx2, "q8_k_avx2_equals_scalar_bitwise");
    q8_k_block_equals_scalar("avx2", super::act::q8_k256::block);
}

/// A SIMD Q8_K block against the element loop, bit for bit: random blocks, ties of opposite
/// sign at the largest magnitude, tiny and subnormal maxima, a lone nonzero, and the blocks
/// it leaves to the loop (NaN, infinities, −127/max overflowing). The caller checked that
/// the CPU runs `block`.
#[cfg(target_arch = "x86_64")]
fn q8_k_block_equals_scalar(name: &str, block: unsafe fn(&[f32], &mut [u8]) -> bool) {
    let mut rng = Rng::new(77);
    let mut blocks: Vec<Vec<f32>> = (0..200)
        .map(|b| {
            let scale = [1.0f32, 1e-3, 1e3, 1e-30][b % 4];
            (0..256).map(|_| rng.act() * scale).collect()
        })
        .collect();
    let mut tie = blocks[0].clone();
    (tie[17], tie[200]) = (-9.5, 9.5);
    blocks.push(tie.clone());
    (tie[17], tie[200]) = (9.5, -9.5);
    blocks.push(tie);
    let mut lone = vec![0f32; 256];
    lone[255] = -3.0e-42; // subnormal: −127/max overflows
    blocks.push(lone.clone());
    lone[255] = 1.0e-36; // −127/max finite, near the largest float
    blocks.push(lone);
    for odd in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut b = blocks[1].clone();
        b[100] = odd;
        blocks.push(b);
    }
    let mut taken = 0;
    for xb in &blocks {
        let (mut v, mut s) = (vec![0xAAu8; 292], vec![0x55u8; 292]);
        super::act::q8_k_block(xb, &mut s);
        // SAFETY: the CPU runs the kernel (the caller checked); one block.
        if unsafe { block(xb, &mut v) } {
            assert_eq!(v, s, "{name} block {:?}", &xb[..4]);
            taken += 1;
        }
        let mut q = vec![0u8; 292];
        quantize_act(GgmlType::Q8K, xb, &mut q).unwrap();
        assert_eq!(q, s);
    }
    // the NaN, ±∞ and overflowing blocks are the element loop's
    assert_eq!(taken, blocks.len() - 4, "{name} takes every other block");
}

#[test]
fn bad_operands_are_errors() {
    let mut a = vec![0u8; 10];
    assert!(quantize_act(GgmlType::Q8_0, &[0f32; 33], &mut a).is_err());
    assert!(quantize_act(GgmlType::Q4K, &[0f32; 256], &mut a).is_err());
    let row = vec![0u8; 144];
    let act = vec![0u8; 292];
    assert!(vec_dot_isa(Isa::Scalar, GgmlType::Q4K, 256, &row, &act[..291]).is_err());
    assert!(vec_dot_isa(Isa::Scalar, GgmlType::I8, 256, &row, &act).is_err());
    assert!(vec_dot_isa(Isa::Scalar, GgmlType::Q4K, 256, &row, &act).is_ok());
}

#[test]
fn every_expert_type_has_a_kernel() {
    use GgmlType::*;
    for w in [
        Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, IQ2XXS, IQ2XS, IQ2S, IQ3XXS, IQ3S,
        IQ1S, IQ1M, IQ4NL, IQ4XS, TQ1_0, TQ2_0, MXFP4, Q2_0, F16, BF16, F32,
    ] {
        assert!(supports(w), "{}", w.name());
    }
}

#[test]
fn rows_match_single_dots() {
    let mut rng = Rng::new(9);
    let (w, n) = (GgmlType::Q4K, 512);
    let rows: Vec<u8> = (0..3).flat_map(|_| random_row(w, n, &mut rng)).collect();
    let act = random_act(w, n, &mut rng);
    let mut out = [0f32; 3];
    vec_dot_rows(w, n, &rows, &act, &mut out);
    let rb = w.row_bytes(n).unwrap();
    for (r, o) in out.iter().enumerate() {
        let one = vec_dot(w, n, &rows[r * rb..(r + 1) * rb], &act);
        assert_eq!(o.to_bits(), one.to_bits());
    }
}

#[test]
fn q8_0_rounds_half_to_even() {
    let mut rng = Rng::new(11);
    let specials = [
        0.5f32,
        -0.5,
        1.5,
        -1.5,
        2.5,
        126.5,
        -126.5,
        0.49999997,
        -0.49999997,
        0.0,
    ];
    let randoms = (0..100_000).map(|_| (rng.f32() - 0.5) * 254.0);
    for v in specials.into_iter().chain(randoms) {
        let mut out = [0u8; 34];
        let mut x = [0f32; 32];
        x[0] = 127.0; // d = 1, so q = round(v)
        x[1] = v;
        act::q8_0(&x, &mut out);
        assert_eq!(out[3] as i8 as i32, v.round_ties_even() as i32, "{v}");
    }
}

#[test]
#[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx2"]
fn simd_kernels_check_their_slices() {
    super::require_isa(Isa::Avx2, "simd_kernels_check_their_slices");
    let isa = best_isa();
    for w in [GgmlType::Q4K, GgmlType::Q8_0, GgmlType::F32] {
        let k = kernel_for(isa, w).unwrap();
        let n = 512;
        let row = vec![0u8; w.row_bytes(n).unwrap()];
        let act = vec![0u8; act_bytes(w, n).unwrap()];
        assert_eq!(k(n, &row, &act), 0.0);
        for (r, a) in [(&row[1..], &act[..]), (&row[..], &act[1..])] {
            let res = std::panic::catch_unwind(|| k(n, r, a));
            assert!(res.is_err(), "{}: short slice accepted", w.name());
        }
    }
}

/// The multi-row (tinyBLAS / tiled) orders: AVX2 bitwise equal to scalar, and within the
/// float rounding of the one-row order.
#[test]
#[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx2"]
fn multi_row_orders_avx2_equal_scalar() {
    use GgmlType::*;
    super::require_isa(Isa::Avx2, "multi_row_orders_avx2_equal_scalar");
    let mut rng = Rng::new(11);
    for w in [F32, Q6K, IQ3S, Q4K] {
        let scalar = kernel_many(Isa::Scalar, w).expect("scalar multi-row kernel");
        for &n in &[256usize, 512, 1024] {
            let row = random_row(w, n, &mut rng);
            let act = random_act(w, n, &mut rng);
            let s = scalar(n, &row, &act);
            let one = vec_dot_isa(Isa::Scalar, w, n, &row, &act).unwrap();
            assert!(
                (s - one).abs() <= 1e-4 * one.abs().max(1.0),
                "{w:?} {n}: {s} vs {one}"
            );
            let v = kernel_many(Isa::Avx2, w).unwrap()(n, &row, &act);
            assert_eq!(s.to_bits(), v.to_bits(), "{w:?} n={n}");
        }
    }
    assert!(kernel_many(Isa::Scalar, Q8_0).is_none());
}

#[test]
fn strata_isa_variable_is_capped_at_the_cpu() {
    use super::{best_isa, env_isa, Isa};
    let best = best_isa();
    assert_eq!(env_isa(None), best);
    assert_eq!(env_isa(Some("auto")), best);
    assert_eq!(env_isa(Some("sse9")), best);
    assert_eq!(env_isa(Some("scalar")), Isa::Scalar);
    // a named ISA the CPU lacks falls back to its best
    let capped = |i: Isa| if i.available() { i } else { best };
    assert_eq!(env_isa(Some("AVX2")), capped(Isa::Avx2));
    assert_eq!(env_isa(Some("avx512")), capped(Isa::Avx512));
}
