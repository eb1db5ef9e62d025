//! Small f32 kernels of the forward pass: RMSNorm, RoPE NEOX or NORM (with linear and YaRN
//! scaling). Reductions accumulate in f64 where ggml's CPU backend does, so that results
//! track llama.cpp.

use super::arch::RopeMode;
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

/// RoPE in ggml's arithmetic (`ggml_rope_cache_init`, `rope_yarn`): for position p,
/// θ_extrap(i) = p·s^i accumulated in f32 by repeated multiplication with
/// s = powf(base, −2/n_rot); θ = freq_scale·θ_extrap, with YaRN's ramp mix where asked; the
/// pairs (i, i + n_rot/2) (NEOX) or (2i, 2i + 1) (NORM) rotate as `fma(x0, cos, −x1·sin)` and `fma(x0, sin, x1·cos)`
/// (ggml's compiled C contracts them into FMAs).
#[derive(Clone, Debug)]
pub struct Rope {
    pub mode: RopeMode,
    pub n_rot: usize,
    /// powf(base, −2/n_rot).
    pub theta_scale: f32,
    /// 1/factor for linear and YaRN scaling, else 1.
    pub freq_scale: f32,
    /// YaRN: per pair, the weight of the extrapolated angle (ramp · ext_factor); else empty.
    pub mix: Vec<f32>,
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
        let base = hp.rope_freq_base;
        let theta_scale = base.powf(-2.0 / n as f32);
        let mode = hp.graph.rope;
        match hp.rope_scaling {
            RopeScaling::None => Rope {
                mode,
                n_rot: n,
                theta_scale,
                freq_scale: 1.0,
                mix: Vec::new(),
                mscale: 1.0,
            },
            RopeScaling::Linear { factor } => Rope {
                mode,
                n_rot: n,
                theta_scale,
                freq_scale: 1.0 / factor,
                mix: Vec::new(),
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
                let lo = yarn_corr_dim(n, orig_ctx, beta_fast, base).floor().max(0.0);
                let hi = yarn_corr_dim(n, orig_ctx, beta_slow, base)
                    .ceil()
                    .min((n - 1) as f32);
                // ramp 1 → keep the extrapolated (original) angle, 0 → interpolate.
                let mix = (0..n / 2)
                    .map(|i| {
                        let y = (i as f32 - lo) / (hi - lo).max(0.001);
                        (1.0 - y.clamp(0.0, 1.0)) * ext_factor
                    })
                    .collect();
                let mut mscale = attn_factor;
                if ext_factor != 0.0 {
                    mscale *= 1.0 + 0.1 * factor.ln();
                }
                Rope {
                    mode,
                    n_rot: n,
                    theta_scale,
                    freq_scale: 1.0 / factor,
                    mix,
                    mscale,
                }
            }
        }
    }

    /// cos and sin of every pair for position `pos`: [n_rot/2] each.
    pub fn table(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        self.angles(pos as f32, self.mscale, cos, sin)
    }

    /// cos and sin of every pair for a move of `delta` positions (`kv_shift`): the angles of
    /// `table` at `delta`, which may be negative, without YaRN's attention scale (a stored key
    /// carries it already).
    pub fn rotation(&self, delta: i64, cos: &mut [f32], sin: &mut [f32]) {
        self.angles(delta as f32, 1.0, cos, sin)
    }

    fn angles(&self, p: f32, scale: f32, cos: &mut [f32], sin: &mut [f32]) {
        let mut extrap = p;
        for (i, (c, s)) in cos.iter_mut().zip(sin.iter_mut()).enumerate() {
            let interp = self.freq_scale * extrap;
            let th = match self.mix.get(i) {
                Some(&m) if m != 0.0 => interp * (1.0 - m) + extrap * m,
                _ => interp,
            };
            *c = th.cos() * scale;
            *s = th.sin() * scale;
            extrap *= self.theta_scale;
        }
    }

    /// Rotates every `head_dim`-wide head of `x` in place with one position's table.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has FMA (checked above).
            unsafe { self.apply_fma(x, head_dim, cos, sin) };
            return;
        }
        self.apply_body(x, head_dim, cos, sin)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "fma")]
    unsafe fn apply_fma(&self, x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
        self.apply_body(x, head_dim, cos, sin)
    }

    #[inline(always)]
    fn apply_body(&self, x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
        let half = self.n_rot / 2;
        for head in x.chunks_exact_mut(head_dim) {
            match self.mode {
                RopeMode::Neox => {
                    let (a, b) = head[..self.n_rot].split_at_mut(half);
                    for i in 0..half {
                        let (x0, x1) = (a[i], b[i]);
                        a[i] = x0.mul_add(cos[i], -(x1 * sin[i]));
                        b[i] = x0.mul_add(sin[i], x1 * cos[i]);
                    }
                }
                RopeMode::Norm => {
                    for (i, p) in head[..self.n_rot].chunks_exact_mut(2).enumerate() {
                        let (x0, x1) = (p[0], p[1]);
                        p[0] = x0.mul_add(cos[i], -(x1 * sin[i]));
                        p[1] = x0.mul_add(sin[i], x1 * cos[i]);
                    }
                }
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

    fn rope4(mode: RopeMode) -> Rope {
        Rope {
            mode,
            n_rot: 4,
            theta_scale: 0.01,
            freq_scale: 1.0,
            mix: Vec::new(),
            mscale: 1.0,
        }
    }

    #[test]
    fn rope_preserves_norm_and_matches_rotation() {
        let r = rope4(RopeMode::Neox);
        let (mut c, mut s) = ([0f32; 2], [0f32; 2]);
        r.table(3, &mut c, &mut s);
        let mut x = [1.0f32, 0.0, 0.0, 0.0, 7.0];
        r.apply(&mut x[..4], 4, &c, &s);
        // pair (0, 2) rotated by 3 rad
        assert!((x[0] - 3f32.cos()).abs() < 1e-6 && (x[2] - 3f32.sin()).abs() < 1e-6);
        assert_eq!(x[4], 7.0);
    }

    #[test]
    fn rope_norm_rotates_adjacent_pairs() {
        let r = rope4(RopeMode::Norm);
        let (mut c, mut s) = ([0f32; 2], [0f32; 2]);
        r.table(3, &mut c, &mut s);
        let mut x = [1.0f32, 0.0, 0.0, 1.0];
        r.apply(&mut x, 4, &c, &s);
        // pair (0, 1) rotated by 3 rad, pair (2, 3) by 0.03 rad
        assert!((x[0] - 3f32.cos()).abs() < 1e-6 && (x[1] - 3f32.sin()).abs() < 1e-6);
        assert!((x[2] + 0.03f32.sin()).abs() < 1e-6 && (x[3] - 0.03f32.cos()).abs() < 1e-6);
    }
}
