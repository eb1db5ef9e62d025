//! AVX2 kernels. Only integer SIMD and the fixed 16-lane float scheme of `common` are used
//! (multiply then add, never fused), so every result equals the scalar kernel's bitwise.
//! Safety: the wrappers in `kernel` are only handed out when `cpu::has_avx2()` holds, and
//! `super::checked` has verified the slice lengths for `n`, so every pointer read below
//! stays inside `w` and `a`.

use super::common::reduce8;
use super::{cpu, DotFn};
use crate::quant::tables::{KVALUES_IQ4NL, KVALUES_MXFP4};
use crate::quant::GgmlType;
use std::arch::x86_64::*;

#[path = "avx2_k.rs"]
pub(super) mod k;
#[path = "avx2_rows.rs"]
pub(super) mod rows;
pub use rows::rows_kernel;
#[path = "avx2_prefetch.rs"]
pub(super) mod pf;

pub fn kernel(w: GgmlType) -> Option<DotFn> {
    use GgmlType::*;
    if !cpu::has_avx2() {
        return None;
    }
    Some(match w {
        F32 => safe_dot!(F32, f32_dot),
        F16 => safe_dot!(F16, f16_dot),
        BF16 => safe_dot!(BF16, bf16_dot),
        Q8_0 => safe_dot!(Q8_0, q8_0),
        Q4_0 => safe_dot!(Q4_0, q4_0),
        Q5_0 => safe_dot!(Q5_0, q5_0),
        Q4_1 => safe_dot!(Q4_1, q4_1),
        Q5_1 => safe_dot!(Q5_1, q5_1),
        IQ4NL => safe_dot!(IQ4NL, iq4_nl),
        MXFP4 => safe_dot!(MXFP4, mxfp4),
        Q2_0 => safe_dot!(Q2_0, q2_0),
        Q2K => safe_dot!(Q2K, k::q2_k),
        Q3K => safe_dot!(Q3K, k::q3_k),
        Q4K => safe_dot!(Q4K, k::q4_k),
        Q5K => safe_dot!(Q5K, k::q5_k),
        Q6K => safe_dot!(Q6K, k::q6_k),
        IQ4XS => safe_dot!(IQ4XS, k::iq4_xs),
        IQ3S => safe_dot!(IQ3S, k::iq3_s),
        IQ3XXS => safe_dot!(IQ3XXS, k::iq3_xxs),
        IQ2XXS => safe_dot!(IQ2XXS, k::iq2_xxs),
        IQ2XS => safe_dot!(IQ2XS, k::iq2_xs),
        IQ2S => safe_dot!(IQ2S, k::iq2_s),
        TQ2_0 => safe_dot!(TQ2_0, k::tq2_0),
        TQ1_0 => safe_dot!(TQ1_0, k::tq1_0),
        IQ1S => safe_dot!(IQ1S, k::iq1_s),
        IQ1M => safe_dot!(IQ1M, k::iq1_m),
        _ => return None,
    })
}

// ---- helpers (inlined into the kernels, which enable the same features) ----

/// 32 bytes from `p`.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// 16 bytes from `p`.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn load128(p: *const u8) -> __m128i {
    _mm_loadu_si128(p as *const __m128i)
}

/// The f16 at byte `i` of `b` as f32 through F16C (exact, like `common::f16_at`, without
/// its run-time feature check and call).
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) fn h2f(b: &[u8], i: usize) -> f32 {
    h2f_bits(u16::from_le_bytes(super::common::bytes(b, i)))
}

/// The f16 `bits` as f32 (F16C).
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) fn h2f_bits(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// Sum of the eight i32 lanes.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    _mm_cvtsi128_si32(s)
}

/// Σ pairs of u8·i8 into 8 i32 lanes: lane k = Σ_{e=4k}^{4k+3} u_e·s_e (no saturation while
/// 2·|u|·|s| < 32768).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn dot_us(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// As `dot_us` for two signed operands; `y` must avoid −128 (activations do).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn dot_ss(x: __m256i, y: __m256i) -> __m256i {
    dot_us(_mm256_abs_epi8(x), _mm256_sign_epi8(y, x))
}

/// 32 bits to 32 bytes: byte e is 0xFF when bit e of `x` is set, else 0.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn bits_to_bytes(x: u32) -> __m256i {
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let b = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    let b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64));
    _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1))
}

/// 16 packed nibbles to 32 bytes: low nibbles first (elements 0..16), then high ones.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn nibbles(q: __m128i) -> __m256i {
    let m = _mm_set1_epi8(15);
    let lo = _mm_and_si128(q, m);
    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
    _mm256_set_m128i(hi, lo)
}

/// A 16-entry i8 table in both 128-bit halves, for `_mm256_shuffle_epi8` lookups.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn table16(t: &[i8; 16]) -> __m256i {
    let v = unsafe { _mm_loadu_si128(t.as_ptr() as *const __m128i) };
    _mm256_set_m128i(v, v)
}

