//! Pool tests: bitwise parity with the serial reference over schedules, worker counts and host
//! participation; the reference against float64 math on dequantized weights; typed errors.

use super::reference::{matmul_serial, moe_serial};
use super::*;
use crate::quant::dequantize;
use half::f16;

/// xorshift64*: reproducible test data without a dependency.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    pub(crate) fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `n` rows of `cols` random weights in type `ty` (F32, or Q8_0 blocks with random scales).
pub(crate) fn random_rows(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut out = Vec::new();
    match ty {
        GgmlType::F32 => {
            for _ in 0..rows * cols {
                out.extend_from_slice(&(rng.f() * 0.2).to_le_bytes());
            }
        }
        GgmlType::Q8_0 => {
            for _ in 0..rows * cols / 32 {
                let d = f16::from_f32(0.002 + 0.002 * rng.f().abs());
                out.extend_from_slice(&d.to_bits().to_le_bytes());
                for _ in 0..32 {
                    out.push(rng.next() as u8);
                }
            }
        }
        // Random blocks with small finite f16 scales at the formats' scale fields.
        GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K | GgmlType::IQ3S => {
            let (_, bs) = ty.block();
            let offs: &[usize] = match ty {
                GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
                GgmlType::Q6K => &[208],
                _ => &[0],
            };
            for _ in 0..rows * cols / 256 {
                let mut b: Vec<u8> = (0..bs).map(|_| rng.next() as u8).collect();
                for &o in offs {
                    let d = f16::from_f32(0.0005 + 0.001 * rng.f().abs());
                    b[o..o + 2].copy_from_slice(&d.to_bits().to_le_bytes());
                }
                out.extend_from_slice(&b);
            }
        }
        other => panic!("test data for {} not written", other.name()),
    }
    out
}

pub(crate) struct Layer {
    tys: [GgmlType; 3],
    bytes: [Vec<u8>; 3],
    pub(crate) e: usize,
    pub(crate) h: usize,
    pub(crate) i: usize,
}

impl Layer {
    pub(crate) fn new(seed: u64, tys: [GgmlType; 3], e: usize, h: usize, i: usize) -> Layer {
        let mut rng = Rng(seed);
        let bytes = [
            random_rows(&mut rng, tys[0], e * i, h),
            random_rows(&mut rng, tys[1], e * i, h),
            random_rows(&mut rng, tys[2], e * h, i),
        ];
        Layer {
            tys,
            bytes,
            e,
            h,
            i,
        }
    }
    pub(crate) fn view(&self) -> ExpertLayer<'_> {
        let m = |n: usize, rows, cols| QExperts {
            ty: self.tys[n],
            data: &self.bytes[n],
            n_expert: self.e,
            rows,
            cols,
            slabs: None,
        };
        ExpertLayer {
            gate: m(0, self.i, self.h),
            up: m(1, self.i, self.h),
            down: m(2, self.h, self.i),
        }
    }
}

/// Routing for `t` tokens × `k` slots: distinct experts within a token, random weights.
pub(crate) fn routing(rng: &mut Rng, t: usize, k: usize, e: usize) -> (Vec<u32>, Vec<f32>) {
    let mut ids = Vec::new();
    for _ in 0..t {
        let mut row: Vec<u32> = Vec::new();
        while row.len() < k {
            let c = rng.below(e) as u32;
            if !row.contains(&c) {
                row.push(c);
            }
        }
        ids.extend(row);
    }
    let w = (0..t * k).map(|_| rng.f().abs() + 0.01).collect();
    (ids, w)
}

pub(crate) fn cfg(workers: usize, host: bool, pipelined: bool) -> PoolConfig {
    PoolConfig {
        workers,
        host_participates: host,
        pipelined,
        pin: false,
        spin_us: 50,
        balanced: true,
    }
}

pub(crate) fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

pub(crate) const MIXES: [[GgmlType; 3]; 3] = [
    [GgmlType::F32, GgmlType::F32, GgmlType::F32],
    [GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0],
    [GgmlType::Q8_0, GgmlType::F32, GgmlType::Q8_0],
];

