//! AVX2 single-token (decode) kernels over groups of four consecutive weight rows against one
//! Q8_K activation (Q4_K, Q6_K) or Q8_0 activation (Q8_0, Q5_0, MXFP4): `out[r] = vec_dot(row r, a)`
//! bitwise.
//!
//! Why: on Zen 1 the one-row kernels are bound by vector µops, not by RAM (a Q4_K row streams
//! ~7 GB/s from L2 and from RAM alike); about a third of a Q4_K block's µops were its tail
//! (horizontal sums, mins, the float combine), done once per row. Here four rows share the
//! activation loads and the mins' pair sums, and their tails run as one in-lane transpose and
//! 4-wide float ops. Q6_K also rebuilds its 6-bit values with fewer shifts.
//!
//! Bitwise contract, per row: the integer sums are exact (so regrouping them changes nothing:
//! Q4_K uses only their totals, Q6_K keeps every i32 lane as `avx2_k::q6_k_ints` forms it),
//! and the float combine is `vec_dot`'s operation for operation — Q4_K `k_add_min`
//! (`acc + (d_a·d·sumi − d_a·dmin·summ)`, separate multiplies and adds, never fused), Q6_K
//! ggml's `Fma8` (`fma(d_a·d, f32(lanes), acc)` per block, then `hsum8`).
//! Q8_0 keeps ggml's `Fma8` order per row (`fma(d_w·d_a, f32(lanes), acc)` per block, then
//! `hsum8`); the four rows share the activation's loads and scale and run four independent
//! accumulator chains. Q5_0 and MXFP4 keep the 32-element lane scheme (`common::Lanes`: per block, the eight exact
//! 4-element sums times 2^(e−128)·d_a, a multiply then an add, even/odd blocks in two
//! registers). Their integer sums avoid the sign juggling of a signed·signed byte product: the
//! weights are taken unsigned, q + off (MXFP4: the doubled E2M1 values plus 12, 0..24; Q5_0:
//! the 5-bit values as stored, 0..31), so Σ q·a = Σ (q+off)·a − off·Σ a, whose second term is
//! shared by the four rows (exact in i16: 31·128·2 < 2^15).
//! Prefetch: hints run a group ahead (the next four rows), which from RAM beat per-row hints.
//!
//! Safety: callers (`super::rows_kernel`'s wrappers) have checked the CPU features and that
//! `w` holds four rows of `rb` = row bytes of `n` elements and `a` the activation of `n`.

use super::super::common::{e8m0_half, k4_scales_packed, u32_at};
use super::super::{cpu, RowsFn};
use super::{bits_to_bytes, dot_ss, h2f, hsum8, load, load128, nibbles, pf, reduce_lanes};
use crate::quant::tables::KVALUES_MXFP4;
use crate::quant::GgmlType;
use std::arch::x86_64::*;

use super::super::common::Q8K_BYTES as AB;
/// Rows per group.
pub(in super::super) const R: usize = 4;

/// Eight u8 (`signed`: i8) scales packed in a u64, as i16 in both 128-bit halves.
#[target_feature(enable = "avx2")]
#[inline]
pub(in super::super) fn scales8(s: u64, signed: bool) -> __m256i {
    let b = _mm_cvtsi64_si128(s as i64);
    let v = if signed {
        _mm_cvtepi8_epi16(b)
    } else {
        _mm_cvtepu8_epi16(b)
    };
    _mm256_broadcastsi128_si256(v)
}

/// Per 128-bit half, lanes `[Σa, Σb, Σc, Σd]` of the i32 vectors a..d summed within the half.
#[target_feature(enable = "avx2")]
#[inline]
pub(in super::super) fn transpose_sum4(s: [__m256i; R]) -> __m256i {
    let ab = _mm256_add_epi32(
        _mm256_unpacklo_epi32(s[0], s[1]),
        _mm256_unpackhi_epi32(s[0], s[1]),
    );
    let cd = _mm256_add_epi32(
        _mm256_unpacklo_epi32(s[2], s[3]),
        _mm256_unpackhi_epi32(s[2], s[3]),
    );
    _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd))
}

