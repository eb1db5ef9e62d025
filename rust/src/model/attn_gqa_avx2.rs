//! AVX2 kernels of grouped-query attention over an f16 cache, multi-row order (a prefill
//! chunk of several query rows): the M query heads that share one KV head are served by one
//! pass over that head's K and V rows, so each f16 row is widened (F16C) once for M heads
//! instead of once per head. Every head keeps `attention.rs`'s float order exactly:
//! - q·k: one 8-lane FMA accumulator over the 8-element steps of D, reduced by `reduce8`,
//!   times the scale (tinyBLAS);
//! - softmax: ggml's (`vexp::softmax` with padding), `ggml_v_expf` lane for lane;
//! - P·V: the probability rounded to f16, lane j % 8 of 8 accumulators per dimension,
//!   `fma(v, p, lane)` in increasing j, then `reduce8` over the lanes (tinyBLAS).
//!
//! Shapes: D = head dim (a multiple of 32), n = visible positions, M ≤ 8 heads; K/V rows of
//! one position are `row_bytes` apart and this KV head starts `kvo` bytes into a row.

use crate::quant::vexp::expf8;
use std::arch::x86_64::*;

/// Positions per block of the P·V pass (widened to 16-dimension slabs of 256·64 bytes, each
/// in L1 while every head and lane of the block reads it).
const PV_BLOCK: usize = 256;

/// Whether the kernels can run (AVX2 + FMA + F16C).
pub fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// The 8 lanes of `a` reduced as `reduce8` does: (lo + hi), then [0]+[2] and [1]+[3], then
/// the two; returned as a 128-bit pair of halves (adds of the same operands in any operand
/// order are bitwise equal).
#[inline(always)]
unsafe fn half_sums(a: __m256) -> __m128 {
    _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a))
}

/// `reduce8` of four accumulators at once: lanes [r(a), r(b), r(c), r(d)].
#[inline(always)]
unsafe fn reduce8_x4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
    let (ha, hb, hc, hd) = (half_sums(a), half_sums(b), half_sums(c), half_sums(d));
    // [a0+a2, a1+a3, b0+b2, b1+b3] and the same for c, d
    let ab = _mm_add_ps(
        _mm_shuffle_ps::<0x44>(ha, hb),
        _mm_shuffle_ps::<0xEE>(ha, hb),
    );
    let cd = _mm_add_ps(
        _mm_shuffle_ps::<0x44>(hc, hd),
        _mm_shuffle_ps::<0xEE>(hc, hd),
    );
    _mm_add_ps(
        _mm_shuffle_ps::<0x88>(ab, cd),
        _mm_shuffle_ps::<0xDD>(ab, cd),
    )
}

/// `scores[h·stride + j] = reduce8(Σ_i k_j[i]·q_h[i]) · scale` for heads h < M and positions
/// j < n: `qf` is [M, D] (f16-rounded queries widened to f32), K row j the `d` f16 values at
/// `k[j·row_bytes + kvo..]`. One widened K step feeds all M heads' accumulators.
///
/// # Safety
/// `available()` holds.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn group_scores<const M: usize>(
    k: &[u8],
    row_bytes: usize,
    kvo: usize,
    qf: &[f32],
    n: usize,
    scale: f32,
    scores: &mut [f32],
    stride: usize,
) {
    let d = check_scores::<M>(k, row_bytes, kvo, qf, n, scores.len(), stride);
    let q = qf.as_ptr();
    for j in 0..n {
        let kp = k.as_ptr().add(j * row_bytes + kvo);
        let mut acc = [_mm256_setzero_ps(); M];
        for i in (0..d).step_by(8) {
            let kv = _mm256_cvtph_ps(_mm_loadu_si128(kp.add(2 * i) as *const __m128i));
            for (h, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q.add(h * d + i)), *a);
            }
        }
        store_scores(&acc, scale, scores.as_mut_ptr().add(j), stride);
    }
}

