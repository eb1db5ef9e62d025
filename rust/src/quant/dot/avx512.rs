//! AVX-512 (F/BW/VL) kernels, with VNNI (`vpdpbusd`) variants of the 32-element block types.
//! As in AVX2, only the integer part and the fixed 16-lane float scheme are vectorised, so
//! results are bitwise equal to the scalar kernels. One zmm of 16 f32 lanes holds an even
//! block's 8 lanes and the following odd block's 8 lanes, exactly `common::Lanes`.
//! Safety: kernels are handed out only when `cpu::has_avx512()` (and `has_vnni()` for the
//! VNNI ones) holds, and `super::checked` has verified the slice lengths for `n`.

use super::avx2::{h2f, load, load128, nibbles};
use super::common::{f32_at, k_add, k_add_min, reduce8, scale_min_k4, u16_at, u32_at};
use super::{cpu, DotFn};
use crate::quant::tables::{IQ3XXS_GRID, KSIGNS_IQ2XS, KVALUES_IQ4NL};
use crate::quant::GgmlType;
use std::arch::x86_64::*;

pub fn kernel(w: GgmlType) -> Option<DotFn> {
    kernel_with(w, cpu::has_vnni())
}

/// The kernel for `w`, with the VNNI variants only when `vnni` (tests check both).
pub fn kernel_with(w: GgmlType, vnni: bool) -> Option<DotFn> {
    use GgmlType::*;
    if !cpu::has_avx512() || (vnni && !cpu::has_vnni()) {
        return None;
    }
    Some(match w {
        F16 => safe_dot!(F16, f16_dot),
        BF16 => safe_dot!(BF16, bf16_dot),
        Q4_0 if vnni => safe_dot!(Q4_0, q4_0_vnni),
        Q4_0 => safe_dot!(Q4_0, q4_0),
        IQ4NL if vnni => safe_dot!(IQ4NL, iq4_nl_vnni),
        IQ4NL => safe_dot!(IQ4NL, iq4_nl),
        Q2K => safe_dot!(Q2K, q2_k),
        Q3K => safe_dot!(Q3K, q3_k),
        Q4K => safe_dot!(Q4K, q4_k),
        Q5K => safe_dot!(Q5K, q5_k),
        IQ4XS => safe_dot!(IQ4XS, iq4_xs),
        IQ3XXS => safe_dot!(IQ3XXS, iq3_xxs),
        IQ3S if cpu::has_vbmi() => safe_dot!(IQ3S, super::gemm::iq3_s_avx512_vbmi),
        IQ3S => safe_dot!(IQ3S, super::gemm::iq3_s_avx512),
        _ => return None,
    })
}

#[path = "avx512_rows.rs"]
pub(super) mod rows;

/// The grouped one-token kernel (`vec_dot_rows`) where the AVX-512 path has its own: IQ3_S
/// with VBMI and BITALG (`gemm_iq3s512_rows.rs`), Q4_K and Q6_K (`avx512_rows.rs`); `None`
/// leaves the type to the AVX2 grouped kernels, or to the per-row kernel.
pub fn rows_kernel(w: GgmlType) -> Option<super::RowsFn> {
    match w {
        GgmlType::IQ3S if cpu::has_vbmi_bitalg() => Some(iq3_s_rows as super::RowsFn),
        GgmlType::Q4K if cpu::has_avx512() => Some(rows::q4_k_rows as super::RowsFn),
        GgmlType::Q6K if cpu::has_avx512() => Some(rows::q6_k_rows as super::RowsFn),
        _ => None,
    }
}

/// `vec_dot_rows` for IQ3_S: `n` whole blocks, `out.len()` rows, one Q8_K activation.
fn iq3_s_rows(n: usize, rows: &[u8], act: &[u8], out: &mut [f32]) {
    super::assert_rows_args(GgmlType::IQ3S, n, rows, act, out.len());
    // SAFETY: handed out only where AVX-512 F/BW/VBMI/BITALG hold (with AVX2/FMA/F16C);
    // the sizes are asserted above.
    unsafe { super::gemm::iq3_s_rows_avx512(n, rows, act, out) }
}