#[test]
fn moe_is_bitwise_identical_to_the_serial_reference() {
    let mut pools: Vec<Pool> = [(0, true), (1, true), (1, false), (3, true), (3, false)]
        .iter()
        .flat_map(|&(w, host)| [false, true].map(|p| Pool::new(cfg(w, host, p))))
        .collect();
    // decode calls' tiles as multi-token calls cut them (`balanced` off)
    pools.push(Pool::new(PoolConfig {
        balanced: false,
        ..cfg(3, true, false)
    }));
    let mut rng = Rng(7);
    for (m, tys) in MIXES.iter().enumerate() {
        let layer = Layer::new(100 + m as u64, *tys, 16, 64, 96);
        let view = layer.view();
        for &(t, k) in &[(1, 1), (1, 4), (2, 2), (3, 8), (5, 3), (9, 16)] {
            let x: Vec<f32> = (0..t * layer.h).map(|_| rng.f()).collect();
            let (ids, w) = routing(&mut rng, t, k, layer.e);
            let mut want = vec![0f32; t * layer.h];
            moe_serial(&view, &MoeInput::new(&x, &ids, &w, k), &mut want).unwrap();
            for pool in &pools {
                let mut y = vec![f32::NAN; t * layer.h];
                pool.moe(&view, &MoeInput::new(&x, &ids, &w, k), &mut y)
                    .unwrap();
                assert_eq!(
                    bits(&y),
                    bits(&want),
                    "mix {m} T={t} k={k} {:?}",
                    pool.config()
                );
            }
        }
    }
}

/// Experts given as per-expert slabs (copies in separate buffers, as the RAM tier's arena
/// holds them) give bitwise the results of the contiguous stack; a slab of the wrong size or
/// a wrong slab count is a typed error.
#[test]
fn per_expert_slabs_match_the_contiguous_stack() {
    let pool = Pool::new(cfg(2, true, false));
    let mut rng = Rng(11);
    let layer = Layer::new(300, MIXES[2], 16, 64, 96);
    let view = layer.view();
    // Each expert's bytes copied into its own allocation.
    let copies: Vec<Vec<Vec<u8>>> = (0..3)
        .map(|n| {
            let eb = layer.bytes[n].len() / layer.e;
            layer.bytes[n].chunks(eb).map(|c| c.to_vec()).collect()
        })
        .collect();
    let tables: Vec<Vec<&[u8]>> = copies
        .iter()
        .map(|c| c.iter().map(|v| v.as_slice()).collect())
        .collect();
    let mut slabbed = view;
    for (m, t) in [&mut slabbed.gate, &mut slabbed.up, &mut slabbed.down]
        .into_iter()
        .zip(&tables)
    {
        m.data = &[];
        m.slabs = Some(t);
    }
    for &(t, k) in &[(1, 4), (3, 8), (9, 16)] {
        let x: Vec<f32> = (0..t * layer.h).map(|_| rng.f()).collect();
        let (ids, w) = routing(&mut rng, t, k, layer.e);
        let mut want = vec![0f32; t * layer.h];
        pool.moe(&view, &MoeInput::new(&x, &ids, &w, k), &mut want)
            .unwrap();
        let mut y = vec![f32::NAN; t * layer.h];
        pool.moe(&slabbed, &MoeInput::new(&x, &ids, &w, k), &mut y)
            .unwrap();
        assert_eq!(bits(&y), bits(&want), "T={t} k={k}");
        let mut r = vec![f32::NAN; t * layer.h];
        moe_serial(&slabbed, &MoeInput::new(&x, &ids, &w, k), &mut r).unwrap();
        assert_eq!(bits(&r), bits(&want), "serial T={t} k={k}");
    }
    let short = &tables[0][..layer.e - 1];
    let mut bad = slabbed;
    bad.gate.slabs = Some(short);
    let (ids, w) = routing(&mut rng, 1, 2, layer.e);
    let x = vec![0.5f32; layer.h];
    let mut y = vec![0f32; layer.h];
    assert!(pool
        .moe(&bad, &MoeInput::new(&x, &ids, &w, 2), &mut y)
        .is_err());
}