/// `[Σ a_lo, Σ a_hi, Σ b_lo, Σ b_hi]`: the four i32 lanes of each 128-bit half of
/// `a` = [s0 ×4 | s1 ×4] and `b` = [s2 ×4 | s3 ×4] summed, as `[s0, s1, s2, s3]`.
#[target_feature(enable = "avx2")]
#[inline]
pub(in super::super) fn sum4_halves(a: __m256i, b: __m256i) -> __m128i {
    let x = _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    let y = _mm256_add_epi32(x, _mm256_shuffle_epi32(x, 0b01_00_11_10)); // [s0 s2 . . | s1 s3 . .]
    _mm_unpacklo_epi32(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1))
}

/// Hints for the group one ahead: over the `nb` blocks the hints walk the next `R·rb` bytes
/// (shifted by half the prefetch distance), `R·bs` bytes per block.
#[inline(always)]
pub(in super::super) fn ahead_group(w: &[u8], b: usize, bs: usize, rb: usize, dist: usize) {
    if dist > 0 {
        pf::ahead(w, R * bs * b, R * rb + dist / 2, R * bs);
    }
}

/// Q4_K: `out[r] = dot(row r, a)` for the four rows of `w` (row r at byte `r·rb`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn q4_k_rows4(n: usize, w: &[u8], rb: usize, a: &[u8]) -> [f32; R] {
    let mut acc = _mm_setzero_ps();
    let m4 = _mm256_set1_epi8(15);
    let bm: [__m256i; 8] = std::array::from_fn(|k| _mm256_set1_epi16((0x0100 + 0x0202 * k) as i16));
    let dist = pf::distance();
    for b in 0..n / 256 {
        ahead_group(w, b, 144, rb, dist);
        let ab = &a[AB * b..AB * b + AB];
        let ap = ab.as_ptr().add(4);
        let mut heads = Q4Heads::default();
        let mut sumv = [_mm256_setzero_si256(); R];
        for r in 0..R {
            let wb = &w[r * rb + 144 * b..r * rb + 144 * b + 144];
            let sc8 = scales8(heads.take(r, wb), false);
            let qp = wb.as_ptr().add(16);
            let mut s = _mm256_setzero_si256();
            for c in 0..4 {
                let q = load(qp.add(32 * c));
                let lo = _mm256_and_si256(q, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                let plo = _mm256_maddubs_epi16(lo, load(ap.add(64 * c)));
                let phi = _mm256_maddubs_epi16(hi, load(ap.add(64 * c + 32)));
                let s0 = _mm256_shuffle_epi8(sc8, bm[2 * c]);
                let s1 = _mm256_shuffle_epi8(sc8, bm[2 * c + 1]);
                let v = _mm256_add_epi32(_mm256_madd_epi16(plo, s0), _mm256_madd_epi16(phi, s1));
                s = _mm256_add_epi32(s, v);
            }
            sumv[r] = s;
        }
        acc = _mm_add_ps(acc, q4_k_tail4(ab, sumv, &heads));
    }
    let mut out = [0f32; R];
    _mm_storeu_ps(out.as_mut_ptr(), acc);
    out
}

/// What the block tail of the grouped Q4_K kernels keeps of each of the four rows' block
/// headers: the packed mins and the d / dmin bits (16 per row).
#[derive(Default)]
pub(in super::super) struct Q4Heads {
    mins: [u64; R],
    dbits: u64,
    mbits: u64,
}

impl Q4Heads {
    /// Row `r`'s block `wb` (144 bytes): its mins, d and dmin kept; its eight scales returned
    /// packed (`k4_scales_packed`).
    #[inline(always)]
    pub(in super::super) fn take(&mut self, r: usize, wb: &[u8]) -> u64 {
        let (sc, mn) = k4_scales_packed(wb);
        self.mins[r] = mn;
        self.dbits |= (u32_at(wb, 0) as u64 & 0xffff) << (16 * r);
        self.mbits |= (u32_at(wb, 0) as u64 >> 16) << (16 * r);
        sc
    }
}