/// Two 256-bit halves as one zmm (`lo` in lanes 0..8 of 32 bits).
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// Sum of the 16 i32 lanes.
#[target_feature(enable = "avx512f")]
#[inline]
fn hsum_i32(v: __m512i) -> i32 {
    _mm512_reduce_add_epi32(v)
}

/// `y` with the sign of `x` applied (negated where x < 0); `y` avoids −128.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
pub(super) fn sign_of(y: __m512i, x: __m512i) -> __m512i {
    _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), _mm512_setzero_si512(), y)
}

/// Lane k: Σ_{e=4k}^{4k+3} x_e·y_e for two signed operands (BW: maddubs + madd).
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn dot_ss(x: __m512i, y: __m512i) -> __m512i {
    let p = _mm512_maddubs_epi16(_mm512_abs_epi8(x), sign_of(y, x));
    _mm512_madd_epi16(p, _mm512_set1_epi16(1))
}

/// The same with VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
fn dot_ss_vnni(x: __m512i, y: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(x), sign_of(y, x))
}

/// `acc + madd(maddubs(u, s), scales)`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn mac(acc: __m512i, u: __m512i, s: __m512i, scales: __m512i) -> __m512i {
    _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), scales))
}

/// i16 lanes 0..16 = `lo`, 16..32 = `hi`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn pair32(lo: i32, hi: i32) -> __m512i {
    _mm512_mask_blend_epi16(
        0xFFFF_0000,
        _mm512_set1_epi16(lo as i16),
        _mm512_set1_epi16(hi as i16),
    )
}

/// The 16-lane float reduction (`common::reduce16`).
#[target_feature(enable = "avx512f")]
#[inline]
fn reduce_lanes(acc: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(acc);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
    let mut r = [0f32; 8];
    unsafe { _mm256_storeu_ps(r.as_mut_ptr(), _mm256_add_ps(lo, hi)) };
    reduce8(&r)
}

/// 32-element blocks, two per zmm: `$q(b) -> __m256i` gives block b's 32 weight bytes,
/// `$a(b)` its activation bytes, `$d(b)` its scale; `$dot` the integer lane dot.
macro_rules! lanes512 {
    ($nb:expr, $dot:ident, |$b:ident| $q:expr, $a:expr, $d:expr) => {{
        let nb = $nb;
        let mut acc = _mm512_setzero_ps();
        let mut i = 0usize;
        while i + 1 < nb {
            let (q0, a0, d0) = {
                let $b = i;
                ($q, $a, $d)
            };
            let (q1, a1, d1) = {
                let $b = i + 1;
                ($q, $a, $d)
            };
            let p = $dot(join(q0, q1), join(a0, a1));
            let dv = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(d0), _mm512_set1_ps(d1));
            acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_cvtepi32_ps(p), dv));
            i += 2;
        }
        if i < nb {
            let (q0, a0, d0) = {
                let $b = i;
                ($q, $a, $d)
            };
            let z = _mm256_setzero_si256();
            let p = $dot(join(q0, z), join(a0, z));
            let t = _mm512_mul_ps(_mm512_cvtepi32_ps(p), _mm512_set1_ps(d0));
            acc = _mm512_mask_add_ps(acc, 0x00FF, acc, t);
        }
        reduce_lanes(acc)
    }};
}

macro_rules! legacy {
    ($name:ident, $feat:literal, $dot:ident, $bs:expr, |$wp:ident, $b:ident| $q:expr) => {
        #[target_feature(enable = $feat)]
        unsafe fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let ($wp, ap) = (w.as_ptr(), a.as_ptr());
            lanes512!(n / 32, $dot, |$b| $q, load(ap.add(34 * $b + 2)), {
                h2f(w, $bs * $b) * h2f(a, 34 * $b)
            })
        }
    };
}