/// The reference (and so the pool) against float64 math on dequantized F32 weights, where the
/// activation formats are exact (F32): only float32 rounding separates them.
#[test]
fn reference_matches_float64_math() {
    let layer = Layer::new(5, [GgmlType::F32; 3], 6, 64, 32);
    let view = layer.view();
    let mut rng = Rng(11);
    let (t, k) = (3, 2);
    let x: Vec<f32> = (0..t * layer.h).map(|_| rng.f()).collect();
    let (ids, w) = routing(&mut rng, t, k, layer.e);
    let mut y = vec![0f32; t * layer.h];
    Pool::new(cfg(2, true, true))
        .moe(&view, &MoeInput::new(&x, &ids, &w, k), &mut y)
        .unwrap();
    let deq = |n: usize| {
        let mut out = vec![0f32; layer.bytes[n].len() / 4];
        dequantize(GgmlType::F32, &layer.bytes[n], &mut out).unwrap();
        out
    };
    let (g, u, d) = (deq(0), deq(1), deq(2));
    let (h, i) = (layer.h, layer.i);
    for tok in 0..t {
        let xt = &x[tok * h..(tok + 1) * h];
        let mut want = vec![0f64; h];
        for j in 0..k {
            let e = ids[tok * k + j] as usize;
            let dot = |m: &[f32], row: usize, v: &[f64]| -> f64 {
                v.iter()
                    .enumerate()
                    .map(|(c, &a)| m[row * v.len() + c] as f64 * a)
                    .sum()
            };
            let x64: Vec<f64> = xt.iter().map(|&v| v as f64).collect();
            let hid: Vec<f64> = (0..i)
                .map(|r| {
                    let gv = dot(&g, e * i + r, &x64);
                    gv / (1.0 + (-gv).exp()) * dot(&u, e * i + r, &x64)
                })
                .collect();
            for (r, wr) in want.iter_mut().enumerate() {
                *wr += w[tok * k + j] as f64 * dot(&d, e * h + r, &hid);
            }
        }
        for r in 0..h {
            let got = y[tok * h + r] as f64;
            assert!(
                (got - want[r]).abs() <= 1e-5 + 1e-4 * want[r].abs(),
                "token {tok} row {r}: {got} vs {}",
                want[r]
            );
        }
    }
}

#[test]
fn matmul_matches_reference_and_float64() {
    let mut rng = Rng(3);
    for ty in [GgmlType::F32, GgmlType::Q8_0] {
        let (rows, cols, t) = (77, 64, 4);
        let data = random_rows(&mut rng, ty, rows, cols);
        let w = QMatrix {
            ty,
            data: &data,
            rows,
            cols,
        };
        let x: Vec<f32> = (0..t * cols).map(|_| rng.f()).collect();
        let mut want = vec![0f32; t * rows];
        matmul_serial(&w, &x, t, &mut want).unwrap();
        for c in [
            cfg(0, true, false),
            cfg(2, true, false),
            cfg(2, false, true),
        ] {
            let mut y = vec![f32::NAN; t * rows];
            Pool::new(c).matmul(&w, &x, t, &mut y).unwrap();
            assert_eq!(bits(&y), bits(&want), "{} {c:?}", ty.name());
        }
        // Against float64 on the dequantized weights (Q8_0 activation rounding: loose bound).
        let mut wf = vec![0f32; rows * cols];
        dequantize(ty, &data, &mut wf).unwrap();
        let tol = if ty == GgmlType::F32 { 1e-5 } else { 2e-2 };
        for tok in 0..t {
            for r in 0..rows {
                let exact: f64 = (0..cols)
                    .map(|c| wf[r * cols + c] as f64 * x[tok * cols + c] as f64)
                    .sum();
                let got = want[tok * rows + r] as f64;
                assert!((got - exact).abs() <= tol, "{} {got} vs {exact}", ty.name());
            }
        }
    }
}

#[test]
fn many_jobs_and_growing_calls_reuse_the_pool() {
    let layer = Layer::new(9, [GgmlType::Q8_0; 3], 128, 64, 32);
    let view = layer.view();
    let pool = Pool::new(cfg(3, true, true));
    let barrier = Pool::new(cfg(2, false, false));
    let mut rng = Rng(21);
    for &(t, k) in &[(1, 8), (4, 25), (1, 97), (2, 2), (8, 8), (1, 1)] {
        let x: Vec<f32> = (0..t * layer.h).map(|_| rng.f()).collect();
        let (ids, w) = routing(&mut rng, t, k, layer.e);
        let mut want = vec![0f32; t * layer.h];
        moe_serial(&view, &MoeInput::new(&x, &ids, &w, k), &mut want).unwrap();
        for p in [&pool, &barrier] {
            let mut y = vec![0f32; t * layer.h];
            p.moe(&view, &MoeInput::new(&x, &ids, &w, k), &mut y)
                .unwrap();
            assert_eq!(bits(&y), bits(&want), "T={t} k={k}");
        }
    }
}

