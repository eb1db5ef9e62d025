//! The float math of ggml's vectorised CPU ops (AVX2+FMA build) that the forward pass must
//! repeat bit for bit to agree with llama.cpp: the `exp` approximation ggml's softmax and
//! SwiGLU use (`ggml_v_expf`: a degree-5 polynomial on a reduced argument, with FMAs), the
//! SwiGLU built on it, and the softmax's summation order (8-element groups reduced in f32,
//! accumulated in f64).
//!
//! Every lane of ggml's vector code is independent, so it is computed here one element at a
//! time with `f32::mul_add` (an exact FMA, in hardware when the CPU has it), which gives the
//! same bits on every ISA.

use crate::quant::dot::common_reduce8;

#[inline(always)]
fn c(bits: u32) -> f32 {
    f32::from_bits(bits)
}

/// ggml's `exp(x)` approximation for one lane. Relative error about 1.5 ulp against the
/// true exp; exactly what `ggml_v_expf` returns for that lane.
#[inline(always)]
pub fn expf_lane(x: f32) -> f32 {
    let shift = c(0x4b40_0000); // 1.5·2^23: rounds x·log2(e) to an integer in the mantissa
    let z = x.mul_add(c(0x3fb8_aa3b), shift); // x·log2(e) + shift
    let n = z - shift; // round(x·log2(e))
                       // b = x − n·ln2, with ln2 split in a high and a low part
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    let e = z.to_bits() << 23; // 2^n in the exponent field (wrapping)
    let k = f32::from_bits(e.wrapping_add(1f32.to_bits()));
    let u = b * b;
    let hi = c(0x3c07_2010).mul_add(b, c(0x3d2b_9f17));
    let lo = c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb));
    let j = hi.mul_add(u, lo).mul_add(u, c(0x3f7f_fff6) * b); // exp(b) − 1
    if n.abs() <= 126.0 || n.is_nan() {
        return j.mul_add(k, k);
    }
    // |n| > 126: the scale 2^n is split in two factors to reach the subnormal or overflow range
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// `silu(g)·u` as ggml's `ggml_vec_swiglu_f32` computes it in its 8-wide loop:
/// `g / (1 + expf_lane(0 − g)) · u`.
#[inline(always)]
pub fn silu_mul(g: f32, u: f32) -> f32 {
    (g / (1.0 + expf_lane(0.0 - g))) * u
}

/// `silu_mul` over slices (`h[i] = silu(g[i])·u[i]`), with the FMAs in hardware where the CPU
/// has them.
pub fn silu_mul_rows(g: &[f32], u: &[f32], h: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has FMA (checked above).
        unsafe { silu_mul_rows_fma(g, u, h) };
        return;
    }
    for ((hi, &gi), &ui) in h.iter_mut().zip(g).zip(u) {
        *hi = silu_mul(gi, ui);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn silu_mul_rows_fma(g: &[f32], u: &[f32], h: &mut [f32]) {
    for ((hi, &gi), &ui) in h.iter_mut().zip(g).zip(u) {
        *hi = silu_mul(gi, ui);
    }
}

/// `ggml_v_expf` on 8 lanes: `vexp::expf_lane` lane for lane (same operations and constants).
/// The CPU runs AVX2 and FMA (the caller's target features).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn expf8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let c = |b: u32| _mm256_set1_ps(f32::from_bits(b));
    let shift = c(0x4b40_0000);
    let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), shift);
    let n = _mm256_sub_ps(z, shift);
    let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
    let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
    let k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(c(0x3f80_0000))));
    let u = _mm256_mul_ps(b, b);
    let hi = _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17));
    let lo = _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb));
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(hi, u, lo),
        u,
        _mm256_mul_ps(c(0x3f7f_fff6), b),
    );
    let abs_n = _mm256_andnot_ps(c(0x8000_0000), n);
    let slow = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(126.0));
    let fast = _mm256_fmadd_ps(j, k, k);
    if _mm256_movemask_ps(slow) == 0 {
        return fast;
    }
    // |n| > 126: 2^n split in two factors (subnormal or overflow range)
    let neg = _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps());
    let g = _mm256_and_si256(
        _mm256_castps_si256(neg),
        _mm256_set1_epi32(0x8200_0000u32 as i32),
    );
    let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
    let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    let huge = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
    let r1 = _mm256_mul_ps(s1, s1);
    let r2 = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
    let slow_v = _mm256_blendv_ps(r2, r1, huge);
    _mm256_blendv_ps(fast, slow_v, slow)
}

/// `g[i] = silu(g[i])·u[i]` in place, eight lanes at a time on AVX2+FMA (`expf8`: each
/// lane the operations of `silu_mul`, so the same bits). The prompt's expert runs call it on
/// their Gate results (`silu_mul_one` per element was ~2% of an IQ3_S pp512).
pub fn silu_mul_in_place(g: &mut [f32], u: &[f32]) {
    assert_eq!(g.len(), u.len(), "silu_mul_in_place: gate and up lengths");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA checked; equal lengths.
        unsafe { silu_mul_in_place_avx2(g, u) };
        return;
    }
    for (gi, &ui) in g.iter_mut().zip(u) {
        *gi = silu_mul(*gi, ui);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_in_place_avx2(g: &mut [f32], u: &[f32]) {
    use std::arch::x86_64::*;
    let n8 = g.len() / 8 * 8;
    for i in (0..n8).step_by(8) {
        let gv = _mm256_loadu_ps(g.as_ptr().add(i));
        let e = expf8(_mm256_sub_ps(_mm256_setzero_ps(), gv)); // expf_lane(0 − g)
        let den = _mm256_add_ps(_mm256_set1_ps(1.0), e);
        let h = _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(u.as_ptr().add(i)));
        _mm256_storeu_ps(g.as_mut_ptr().add(i), h);
    }
    for j in n8..g.len() {
        g[j] = silu_mul(g[j], u[j]);
    }
}

