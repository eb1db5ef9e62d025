//! AVX2 kernels of the repacked Q6_K dot (`q6k_repack`): per block 3 shifts per 128 quants
//! to decode, 8 `maddubs` + 4 `madd` for the scaled sums and 1 `madd` for the bsum term,
//! then ggml's float combine of the eight lanes.
//! Safety: callers have checked AVX2/FMA/F16C and that the slices hold `n / 256` blocks.

use super::super::avx2::{h2f, h2f_bits, hsum8, hsum_i32, load, load128, pf};
use super::super::common::f32_at;
use std::arch::x86_64::*;

/// `pshufb` masks: mask m puts scale words 2m and 2m+1 of each 128-bit half of the widened
/// reordered scales in alternate i16 lanes (i16 lane k of `madd` m scales S(2m + k%2, k/2)).
#[target_feature(enable = "avx2")]
#[inline]
fn pair_masks() -> [__m256i; 4] {
    std::array::from_fn(|m| {
        let b: [u8; 32] = std::array::from_fn(|i| {
            let k = (i % 16) / 2;
            (2 * (2 * m + k % 2) + i % 2) as u8
        });
        unsafe { _mm256_loadu_si256(b.as_ptr() as *const __m256i) }
    })
}

/// One repacked block decoded for any number of activations: the quant vectors of each
/// half, the scales arranged for each `madd`, the natural-order scales of the bsum term.
struct Decoded {
    v: [[__m256i; 4]; 2],
    s: [__m256i; 4],
    scn: __m256i,
}

/// The four quant vectors (0..63 per byte) of half `g` (0, 1) of repacked block `wb`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn quants_half(wb: *const u8, g: usize) -> [__m256i; 4] {
    let (m6, m3) = (_mm256_set1_epi8(0x3f), _mm256_set1_epi8(3));
    let (mc, m30) = (_mm256_set1_epi8(0x0c), _mm256_set1_epi8(0x30));
    let qa = load(wb.add(96 * g));
    let qb = load(wb.add(96 * g + 32));
    let qc = load(wb.add(96 * g + 64));
    let v3 = _mm256_or_si256(
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(qa, 6), m3),
            _mm256_and_si256(_mm256_srli_epi16(qb, 4), mc),
        ),
        _mm256_and_si256(_mm256_srli_epi16(qc, 2), m30),
    );
    [
        _mm256_and_si256(qa, m6),
        _mm256_and_si256(qb, m6),
        _mm256_and_si256(qc, m6),
        v3,
    ]
}

/// A block's 16 reordered signed scales (`scr`, bytes 192..208) widened to i16 in natural
/// order (word i = sc[i]), for the bsum term.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn natural_scales(scr: __m128i) -> __m256i {
    // byte i = sc[i]
    let nat = _mm_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scr, nat))
}

/// Decodes repacked block `wb` (its quants and scales; not d).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn decode(wb: *const u8, masks: &[__m256i; 4]) -> Decoded {
    let scr = load128(wb.add(192));
    let w = _mm256_cvtepi8_epi16(scr); // [sc0, sc2, .., sc14 | sc1, sc3, .., sc15]
    Decoded {
        v: std::array::from_fn(|g| quants_half(wb, g)),
        s: std::array::from_fn(|m| _mm256_shuffle_epi8(w, masks[m])),
        scn: natural_scales(scr),
    }
}

/// The block's eight lane integers (ggml's) of decoded block `d` against permuted
/// activation block `ab`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn lanes_of(d: &Decoded, ab: *const u8) -> __m256i {
    let ap = ab.add(4);
    let mut sum = _mm256_setzero_si256();
    for g in 0..2 {
        let [v0, v1, v2, v3] = d.v[g];
        let a = |v: usize| load(ap.add(32 * (4 * g + v)));
        let p0 = _mm256_add_epi16(
            _mm256_maddubs_epi16(v0, a(0)),
            _mm256_maddubs_epi16(v1, a(1)),
        );
        let p1 = _mm256_add_epi16(
            _mm256_maddubs_epi16(v2, a(2)),
            _mm256_maddubs_epi16(v3, a(3)),
        );
        let s0 = _mm256_madd_epi16(p0, d.s[2 * g]);
        let s1 = _mm256_madd_epi16(p1, d.s[2 * g + 1]);
        sum = _mm256_add_epi32(sum, _mm256_add_epi32(s0, s1));
    }
    let msum = _mm256_madd_epi16(d.scn, load(ab.add(260)));
    _mm256_sub_epi32(sum, _mm256_slli_epi32(msum, 5))
}

/// The block's eight lane integers (ggml's), from repacked block `wb` and permuted
/// activation block `ab`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn lanes(wb: *const u8, ab: *const u8, masks: &[__m256i; 4]) -> __m256i {
    lanes_of(&decode(wb, masks), ab)
}

/// Prefetch (into L1) the block `dist` bytes past block offset `wo` of `w`: the hardware
/// prefetcher alone left one core at ~7 GB/s on a 255 MB head (Zen 1), with hints 2048 bytes
/// ahead at ~13 GB/s. `dist`: the head's knob (`pf::knob::HEAD`, read once per kernel call).
#[inline(always)]
fn prefetch(w: &[u8], wo: usize, dist: usize) {
    pf::ahead(w, wo, dist, super::BLOCK_BYTES);
}