/// The four rows' block tail of the grouped Q4_K kernels: from their integer lane sums
/// (`sumv`, summed whole) and headers, the block's `d_a·d·sumi − d_a·dmin·summ` per row
/// ([r0, r1, r2, r3]; `vec_dot`'s float steps).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(in super::super) unsafe fn q4_k_tail4(ab: &[u8], sumv: [__m256i; R], h: &Q4Heads) -> __m128 {
    let (mins, dbits, mbits) = (h.mins, h.dbits, h.mbits);
    // sumi of the four rows: lanes [r0, r1, r2, r3].
    let t = transpose_sum4(sumv);
    let si = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    // summ = Σ_k min_k·(bsum_2k + bsum_2k+1): rows 0|1 and 2|3 in the halves of a madd.
    let bs = load(ab.as_ptr().add(260));
    let pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    let pairs = _mm256_broadcastsi128_si256(pairs);
    let mv = |r: usize| _mm256_cvtepu8_epi16(_mm_set_epi64x(mins[r + 1] as i64, mins[r] as i64));
    let m01 = _mm256_madd_epi16(mv(0), pairs); // [r0 ×4 | r1 ×4]
    let m23 = _mm256_madd_epi16(mv(2), pairs); // [r2 ×4 | r3 ×4]
    let sm = sum4_halves(m01, m23);
    // acc + (d_a·d·sumi − d_a·dmin·summ), four rows at once.
    let da = _mm_set1_ps(f32::from_le_bytes(ab[0..4].try_into().unwrap()));
    let dd = _mm_mul_ps(da, _mm_cvtph_ps(_mm_cvtsi64_si128(dbits as i64)));
    let dm = _mm_mul_ps(da, _mm_cvtph_ps(_mm_cvtsi64_si128(mbits as i64)));
    _mm_sub_ps(
        _mm_mul_ps(dd, _mm_cvtepi32_ps(si)),
        _mm_mul_ps(dm, _mm_cvtepi32_ps(sm)),
    )
}

/// The four 6-bit value vectors of Q6_K half-blocks (low nibbles of `ql0`, `ql1` | the `qh`
/// bit pairs 0-1, 2-3, 4-5, 6-7 moved to bits 4-5; `m4` = 0x0F, `m30` = 0x30 bytes), with the
/// 256- or 512-bit intrinsics: the AVX2 and zmm grouped kernels build them alike.
macro_rules! q6_values {
    ($ql0:expr, $ql1:expr, $qh:expr, $m4:expr, $m30:expr, 256) => {
        q6_values!(@ $ql0, $ql1, $qh, $m4, $m30, _mm256_or_si256, _mm256_and_si256,
            _mm256_slli_epi16, _mm256_srli_epi16)
    };
    ($ql0:expr, $ql1:expr, $qh:expr, $m4:expr, $m30:expr, 512) => {
        q6_values!(@ $ql0, $ql1, $qh, $m4, $m30, _mm512_or_si512, _mm512_and_si512,
            _mm512_slli_epi16, _mm512_srli_epi16)
    };
    (@ $ql0:expr, $ql1:expr, $qh:expr, $m4:expr, $m30:expr, $or:ident, $and:ident, $sl:ident,
        $sr:ident) => {{
        let (ql0, ql1, qh, m4, m30) = ($ql0, $ql1, $qh, $m4, $m30);
        [
            $or($and(ql0, m4), $and($sl(qh, 4), m30)),
            $or($and(ql1, m4), $and($sl(qh, 2), m30)),
            $or($and($sr(ql0, 4), m4), $and(qh, m30)),
            $or($and($sr(ql1, 4), m4), $and($sr(qh, 2), m30)),
        ]
    }};
}
pub(in super::super) use q6_values;

/// The byte masks that spread Q6_K quant vector j's i16 scale pairs (`vpshufb` within each
/// 128-bit lane of the scales as i16).
#[target_feature(enable = "avx2")]
#[inline]
pub(in super::super) fn q6_scale_masks() -> [__m256i; 4] {
    std::array::from_fn(|p| {
        let m: [u8; 32] = std::array::from_fn(|i| (4 * p + 2 * (i / 16) + i % 2) as u8);
        // SAFETY: `m` is 32 bytes
        unsafe { _mm256_loadu_si256(m.as_ptr() as *const __m256i) }
    })
}

