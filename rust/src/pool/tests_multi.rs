//! Pool tests of prefill's multi-token tiles (weight reuse across up to `TILE_MAX_T` tokens, row
//! blocks, token groups split where ggml's float order changes) and of `for_each`.

use super::reference::{matmul_serial, moe_serial};
use super::tests::{bits, cfg, random_rows, routing, Layer, Rng};
use super::*;

/// MoE and dense calls on the types with multi-token kernels are bitwise equal to the serial
/// reference (`vec_dot_id` / `vec_dot_t` per element): jobs of fewer and of more than 8 pairs
/// (Q6_K / IQ3_S switch to ggml's tiled order at 8), more pairs than one token group, dense
/// calls of several row blocks, and token counts whose Q4_K rows split between the repacked
/// gemm order and the gemv order (t mod 4 ≠ 0); one token (decode: grouped row kernels over
/// tiles whose row counts are not multiples of the group); IQ3_S jobs and dense calls of more
/// than one 32-token group.
#[test]
fn multi_token_tiles_match_the_serial_reference() {
    let pools = [
        cfg(0, true, false),
        cfg(2, true, true),
        cfg(1, false, false),
    ]
    .map(Pool::new);
    let mut rng = Rng(11);
    let mixes = [
        [GgmlType::Q4K, GgmlType::Q4K, GgmlType::Q6K],
        [GgmlType::IQ3S, GgmlType::Q5K, GgmlType::Q4K],
    ];
    for (m, tys) in mixes.iter().enumerate() {
        let layer = Layer::new(300 + m as u64, *tys, 4, 512, 256);
        let view = layer.view();
        // (40, 4): ~40 pairs per expert, more than IQ3_S's 32-token group
        for &(t, k) in &[(1, 2), (7, 2), (19, 3), (40, 4)] {
            let x: Vec<f32> = (0..t * layer.h).map(|_| rng.f()).collect();
            let (ids, w) = routing(&mut rng, t, k, layer.e);
            let mut want = vec![0f32; t * layer.h];
            moe_serial(&view, &MoeInput::new(&x, &ids, &w, k), &mut want).unwrap();
            for pool in &pools {
                let mut y = vec![f32::NAN; t * layer.h];
                pool.moe(&view, &MoeInput::new(&x, &ids, &w, k), &mut y)
                    .unwrap();
                assert_eq!(bits(&y), bits(&want), "mix {m} T={t} k={k}");
            }
        }
    }
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::IQ3S, GgmlType::Q5K] {
        // 700 rows of 512 columns: several 96 KiB row blocks per tile.
        let (rows, cols) = (700, 512);
        let data = random_rows(&mut rng, ty, rows, cols);
        let w = QMatrix {
            ty,
            data: &data,
            rows,
            cols,
        };
        // 45: an IQ3_S group of 32 tokens and one of 13; 270: past the tiles' 256-token call
        for t in [1, 3, 13, 45, 270] {
            let x: Vec<f32> = (0..t * cols).map(|_| rng.f()).collect();
            let mut want = vec![0f32; t * rows];
            matmul_serial(&w, &x, t, &mut want).unwrap();
            for pool in &pools {
                let mut y = vec![f32::NAN; t * rows];
                pool.matmul(&w, &x, t, &mut y).unwrap();
                assert_eq!(bits(&y), bits(&want), "{} T={t}", ty.name());
            }
        }
    }
}

/// `for_each` runs every index exactly once on any pool shape, and nothing for n = 0.
#[test]
fn for_each_runs_every_index_once() {
    use std::sync::atomic::AtomicU32;
    for c in [
        cfg(0, true, false),
        cfg(3, true, false),
        cfg(2, false, true),
    ] {
        let pool = Pool::new(c);
        for n in [0usize, 1, 5, 200] {
            let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
            pool.for_each(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            })
            .unwrap();
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "{c:?} n={n}"
            );
        }
    }
}