/// One `silu_mul` with hardware FMAs where the CPU has them (for callers that produce one
/// element at a time).
#[inline]
pub fn silu_mul_one(g: f32, u: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has FMA (checked above).
        return unsafe { silu_mul_one_fma(g, u) };
    }
    silu_mul(g, u)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn silu_mul_one_fma(g: f32, u: f32) -> f32 {
    silu_mul(g, u)
}

/// In-place softmax of one row as ggml's `soft_max` op computes it (AVX2 build): the max;
/// `expf_lane(x − max)` over 8-element groups, each group summed by `reduce8` in f32 and
/// added to an f64 total; then every element times `(1/total) as f32`.
/// A last partial group is padded with −∞ (exp 0) when `pad` holds — ggml's attention rows
/// are padded to a multiple of 256 masked positions — and otherwise (as ggml's scalar tail
/// does) uses `f32::exp` and adds element by element.
pub fn softmax(x: &mut [f32], pad: bool) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has FMA (checked above).
        unsafe { softmax_fma(x, pad) };
        return;
    }
    softmax_body(x, pad, None)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn softmax_fma(x: &mut [f32], pad: bool) {
    softmax_body(x, pad, None)
}

/// `softmax(x, true)` with one more logit `sink` that takes part in the max and the sum but
/// has no output (ggml's `soft_max_ext` with sinks: the max is raised to the sink, the sum
/// gains `expf(sink − max)`).
pub fn softmax_sink(x: &mut [f32], sink: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has FMA (checked above).
        unsafe { softmax_sink_fma(x, sink) };
        return;
    }
    softmax_body(x, true, Some(sink))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn softmax_sink_fma(x: &mut [f32], sink: f32) {
    softmax_body(x, true, Some(sink))
}

#[inline(always)]
fn softmax_body(x: &mut [f32], pad: bool, sink: Option<f32>) {
    let mut max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if let Some(sk) = sink {
        max = max.max(sk);
    }
    let mut sum = 0f64;
    let mut groups = x.chunks_exact_mut(8);
    for grp in &mut groups {
        let mut r = [0f32; 8];
        for (v, o) in grp.iter_mut().zip(r.iter_mut()) {
            *v = expf_lane(*v - max);
            *o = *v;
        }
        sum += common_reduce8(&r) as f64;
    }
    let tail = groups.into_remainder();
    if pad && !tail.is_empty() {
        let mut r = [0f32; 8];
        for (v, o) in tail.iter_mut().zip(r.iter_mut()) {
            *v = expf_lane(*v - max);
            *o = *v;
        }
        sum += common_reduce8(&r) as f64;
    } else {
        for v in tail.iter_mut() {
            *v = (*v - max).exp();
            sum += *v as f64;
        }
    }
    if let Some(sk) = sink {
        sum += (sk - max).exp() as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expf_lane_is_close_to_exp_and_handles_the_ends() {
        for i in -2000..2000 {
            let x = i as f32 * 0.043;
            let (a, b) = (expf_lane(x), x.exp());
            assert!(((a - b) / b).abs() < 4e-7, "{x}: {a} vs {b}");
        }
        assert_eq!(expf_lane(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf_lane(-200.0), 0.0);
        assert_eq!(expf_lane(0.0), 1.0);
        assert!(expf_lane(100.0).is_infinite());
        let sub = expf_lane(-100.0); // subnormal range
        assert!(sub > 0.0 && ((sub - (-100f32).exp()) / (-100f32).exp()).abs() < 1e-3);
    }

    /// The eight-lane SwiGLU equals `silu_mul` bit for bit: a sweep across the exp's range
    /// (groups with a lane past |n| > 126 go element by element), ±0, ±∞, NaN, and a tail.
    #[test]
    fn silu_in_place_equals_the_element_bitwise() {
        let mut g: Vec<f32> = (-3000..3000).map(|i| i as f32 * 0.061).collect();
        g.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-40,
            -1e-40,
        ]);
        let u: Vec<f32> = (0..g.len()).map(|i| 1.0 - (i % 13) as f32 * 0.37).collect();
        let want: Vec<u32> = g
            .iter()
            .zip(&u)
            .map(|(&a, &b)| silu_mul(a, b).to_bits())
            .collect();
        let mut h = g.clone();
        silu_mul_in_place(&mut h, &u);
        let got: Vec<u32> = h.iter().map(|x| x.to_bits()).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn softmax_sink_is_the_softmax_with_one_more_logit_dropped() {
        for sink in [-3.0f32, 0.5, 9.0] {
            let mut x = [1.0f32, 2.0, 3.0, 0.5, -1.0, 0.25, 7.0, 1.0, 2.0];
            let mut full: Vec<f32> = x.iter().copied().chain([sink]).collect();
            softmax_sink(&mut x, sink);
            softmax(&mut full, false);
            for (a, b) in x.iter().zip(&full) {
                assert!((a - b).abs() < 1e-6, "sink {sink}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn softmax_sums_to_one_and_pads_with_zeros() {
        let mut x = [1.0f32, 2.0, 3.0, -1e9, 0.5, 0.25, 7.0, 1.0, 2.0, 3.0, 0.0];
        let mut y = x;
        softmax(&mut x, true);
        softmax(&mut y, false);
        for v in [&x, &y] {
            assert!((v.iter().sum::<f32>() - 1.0).abs() < 1e-6);
            assert!(v[3] == 0.0 && v[2] > v[1]);
        }
    }
}
