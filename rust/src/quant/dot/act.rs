//! Activation quantizers, rounding exactly as ggml's CPU backend does on x86 (what llama.cpp
//! runs: `from_float` of the CPU type traits; for Q8_0/Q8_1 that is the SIMD path, which
//! differs from `quantize_row_q8_0_ref` in its rounding), and the F16/BF16 conversions.
//! Every quantized activation lies in [-127, 127]; the SIMD kernels rely on that (the
//! sign trick of `maddubs` needs |a| ≤ 127 to stay clear of 16-bit saturation).

use half::f16;

/// ggml's `nearest_int`: round half to even through the 1.5·2^23 trick; exact for
/// |v| ≤ 2^22 − 1, which holds here (|v| ≤ 127 plus rounding).
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    let t = (v + 12_582_912.0f32).to_bits() as i32;
    (t & 0x007f_ffff) - 0x0040_0000
}

/// Q8_0 (34 bytes per 32): d = amax/127 (stored f16), q = round-half-even(x · 127/amax),
/// as ggml's x86 `quantize_row_q8_0` computes it (the reference uses 1/d and roundf).
pub fn q8_0(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        ob[0..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for (o, v) in ob[2..].iter_mut().zip(xb) {
            *o = nearest_int(v * id) as i8 as u8;
        }
    }
}

/// Q8_1 (36 bytes per 32): as Q8_0 (x86 rounding), plus s = f16(d · Σq).
pub fn q8_1(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(36)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (o, v) in ob[4..].iter_mut().zip(xb) {
            let q = nearest_int(v * id);
            sum += q;
            *o = q as i8 as u8;
        }
        ob[0..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        ob[2..4].copy_from_slice(&f16::from_f32(sum as f32 * d).to_bits().to_le_bytes());
    }
}

/// Q8_K (292 bytes per 256): the element of largest magnitude `max` (first one on ties)
/// maps to −127: iscale = −127/max, q = min(127, nearest_int(iscale·x)), d = 1/iscale (f32),
/// bsums[k] = Σ q[16k..16k+16]. An all-zero block gives d = 0 and zero quants and sums.
pub fn q8_k(x: &[f32], out: &mut [u8]) {
    let simd = q8_k_simd();
    for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(292)) {
        // SAFETY: `q8_k_simd` gave a block the CPU runs; a 256-float block, 292 bytes.
        if simd.is_some_and(|f| unsafe { f(xb, ob) }) {
            continue;
        }
        q8_k_block(xb, ob);
    }
}

/// A SIMD Q8_K block: quantizes and returns true, or writes nothing and returns false for
/// the element loop to take the block.
type Q8kBlock = unsafe fn(&[f32], &mut [u8]) -> bool;