/// Block `b` of a Q8_K activation `a`: its 256 quants, its 16 block sums (i16) and d.
/// Safety: `a` holds at least `b + 1` blocks.
#[target_feature(enable = "avx2")]
#[inline]
pub(in super::super) unsafe fn q8k_block(a: &[u8], b: usize) -> (*const u8, __m256i, f32) {
    let ab = &a[AB * b..AB * b + AB];
    let da = f32::from_le_bytes(ab[0..4].try_into().unwrap());
    (ab.as_ptr().add(4), load(ab.as_ptr().add(260)), da)
}

/// Q6_K: `out[r] = dot(row r, a)` for the four rows of `w` (row r at byte `r·rb`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn q6_k_rows4(n: usize, w: &[u8], rb: usize, a: &[u8]) -> [f32; R] {
    let mut acc = [_mm256_setzero_ps(); R];
    let (m4, m30) = (_mm256_set1_epi8(15), _mm256_set1_epi8(0x30));
    let masks = q6_scale_masks();
    let dist = pf::distance();
    let wp = w.as_ptr();
    for b in 0..n / 256 {
        ahead_group(w, b, 210, rb, dist);
        let (ap, bsums, da) = q8k_block(a, b);
        for r in 0..R {
            let wb = &w[r * rb + 210 * b..r * rb + 210 * b + 210];
            let base = wp.add(r * rb + 210 * b);
            let mut sumv = _mm256_setzero_si256();
            for h in 0..2 {
                let ql0 = load(base.add(64 * h));
                let ql1 = load(base.add(64 * h + 32));
                let qh = load(base.add(128 + 32 * h));
                let q = q6_values!(ql0, ql1, qh, m4, m30, 256);
                let sc8 = scales8(
                    u64::from_le_bytes(wb[192 + 8 * h..200 + 8 * h].try_into().unwrap()),
                    true,
                );
                for (j, &qj) in q.iter().enumerate() {
                    let scv = _mm256_shuffle_epi8(sc8, masks[j]);
                    let p = _mm256_maddubs_epi16(qj, load(ap.add(128 * h + 32 * j)));
                    sumv = _mm256_add_epi32(sumv, _mm256_madd_epi16(p, scv));
                }
            }
            acc[r] = q6_k_block_done(wb, sumv, bsums, da, acc[r]);
        }
    }
    std::array::from_fn(|r| hsum8(acc[r]))
}

/// The block tail of the grouped Q6_K kernels for one row (`wb`: its 210-byte block): ggml's
/// eight i32 lanes (`sumv`, the scaled 6-bit products) less 32·Σ sc·bsum, then
/// `fma(d_a·d, f32(lanes), acc)`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(in super::super) unsafe fn q6_k_block_done(
    wb: &[u8],
    sumv: __m256i,
    bsums: __m256i,
    da: f32,
    acc: __m256,
) -> __m256 {
    let scv = _mm256_cvtepi8_epi16(load128(wb.as_ptr().add(192)));
    let msum = _mm256_madd_epi16(scv, bsums);
    let lanes = _mm256_sub_epi32(sumv, _mm256_slli_epi32(msum, 5));
    let d = da * h2f(wb, 208);
    _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc)
}

