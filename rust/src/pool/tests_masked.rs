//! Masked MoE calls (`Pool::moe_masked`, ids equal to `SKIP`): what the hybrid step uses to
//! compute only the experts that are not in VRAM.

use super::reference::moe_serial;
use super::tests::{bits, cfg, routing, Layer, Rng, MIXES};
use super::*;

/// Every slot skipped with probability ~1/3 (some tokens entirely).
fn mask(rng: &mut Rng, ids: &[u32]) -> Vec<u32> {
    ids.iter()
        .map(|&e| if rng.below(3) == 0 { SKIP } else { e })
        .collect()
}

/// One token's kept slots, compacted: `moe` on these is the independent expectation.
fn compact(ids: &[u32], w: &[f32]) -> (Vec<u32>, Vec<f32>) {
    ids.iter()
        .zip(w)
        .filter(|(&e, _)| e != SKIP)
        .map(|(&e, &w)| (e, w))
        .unzip()
}

/// A masked call equals, bitwise, the unmasked call on each token's kept slots alone (same
/// slot order), for the pool under every schedule and for the serial reference; a token with
/// every slot skipped gets exact zeros.
#[test]
fn masked_moe_equals_the_call_on_the_kept_pairs() {
    let pools: Vec<Pool> = [(0, true), (2, true), (3, false)]
        .iter()
        .flat_map(|&(w, host)| [false, true].map(|p| Pool::new(cfg(w, host, p))))
        .collect();
    let mut rng = Rng(91);
    for (m, tys) in MIXES.iter().enumerate() {
        let layer = Layer::new(500 + m as u64, *tys, 16, 64, 96);
        let view = layer.view();
        for &(t, k) in &[(1, 1), (1, 8), (3, 4), (6, 8)] {
            let x: Vec<f32> = (0..t * layer.h).map(|_| rng.f()).collect();
            let (ids, w) = routing(&mut rng, t, k, layer.e);
            let masked = mask(&mut rng, &ids);
            // Expectation, token by token, from unmasked serial calls on the kept slots.
            let mut want = vec![0f32; t * layer.h];
            for tok in 0..t {
                let r = tok * k..(tok + 1) * k;
                let (ci, cw) = compact(&masked[r.clone()], &w[r]);
                let yt = &mut want[tok * layer.h..(tok + 1) * layer.h];
                if ci.is_empty() {
                    yt.fill(0.0);
                    continue;
                }
                let xt = &x[tok * layer.h..(tok + 1) * layer.h];
                moe_serial(&view, &MoeInput::new(xt, &ci, &cw, ci.len()), yt).unwrap();
            }
            let mut r = vec![f32::NAN; t * layer.h];
            validate_moe_masked(&view, &MoeInput::new(&x, &masked, &w, k), &r).unwrap();
            moe_serial(&view, &MoeInput::new(&x, &masked, &w, k), &mut r).unwrap();
            assert_eq!(bits(&r), bits(&want), "serial mix {m} T={t} k={k}");
            for pool in &pools {
                let mut y = vec![f32::NAN; t * layer.h];
                pool.moe_masked(&view, &MoeInput::new(&x, &masked, &w, k), &mut y)
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

/// The hybrid split: resident part + missed part = the full layer (to float rounding: the two
/// partial sums are added instead of one left-to-right sum).
#[test]
fn resident_plus_missed_equals_the_full_moe() {
    let pool = Pool::new(cfg(2, true, false));
    let mut rng = Rng(17);
    let layer = Layer::new(700, MIXES[1], 32, 128, 64);
    let view = layer.view();
    for &(t, k) in &[(1, 8), (4, 8), (7, 4)] {
        let x: Vec<f32> = (0..t * layer.h).map(|_| rng.f()).collect();
        let (ids, w) = routing(&mut rng, t, k, layer.e);
        let resident: Vec<bool> = (0..layer.e).map(|_| rng.below(2) == 0).collect();
        let split = |keep_resident: bool| -> Vec<u32> {
            ids.iter()
                .map(|&e| {
                    if resident[e as usize] == keep_resident {
                        e
                    } else {
                        SKIP
                    }
                })
                .collect()
        };
        let mut full = vec![0f32; t * layer.h];
        moe_serial(&view, &MoeInput::new(&x, &ids, &w, k), &mut full).unwrap();
        let mut y_res = vec![0f32; t * layer.h];
        moe_serial(&view, &MoeInput::new(&x, &split(true), &w, k), &mut y_res).unwrap();
        let mut y_miss = vec![f32::NAN; t * layer.h];
        pool.moe_masked(&view, &MoeInput::new(&x, &split(false), &w, k), &mut y_miss)
            .unwrap();
        let scale = full.iter().fold(0f32, |a, v| a.max(v.abs()));
        for (n, (f, (a, b))) in full.iter().zip(y_res.iter().zip(&y_miss)).enumerate() {
            assert!(
                (f - (a + b)).abs() <= 1e-5 * scale,
                "T={t} k={k} [{n}]: full {f} vs {a} + {b}"
            );
        }
    }
}

/// `SKIP` is accepted only by the masked entry points; any other out-of-range id is a typed
/// error there too, and `y` is left untouched.
#[test]
fn skip_is_rejected_by_the_unmasked_call() {
    let pool = Pool::new(cfg(1, true, false));
    let layer = Layer::new(9, MIXES[0], 4, 32, 32);
    let view = layer.view();
    let x = vec![0.5f32; 32];
    let mut y = vec![7f32; 32];
    let e = pool.moe(
        &view,
        &MoeInput::new(&x, &[SKIP, 1], &[0.5, 0.5], 2),
        &mut y,
    );
    assert!(matches!(e, Err(crate::error::Error::Shape(_))), "{e:?}");
    let e = pool.moe_masked(
        &view,
        &MoeInput::new(&x, &[SKIP, 4], &[0.5, 0.5], 2),
        &mut y,
    );
    assert!(matches!(e, Err(crate::error::Error::Shape(_))), "{e:?}");
    assert!(y.iter().all(|&v| v == 7.0));
    pool.moe_masked(
        &view,
        &MoeInput::new(&x, &[SKIP, SKIP], &[0.5, 0.5], 2),
        &mut y,
    )
    .unwrap();
    assert!(y.iter().all(|&v| v == 0.0));
}