/// The SIMD block of the active ISA (`STRATA_ISA`, as the dot kernels), if any.
fn q8_k_simd() -> Option<Q8kBlock> {
    #[cfg(target_arch = "x86_64")]
    {
        match super::active_isa() {
            super::Isa::Avx512 => Some(q8_k512::block as Q8kBlock),
            super::Isa::Avx2 => Some(q8_k256::block as Q8kBlock),
            super::Isa::Scalar => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// −127 over the block's element `at` (its first of largest magnitude): the SIMD blocks'
/// scale, None where it is not finite (the element loop's `nearest_int` decides those).
#[cfg(target_arch = "x86_64")]
fn simd_iscale(xb: &[f32], at: usize) -> Option<f32> {
    let iscale = -127.0f32 / xb[at];
    iscale.is_finite().then_some(iscale)
}

/// One Q8_K block, element by element (the reference the SIMD block is tested against).
pub(super) fn q8_k_block(xb: &[f32], ob: &mut [u8]) {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in xb {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        ob.fill(0);
        return;
    }
    let iscale = -127.0f32 / max;
    for (o, &v) in ob[4..260].iter_mut().zip(xb) {
        *o = nearest_int(iscale * v).min(127) as i8 as u8;
    }
    for k in 0..16 {
        let s: i32 = ob[4 + 16 * k..4 + 16 * k + 16]
            .iter()
            .map(|&q| q as i8 as i32)
            .sum();
        ob[260 + 2 * k..262 + 2 * k].copy_from_slice(&(s as i16).to_le_bytes());
    }
    ob[0..4].copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
}

/// Q8_K's block on AVX-512 registers, bitwise `q8_k_block` (the prompt's activations are
/// quantized once per matrix input: element by element they took ~5% of an IQ3_S pp512).
#[cfg(target_arch = "x86_64")]
pub(super) mod q8_k512 {
    use std::arch::x86_64::*;

    /// Quantizes the block and returns true, or returns false (nothing written) where a
    /// NaN or an infinity is in it or −127/max is not finite: the element loop's
    /// `nearest_int` and its sums of the stored bytes decide those.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW; `xb` is 256 floats and `ob` 292 bytes.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn block(xb: &[f32], ob: &mut [u8]) -> bool {
        debug_assert!(xb.len() == 256 && ob.len() == 292);
        let p = xb.as_ptr();
        let mag = |i: usize| _mm512_abs_ps(_mm512_loadu_ps(p.add(16 * i)));
        let mut m = _mm512_setzero_ps();
        let mut odd: __mmask16 = 0;
        for i in 0..16 {
            let a = mag(i);
            // NaN or ±inf: |v| not below +inf
            odd |= _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(a, _mm512_set1_ps(f32::INFINITY));
            m = _mm512_max_ps(m, a);
        }
        if odd != 0 {
            return false;
        }
        let amax = _mm512_reduce_max_ps(m);
        if amax == 0.0 {
            ob.fill(0);
            return true;
        }
        // the first element of that magnitude (the element loop keeps the first on ties)
        let at = (0..16)
            .find_map(|i| {
                let k = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(mag(i), _mm512_set1_ps(amax));
                (k != 0).then(|| 16 * i + k.trailing_zeros() as usize)
            })
            .unwrap_or(0);
        let Some(iscale) = super::simd_iscale(xb, at) else {
            return false;
        };
        // |iscale·v| ≤ 127 (plus rounding): the conversion's round-half-even is
        // `nearest_int`'s
        let is = _mm512_set1_ps(iscale);
        let q = ob.as_mut_ptr().add(4);
        for i in 0..16 {
            let v = _mm512_mul_ps(is, _mm512_loadu_ps(p.add(16 * i)));
            let r = _mm512_min_epi32(_mm512_cvtps_epi32(v), _mm512_set1_epi32(127));
            _mm_storeu_si128(q.add(16 * i) as *mut __m128i, _mm512_cvtepi32_epi8(r));
            let s = _mm512_reduce_add_epi32(r) as i16;
            ob[260 + 2 * i..262 + 2 * i].copy_from_slice(&s.to_le_bytes());
        }
        ob[0..4].copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
        true
    }
}

/// Q8_K's block on AVX2 registers, bitwise `q8_k_block`: `q8_k512` eight lanes wide.
#[cfg(target_arch = "x86_64")]
pub(super) mod q8_k256 {
    use std::arch::x86_64::*;

    /// As `q8_k512::block`.
    ///
    /// # Safety
    /// The CPU has AVX2; `xb` is 256 floats and `ob` 292 bytes.
    #[target_feature(enable = "avx2")]
    pub unsafe fn block(xb: &[f32], ob: &mut [u8]) -> bool {
        debug_assert!(xb.len() == 256 && ob.len() == 292);
        let p = xb.as_ptr();
        let sign = _mm256_set1_ps(-0.0);
        let mag = |i: usize| _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * i)));
        let inf = _mm256_set1_ps(f32::INFINITY);
        let mut m = _mm256_setzero_ps();
        let mut odd = 0;
        for i in 0..32 {
            let a = mag(i);
            odd |= _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NLT_UQ>(a, inf));
            m = _mm256_max_ps(m, a);
        }
        if odd != 0 {
            return false;
        }
        let mut l = [0f32; 8];
        _mm256_storeu_ps(l.as_mut_ptr(), m);
        let amax = l.iter().fold(0f32, |x, &y| x.max(y));
        if amax == 0.0 {
            ob.fill(0);
            return true;
        }
        let am = _mm256_set1_ps(amax);
        let at = (0..32)
            .find_map(|i| {
                let k = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(mag(i), am));
                (k != 0).then(|| 8 * i + k.trailing_zeros() as usize)
            })
            .unwrap_or(0);
        let Some(iscale) = super::simd_iscale(xb, at) else {
            return false;
        };
        let is = _mm256_set1_ps(iscale);
        let q = ob.as_mut_ptr().add(4);
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for g in 0..8 {
            // 32 elements: four registers of i32, packed to bytes in order
            let r: [__m256i; 4] = std::array::from_fn(|j| {
                let v = _mm256_mul_ps(is, _mm256_loadu_ps(p.add(32 * g + 8 * j)));
                _mm256_min_epi32(_mm256_cvtps_epi32(v), _mm256_set1_epi32(127))
            });
            let w = _mm256_packs_epi16(
                _mm256_packs_epi32(r[0], r[1]),
                _mm256_packs_epi32(r[2], r[3]),
            );
            let bytes = _mm256_permutevar8x32_epi32(w, order);
            _mm256_storeu_si256(q.add(32 * g) as *mut __m256i, bytes);
            for h in 0..2 {
                let s = _mm256_add_epi32(r[2 * h], r[2 * h + 1]);
                let x = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
                let x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
                let x = _mm_add_epi32(x, _mm_shuffle_epi32::<0b01>(x));
                let k = 2 * g + h;
                let v = (_mm_cvtsi128_si32(x) as i16).to_le_bytes();
                ob[260 + 2 * k..262 + 2 * k].copy_from_slice(&v);
            }
        }
        ob[0..4].copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
        true
    }
}

pub fn f32_row(x: &[f32], out: &mut [u8]) {
    for (o, v) in out.chunks_exact_mut(4).zip(x) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

/// F16, round to nearest even (ggml's `ggml_fp32_to_fp16`).
pub fn f16_row(x: &[f32], out: &mut [u8]) {
    for (o, v) in out.chunks_exact_mut(2).zip(x) {
        o.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
    }
}

/// BF16 as ggml's `ggml_fp32_to_bf16`: NaN is kept quiet, everything else rounds to
/// nearest even.
pub fn bf16_row(x: &[f32], out: &mut [u8]) {
    for (o, v) in out.chunks_exact_mut(2).zip(x) {
        let u = v.to_bits();
        let h = if (u & 0x7fff_ffff) > 0x7f80_0000 {
            ((u >> 16) | 64) as u16
        } else {
            ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
        };
        o.copy_from_slice(&h.to_le_bytes());
    }
}