/// The lane scheme's final reduction (`common::reduce16`).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn reduce_lanes(acc0: __m256, acc1: __m256) -> f32 {
    let mut r = [0f32; 8];
    unsafe { _mm256_storeu_ps(r.as_mut_ptr(), _mm256_add_ps(acc0, acc1)) };
    reduce8(&r)
}

/// 32-element blocks: `$body(b) -> (partials: __m256i, scale: f32)` per block; even blocks
/// go to the first lane register, odd ones to the second.
macro_rules! lanes {
    ($nb:expr, |$b:ident| $body:block) => {{
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let nb = $nb;
        let mut $b = 0usize;
        while $b + 1 < nb {
            let (p, d) = $body;
            acc0 = _mm256_add_ps(
                acc0,
                _mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d)),
            );
            $b += 1;
            let (p, d) = $body;
            acc1 = _mm256_add_ps(
                acc1,
                _mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d)),
            );
            $b += 1;
        }
        if $b < nb {
            let (p, d) = $body;
            acc0 = _mm256_add_ps(
                acc0,
                _mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d)),
            );
        }
        reduce_lanes(acc0, acc1)
    }};
}

/// ggml's order (`common::Fma8`): one accumulator, `fma(d_w·d_a, partials, acc)`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let dist = pf::distance();
    for b in 0..n / 32 {
        pf::ahead(w, 34 * b, dist, 34);
        let (wb, ab) = (wp.add(34 * b), ap.add(34 * b));
        let p = dot_ss(load(wb.add(2)), load(ab.add(2)));
        let d = _mm256_set1_ps(h2f(w, 34 * b) * h2f(a, 34 * b));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
    }
    hsum8(acc)
}

/// `common::reduce8` of one register (ggml's `hsum_float_8`).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn hsum8(v: __m256) -> f32 {
    let mut r = [0f32; 8];
    unsafe { _mm256_storeu_ps(r.as_mut_ptr(), v) };
    reduce8(&r)
}

/// ggml's `ggml_vec_dot_f32` (`scalar::f32_dot`): four accumulators over 32-element steps.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wp, ap) = (w.as_ptr() as *const f32, a.as_ptr() as *const f32);
    let mut acc = [_mm256_setzero_ps(); 4];
    let n32 = n / 32 * 32;
    let mut i = 0;
    while i < n32 {
        for (j, s) in acc.iter_mut().enumerate() {
            let o = i + 8 * j;
            *s = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(o)), _mm256_loadu_ps(ap.add(o)), *s);
        }
        i += 32;
    }
    let mut r = [[0f32; 8]; 4];
    for (j, s) in acc.iter().enumerate() {
        _mm256_storeu_ps(r[j].as_mut_ptr(), *s);
    }
    let mut s = super::common::reduce_4x8(&r) as f64;
    for i in n32..n {
        s += (*wp.add(i) * *ap.add(i)) as f64;
    }
    s as f32
}

/// The multi-row F32 order (`scalar::f32_dot_many`): one 8-lane accumulator.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f32_dot_many(n: usize, w: &[u8], a: &[u8]) -> f32 {
    if !n.is_multiple_of(8) {
        return f32_dot(n, w, a);
    }
    let (wp, ap) = (w.as_ptr() as *const f32, a.as_ptr() as *const f32);
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i < n {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(i)), _mm256_loadu_ps(ap.add(i)), acc);
        i += 8;
    }
    hsum8(acc)
}