/// `group_scores`' argument checks (M ≤ 8 heads of D, a multiple of 8, the scores rows and
/// the K rows in range); returns D.
fn check_scores<const M: usize>(
    k: &[u8],
    row_bytes: usize,
    kvo: usize,
    qf: &[f32],
    n: usize,
    scores_len: usize,
    stride: usize,
) -> usize {
    let d = qf.len() / M;
    assert!(
        M <= 8 && d.is_multiple_of(8) && qf.len() == M * d,
        "q·k shape"
    );
    assert!(n <= stride && (M - 1) * stride + n <= scores_len, "scores");
    assert!(
        n == 0 || (n - 1) * row_bytes + kvo + 2 * d <= k.len(),
        "K rows out of range"
    );
    d
}

/// One position's scores from its M heads' 8-lane accumulators: `reduce8` (four heads at a
/// time for M = 8), times `scale`, into `out[h·stride]`.
#[inline(always)]
unsafe fn store_scores<const M: usize>(
    acc: &[__m256; M],
    scale: f32,
    out: *mut f32,
    stride: usize,
) {
    let mut r = [0f32; 8];
    if M == 8 {
        let sc = _mm_set1_ps(scale);
        let lo = reduce8_x4(acc[0], acc[1], acc[2], acc[3]);
        let hi = reduce8_x4(acc[4], acc[5], acc[6], acc[7]);
        _mm_storeu_ps(r.as_mut_ptr(), _mm_mul_ps(lo, sc));
        _mm_storeu_ps(r.as_mut_ptr().add(4), _mm_mul_ps(hi, sc));
    } else {
        for (h, a) in acc.iter().enumerate() {
            let mut l = [0f32; 8];
            _mm256_storeu_ps(l.as_mut_ptr(), *a);
            r[h] = crate::quant::dot::common_reduce8(&l) * scale;
        }
    }
    for (h, &v) in r.iter().enumerate().take(M) {
        *out.add(h * stride) = v;
    }
}

/// Whether `group_scores_x2` can run (AVX-512F beside `available`).
pub fn available_x2() -> bool {
    available() && std::arch::is_x86_feature_detected!("avx512f")
}

/// The 8 floats at `p` in both halves of a 16-lane register.
#[inline(always)]
unsafe fn both_halves(p: *const f32) -> __m512 {
    let v = _mm256_loadu_ps(p);
    let both = _mm512_insertf64x4::<1>(
        _mm512_castps_pd(_mm512_castps256_ps512(v)),
        _mm256_castps_pd(v),
    );
    _mm512_castpd_ps(both)
}

/// Positions j (lanes 0–7) and j + 1 (lanes 8–15) of M heads' accumulators: `store_scores`
/// of each half, at `out` and `out + 1`.
#[inline(always)]
unsafe fn store_pair<const M: usize>(acc: &[__m512; M], scale: f32, out: *mut f32, stride: usize) {
    let first: [__m256; M] = std::array::from_fn(|h| _mm512_castps512_ps256(acc[h]));
    let second: [__m256; M] = std::array::from_fn(|h| {
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[h])))
    });
    store_scores(&first, scale, out, stride);
    store_scores(&second, scale, out.add(1), stride);
}

/// Head dims the 16-lane q·k kernels take.
const MAX_STEPS: usize = 256 / 8;

