//! The layer split (issue #21): which layers each stage holds. Stage `s` runs on device
//! `gpus[s]` (a device may repeat: one GPU as several stages) and holds layers
//! `ranges[s] = b[s] .. b[s + 1]` with their dense weights, KV cache and expert slots.
//!
//! Strategies behind `SplitStrategy`:
//! - `ByBytes` (`layer_split = auto`): cut so that each stage's share of the layers' weight
//!   bytes follows its share of the free memory (a device's free memory is shared equally by
//!   the stages on it);
//! - `Explicit` (`layer_split = "b1,b2,…"`): the first layer of every stage after the first.
//!
//! Every stage gets at least one layer; a split that cannot is a `ConfigError` naming it.

use crate::error::{Error, Result};
use std::ops::Range;

/// What a split is cut from.
pub struct SplitInputs<'a> {
    /// Bytes of each layer's weights (dense and experts: what the stage must hold or slot).
    pub layer_bytes: &'a [u64],
    /// The device of each stage.
    pub gpus: &'a [usize],
    /// Free memory of each device, by device ordinal (`cuMemGetInfo` before loading).
    pub free: &'a dyn Fn(usize) -> u64,
}

pub trait SplitStrategy {
    /// One range of layers per stage, in order, covering every layer.
    fn split(&self, inp: &SplitInputs<'_>) -> Result<Vec<Range<usize>>>;
}

fn bad<T>(m: String) -> Result<T> {
    Err(Error::Config(format!("layer_split: {m}")))
}

/// Boundaries → ranges, checked: strictly increasing, inside (0, n_layer).
fn ranges(bounds: &[usize], n_layer: usize, n_stages: usize) -> Result<Vec<Range<usize>>> {
    if bounds.len() + 1 != n_stages {
        return bad(format!(
            "{} boundaries for {n_stages} stages (one fewer than the stages)",
            bounds.len()
        ));
    }
    let mut all = vec![0];
    all.extend_from_slice(bounds);
    all.push(n_layer);
    if all.windows(2).any(|w| w[0] >= w[1]) {
        return bad(format!(
            "boundaries {bounds:?} must increase strictly inside 1..{n_layer} (every stage \
             holds a layer)"
        ));
    }
    Ok(all.windows(2).map(|w| w[0]..w[1]).collect())
}

/// Explicit boundaries: the first layer of stages 1.. .
pub struct Explicit(pub Vec<usize>);

impl SplitStrategy for Explicit {
    fn split(&self, inp: &SplitInputs<'_>) -> Result<Vec<Range<usize>>> {
        ranges(&self.0, inp.layer_bytes.len(), inp.gpus.len())
    }
}

/// By weight bytes and free memory (`auto`).
pub struct ByBytes;

impl SplitStrategy for ByBytes {
    fn split(&self, inp: &SplitInputs<'_>) -> Result<Vec<Range<usize>>> {
        let (n, k) = (inp.layer_bytes.len(), inp.gpus.len());
        if k == 0 {
            return bad("no stage (gpus is empty)".into());
        }
        if n < k {
            return bad(format!("{n} layers cannot make {k} stages"));
        }
        // each stage's capacity: its device's free memory over the stages on that device
        let cap: Vec<f64> = inp
            .gpus
            .iter()
            .map(|&g| {
                let on = inp.gpus.iter().filter(|&&x| x == g).count() as f64;
                (inp.free)(g) as f64 / on
            })
            .collect();
        let total_cap: f64 = cap.iter().sum();
        let total: f64 = inp.layer_bytes.iter().map(|&b| b as f64).sum();
        if total_cap <= 0.0 {
            return bad("no free memory on the devices".into());
        }
        // stage s ends where the running bytes pass its cumulative share (nearest cut),
        // leaving at least one layer to each stage after it
        let mut bounds = Vec::with_capacity(k - 1);
        let (mut acc, mut share, mut l) = (0f64, 0f64, 0usize);
        for (s, c) in cap.iter().enumerate().take(k - 1) {
            share += c / total_cap * total;
            let lo = bounds.last().map_or(1, |&b: &usize| b + 1);
            let hi = n - (k - 1 - s);
            while l < hi && (l < lo || acc + inp.layer_bytes[l] as f64 / 2.0 <= share) {
                acc += inp.layer_bytes[l] as f64;
                l += 1;
            }
            bounds.push(l);
        }
        ranges(&bounds, n, k)
    }
}

/// The strategy of a `layer_split` setting: "auto", or comma-separated boundaries.
pub fn strategy(spec: &str) -> Result<Box<dyn SplitStrategy>> {
    let spec = spec.trim();
    if spec.is_empty() || spec == "auto" {
        return Ok(Box::new(ByBytes));
    }
    let bounds = spec
        .split(',')
        .map(|p| p.trim().parse::<usize>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .or_else(|_| {
            bad(format!(
                "{spec:?} is neither \"auto\" nor layer numbers like \"24\""
            ))
        })?;
    Ok(Box::new(Explicit(bounds)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(spec: &str, bytes: &[u64], gpus: &[usize], free: &[u64]) -> Result<Vec<Range<usize>>> {
        let f = |g: usize| free[g];
        strategy(spec)?.split(&SplitInputs {
            layer_bytes: bytes,
            gpus,
            free: &f,
        })
    }

    #[test]
    fn auto_follows_free_memory() {
        let b = [10u64; 48];
        // equal cards: halves
        assert_eq!(
            run("auto", &b, &[0, 1], &[16, 16]).unwrap(),
            vec![0..24, 24..48]
        );
        // one GPU as two stages: the device's memory shared by both
        assert_eq!(
            run("auto", &b, &[0, 0], &[16]).unwrap(),
            vec![0..24, 24..48]
        );
        // a card with 1/4 of the free memory gets 1/4 of the bytes
        assert_eq!(
            run("auto", &b, &[0, 1], &[8, 24]).unwrap(),
            vec![0..12, 12..48]
        );
        // three stages, two on device 1: 16 | 8 | 8
        assert_eq!(
            run("auto", &b, &[0, 1, 1], &[16, 16]).unwrap(),
            vec![0..24, 24..36, 36..48]
        );
    }

    #[test]
    fn auto_weighs_layer_bytes() {
        // a heavy first half: 4 layers of 30 and 4 of 10 = 160; half is 80
        let b = [30, 30, 30, 30, 10, 10, 10, 10];
        let r = run("auto", &b, &[0, 1], &[1, 1]).unwrap();
        let bytes = |r: &Range<usize>| b[r.clone()].iter().sum::<u64>();
        assert_eq!(r, vec![0..3, 3..8]);
        assert!(bytes(&r[0]).abs_diff(80) <= 15 && bytes(&r[1]).abs_diff(80) <= 15);
    }

    #[test]
    fn every_stage_gets_a_layer() {
        // a device with almost nothing free still gets one layer
        let r = run("auto", &[5; 4], &[0, 1], &[1000, 1]).unwrap();
        assert_eq!(r, vec![0..3, 3..4]);
        let r = run("auto", &[5; 4], &[0, 1], &[1, 1000]).unwrap();
        assert_eq!(r, vec![0..1, 1..4]);
        assert!(run("auto", &[5; 2], &[0, 0, 0], &[9]).is_err());
    }

    #[test]
    fn explicit_boundaries() {
        let b = [1u64; 10];
        assert_eq!(run("4", &b, &[0, 0], &[1]).unwrap(), vec![0..4, 4..10]);
        assert_eq!(
            run(" 3, 7 ", &b, &[0, 1, 0], &[1, 1]).unwrap(),
            vec![0..3, 3..7, 7..10]
        );
        for (spec, gpus) in [
            ("0", &[0, 0][..]),
            ("10", &[0, 0][..]),
            ("5,5", &[0, 0, 0][..]),
            ("4", &[0, 0, 0][..]),
            ("x", &[0, 0][..]),
        ] {
            let e = run(spec, &b, gpus, &[1]).unwrap_err();
            assert!(
                matches!(e, Error::Config(ref m) if m.starts_with("layer_split")),
                "{e}"
            );
        }
    }
}