/// `vec_dot`'s order (`k::q6_k`): `fma(d_a·d, f32(lanes), acc)` per block, then `hsum8`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_single(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (masks, dist) = (pair_masks(), pf::knob::HEAD.get());
    let mut acc = _mm256_setzero_ps();
    for b in 0..n / 256 {
        let (wo, ao) = (210 * b, 292 * b);
        prefetch(w, wo, dist);
        let l = lanes(w.as_ptr().add(wo), a.as_ptr().add(ao), &masks);
        let d = f32_at(a, ao) * h2f(w, wo + 208);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(l), acc);
    }
    hsum8(acc)
}

/// The tiled order (`k::q6_k_tiled`): `acc + (f32(Σ lanes)·d)·d_a` per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_tiled(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (masks, dist) = (pair_masks(), pf::knob::HEAD.get());
    let mut acc = 0f32;
    for b in 0..n / 256 {
        let (wo, ao) = (210 * b, 292 * b);
        prefetch(w, wo, dist);
        let s = hsum_i32(lanes(w.as_ptr().add(wo), a.as_ptr().add(ao), &masks)) as f32;
        acc += (s * h2f(w, wo + 208)) * f32_at(a, ao);
    }
    acc
}

/// `dot_single` of each row `r` in `rows` of the repacked matrix `w` (rows of `n` elements
/// back to back) against `N` permuted activations: `put(r, y)` with `y[k]` bitwise
/// `dot_single(n, row r, a[k])` (the same lane integers and float steps per activation).
/// Each block is decoded once for the N, half a block at a time, so that its four quant
/// vectors and two scale vectors stay in registers across the N activations; the masks and
/// the row loop are hoisted out of the per-row call.
/// Safety (besides the CPU's): `w` holds `rows.end` rows and each `a[k]` `n / 256` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_single_n<const N: usize, F: FnMut(usize, [f32; N])>(
    n: usize,
    w: &[u8],
    rows: std::ops::Range<usize>,
    a: [&[u8]; N],
    put: F,
) {
    rows_single_body::<N, false, F>(n, w, rows, a, put)
}

/// `rows_single_n` with AVX-512 VL/VNNI: `vpdpwssd` scales and accumulates in one step (and
/// takes the bsum term as `(−32·sc)·bsum` pairs), and the 32 vector registers hold both
/// halves' quants and scales (bitwise the same integers, so the same results).
/// Safety: as `rows_single_n`, and the CPU runs AVX-512 F/VL/VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) unsafe fn rows_single_n_vnni<const N: usize, F: FnMut(usize, [f32; N])>(
    n: usize,
    w: &[u8],
    rows: std::ops::Range<usize>,
    a: [&[u8]; N],
    put: F,
) {
    rows_single_body::<N, true, F>(n, w, rows, a, put)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows_single_body<const N: usize, const VNNI: bool, F: FnMut(usize, [f32; N])>(
    n: usize,
    w: &[u8],
    rows: std::ops::Range<usize>,
    a: [&[u8]; N],
    mut put: F,
) {
    // sum + Σ pairs of p·s per i32 lane
    let mac = |sum: __m256i, p: __m256i, s: __m256i| {
        if VNNI {
            _mm256_dpwssd_epi32(sum, p, s)
        } else {
            _mm256_add_epi32(sum, _mm256_madd_epi16(p, s))
        }
    };
    let (masks, dist) = (pair_masks(), pf::knob::HEAD.get());
    let nb = n / 256;
    let ap = a.map(<[u8]>::as_ptr);
    for r in rows {
        let mut acc = [_mm256_setzero_ps(); N];
        for b in 0..nb {
            let wo = (r * nb + b) * 210;
            prefetch(w, wo, dist);
            let wb = w.as_ptr().add(wo);
            let scr = load128(wb.add(192));
            let sw = _mm256_cvtepi8_epi16(scr); // [sc0, sc2, .., sc14 | sc1, sc3, .., sc15]
            let mut sum = [_mm256_setzero_si256(); N]; // ggml's eight lanes per activation
            for g in 0..2 {
                let [v0, v1, v2, v3] = quants_half(wb, g);
                let s0 = _mm256_shuffle_epi8(sw, masks[2 * g]);
                let s1 = _mm256_shuffle_epi8(sw, masks[2 * g + 1]);
                for k in 0..N {
                    let q = ap[k].add(292 * b + 4 + 128 * g); // this half's permuted quants
                    let p0 = _mm256_add_epi16(
                        _mm256_maddubs_epi16(v0, load(q)),
                        _mm256_maddubs_epi16(v1, load(q.add(32))),
                    );
                    let p1 = _mm256_add_epi16(
                        _mm256_maddubs_epi16(v2, load(q.add(64))),
                        _mm256_maddubs_epi16(v3, load(q.add(96))),
                    );
                    sum[k] = mac(mac(sum[k], p0, s0), p1, s1);
                }
                // Keep the halves apart: the sums are made here, so the compiler cannot
                // interleave both halves' twelve quant and scale vectors (which spills).
                if !VNNI {
                    for x in sum.iter_mut() {
                        std::arch::asm!(
                            "/* {0} */",
                            inout(ymm_reg) * x,
                            options(pure, nomem, nostack)
                        );
                    }
                }
            }
            let scn = natural_scales(scr);
            let scm = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(scn, 5));
            // the caller's contract covers these reads: no bounds checks in the block loop
            let dw = h2f_bits(wb.add(208).cast::<u16>().read_unaligned());
            for k in 0..N {
                let bs = load(ap[k].add(292 * b + 260));
                let l = mac(sum[k], scm, bs); // sum − 32·Σ sc·bsum
                let d = ap[k].add(292 * b).cast::<f32>().read_unaligned() * dw;
                acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(l), acc[k]);
            }
        }
        put(r, acc.map(|x| hsum8(x)));
    }
}