/// The two-positions-per-register q·k of R query rows (`qs[row]`: [M, D], f16-rounded) over
/// the same K rows [0, n), n even, scores into `out[row]` ([M, stride] each): each widened
/// pair of K rows feeds the R rows' M heads (R·M FMA chains), each score the same FMA chain
/// over D's 8-element steps, `reduce8` and scale whatever R is.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_x2_body<const M: usize, const R: usize>(
    k: &[u8],
    row_bytes: usize,
    kvo: usize,
    qs: [&[f32]; R],
    d: usize,
    n: usize,
    scale: f32,
    out: [*mut f32; R],
    stride: usize,
) {
    let steps = d / 8;
    // the rows' q steps in both halves, step-major (a step's R·M vectors side by side: one
    // base address per step): q2[(s·R + row)·M + h] = [q_h[8s..8s+8], q_h[8s..8s+8]]
    let mut q2 = [_mm512_setzero_ps(); 2 * 8 * MAX_STEPS];
    for (row, q) in qs.into_iter().enumerate() {
        for h in 0..M {
            for st in 0..steps {
                q2[(st * R + row) * M + h] = both_halves(q.as_ptr().add(h * d + 8 * st));
            }
        }
    }
    for j in (0..n).step_by(2) {
        let k0 = k.as_ptr().add(j * row_bytes + kvo);
        let k1 = k0.add(row_bytes);
        let mut acc = [[_mm512_setzero_ps(); M]; R];
        for st in 0..steps {
            let lo = _mm_loadu_si128(k0.add(16 * st) as *const __m128i);
            let hi = _mm_loadu_si128(k1.add(16 * st) as *const __m128i);
            let kv = _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi));
            let qstep = &q2[st * R * M..(st + 1) * R * M];
            for (ar, qr) in acc.iter_mut().zip(qstep.chunks_exact(M)) {
                for (a, &qh) in ar.iter_mut().zip(qr) {
                    *a = _mm512_fmadd_ps(kv, qh, *a);
                }
            }
        }
        for (ar, &o) in acc.iter().zip(&out) {
            store_pair(ar, scale, o.add(j), stride);
        }
    }
}

/// `group_scores` with two positions per 16-lane register (AVX-512): lanes 0–7 carry position
/// j's 8-lane accumulator and lanes 8–15 position j + 1's, each the same FMA chain over D's
/// 8-element steps against the same q, then the same `reduce8` and scale — bitwise
/// `group_scores`'s scores with half its FMAs and widenings. D ≤ 256; an odd last position
/// goes to `group_scores`.
///
/// # Safety
/// `available_x2()` holds.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn group_scores_x2<const M: usize>(
    k: &[u8],
    row_bytes: usize,
    kvo: usize,
    qf: &[f32],
    n: usize,
    scale: f32,
    scores: &mut [f32],
    stride: usize,
) {
    let d = check_scores::<M>(k, row_bytes, kvo, qf, n, scores.len(), stride);
    assert!(d <= 256, "q·k: head dim {d} > 256");
    let even = n & !1;
    let out = [scores.as_mut_ptr()];
    scores_x2_body::<M, 1>(k, row_bytes, kvo, [qf], d, even, scale, out, stride);
    if n % 2 == 1 {
        let j = n - 1;
        group_scores::<M>(
            &k[j * row_bytes..],
            row_bytes,
            kvo,
            qf,
            1,
            scale,
            &mut scores[j..],
            stride,
        );
    }
}

/// `group_scores_x2` of two query rows a and b (`qa`, `qb`: [M, D] each) over the same K rows
/// [0, n), n even: each widened pair of K rows feeds both rows' M heads (16 FMA chains), so a
/// prefill chunk's rows read and widen their KV head's K rows half as often. Every score is
/// the same FMA chain, reduction and scale as `group_scores_x2`'s (bitwise).
///
/// # Safety
/// `available_x2()` holds.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn group_scores_x2_pair<const M: usize>(
    k: &[u8],
    row_bytes: usize,
    kvo: usize,
    qa: &[f32],
    qb: &[f32],
    n: usize,
    scale: f32,
    sa: &mut [f32],
    sb: &mut [f32],
    stride: usize,
) {
    let d = check_scores::<M>(k, row_bytes, kvo, qa, n, sa.len(), stride);
    assert!(qb.len() == qa.len(), "q·k pair: rows of different shapes");
    check_scores::<M>(k, row_bytes, kvo, qb, n, sb.len(), stride);
    assert!(
        d <= 256 && n.is_multiple_of(2),
        "q·k pair: head dim {d}, n {n}"
    );
    let out = [sa.as_mut_ptr(), sb.as_mut_ptr()];
    scores_x2_body::<M, 2>(k, row_bytes, kvo, [qa, qb], d, n, scale, out, stride);
}

/// `expf8` on an array (tests).
///
/// # Safety
/// `available()` holds.
#[cfg(test)]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn expf_lanes(x: &[f32; 8]) -> [f32; 8] {
    let mut r = [0f32; 8];
    _mm256_storeu_ps(r.as_mut_ptr(), expf8(_mm256_loadu_ps(x.as_ptr())));
    r
}