#[test]
fn bad_inputs_are_typed_errors_and_leave_y_alone() {
    let layer = Layer::new(1, [GgmlType::Q8_0; 3], 4, 64, 32);
    let view = layer.view();
    let pool = Pool::new(cfg(1, true, false));
    let x = vec![0.5f32; 64];
    let mut y = vec![7f32; 64];
    let shape_err = |r: Result<()>| matches!(r, Err(Error::Shape(_)));
    assert!(shape_err(pool.moe(
        &view,
        &MoeInput::new(&x, &[4], &[1.0], 1),
        &mut y
    )));
    assert!(shape_err(pool.moe(
        &view,
        &MoeInput::new(&x, &[u32::MAX], &[1.0], 1),
        &mut y
    )));
    assert!(shape_err(pool.moe(
        &view,
        &MoeInput::new(&x, &[0, 1], &[1.0], 2),
        &mut y
    )));
    assert!(shape_err(pool.moe(
        &view,
        &MoeInput::new(&x[..10], &[0], &[1.0], 1),
        &mut y
    )));
    assert!(shape_err(pool.moe(
        &view,
        &MoeInput::new(&x, &[0], &[1.0], 1),
        &mut y[..32]
    )));
    let mut short = view;
    short.down.data = &layer.bytes[2][..100];
    assert!(shape_err(pool.moe(
        &short,
        &MoeInput::new(&x, &[0], &[1.0], 1),
        &mut y
    )));
    let mut swapped = view;
    swapped.down = view.gate;
    assert!(shape_err(pool.moe(
        &swapped,
        &MoeInput::new(&x, &[0], &[1.0], 1),
        &mut y
    )));
    let mut odd = view;
    odd.gate.cols = 48; // not whole Q8_0 blocks
    assert!(matches!(
        pool.moe(&odd, &MoeInput::new(&x, &[0], &[1.0], 1), &mut y),
        Err(Error::Quant(_))
    ));
    assert!(y.iter().all(|&v| v == 7.0));
    let w = QMatrix {
        ty: GgmlType::Q8_0,
        data: &layer.bytes[0][..34 * 2],
        rows: 1,
        cols: 64,
    };
    assert!(shape_err(pool.matmul(&w, &x, 2, &mut y)));
    // k = 0: no expert, y = 0.
    pool.moe(&view, &MoeInput::new(&x, &[], &[], 0), &mut y)
        .unwrap();
    assert!(y.iter().all(|&v| v == 0.0));
}

#[test]
fn parked_workers_wake_for_calls_and_exit_on_drop() {
    let layer = Layer::new(2, [GgmlType::F32; 3], 4, 32, 16);
    let view = layer.view();
    let mut c = cfg(2, false, true);
    c.spin_us = 0;
    let pool = Pool::new(c);
    let x = vec![0.25f32; 32];
    let mut want = vec![0f32; 32];
    moe_serial(
        &view,
        &MoeInput::new(&x, &[1, 3], &[0.5, 0.5], 2),
        &mut want,
    )
    .unwrap();
    for _ in 0..20 {
        std::thread::sleep(std::time::Duration::from_millis(2));
        let mut y = vec![0f32; 32];
        pool.moe(&view, &MoeInput::new(&x, &[1, 3], &[0.5, 0.5], 2), &mut y)
            .unwrap();
        assert_eq!(bits(&y), bits(&want));
    }
    drop(pool);
}

#[test]
fn for_threads_counts_the_caller_as_llama_cpp_counts_t() {
    // threads = compute threads in all (llama.cpp's -t): a participating caller is one of them
    let c = PoolConfig::for_threads(2, true, true);
    assert_eq!(
        (c.workers, c.host_participates, c.pipelined),
        (1, true, true)
    );
    let c = PoolConfig::for_threads(1, true, false);
    assert_eq!(c.workers, 0, "the caller alone");
    // a caller that only waits is not a compute thread
    let c = PoolConfig::for_threads(2, false, false);
    assert_eq!((c.workers, c.host_participates), (2, false));
    // 0: one compute thread per physical core, the caller among them
    let cores = crate::pool::topology::physical_cores().len().max(1);
    assert_eq!(PoolConfig::for_threads(0, true, false).workers, cores - 1);
    assert_eq!(PoolConfig::default().workers, cores.saturating_sub(1));
}