legacy!(
    q4_0,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl",
    dot_ss,
    18,
    |wp, b| { _mm256_sub_epi8(nibbles(load128(wp.add(18 * b + 2))), _mm256_set1_epi8(8)) }
);
legacy!(
    q4_0_vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    dot_ss_vnni,
    18,
    |wp, b| { _mm256_sub_epi8(nibbles(load128(wp.add(18 * b + 2))), _mm256_set1_epi8(8)) }
);
legacy!(
    iq4_nl,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl",
    dot_ss,
    18,
    |wp, b| {
        _mm256_shuffle_epi8(
            super::avx2::table16(&KVALUES_IQ4NL),
            nibbles(load128(wp.add(18 * b + 2))),
        )
    }
);
legacy!(
    iq4_nl_vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    dot_ss_vnni,
    18,
    |wp, b| {
        _mm256_shuffle_epi8(
            super::avx2::table16(&KVALUES_IQ4NL),
            nibbles(load128(wp.add(18 * b + 2))),
        )
    }
);

/// Float rows: one zmm of 16 lanes (lane i % 16), the tail in order.
macro_rules! float_kernel {
    ($name:ident, $sz:expr, $ld:ident, $scalar:path) => {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
        unsafe fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let (wp, ap) = (w.as_ptr(), a.as_ptr());
            let mut acc = _mm512_setzero_ps();
            let n16 = n / 16 * 16;
            let mut i = 0;
            while i < n16 {
                acc = _mm512_add_ps(
                    acc,
                    _mm512_mul_ps($ld(wp.add($sz * i)), $ld(ap.add($sz * i))),
                );
                i += 16;
            }
            let mut s = reduce_lanes(acc);
            for i in n16..n {
                s += $scalar(w, $sz * i) * $scalar(a, $sz * i);
            }
            s
        }
    };
}

#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn ld_f16(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn ld_bf16(p: *const u8) -> __m512 {
    let v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
    _mm512_castsi512_ps(_mm512_slli_epi32(v, 16))
}

float_kernel!(f16_dot, 2, ld_f16, super::common::f16_at);
float_kernel!(bf16_dot, 2, ld_bf16, super::common::bf16_at);

/// 64 contiguous bytes.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn load512(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const __m512i)
}

/// A 256-bit value in both halves, shifted right (16-bit lanes) by `s0` in the low half
/// and `s1` in the high half.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
pub(super) fn bcast_shift(v: __m256i, s0: i16, s1: i16) -> __m512i {
    let cnt = _mm512_mask_blend_epi16(0xFFFF_0000, _mm512_set1_epi16(s0), _mm512_set1_epi16(s1));
    _mm512_srlv_epi16(_mm512_broadcast_i64x4(v), cnt)
}

/// Q4_K / Q5_K block: chunk c's 64 activations (contiguous) against [low nibbles of
/// qs[32c..], high nibbles] (+ the Q5_K 5th bits).
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn q45_k_ints(wb: &[u8], ab: &[u8], qs: *const u8, qh: Option<*const u8>) -> (i32, i32) {
    let mut sc = [0i32; 8];
    let mut mins = [0i16; 16];
    for k in 0..8 {
        let (s, m) = scale_min_k4(k, &wb[4..16]);
        sc[k] = s;
        mins[2 * k] = m as i16;
        mins[2 * k + 1] = m as i16;
    }
    let ap = ab.as_ptr().add(4);
    let (m4, one) = (_mm512_set1_epi8(15), _mm512_set1_epi8(1));
    let mut hv = match qh {
        Some(p) => bcast_shift(load(p), 0, 1),
        None => _mm512_setzero_si512(),
    };
    let mut sumv = _mm512_setzero_si512();
    for c in 0..4 {
        let mut q = _mm512_and_si512(bcast_shift(load(qs.add(32 * c)), 0, 4), m4);
        if qh.is_some() {
            q = _mm512_or_si512(q, _mm512_slli_epi16(_mm512_and_si512(hv, one), 4));
            hv = _mm512_srli_epi16(hv, 2);
        }
        sumv = mac(
            sumv,
            q,
            load512(ap.add(64 * c)),
            pair32(sc[2 * c], sc[2 * c + 1]),
        );
    }
    let mv = _mm256_loadu_si256(mins.as_ptr() as *const __m256i);
    let summ = _mm256_madd_epi16(mv, load(ab.as_ptr().add(260)));
    (hsum_i32(sumv), super::avx2::hsum_i32(summ))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn q4_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0f32;
    for b in 0..n / 256 {
        let (wb, ab) = (&w[144 * b..144 * b + 144], &a[292 * b..292 * b + 292]);
        let (si, sm) = q45_k_ints(wb, ab, wb.as_ptr().add(16), None);
        let da = f32_at(ab, 0);
        acc = k_add_min(acc, da * h2f(wb, 0), si, da * h2f(wb, 2), sm);
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn q5_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0f32;
    for b in 0..n / 256 {
        let (wb, ab) = (&w[176 * b..176 * b + 176], &a[292 * b..292 * b + 292]);
        let (si, sm) = q45_k_ints(wb, ab, wb.as_ptr().add(48), Some(wb.as_ptr().add(16)));
        let da = f32_at(ab, 0);
        acc = k_add_min(acc, da * h2f(wb, 0), si, da * h2f(wb, 2), sm);
    }
    acc
}

/// Permutation indices for 16 i16 scales: table t puts scale 4t + i/8 in i16 lane i, so a
/// zmm of 64 elements (four 16-element sub-blocks) gets its four scales.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) fn scale_perms() -> [__m512i; 4] {
    std::array::from_fn(|t| {
        let v: [i16; 32] = std::array::from_fn(|i| (4 * t + i / 8) as i16);
        unsafe { _mm512_loadu_si512(v.as_ptr() as *const __m512i) }
    })
}