/// `vexp::softmax(x, true)` (bitwise; `vexp::softmax_sink(x, s)` with a sink), then each
/// probability rounded to f16 (to nearest even) as the P·V product of an f16 V reads it.
///
/// # Safety
/// `available()` holds.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn softmax_f16p(x: &mut [f32], sink: Option<f32>) {
    let n = x.len();
    if n == 0 {
        return;
    }
    let full = n / 8 * 8;
    let mut tail = [f32::NEG_INFINITY; 8];
    tail[..n - full].copy_from_slice(&x[full..]);
    let mut m = _mm256_loadu_ps(tail.as_ptr());
    for i in (0..full).step_by(8) {
        m = _mm256_max_ps(m, _mm256_loadu_ps(x.as_ptr().add(i)));
    }
    let mut mr = [0f32; 8];
    _mm256_storeu_ps(mr.as_mut_ptr(), m);
    let mut max = mr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if let Some(sk) = sink {
        max = max.max(sk);
    }
    let mv = _mm256_set1_ps(max);
    let mut sum = 0f64;
    let group = |e: __m256| -> f32 {
        let h = half_sums(e);
        let q = _mm_add_ps(h, _mm_movehl_ps(h, h));
        _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)))
    };
    for i in (0..full).step_by(8) {
        let p = x.as_mut_ptr().add(i);
        let e = expf8(_mm256_sub_ps(_mm256_loadu_ps(p), mv));
        _mm256_storeu_ps(p, e);
        sum += group(e) as f64;
    }
    if full < n {
        // ggml pads the row with masked positions: their lanes add exp(−∞) = 0
        let live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
            _mm256_set1_epi32((n - full) as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        ));
        let e = expf8(_mm256_sub_ps(_mm256_loadu_ps(tail.as_ptr()), mv));
        let e = _mm256_and_ps(e, live);
        _mm256_storeu_ps(tail.as_mut_ptr(), e);
        x[full..].copy_from_slice(&tail[..n - full]);
        sum += group(e) as f64;
    }
    if let Some(sk) = sink {
        sum += (sk - max).exp() as f64;
    }
    let inv = _mm256_set1_ps((1.0 / sum) as f32);
    let round = |v: __m256| _mm256_cvtph_ps(_mm256_cvtps_ph::<0>(_mm256_mul_ps(v, inv)));
    for i in (0..full).step_by(8) {
        let p = x.as_mut_ptr().add(i);
        _mm256_storeu_ps(p, round(_mm256_loadu_ps(p)));
    }
    for v in &mut x[full..] {
        let r = round(_mm256_set1_ps(*v));
        *v = _mm256_cvtss_f32(r);
    }
}

/// `out[r][h·D + i] = reduce8_l(Σ_{j ≡ l mod 8} p[r][h·stride + j]·v_j[i])` for R query rows
/// r (R = `ns.len()`), heads h < M and positions j < ns[r] in increasing j per lane l (p
/// already rounded to f16), V row j being the `d` f16 values at `v[j·row_bytes + kvo..]`;
/// `p` is [R, M, stride], `out` [R, M·D]. `acc` is scratch of [R, 8, M, D], `pack` of
/// `pack_len(d)` floats: each block of V rows is first widened into it as 16-dimension slabs
/// ([D/16, PV_BLOCK, 16] f32, exact), so that each row is widened once for all M heads and
/// all R query rows (a prefill chunk's rows read the same V rows), and one slab
/// (PV_BLOCK·64 bytes) serves every row, head and lane from L1 (rows `row_bytes` apart in the
/// cache would fall into a few L1 sets). Each query row's floats are those of a pass of its
/// own: the blocks start at the same positions, and its tiles run over its own `ns[r]`.
///
/// # Safety
/// `available()` holds.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn group_pv<const M: usize>(
    p: &[f32],
    stride: usize,
    ns: &[usize],
    v: &[u8],
    row_bytes: usize,
    kvo: usize,
    acc: &mut [f32],
    pack: &mut [f32],
    out: &mut [f32],
) {
    pv_body::<M, false>(p, stride, ns, v, row_bytes, kvo, acc, pack, out)
}