/// The kernel of ggml's multi-row matmul order where it differs from `kernel`: F32
/// (tinyBLAS, t > 1), Q6_K and IQ3_S (tiled, t ≥ 8), Q4_K (repacked gemm).
pub fn kernel_many(w: GgmlType) -> Option<DotFn> {
    use GgmlType::*;
    if !cpu::has_avx2() {
        return None;
    }
    Some(match w {
        F32 => safe_dot!(F32, f32_dot_many),
        Q6K => safe_dot!(Q6K, k::q6_k_tiled),
        IQ3S => safe_dot!(IQ3S, k::iq3_s_tiled),
        Q4K => safe_dot!(Q4K, k::q4_k_gemm),
        _ => return None,
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    lanes!(n / 32, |b| {
        let q = _mm256_sub_epi8(nibbles(load128(wp.add(18 * b + 2))), _mm256_set1_epi8(8));
        let p = dot_ss(q, load(ap.add(34 * b + 2)));
        (p, h2f(w, 18 * b) * h2f(a, 34 * b))
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    lanes!(n / 32, |b| {
        let wb = wp.add(22 * b);
        let qh = (wb.add(2) as *const u32).read_unaligned();
        // 5th bit clear: nibble − 16 as i8 (= nibble | 0xF0); set: the nibble plus 16 − 16.
        let hi = _mm256_andnot_si256(bits_to_bytes(qh), _mm256_set1_epi8(0xF0u8 as i8));
        let q = _mm256_or_si256(nibbles(load128(wb.add(6))), hi);
        let p = dot_ss(q, load(ap.add(34 * b + 2)));
        (p, h2f(w, 22 * b) * h2f(a, 34 * b))
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_nl(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let kv = table16(&KVALUES_IQ4NL);
    lanes!(n / 32, |b| {
        let q = _mm256_shuffle_epi8(kv, nibbles(load128(wp.add(18 * b + 2))));
        let p = dot_ss(q, load(ap.add(34 * b + 2)));
        (p, h2f(w, 18 * b) * h2f(a, 34 * b))
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mxfp4(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let kv = table16(&KVALUES_MXFP4);
    lanes!(n / 32, |b| {
        let q = _mm256_shuffle_epi8(kv, nibbles(load128(wp.add(17 * b + 1))));
        let p = dot_ss(q, load(ap.add(34 * b + 2)));
        (p, super::common::e8m0_half(w[17 * b]) * h2f(a, 34 * b))
    })
}

/// Q2_0: each 32-element half (8 bytes of 2-bit fields, element 4k + j in bits 2j of
/// byte k) is one lane-scheme block; a 4×8 byte transpose puts the fields in element order.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let m3 = _mm_set1_epi8(3);
    lanes!(n / 32, |b| {
        let x = _mm_loadl_epi64(wp.add(18 * (b / 2) + 2 + 8 * (b % 2)) as *const __m128i);
        let y0 = _mm_and_si128(x, m3);
        let y1 = _mm_and_si128(_mm_srli_epi16(x, 2), m3);
        let y2 = _mm_and_si128(_mm_srli_epi16(x, 4), m3);
        let y3 = _mm_and_si128(_mm_srli_epi16(x, 6), m3);
        let (lo01, lo23) = (_mm_unpacklo_epi8(y0, y1), _mm_unpacklo_epi8(y2, y3));
        let q = _mm256_set_m128i(
            _mm_unpackhi_epi16(lo01, lo23),
            _mm_unpacklo_epi16(lo01, lo23),
        );
        let p = dot_ss(
            _mm256_sub_epi8(q, _mm256_set1_epi8(1)),
            load(ap.add(34 * b + 2)),
        );
        (p, h2f(w, 18 * (b / 2)) * h2f(a, 34 * b))
    })
}

/// Q4_1 / Q5_1 with Q8_1: lanes of d_w·d_a·Σq·a, plus Σ m·s in block order.
macro_rules! q8_1_kernel {
    ($name:ident, $bs:expr, |$wb:ident| $q:block) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let (wp, ap) = (w.as_ptr(), a.as_ptr());
            let mut ms = 0f32;
            let s = lanes!(n / 32, |b| {
                let $wb = wp.add($bs * b);
                let p = dot_us($q, load(ap.add(36 * b + 4)));
                ms += h2f(w, $bs * b + 2) * h2f(a, 36 * b + 2);
                (p, h2f(w, $bs * b) * h2f(a, 36 * b))
            });
            s + ms
        }
    };
}

q8_1_kernel!(q4_1, 20, |wb| { nibbles(load128(wb.add(4))) });
q8_1_kernel!(q5_1, 24, |wb| {
    let qh = (wb.add(4) as *const u32).read_unaligned();
    let hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(16));
    _mm256_or_si256(nibbles(load128(wb.add(8))), hi)
});

/// Float rows: `$ld(i)` loads elements i..i+8 of the weight or activation as __m256.
macro_rules! float_kernel {
    ($name:ident, $sz:expr, $ld:ident, $scalar:path) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let (wp, ap) = (w.as_ptr(), a.as_ptr());
            let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let n16 = n / 16 * 16;
            let mut i = 0;
            while i < n16 {
                let p0 = _mm256_mul_ps($ld(wp.add($sz * i)), $ld(ap.add($sz * i)));
                let p1 = _mm256_mul_ps($ld(wp.add($sz * (i + 8))), $ld(ap.add($sz * (i + 8))));
                acc0 = _mm256_add_ps(acc0, p0);
                acc1 = _mm256_add_ps(acc1, p1);
                i += 16;
            }
            let mut s = reduce_lanes(acc0, acc1);
            for i in n16..n {
                s += $scalar(w, $sz * i) * $scalar(a, $sz * i);
            }
            s
        }
    };
}

#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn ld_f16(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(load128(p))
}

#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn ld_bf16(p: *const u8) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(p)), 16))
}

float_kernel!(f16_dot, 2, ld_f16, super::common::f16_at);
float_kernel!(bf16_dot, 2, ld_bf16, super::common::bf16_at);
