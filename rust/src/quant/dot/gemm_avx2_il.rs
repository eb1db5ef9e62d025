//! AVX2 rows × tokens Q4_K kernel over interleaved rows (prefill tiles: up to 64 tokens),
//! either order: `out[r·nt + t]` = the single-token dot of row r and `a[t]` in that order,
//! bitwise (`vec_dot` for `Order::Single`, `kernel_many` for `Order::Many`).
//!
//! Why: per (row, token, 32-weight sub-block) the row-by-row kernels spend a `maddubs` for
//! the 32 products and a `madd` for the sub-block's scale — two multiplies, the unit that
//! bounds them. Here four rows' blocks are transposed in registers into 8-byte chunks
//! (`V_k` = chunk k of rows 0..3, one 32-byte register), and each token's chunk k is
//! broadcast to the four rows (one load, `vpbroadcastq`): the four `maddubs` of a sub-block
//! add in i16 (|Σ| ≤ 4·2·15·128 < 2^15) and take the sub-block's four row scales in one
//! `madd` — 1.25 multiplies per (row, token, sub-block) instead of 2. The transpose costs
//! about one token's work per block of four rows and is shared by all the call's tokens,
//! so it pays from ~5 tokens (`q4k_rows_tokens_ab`); fewer go to `gemm_avx2_rows.rs`.
//!
//! Bitwise contract, per (row, token): the integer sums (sumi, and summ from the mins and
//! the activation's bsum pairs) are exact, so any grouping gives the same integers, and the
//! float combine is the order's, 8 (row, token) slots per vector (two tokens × four rows):
//! `Single` `k_add_min`'s `acc + (d_a·d·sumi − d_a·dmin·summ)` per block, separate
//! multiplies and adds, never fused; `Many` the repacked gemm's per pair of sub-blocks
//! `fma(f32(si_c), d·d_a, acc)`, `fma(f32(sm_c), dmin·d_a, accm)`, then `acc − accm`.
//!
//! Safety: callers (`MultiDot::rows_plain` through `rows_kernel`) have checked AVX2/FMA/F16C
//! and that `rows` holds `nr` rows of `n` elements and every activation `n / 256` blocks.

use super::super::super::avx2::rows::{ahead_group, R};
use super::super::super::avx2::{h2f, load, pf};
use super::super::super::common::k4_scales_packed;
use super::super::MAX_T;
use super::{da_at, AB};
use std::arch::x86_64::*;

/// Q4_K block bytes.
const BS: usize = 144;

/// Per sub-block j, the byte shuffle that puts scale j of the four rows into i16 lanes as
/// the transposed chunks lie (row r in lanes 4r..4r+4), from `[sc0 | sc1 || sc2 | sc3]`
/// (row r's eight 6-bit scales in bytes 8r..8r+8 of the 32).
#[target_feature(enable = "avx2")]
#[inline]
fn scale_masks() -> [__m256i; 8] {
    std::array::from_fn(|j| {
        let m: [u8; 32] = std::array::from_fn(|i| {
            let k = i % 16;
            if k % 2 == 1 {
                0x80
            } else {
                (j + 8 * (k / 8)) as u8
            }
        });
        // SAFETY: 32 bytes read from a 32-byte array.
        unsafe { _mm256_loadu_si256(m.as_ptr() as *const __m256i) }
    })
}

/// The 4×4 transpose of 8-byte chunks: `out[k]` = chunk k of rows 0, 1, 2, 3.
#[target_feature(enable = "avx2")]
#[inline]
fn chunks4(q: [__m256i; R]) -> [__m256i; 4] {
    let t0 = _mm256_unpacklo_epi64(q[0], q[1]); // [0.0 1.0 | 0.2 1.2]
    let t1 = _mm256_unpackhi_epi64(q[0], q[1]); // [0.1 1.1 | 0.3 1.3]
    let t2 = _mm256_unpacklo_epi64(q[2], q[3]);
    let t3 = _mm256_unpackhi_epi64(q[2], q[3]);
    [
        _mm256_permute2x128_si256(t0, t2, 0x20),
        _mm256_permute2x128_si256(t1, t3, 0x20),
        _mm256_permute2x128_si256(t0, t2, 0x31),
        _mm256_permute2x128_si256(t1, t3, 0x31),
    ]
}