/// `group_pv` with each register tile's 16 dimensions in one 16-lane register (AVX-512):
/// every dimension's FMA chain is the same, so the output is bitwise `group_pv`'s.
///
/// # Safety
/// `available_x2()` holds.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn group_pv_x2<const M: usize>(
    p: &[f32],
    stride: usize,
    ns: &[usize],
    v: &[u8],
    row_bytes: usize,
    kvo: usize,
    acc: &mut [f32],
    pack: &mut [f32],
    out: &mut [f32],
) {
    pv_body::<M, true>(p, stride, ns, v, row_bytes, kvo, acc, pack, out)
}

/// `group_pv`'s body; `WIDE`: the AVX-512 register tiles (`pv_tile_x2`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_body<const M: usize, const WIDE: bool>(
    p: &[f32],
    stride: usize,
    ns: &[usize],
    v: &[u8],
    row_bytes: usize,
    kvo: usize,
    acc: &mut [f32],
    pack: &mut [f32],
    out: &mut [f32],
) {
    let rows = ns.len();
    let md = out.len() / rows.max(1);
    let d = md / M;
    assert!(
        M <= 8 && d.is_multiple_of(16) && out.len() == rows * M * d,
        "P·V shape"
    );
    assert!(
        acc.len() >= rows * 8 * M * d && pack.len() >= pack_len(d),
        "P·V scratch"
    );
    let n_max = ns.iter().copied().max().unwrap_or(0);
    assert!(n_max <= stride && p.len() >= rows * M * stride, "P rows");
    if n_max > 0 {
        assert!(
            (n_max - 1) * row_bytes + kvo + 2 * d <= v.len(),
            "V rows out of range"
        );
    }
    let racc = 8 * M * d; // one row's accumulators
    acc[..rows * racc].fill(0.0);
    for j0 in (0..n_max).step_by(PV_BLOCK) {
        let nb_max = (n_max - j0).min(PV_BLOCK);
        for jj in 0..nb_max {
            let src = v.as_ptr().add((j0 + jj) * row_bytes + kvo);
            for c in 0..d / 16 {
                let x0 = _mm256_cvtph_ps(_mm_loadu_si128(src.add(32 * c) as *const __m128i));
                let x1 = _mm256_cvtph_ps(_mm_loadu_si128(src.add(32 * c + 16) as *const __m128i));
                let dst = pack.as_mut_ptr().add((c * PV_BLOCK + jj) * 16);
                _mm256_storeu_ps(dst, x0);
                _mm256_storeu_ps(dst.add(8), x1);
            }
        }
        for (r, &n) in ns.iter().enumerate() {
            if n <= j0 {
                continue;
            }
            let nb = (n - j0).min(PV_BLOCK);
            let pj = p.as_ptr().add(r * M * stride + j0);
            let ar = acc.as_mut_ptr().add(r * racc);
            for c in 0..d / 16 {
                let slab = pack.as_ptr().add(c * PV_BLOCK * 16);
                let mut h = 0;
                while h < M {
                    // the 16-lane tiles take 8 heads at once: a tile's heads are its
                    // independent FMA chains (the AVX2 tile has two registers per head)
                    let w = match M - h {
                        1 => 1,
                        2 | 3 => 2,
                        left if WIDE && left >= 8 => 8,
                        _ => 4,
                    };
                    let a = ar.add(h * d + 16 * c);
                    let ph = pj.add(h * stride);
                    match (w, WIDE) {
                        (1, false) => pv_tile::<1>(ph, stride, slab, nb, a, d, M * d),
                        (2, false) => pv_tile::<2>(ph, stride, slab, nb, a, d, M * d),
                        (_, false) => pv_tile::<4>(ph, stride, slab, nb, a, d, M * d),
                        (1, true) => pv_tile_x2::<1>(ph, stride, slab, nb, a, d, M * d),
                        (2, true) => pv_tile_x2::<2>(ph, stride, slab, nb, a, d, M * d),
                        (8, true) => pv_tile_x2::<8>(ph, stride, slab, nb, a, d, M * d),
                        (_, true) => pv_tile_x2::<4>(ph, stride, slab, nb, a, d, M * d),
                    }
                    h += w;
                }
            }
        }
    }
    // reduce8 over the lanes, 8 dimensions at a time
    for r in 0..rows {
        let a = acc.as_ptr().add(r * racc);
        let o = out.as_mut_ptr().add(r * M * d);
        for h in 0..M {
            for i in (0..d).step_by(8) {
                let l = |x: usize| _mm256_loadu_ps(a.add((x * M + h) * d + i));
                let s = _mm256_add_ps(
                    _mm256_add_ps(_mm256_add_ps(l(0), l(4)), _mm256_add_ps(l(2), l(6))),
                    _mm256_add_ps(_mm256_add_ps(l(1), l(5)), _mm256_add_ps(l(3), l(7))),
                );
                _mm256_storeu_ps(o.add(h * d + i), s);
            }
        }
    }
}