/// Q8_0 (34-byte blocks: f16 scale, 32 i8) with a Q8_0 activation: `out[r] = dot(row r, a)`
/// for the four rows of `w` (row r at byte `r·rb`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn q8_0_rows4(n: usize, w: &[u8], rb: usize, a: &[u8]) -> [f32; R] {
    let mut acc = [_mm256_setzero_ps(); R];
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let nb = n / 32;
    assert!(w.len() >= 3 * rb + 34 * nb && a.len() >= 34 * nb);
    let dist = pf::distance();
    for b in 0..nb {
        ahead_group(w, b, 34, rb, dist);
        let av = load(ap.add(34 * b + 2));
        let da = h2f(a, 34 * b);
        for r in 0..R {
            let o = r * rb + 34 * b;
            let p = dot_ss(load(wp.add(o + 2)), av);
            let d = _mm256_set1_ps(h2f(w, o) * da);
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    std::array::from_fn(|r| hsum8(acc[r]))
}

/// Four rows of 32-element blocks in the lane scheme (`common::Lanes`) against a Q8_0
/// activation: `$u(wb)` gives block `wb`'s 32 weights as unsigned bytes q + `$off`, `$d(wb)`
/// its weight scale; Σ q·a = Σ u·a − off·Σ a, the second term once for the four rows.
macro_rules! lanes_rows4 {
    ($name:ident, $bs:expr, $off:expr, |$wb:ident| $u:expr, $d:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(in super::super) unsafe fn $name(n: usize, w: &[u8], rb: usize, a: &[u8]) -> [f32; R] {
            let (ones, off) = (_mm256_set1_epi16(1), _mm256_set1_epi8($off));
            // Row r's lanes of the even blocks in ev[r], of the odd blocks in od[r].
            let (mut ev, mut od) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
            let (wp, ap) = (w.as_ptr(), a.as_ptr());
            let nb = n / 32;
            assert!(w.len() >= 3 * rb + $bs * nb && a.len() >= 34 * nb);
            let dist = pf::distance();
            macro_rules! block {
                ($b:expr, $acc:ident) => {{
                    let b = $b;
                    ahead_group(w, b, $bs, rb, dist);
                    let av = load(ap.add(34 * b + 2));
                    let da = h2f(a, 34 * b);
                    // off·Σ a over each 4-element group, i32 lanes
                    let sa = _mm256_madd_epi16(_mm256_maddubs_epi16(off, av), ones);
                    for r in 0..R {
                        let $wb = wp.add(r * rb + $bs * b);
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16($u, av), ones);
                        let p = _mm256_sub_epi32(p, sa);
                        let d = _mm256_set1_ps($d * da);
                        $acc[r] = _mm256_add_ps($acc[r], _mm256_mul_ps(_mm256_cvtepi32_ps(p), d));
                    }
                }};
            }
            let mut b = 0;
            while b + 1 < nb {
                block!(b, ev);
                block!(b + 1, od);
                b += 2;
            }
            if b < nb {
                block!(b, ev);
            }
            std::array::from_fn(|r| reduce_lanes(ev[r], od[r]))
        }
    };
}

// MXFP4 (17-byte blocks: E8M0 exponent, 16 bytes of E2M1 nibbles): the doubled E2M1 values
// plus 12 (0..24) through a byte shuffle; scale 2^(e−128) as the scalar kernel forms it.
lanes_rows4!(
    mxfp4_rows4,
    17,
    12,
    |wb| _mm256_shuffle_epi8(mxfp4_table(), nibbles(load128(wb.add(1)))),
    e8m0_half(*wb)
);

// Q5_0 (22-byte blocks: f16 scale, 32 high bits, 16 bytes of nibbles): the 5-bit values
// unsigned (0..31, the scalar kernel's q + 16).
lanes_rows4!(
    q5_0_rows4,
    22,
    16,
    |wb| {
        let qh = (wb.add(2) as *const u32).read_unaligned();
        let hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
        _mm256_or_si256(nibbles(load128(wb.add(6))), hi)
    },
    half::f16::from_bits((wb as *const u16).read_unaligned()).to_f32()
);

/// The doubled E2M1 values plus 12, in both 128-bit halves.
#[target_feature(enable = "avx2")]
#[inline]
fn mxfp4_table() -> __m256i {
    let t: [i8; 16] = std::array::from_fn(|i| KVALUES_MXFP4[i] + 12);
    super::table16(&t)
}

/// The grouped kernel for `w`, if it has one: `f(n, rows, act, out)` with `out.len()` rows
/// back to back in `rows`; groups of four, the rest row by row with the one-row kernel.
pub fn rows_kernel(w: GgmlType) -> Option<RowsFn> {
    if !cpu::has_avx2() {
        return None;
    }
    match w {
        GgmlType::Q4K => Some(q4_k_rows as RowsFn),
        GgmlType::Q6K => Some(q6_k_rows as RowsFn),
        GgmlType::MXFP4 => Some(mxfp4_rows as RowsFn),
        GgmlType::Q8_0 => Some(q8_0_rows as RowsFn),
        GgmlType::Q5_0 => Some(q5_0_rows as RowsFn),
        _ => None,
    }
}