/// One 32-weight sub-block of the four rows against one token: Σ_k maddubs(V_k, a chunk k)
/// in i16 lanes (row r in lanes 4r..4r+4), `ap` at the sub-block's 32 activation bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn sub4(v: &[__m256i; 4], ap: *const u8) -> __m256i {
    let b = |k: usize| _mm256_set1_epi64x((ap.add(8 * k) as *const i64).read_unaligned());
    let p01 = _mm256_add_epi16(
        _mm256_maddubs_epi16(v[0], b(0)),
        _mm256_maddubs_epi16(v[1], b(1)),
    );
    let p23 = _mm256_add_epi16(
        _mm256_maddubs_epi16(v[2], b(2)),
        _mm256_maddubs_epi16(v[3], b(3)),
    );
    _mm256_add_epi16(p01, p23)
}

/// A rows call's working registers in memory, set up once for all its groups of four rows.
struct Bufs {
    /// i32 × 8 per token and pair of sub-blocks c: lanes 2r, 2r+1 = row r's sum in two parts
    /// (`Order::Single` sums the block's four c into [t][0]); every block writes before it reads
    si: [[__m256i; 4]; MAX_T],
    /// f32 × 8 per token pair (t, u): [r0t r1t r0u r1u | r2t r3t r2u r3u]; `accm`: `Many`'s
    /// mins accumulator (both zeroed per group)
    acc: [__m256; MAX_T / 2],
    accm: [__m256; MAX_T / 2],
}