/// Floats of `group_pv`'s V block copy for head dim `d`.
pub fn pack_len(d: usize) -> usize {
    PV_BLOCK * d
}

/// One register tile of `group_pv`: H heads (probability rows `p + h·stride`, from the
/// block's first position), 16 dimensions (the slab: row jj's 16 values at `slab + 16·jj`),
/// the block's `nb` positions. Lane l's accumulators of head h are the 16 floats at
/// `acc + l·lane_stride + h·d`; for each lane they are loaded, advanced over the lane's
/// positions and stored back. (4 heads × 16 dimensions: per position 2 loads, 4 broadcasts,
/// 8 FMAs. On Zen 1 a tile of 8 heads × 8 dimensions, 8 broadcasts, ran at half the speed,
/// and 2 heads × 32 dimensions 10% slower.)
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_tile<const H: usize>(
    p: *const f32,
    stride: usize,
    slab: *const f32,
    nb: usize,
    acc: *mut f32,
    d: usize,
    lane_stride: usize,
) {
    for l in 0..8.min(nb) {
        let at = |h: usize, half: usize| acc.add(l * lane_stride + h * d + 8 * half);
        let mut a = [[_mm256_setzero_ps(); 2]; H];
        for (h, ah) in a.iter_mut().enumerate() {
            ah[0] = _mm256_loadu_ps(at(h, 0));
            ah[1] = _mm256_loadu_ps(at(h, 1));
        }
        for jj in (l..nb).step_by(8) {
            let r = slab.add(16 * jj);
            let (v0, v1) = (_mm256_loadu_ps(r), _mm256_loadu_ps(r.add(8)));
            for (h, ah) in a.iter_mut().enumerate() {
                let pj = _mm256_broadcast_ss(&*p.add(h * stride + jj));
                ah[0] = _mm256_fmadd_ps(v0, pj, ah[0]);
                ah[1] = _mm256_fmadd_ps(v1, pj, ah[1]);
            }
        }
        for (h, ah) in a.iter().enumerate() {
            _mm256_storeu_ps(at(h, 0), ah[0]);
            _mm256_storeu_ps(at(h, 1), ah[1]);
        }
    }
}

/// `pv_tile` with the 16 dimensions in one 16-lane register (per position 1 load, H
/// broadcasts, H FMAs): the same FMA per dimension. Inlined into `group_pv_x2` only.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_tile_x2<const H: usize>(
    p: *const f32,
    stride: usize,
    slab: *const f32,
    nb: usize,
    acc: *mut f32,
    d: usize,
    lane_stride: usize,
) {
    for l in 0..8.min(nb) {
        let at = |h: usize| acc.add(l * lane_stride + h * d);
        let mut a = [_mm512_setzero_ps(); H];
        for (h, ah) in a.iter_mut().enumerate() {
            *ah = _mm512_loadu_ps(at(h));
        }
        for jj in (l..nb).step_by(8) {
            let v = _mm512_loadu_ps(slab.add(16 * jj));
            for (h, ah) in a.iter_mut().enumerate() {
                *ah = _mm512_fmadd_ps(v, _mm512_set1_ps(*p.add(h * stride + jj)), *ah);
            }
        }
        for (h, ah) in a.iter().enumerate() {
            _mm512_storeu_ps(at(h), *ah);
        }
    }
}