/// Rows of `w` through `four` in groups, the rest through `one` (both unsafe AVX2 kernels).
#[inline(always)]
pub(in super::super) fn by_groups(
    w: GgmlType,
    n: usize,
    rows: &[u8],
    act: &[u8],
    out: &mut [f32],
    four: unsafe fn(usize, &[u8], usize, &[u8]) -> [f32; R],
    one: unsafe fn(usize, &[u8], &[u8]) -> f32,
) {
    super::super::assert_rows_args(w, n, rows, act, out.len());
    let rb = w.row_bytes(n).unwrap_or(0);
    let done = out.len() / R * R;
    let mut groups = out.chunks_exact_mut(R);
    for (o, g) in (&mut groups).zip(rows.chunks_exact(R * rb)) {
        // SAFETY: `rows_kernel` hands this out only on an AVX2 CPU; `g` holds four rows of
        // `rb` bytes and `act` the activation of n elements (asserted above).
        o.copy_from_slice(&unsafe { four(n, g, rb, act) });
    }
    for (o, row) in groups
        .into_remainder()
        .iter_mut()
        .zip(rows[done * rb..].chunks_exact(rb))
    {
        // SAFETY: as above, one row of `rb` bytes.
        *o = unsafe { one(n, row, act) };
    }
}

fn q4_k_rows(n: usize, rows: &[u8], act: &[u8], out: &mut [f32]) {
    by_groups(GgmlType::Q4K, n, rows, act, out, q4_k_rows4, super::k::q4_k);
}

fn q6_k_rows(n: usize, rows: &[u8], act: &[u8], out: &mut [f32]) {
    by_groups(GgmlType::Q6K, n, rows, act, out, q6_k_rows4, super::k::q6_k);
}

fn q8_0_rows(n: usize, rows: &[u8], act: &[u8], out: &mut [f32]) {
    by_groups(GgmlType::Q8_0, n, rows, act, out, q8_0_rows4, super::q8_0);
}

fn q5_0_rows(n: usize, rows: &[u8], act: &[u8], out: &mut [f32]) {
    by_groups(GgmlType::Q5_0, n, rows, act, out, q5_0_rows4, super::q5_0);
}

fn mxfp4_rows(n: usize, rows: &[u8], act: &[u8], out: &mut [f32]) {
    by_groups(
        GgmlType::MXFP4,
        n,
        rows,
        act,
        out,
        mxfp4_rows4,
        super::mxfp4,
    );
}

/// Every row of the grouped kernels equals the one-row kernels (AVX2 and scalar) bitwise:
/// random blocks, row counts around and not multiples of the group, prefetch off and on, and
/// the extremes (every weight at its maximum, every activation ±127) that bound the i16 sums.
#[cfg(test)]
mod exact {
    use super::super::super::tests::{
        flat_q8k_act, random_act, random_row, set_extreme_k_rows, Rng,
    };
    use super::super::super::{kernel_for, rows_kernel_for, Isa};
    use super::super::pf::{knob::DIST, DISTANCE};
    use crate::quant::GgmlType;

    fn check(w: GgmlType, n: usize, m: &[u8], act: &[u8], what: &str) {
        let rb = w.row_bytes(n).unwrap();
        let rows = m.len() / rb;
        let g = rows_kernel_for(Isa::Avx2, w).expect("a grouped kernel");
        let mut out = vec![f32::NAN; rows];
        g(n, m, act, &mut out);
        let (one, scalar) = (
            kernel_for(Isa::Avx2, w).unwrap(),
            kernel_for(Isa::Scalar, w).unwrap(),
        );
        for (r, row) in m.chunks_exact(rb).enumerate() {
            let (a, s) = (one(n, row, act), scalar(n, row, act));
            assert_eq!(a.to_bits(), s.to_bits());
            assert_eq!(
                out[r].to_bits(),
                a.to_bits(),
                "{} {what} n={n} row {r}/{rows}",
                w.name()
            );
        }
    }

    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx2"]
    fn grouped_rows_equal_one_row_kernel_bitwise() {
        crate::quant::dot::require_isa(Isa::Avx2, "grouped_rows_equal_one_row_kernel_bitwise");
        for w in [
            GgmlType::Q4K,
            GgmlType::Q6K,
            GgmlType::MXFP4,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
        ] {
            let mut rng = Rng::new(17 + w.id() as u64);
            let ns: &[usize] = match w {
                GgmlType::Q4K | GgmlType::Q6K => &[256, 768, 2048],
                _ => &[32, 96, 256, 1408, 2880], // 1, 3, 8, 44, 90 blocks
            };
            for &n in ns {
                let act = random_act(w, n, &mut rng);
                let m: Vec<u8> = (0..13).flat_map(|_| random_row(w, n, &mut rng)).collect();
                let rb = m.len() / 13;
                for d in [0, DISTANCE] {
                    DIST.set(d);
                    for rows in [1usize, 2, 3, 4, 5, 7, 8, 9, 13] {
                        check(w, n, &m[..rows * rb], &act, &format!("random pf {d}"));
                    }
                }
                DIST.set(DISTANCE);
            }
        }
    }

    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx2"]
    fn grouped_rows_extremes_bitwise() {
        crate::quant::dot::require_isa(Isa::Avx2, "grouped_rows_extremes_bitwise");
        let n = 512;
        for w in [GgmlType::Q4K, GgmlType::Q6K] {
            let mut rng = Rng::new(3);
            let rb = w.row_bytes(n).unwrap();
            // all quant bits set (nibbles 15, 6-bit values 63), scales from random rows so
            // the f16 fields stay finite; Q6_K scales at ±127/−128 extremes.
            let mut m: Vec<u8> = (0..6).flat_map(|_| random_row(w, n, &mut rng)).collect();
            set_extreme_k_rows(w, &mut m, rb);
            for v in [127i8, -127, 1] {
                check(w, n, &m, &flat_q8k_act(n, v), &format!("extreme act {v}"));
            }
        }
    }