/// Four rows (row r at byte `r·rb` of `w`) × the `nt` tokens of `a`: `out[r·nt + t]`, in
/// `Order::Single` (`MANY` false) or `Order::Many`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_il4<const MANY: bool>(
    n: usize,
    w: &[u8],
    rb: usize,
    a: &[*const u8],
    out: &mut [f32],
    bufs: &mut Bufs,
) {
    let nt = a.len();
    let np = nt.div_ceil(2); // token pairs; an odd count's last pair is (t, t)
    let (m4, sm) = (_mm256_set1_epi8(15), scale_masks());
    let dist = pf::distance();
    let Bufs { si, acc, accm } = bufs;
    acc[..np].fill(_mm256_setzero_ps());
    accm[..np].fill(_mm256_setzero_ps());
    let pair = |p: usize| (2 * p, (2 * p + 1).min(nt - 1));
    for b in 0..n / 256 {
        ahead_group(w, b, BS, rb, dist);
        let blk = |r: usize| &w[r * rb + BS * b..r * rb + BS * b + BS];
        let sc = std::array::from_fn::<_, R, _>(|r| k4_scales_packed(blk(r)));
        let scv = _mm256_setr_epi64x(
            sc[0].0 as i64,
            sc[1].0 as i64,
            sc[2].0 as i64,
            sc[3].0 as i64,
        );
        let s: [__m256i; 8] = std::array::from_fn(|j| _mm256_shuffle_epi8(scv, sm[j]));
        for c in 0..4 {
            // sub-blocks 2c (low nibbles) and 2c+1 (high nibbles) of the four rows
            let q = chunks4(std::array::from_fn(|r| {
                load(blk(r).as_ptr().add(16 + 32 * c))
            }));
            let lo: [__m256i; 4] = std::array::from_fn(|k| _mm256_and_si256(q[k], m4));
            let hi: [__m256i; 4] =
                std::array::from_fn(|k| _mm256_and_si256(_mm256_srli_epi16(q[k], 4), m4));
            for (t, &at) in a.iter().enumerate() {
                let ap = at.add(AB * b + 4 + 64 * c);
                let x = _mm256_add_epi32(
                    _mm256_madd_epi16(sub4(&lo, ap), s[2 * c]),
                    _mm256_madd_epi16(sub4(&hi, ap.add(32)), s[2 * c + 1]),
                );
                si[t][if MANY { c } else { 0 }] = if MANY || c == 0 {
                    x
                } else {
                    _mm256_add_epi32(si[t][0], x)
                };
            }
        }
        // per row: the mins as i16 (rows 0|2 and 1|3 in the halves), d and dmin
        let mv = |r: usize| _mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc[r].1 as i64));
        let (m02, m13) = (
            _mm256_set_m128i(mv(2), mv(0)),
            _mm256_set_m128i(mv(3), mv(1)),
        );
        let d: [f32; R] = std::array::from_fn(|r| h2f(blk(r), 0));
        let dmin: [f32; R] = std::array::from_fn(|r| h2f(blk(r), 2));
        let dv = _mm256_setr_ps(d[0], d[1], d[0], d[1], d[2], d[3], d[2], d[3]);
        let dmv = _mm256_setr_ps(
            dmin[0], dmin[1], dmin[0], dmin[1], dmin[2], dmin[3], dmin[2], dmin[3],
        );
        // per token: its bsum pairs (bsum_2k + bsum_2k+1, i16) in both halves
        let pairs = |t: usize| {
            let bs = load(a[t].add(AB * b + 260));
            let p = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            _mm256_broadcastsi128_si256(p)
        };
        for p in 0..np {
            let (t, u) = pair(p);
            let (pt, pu) = (pairs(t), pairs(u));
            // per row and token the four mins terms m_2c·pair_2c + m_2c+1·pair_2c+1, c < 4:
            // [r0t ×4 | r2t ×4], [r1t | r3t], [r0u | r2u], [r1u | r3u]
            let x = [
                _mm256_madd_epi16(m02, pt),
                _mm256_madd_epi16(m13, pt),
                _mm256_madd_epi16(m02, pu),
                _mm256_madd_epi16(m13, pu),
            ];
            let (dt, du) = (da_at(a[t].add(AB * b)), da_at(a[u].add(AB * b)));
            let dav = _mm256_setr_ps(dt, dt, du, du, dt, dt, du, du);
            let (dd, dm) = (_mm256_mul_ps(dav, dv), _mm256_mul_ps(dav, dmv));
            // slots [r0t r1t r0u r1u | r2t r3t r2u r3u] of the i32 sums `v` of tokens t, u
            let slots = |vt: __m256i, vu: __m256i| _mm256_hadd_epi32(vt, vu);
            if MANY {
                // as avx2_k::q4_k_gemm: per c, fma(f32(si_c), d·d_a, acc) and
                // fma(f32(sm_c), dmin·d_a, accm)
                let lo = (
                    _mm256_unpacklo_epi32(x[0], x[1]),
                    _mm256_unpacklo_epi32(x[2], x[3]),
                );
                let hi = (
                    _mm256_unpackhi_epi32(x[0], x[1]),
                    _mm256_unpackhi_epi32(x[2], x[3]),
                );
                let sm = [
                    _mm256_unpacklo_epi64(lo.0, lo.1),
                    _mm256_unpackhi_epi64(lo.0, lo.1),
                    _mm256_unpacklo_epi64(hi.0, hi.1),
                    _mm256_unpackhi_epi64(hi.0, hi.1),
                ];
                for (c, sm) in sm.iter().enumerate() {
                    let sic = _mm256_cvtepi32_ps(slots(si[t][c], si[u][c]));
                    acc[p] = _mm256_fmadd_ps(sic, dd, acc[p]);
                    accm[p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(*sm), dm, accm[p]);
                }
            } else {
                let sumi = slots(si[t][0], si[u][0]);
                let summ =
                    _mm256_hadd_epi32(_mm256_hadd_epi32(x[0], x[1]), _mm256_hadd_epi32(x[2], x[3]));
                // as common::k_add_min, per slot
                let v = _mm256_sub_ps(
                    _mm256_mul_ps(dd, _mm256_cvtepi32_ps(sumi)),
                    _mm256_mul_ps(dm, _mm256_cvtepi32_ps(summ)),
                );
                acc[p] = _mm256_add_ps(acc[p], v);
            }
        }
    }
    for p in 0..np {
        let (t, u) = pair(p);
        let mut f = [0f32; 8];
        let v = if MANY {
            _mm256_sub_ps(acc[p], accm[p])
        } else {
            acc[p]
        };
        _mm256_storeu_ps(f.as_mut_ptr(), v);
        for (r, (ft, fu)) in [(0, 2), (1, 3), (4, 6), (5, 7)].into_iter().enumerate() {
            out[r * nt + t] = f[ft];
            out[r * nt + u] = f[fu];
        }
    }
}