/// Q2_K: per half h, zmm A = elements 128h..+64 (qs[32h..] >> 0 | >> 2), B = the next 64
/// (>> 4 | >> 6); scales as in Q6_K; the mins part from the bsums.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn q2_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let m3 = _mm512_set1_epi8(3);
    let idx = scale_perms();
    let mut acc = 0f32;
    for b in 0..n / 256 {
        let (wb, ab) = (&w[84 * b..84 * b + 84], &a[292 * b..292 * b + 292]);
        let (wp, ap) = (wb.as_ptr(), ab.as_ptr().add(4));
        let sc = load128(wp);
        let m15 = _mm_set1_epi8(15);
        let sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc, m15));
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), m15));
        let sc512 = _mm512_castsi256_si512(sc16);
        let mut sumv = _mm512_setzero_si512();
        for h in 0..2 {
            let q = load(wp.add(16 + 32 * h));
            let qa = _mm512_and_si512(bcast_shift(q, 0, 2), m3);
            let qb = _mm512_and_si512(bcast_shift(q, 4, 6), m3);
            let sa = _mm512_permutexvar_epi16(idx[2 * h], sc512);
            let sb = _mm512_permutexvar_epi16(idx[2 * h + 1], sc512);
            sumv = mac(sumv, qa, load512(ap.add(128 * h)), sa);
            sumv = mac(sumv, qb, load512(ap.add(128 * h + 64)), sb);
        }
        let summ = super::avx2::hsum_i32(_mm256_madd_epi16(mins, load(ab.as_ptr().add(260))));
        let da = f32_at(ab, 0);
        acc = k_add_min(
            acc,
            da * h2f(wb, 80),
            hsum_i32(sumv),
            da * h2f(wb, 82),
            summ,
        );
    }
    acc
}

/// Q3_K: as Q2_K with u = q2 + 4·hbit (hmask bit 4h + j) and q = u − 4 (the 4·Σa from the
/// bsums); signed 6-bit scales.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn q3_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (m3, one) = (_mm512_set1_epi8(3), _mm512_set1_epi8(1));
    let idx = scale_perms();
    let mut acc = 0f32;
    for b in 0..n / 256 {
        let (wb, ab) = (&w[110 * b..110 * b + 110], &a[292 * b..292 * b + 292]);
        let (wp, ap) = (wb.as_ptr(), ab.as_ptr().add(4));
        let sc = super::avx2::k::q3k_scales_packed(wb);
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
        let sc512 = _mm512_castsi256_si512(sc16);
        let hm = load(wp);
        let mut sumv = _mm512_setzero_si512();
        for h in 0..2 {
            let q = load(wp.add(32 + 32 * h));
            let s = 4 * h as i16;
            let ha = _mm512_slli_epi16(_mm512_and_si512(bcast_shift(hm, s, s + 1), one), 2);
            let hb = _mm512_slli_epi16(_mm512_and_si512(bcast_shift(hm, s + 2, s + 3), one), 2);
            let qa = _mm512_or_si512(_mm512_and_si512(bcast_shift(q, 0, 2), m3), ha);
            let qb = _mm512_or_si512(_mm512_and_si512(bcast_shift(q, 4, 6), m3), hb);
            let sa = _mm512_permutexvar_epi16(idx[2 * h], sc512);
            let sb = _mm512_permutexvar_epi16(idx[2 * h + 1], sc512);
            sumv = mac(sumv, qa, load512(ap.add(128 * h)), sa);
            sumv = mac(sumv, qb, load512(ap.add(128 * h + 64)), sb);
        }
        let msum = _mm256_madd_epi16(sc16, load(ab.as_ptr().add(260)));
        let si = hsum_i32(sumv) - 4 * super::avx2::hsum_i32(msum);
        acc = k_add(acc, f32_at(ab, 0) * h2f(wb, 108), si);
    }
    acc
}

