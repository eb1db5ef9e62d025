//! Small f32 kernels of the forward pass: RMSNorm, softmax, RoPE NEOX (with linear and YaRN
//! scaling). Reductions accumulate in f64 where ggml's CPU backend does, so that results
//! track llama.cpp.

use super::hparams::{HParams, RopeScaling};

/// `out = x / sqrt(mean(x²) + eps) · w` over one row.
#[inline]
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = (v * scale) * g;
    }
}

/// RMSNorm of every `w.len()`-wide row of `x`, in place.
pub fn rms_norm_rows_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for row in x.chunks_exact_mut(n) {
        let sum: f64 = row.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for (v, &g) in row.iter_mut().zip(w) {
            *v = (*v * scale) * g;
        }
    }
}

/// In-place softmax of one row; returns nothing, the row sums to 1.
#[inline]
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// RoPE NEOX: per rotated pair i < n_rot/2 a frequency `freq[i]` (scaling folded in) and a
/// magnitude `mscale`; θ = pos·freq[i]; pairs are (i, i + n_rot/2).
#[derive(Clone, Debug)]
pub struct Rope {
    pub n_rot: usize,
    pub freq: Vec<f32>,
    pub mscale: f32,
}

/// YaRN: the dimension index at which a frequency completes `n_rot_turns` turns over the
/// original context.
fn yarn_corr_dim(n_dims: usize, orig_ctx: usize, turns: f32, base: f32) -> f32 {
    n_dims as f32 * (orig_ctx as f32 / (turns * 2.0 * std::f32::consts::PI)).ln()
        / (2.0 * base.ln())
}

impl Rope {
    pub fn new(hp: &HParams) -> Rope {
        let n = hp.n_rot;
        let base = hp.rope_freq_base as f64;
        // Unscaled θ_i = base^(−2i/n).
        let extrap: Vec<f32> = (0..n / 2)
            .map(|i| (1.0 / base.powf((2 * i) as f64 / n as f64)) as f32)
            .collect();
        match hp.rope_scaling {
            RopeScaling::None => Rope {
                n_rot: n,
                freq: extrap,
                mscale: 1.0,
            },
            RopeScaling::Linear { factor } => Rope {
                n_rot: n,
                freq: extrap.iter().map(|f| f / factor).collect(),
                mscale: 1.0,
            },
            RopeScaling::Yarn {
                factor,
                orig_ctx,
                beta_fast,
                beta_slow,
                ext_factor,
                attn_factor,
            } => {
                let base = hp.rope_freq_base;
                let lo = yarn_corr_dim(n, orig_ctx, beta_fast, base).floor().max(0.0);
                let hi = yarn_corr_dim(n, orig_ctx, beta_slow, base)
                    .ceil()
                    .min((n - 1) as f32);
                let freq = extrap
                    .iter()
                    .enumerate()
                    .map(|(i, &e)| {
                        // ramp 1 → keep the extrapolated (original) frequency, 0 → interpolate.
                        let y = (i as f32 - lo) / (hi - lo).max(0.001);
                        let mix = (1.0 - y.clamp(0.0, 1.0)) * ext_factor;
                        let interp = e / factor;
                        interp * (1.0 - mix) + e * mix
                    })
                    .collect();
                let mut mscale = attn_factor;
                if ext_factor != 0.0 {
                    mscale *= 1.0 + 0.1 * factor.ln();
                }
                Rope {
                    n_rot: n,
                    freq,
                    mscale,
                }
            }
        }
    }

    /// cos and sin of every pair for position `pos`: [n_rot/2] each.
    pub fn table(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        let p = pos as f32;
        for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(&self.freq) {
            let th = p * f;
            *c = th.cos() * self.mscale;
            *s = th.sin() * self.mscale;
        }
    }

    /// Rotates every `head_dim`-wide head of `x` in place with one position's table.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
        let half = self.n_rot / 2;
        for head in x.chunks_exact_mut(head_dim) {
            let (a, b) = head[..self.n_rot].split_at_mut(half);
            for i in 0..half {
                let (x0, x1) = (a[i], b[i]);
                a[i] = x0 * cos[i] - x1 * sin[i];
                b[i] = x0 * sin[i] + x1 * cos[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_weight_gives_unit_rms() {
        let x = [3.0f32, -4.0, 12.0, 0.0];
        let mut o = [0f32; 4];
        rms_norm(&x, &[1.0; 4], 0.0, &mut o);
        let ms: f32 = o.iter().map(|v| v * v).sum::<f32>() / 4.0;
        assert!((ms - 1.0).abs() < 1e-6);
        assert!((o[1] / o[0] - (-4.0 / 3.0)).abs() < 1e-6);
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = [1.0f32, 2.0, 3.0, -1e9];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[3] == 0.0 && x[2] > x[1]);
    }

    #[test]
    fn rope_preserves_norm_and_matches_rotation() {
        let r = Rope {
            n_rot: 4,
            freq: vec![1.0, 0.01],
            mscale: 1.0,
        };
        let (mut c, mut s) = ([0f32; 2], [0f32; 2]);
        r.table(3, &mut c, &mut s);
        let mut x = [1.0f32, 0.0, 0.0, 0.0, 7.0];
        r.apply(&mut x[..4], 4, &c, &s);
        // pair (0, 2) rotated by 3 rad
        assert!((x[0] - 3f32.cos()).abs() < 1e-6 && (x[2] - 3f32.sin()).abs() < 1e-6);
        assert_eq!(x[4], 7.0);
    }
}
