//! Pool tests of batched calls (`matmul_segs`, `moe_segs`, `moe_masked_segs`): each segment's
//! rows are bitwise the serial reference run on that segment alone, whatever segments share
//! the call (batch invariance at the kernel level), on every type with a multi-row order.

use super::reference::{matmul_serial, moe_serial};
use super::tests::{bits, cfg, random_rows, routing, Layer, Rng};
use super::*;

/// Random segment lengths covering `t` rows (1..=max each), in a random order of sizes.
fn random_segs(rng: &mut Rng, t: usize, max: usize) -> Vec<usize> {
    let mut segs = Vec::new();
    let mut left = t;
    while left > 0 {
        let n = (1 + rng.below(max)).min(left);
        segs.push(n);
        left -= n;
    }
    segs
}

/// Batches mixing one-row segments (decode) with segments of 8+ rows (where Q6_K / IQ3_S
/// jobs and Q4_K / F32 dense rows take ggml's multi-row order), so that the pairs of one
/// expert mix orders within a job: every segment equals its own serial call.
#[test]
fn segments_equal_their_calls_alone() {
    let pools = [
        cfg(0, true, false),
        cfg(2, true, true),
        cfg(1, false, false),
    ]
    .map(Pool::new);
    let mut rng = Rng(77);
    let mixes = [
        [GgmlType::Q4K, GgmlType::Q4K, GgmlType::Q6K],
        [GgmlType::IQ3S, GgmlType::IQ3S, GgmlType::IQ3S],
        [GgmlType::F32, GgmlType::Q8_0, GgmlType::Q6K],
    ];
    for (m, tys) in mixes.iter().enumerate() {
        let layer = Layer::new(500 + m as u64, *tys, 4, 256, 256);
        let view = layer.view();
        for round in 0..6 {
            let k = 2 + round % 2;
            let t = [5, 12, 30, 47, 64, 9][round];
            let segs = match round {
                0 => vec![1; t],
                5 => vec![9],
                _ => random_segs(&mut rng, t, 20),
            };
            let x: Vec<f32> = (0..t * layer.h).map(|_| rng.f()).collect();
            let (mut ids, w) = routing(&mut rng, t, k, layer.e);
            // masked variant: a few pairs computed elsewhere
            let mut masked = ids.clone();
            for v in masked.iter_mut().step_by(5) {
                *v = SKIP;
            }
            for (mi, ids) in [&mut ids, &mut masked].into_iter().enumerate() {
                let mut want = vec![0f32; t * layer.h];
                let mut t0 = 0;
                for &n in &segs {
                    let (xs, ps) = (t0 * layer.h..(t0 + n) * layer.h, t0 * k..(t0 + n) * k);
                    let (x, i, ww) = (&x[xs.clone()], &ids[ps.clone()], &w[ps]);
                    moe_serial(&view, &MoeInput::new(x, i, ww, k), &mut want[xs]).unwrap();
                    t0 += n;
                }
                for pool in &pools {
                    let mut y = vec![f32::NAN; t * layer.h];
                    match mi {
                        0 => pool.moe_segs(&view, &MoeInput::new(&x, ids, &w, k), &segs, &mut y),
                        _ => pool.moe_masked_segs(
                            &view,
                            &MoeInput::new(&x, ids, &w, k),
                            &segs,
                            &mut y,
                        ),
                    }
                    .unwrap();
                    assert_eq!(bits(&y), bits(&want), "mix {m} segs {segs:?} masked {mi}");
                }
            }
        }
    }
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::IQ3S, GgmlType::F32] {
        let (rows, cols) = (300, 512);
        let data = random_rows(&mut rng, ty, rows, cols);
        let w = QMatrix {
            ty,
            data: &data,
            rows,
            cols,
        };
        for segs in [vec![1, 1, 1], vec![3, 8, 1, 5], vec![13, 1, 40, 2], vec![6]] {
            let t: usize = segs.iter().sum();
            let x: Vec<f32> = (0..t * cols).map(|_| rng.f()).collect();
            let mut want = vec![0f32; t * rows];
            let mut t0 = 0;
            for &n in &segs {
                let (xs, ys) = (t0 * cols..(t0 + n) * cols, t0 * rows..(t0 + n) * rows);
                matmul_serial(&w, &x[xs], n, &mut want[ys]).unwrap();
                t0 += n;
            }
            for pool in &pools {
                let mut y = vec![f32::NAN; t * rows];
                pool.matmul_segs(&w, &x, &segs, &mut y).unwrap();
                assert_eq!(bits(&y), bits(&want), "{} segs {segs:?}", ty.name());
            }
        }
    }
}

/// Segments that do not cover the call's rows are refused with a shape error.
#[test]
fn segments_must_cover_the_rows() {
    let pool = Pool::new(cfg(1, true, false));
    let layer = Layer::new(9, [GgmlType::Q8_0; 3], 4, 256, 256);
    let mut rng = Rng(3);
    let x: Vec<f32> = (0..4 * layer.h).map(|_| rng.f()).collect();
    let (ids, w) = routing(&mut rng, 4, 2, layer.e);
    let mut y = vec![0f32; 4 * layer.h];
    let err = pool.moe_segs(
        &layer.view(),
        &MoeInput::new(&x, &ids, &w, 2),
        &[1, 2],
        &mut y,
    );
    assert!(matches!(err, Err(Error::Shape(_))), "{err:?}");
}