/// IQ4_XS: groups g, g+1 per zmm (64 contiguous activations).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn iq4_xs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let kv = _mm512_broadcast_i32x4(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i));
    let mut acc = 0f32;
    for b in 0..n / 256 {
        let (wb, ab) = (&w[136 * b..136 * b + 136], &a[292 * b..292 * b + 292]);
        let (wp, ap) = (wb.as_ptr(), ab.as_ptr().add(4));
        let sh = u16_at(wb, 2);
        let ls = |g: usize| {
            let lo = (wb[4 + g / 2] >> (4 * (g % 2))) & 15;
            (lo as u32 | ((sh >> (2 * g)) & 3) << 4) as i32 - 32
        };
        let mut sumv = _mm512_setzero_si512();
        for g in (0..8).step_by(2) {
            let nib = join(
                nibbles(load128(wp.add(8 + 16 * g))),
                nibbles(load128(wp.add(24 + 16 * g))),
            );
            let q = _mm512_shuffle_epi8(kv, nib);
            let av = sign_of(load512(ap.add(32 * g)), q);
            sumv = mac(sumv, _mm512_abs_epi8(q), av, pair32(ls(g), ls(g + 1)));
        }
        acc = k_add(acc, f32_at(ab, 0) * h2f(wb, 0), hsum_i32(sumv));
    }
    acc
}

/// Eight grid entries of 4 bytes as a __m256i (entry m in 32-bit lane m).
#[target_feature(enable = "avx2")]
#[inline]
fn grid8x4(e: [u32; 8]) -> __m256i {
    unsafe { _mm256_loadu_si256(e.as_ptr() as *const __m256i) }
}

/// IQ3_XXS: as IQ3_S with 8-bit grid indices and KSIGNS sign bytes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn iq3_xxs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0f32;
    for b in 0..n / 256 {
        let (wb, ab) = (&w[98 * b..98 * b + 98], &a[292 * b..292 * b + 292]);
        let ap = ab.as_ptr().add(4);
        let grid = |g: usize| {
            let qs = &wb[2 + 8 * g..10 + 8 * g];
            grid8x4(std::array::from_fn(|m| IQ3XXS_GRID[qs[m] as usize]))
        };
        let signs = |wd: u32| {
            (0..4).fold(0u64, |s, l| {
                s | (KSIGNS_IQ2XS[((wd >> (7 * l)) & 127) as usize] as u64) << (8 * l)
            })
        };
        let mut sumv = _mm512_setzero_si512();
        for g in (0..8).step_by(2) {
            let (w0, w1) = (u32_at(wb, 66 + 4 * g), u32_at(wb, 70 + 4 * g));
            let gv = join(grid(g), grid(g + 1));
            let av = load512(ap.add(32 * g));
            let k = signs(w0) | signs(w1) << 32;
            let av = _mm512_mask_sub_epi8(av, k, _mm512_setzero_si512(), av);
            let scv = pair32(2 * (w0 >> 28) as i32 + 1, 2 * (w1 >> 28) as i32 + 1);
            sumv = mac(sumv, gv, av, scv);
        }
        acc = k_add(acc, f32_at(ab, 0) * h2f(wb, 0) * 0.25, hsum_i32(sumv));
    }
    acc
}