/// `out[r·nt + t]` for the `nr` rows of `rows` (row bytes `rl`) and 2..=`MAX_T` tokens:
/// groups of four rows through `q4_k_il4`; the rows left over through `rest(row, out)`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k_rows_il<const MANY: bool>(
    n: usize,
    rows: &[u8],
    nr: usize,
    acts: &[&[u8]],
    out: &mut [f32],
    rest: impl Fn(&[u8], &mut [f32]),
) {
    let (nt, rl) = (acts.len(), BS * (n / 256));
    assert!((2..=MAX_T).contains(&nt) && out.len() >= nr * nt && rows.len() >= nr * rl);
    let mut a = [std::ptr::null::<u8>(); MAX_T];
    for (p, x) in a.iter_mut().zip(acts) {
        *p = x.as_ptr();
    }
    let mut bufs = Bufs {
        si: [[_mm256_setzero_si256(); 4]; MAX_T],
        acc: [_mm256_setzero_ps(); MAX_T / 2],
        accm: [_mm256_setzero_ps(); MAX_T / 2],
    };
    let mut r = 0;
    while nr - r >= R {
        let o = &mut out[r * nt..(r + R) * nt];
        q4_k_il4::<MANY>(n, &rows[r * rl..nr * rl], rl, &a[..nt], o, &mut bufs);
        r += R;
    }
    for r in r..nr {
        rest(&rows[r * rl..(r + 1) * rl], &mut out[r * nt..(r + 1) * nt]);
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::super::tests::{random_act, random_row, Rng};
    use super::super::super::super::{quantize_act, Isa, Order};
    use super::super::super::{single_for, MAX_T};
    use crate::quant::GgmlType;

    /// AVX2's interleaved Q4_K rows × tokens kernel (`gemm_avx2_il.rs`, reached from
    /// `IL_MIN_T` tokens; here also at 2..=4), both orders, at every token count up to `MAX_T`,
    /// rows of 1, 3 and 8 blocks, rows with every nibble 15 and the largest scales beside random ones,
    /// activations at ±127 (the i16 sums' extremes) and random: bitwise the scalar
    /// single-token kernel.
    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx2"]
    fn q4k_interleaved_rows_equal_scalar_bitwise() {
        crate::quant::dot::require_isa(Isa::Avx2, "q4k_interleaved_rows_equal_scalar_bitwise");
        let w = GgmlType::Q4K;
        let mut rng = Rng::new(0x4a11);
        for nb in [1usize, 3, 8] {
            let n = 256 * nb;
            let rb = w.row_bytes(n).unwrap();
            let nr = 9;
            let mut rows: Vec<u8> = (0..nr).flat_map(|_| random_row(w, n, &mut rng)).collect();
            // rows 1 and 6: every nibble 15, every 6-bit scale and min 63
            for r in [1usize, 6] {
                for b in 0..nb {
                    let blk = &mut rows[r * rb + 144 * b..r * rb + 144 * (b + 1)];
                    blk[4..16].fill(0xff);
                    blk[16..].fill(0xff);
                }
            }
            let mut acts: Vec<Vec<u8>> = (0..MAX_T).map(|_| random_act(w, n, &mut rng)).collect();
            for (i, sign) in [(0usize, 1.0f32), (2, -1.0), (5, 1.0), (7, -1.0)] {
                let x: Vec<f32> = (0..n).map(|_| sign).collect();
                quantize_act(GgmlType::Q8K, &x, &mut acts[i]).unwrap();
            }
            for nt in 2..=MAX_T {
                let refs: Vec<&[u8]> = acts[..nt].iter().map(|a| &a[..]).collect();
                let mut out = vec![f32::NAN; nr * nt];
                for (order, many) in [(Order::Single, false), (Order::Many, true)] {
                    let single = single_for(Isa::Scalar, w, order);
                    // SAFETY: AVX2 checked above; `rows` holds nr rows of n, every act n / 256
                    // blocks.
                    unsafe {
                        if many {
                            super::super::rows::q4_k_rows_il::<true>(n, &rows, nr, &refs, &mut out)
                        } else {
                            super::super::rows::q4_k_rows_il::<false>(n, &rows, nr, &refs, &mut out)
                        }
                    };
                    for (i, o) in out.iter().enumerate() {
                        let want = single(n, &rows[(i / nt) * rb..(i / nt + 1) * rb], refs[i % nt]);
                        assert_eq!(
                            o.to_bits(),
                            want.to_bits(),
                            "{order:?} n={n} tokens={nt} at {i}"
                        );
                    }
                }
            }
        }
    }
}