    /// MXFP4 at its extremes: every nibble ±12 (0x77 / 0xFF) or mixed, exponents from the
    /// subnormal 0 to 254, Q8_0 activations of ±127 (the largest |(q+12)·a| pair sums).
    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx2"]
    fn grouped_mxfp4_extremes_bitwise() {
        crate::quant::dot::require_isa(Isa::Avx2, "grouped_mxfp4_extremes_bitwise");
        let (w, n) = (GgmlType::MXFP4, 2880);
        let rb = w.row_bytes(n).unwrap();
        let mut rng = Rng::new(5);
        let mut m: Vec<u8> = (0..7).flat_map(|_| random_row(w, n, &mut rng)).collect();
        for (k, row) in m.chunks_exact_mut(rb).enumerate() {
            for (j, blk) in row.chunks_exact_mut(17).enumerate() {
                blk[0] = [0u8, 1, 2, 127, 128, 200, 254][(k + j) % 7];
                blk[1..].fill([0x77u8, 0xff, 0x7f, 0xf7, 0x08][k % 5]);
            }
        }
        for v in [127i8, -127, 1] {
            let mut act = Vec::new();
            for _ in 0..n / 32 {
                act.extend_from_slice(&half::f16::from_f32(0.5).to_bits().to_le_bytes());
                act.extend(std::iter::repeat_n(v as u8, 32));
            }
            check(w, n, &m, &act, &format!("extreme act {v}"));
        }
    }

    /// Q8_0 at its extremes: weights −128, 127 and mixed, f16 scales from random rows,
    /// activations of ±127 (the largest maddubs pair sums, 2·128·127).
    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx2"]
    fn grouped_q8_0_extremes_bitwise() {
        crate::quant::dot::require_isa(Isa::Avx2, "grouped_q8_0_extremes_bitwise");
        let (w, n) = (GgmlType::Q8_0, 2880);
        let rb = w.row_bytes(n).unwrap();
        let mut rng = Rng::new(6);
        let mut m: Vec<u8> = (0..6).flat_map(|_| random_row(w, n, &mut rng)).collect();
        for (k, row) in m.chunks_exact_mut(rb).enumerate() {
            for blk in row.chunks_exact_mut(34) {
                let fill = [0x80u8, 0x7f, 0x81][k % 3];
                blk[2..].fill(fill);
                if k >= 3 {
                    blk[2..].iter_mut().step_by(2).for_each(|x| *x = 0x7f);
                }
            }
        }
        for v in [127i8, -127, 1] {
            let mut act = Vec::new();
            for _ in 0..n / 32 {
                act.extend_from_slice(&half::f16::from_f32(0.25).to_bits().to_le_bytes());
                act.extend(std::iter::repeat_n(v as u8, 32));
            }
            check(w, n, &m, &act, &format!("extreme act {v}"));
        }
    }
}
