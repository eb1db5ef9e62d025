//! IQ3_S one-token rows (`vec_dot_rows`) on AVX-512 VBMI + BITALG: the same eight integer
//! lanes per block as `iq3_s_dot` (so bitwise its results), with a third fewer vector
//! operations per block, because the block's 64 grid entries are looked up in an order that
//! needs no transpose afterwards.
//!
//! `Permute` (the parent module) looks the entries up in storage order and then transposes
//! the four planes' bytes into whole entries in weight order (4 byte unpacks, 4 word
//! unpacks, 6 128-bit shuffles) to meet the activation as stored. Here the entry indices are
//! permuted first (one `vpermb`): position p of the lookup holds entry `E[p]`, so that one
//! byte unpack per pair of planes already puts every entry's bytes next to each other, and
//! the activation is permuted to match once per call (it is shared by every row of it); the
//! weights' sign bits follow it with one `vpshufbitqmb` per register, the 9th index bits
//! with one more, the group scales with one `vpermw` per half.
//!
//! The order: p = 16L + 8h + 2d + b (L 0..4 the 128-bit lane, h, d, b as named) holds entry
//! e = m + 8b + 16t with m = 4(L mod 2) + d and t = 2(L / 2) + h. A byte unpack of the lookup's
//! planes gives, in 128-bit lane L, word w = entry `E[16L + w]` (`lo`) or `E[16L + 8 + w]`
//! (`hi`); `vpmaddubsw` with the activation, an i16 add of the two byte pairs (|Σ| ≤
//! 4·15·128), `vpmaddwd` with the entries' group scales and an add leave in i32 lane
//! 4L + d the four entries of that lane's positions; lanes k and k + 8 together hold the
//! entries k + 8j (j 0..8), exactly ggml's lane k (`Σ_j scale_j · Σ grid·a over entry
//! k + 8j`). The integers are exact, so any grouping gives the same lanes.

use super::{multi_with, Permute, AB, WB};
use crate::quant::dot::avx2::{h2f, hsum8};
use std::arch::x86_64::*;

/// The entry at lookup position `p` (0..64).
const fn entry(p: usize) -> usize {
    let (l, h, d, b) = (p / 16, (p / 8) % 2, (p / 2) % 4, p % 2);
    let (m, t) = (4 * (l % 2) + d, 2 * (l / 2) + h);
    m + 8 * b + 16 * t
}

/// `E[p] = entry(p)`: the `vpermb` index that reorders the qs bytes, and the `vpshufbitqmb`
/// index that reorders the 9th index bits.
static E: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut p = 0;
    while p < 64 {
        t[p] = entry(p) as u8;
        p += 1;
    }
    t
};

/// The weight (0..256) whose activation byte j (0..64) of register r (0..4) holds:
/// registers 0, 1 pair with the `lo` unpacks (grid bytes 0-1, 2-3 of entries `E[16L + w]`),
/// 2, 3 with the `hi` ones (entries `E[16L + 8 + w]`).
const fn weight(r: usize, j: usize) -> usize {
    let (l, w, k) = (j / 16, (j % 16) / 2, j % 2);
    let p = 16 * l + 8 * (r / 2) + w;
    4 * entry(p) + 2 * (r % 2) + k
}

/// The 64-weight chunk of register r's qword q: t = 2(q / 4) + h (see the module order).
const fn chunk(r: usize, q: usize) -> usize {
    2 * (q / 4) + r / 2
}

/// Per register: the `vpermi2b` index over its two source chunks (chunk `r / 2` and
/// `r / 2 + 2` of the activation's 256 quants; bit 6 picks the second).
static ACT_IDX: [[u8; 64]; 4] = {
    let mut t = [[0u8; 64]; 4];
    let mut r = 0;
    while r < 4 {
        let mut j = 0;
        while j < 64 {
            let wt = weight(r, j);
            t[r][j] = if wt / 64 == r / 2 {
                wt % 64
            } else {
                64 + wt % 64
            } as u8;
            j += 1;
        }
        r += 1;
    }
    t
};

/// Per register: the `vpshufbitqmb` index of each byte's sign bit within its qword's chunk.
static SIGN_IDX: [[u8; 64]; 4] = {
    let mut t = [[0u8; 64]; 4];
    let mut r = 0;
    while r < 4 {
        let mut j = 0;
        while j < 64 {
            t[r][j] = (weight(r, j) - 64 * chunk(r, j / 8)) as u8;
            j += 1;
        }
        r += 1;
    }
    t
};

/// Per half (`lo`, `hi`): the `vpermw` index of each word's group (entry / 8) among the
/// block's eight scales.
static SCALE_IDX: [[u16; 32]; 2] = {
    let mut t = [[0u16; 32]; 2];
    let mut h = 0;
    while h < 2 {
        let mut i = 0;
        while i < 32 {
            let (l, w) = (i / 8, i % 8);
            t[h][i] = (entry(16 * l + 8 * h + w) / 8) as u16;
            i += 1;
        }
        h += 1;
    }
    t
};

/// Most activation blocks (all the tokens' together) the rows kernels hold permuted on the
/// stack (one token of n ≤ 16,384, four of n ≤ 4,096); more go through the multi-token
/// kernel row by row.
const MAX_BLOCKS: usize = 64;

/// The constant registers of the kernel.
struct Consts {
    grid: Permute,
    e: __m512i,
    sign_idx: [__m512i; 4],
    scale_idx: [__m512i; 2],
}

#[inline(always)]
unsafe fn load512<T>(p: *const T) -> __m512i {
    _mm512_loadu_si512(p as *const _)
}

/// Permutes the quants of the activation's blocks (`a`: `nb` Q8_K blocks) into `out`, 256
/// bytes per block: the four registers' 64 quants (`weight(r, j)`); its d is read from `a`,
/// its block sums are not used.
/// Safety: `a` holds `nb` blocks, `out` has room for `256·nb` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
unsafe fn permute_act(a: &[u8], nb: usize, out: *mut u8) {
    let idx: [__m512i; 4] = std::array::from_fn(|r| load512(ACT_IDX[r].as_ptr()));
    for b in 0..nb {
        let (src, dst) = (a[AB * b..].as_ptr(), out.add(256 * b));
        let q: [__m512i; 4] = std::array::from_fn(|c| load512(src.add(4 + 64 * c)));
        for r in 0..4 {
            let v = _mm512_permutex2var_epi8(q[r / 2], idx[r], q[r / 2 + 2]);
            _mm512_storeu_si512(dst.add(64 * r) as *mut _, v);
        }
    }
}

/// One block decoded in the module's order: the four grid registers (`g[r]` meets activation
/// register r), each register's sign mask (bit set: negate that activation byte) and each
/// half's group scales.
struct Decoded {
    g: [__m512i; 4],
    neg: [__mmask64; 4],
    scale: [__m512i; 2],
}

/// Decodes block `wb`.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi,avx512bitalg")]
#[inline]
unsafe fn decode(k: &Consts, wb: *const u8) -> Decoded {
    // the lookup, positions in the module's order
    let idx = _mm512_permutexvar_epi8(k.e, load512(wb.add(2)));
    let qh = _mm512_set1_epi64((wb.add(66) as *const i64).read_unaligned());
    let hi = _mm512_bitshuffle_epi64_mask(qh, k.e);
    let b7 = _mm512_movepi8_mask(idx);
    let (p01, p23) = (k.grid.plane(0, idx, b7, hi), k.grid.plane(1, idx, b7, hi));
    let m4 = _mm512_set1_epi8(15);
    let (b0, b1) = (
        _mm512_and_si512(p01, m4),
        _mm512_and_si512(_mm512_srli_epi16::<4>(p01), m4),
    );
    let (b2, b3) = (
        _mm512_and_si512(p23, m4),
        _mm512_and_si512(_mm512_srli_epi16::<4>(p23), m4),
    );
    // the sign bits (chunks 0 and 2 for the lo registers, 1 and 3 for the hi ones)
    let s = _mm512_castsi256_si512(_mm256_loadu_si256(wb.add(74) as *const __m256i));
    let slo = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2), s);
    let shi = _mm512_permutexvar_epi64(_mm512_setr_epi64(1, 1, 1, 1, 3, 3, 3, 3), s);
    // the eight group scales 2·s + 1 as words, spread over each half's words
    let sb = _mm_cvtsi32_si128((wb.add(106) as *const i32).read_unaligned());
    let m4x = _mm_set1_epi8(15);
    let nib = _mm_unpacklo_epi8(
        _mm_and_si128(sb, m4x),
        _mm_and_si128(_mm_srli_epi16::<4>(sb), m4x),
    );
    let w = _mm_cvtepu8_epi16(nib);
    let sc = _mm512_castsi128_si512(_mm_add_epi16(_mm_add_epi16(w, w), _mm_set1_epi16(1)));
    Decoded {
        g: [
            _mm512_unpacklo_epi8(b0, b1),
            _mm512_unpacklo_epi8(b2, b3),
            _mm512_unpackhi_epi8(b0, b1),
            _mm512_unpackhi_epi8(b2, b3),
        ],
        neg: std::array::from_fn(|r| {
            _mm512_bitshuffle_epi64_mask(if r < 2 { slo } else { shi }, k.sign_idx[r])
        }),
        scale: std::array::from_fn(|h| _mm512_permutexvar_epi16(k.scale_idx[h], sc)),
    }
}

/// The eight integer lanes of decoded block `d` against the permuted quants `ap` of an
/// activation block.
#[target_feature(enable = "avx2,avx512f,avx512bw")]
#[inline]
unsafe fn lanes(d: &Decoded, ap: *const u8) -> __m256i {
    let mut sum = _mm512_setzero_si512();
    for h in 0..2 {
        let p = [2 * h, 2 * h + 1].map(|r| {
            let a = load512(ap.add(64 * r));
            let av = _mm512_mask_sub_epi8(a, d.neg[r], _mm512_setzero_si512(), a);
            _mm512_maddubs_epi16(d.g[r], av)
        });
        let s = _mm512_madd_epi16(_mm512_add_epi16(p[0], p[1]), d.scale[h]);
        sum = _mm512_add_epi32(sum, s);
    }
    _mm256_add_epi32(
        _mm512_castsi512_si256(sum),
        _mm512_extracti64x4_epi64::<1>(sum),
    )
}

/// The kernels' constant registers.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn consts() -> Consts {
    Consts {
        grid: Permute::load(),
        e: load512(E.as_ptr()),
        sign_idx: std::array::from_fn(|r| load512(SIGN_IDX[r].as_ptr())),
        scale_idx: std::array::from_fn(|h| load512(SCALE_IDX[h].as_ptr())),
    }
}

/// The Q8_K d of block `b` of activation `a`.
#[inline(always)]
fn da(a: &[u8], b: usize) -> f32 {
    crate::quant::dot::common::f32_at(a, AB * b)
}

/// `out[r] = iq3_s_dot(n, row r, a)` bitwise for consecutive rows (`rows`: `out.len()` rows
/// of `n / 256` blocks back to back), the activation permuted once for all of them.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 F/BW/VBMI/BITALG are available; `rows` holds `out.len()` rows
/// and `a` `n / 256` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vbmi,avx512bitalg")]
pub(in crate::quant::dot) unsafe fn iq3_s_rows_perm(
    n: usize,
    rows: &[u8],
    a: &[u8],
    out: &mut [f32],
) {
    let nb = n / 256;
    if nb > MAX_BLOCKS {
        return iq3_s_rows_tokens(n, rows, out.len(), &[a], out);
    }
    // as in `iq3_s_rows_tokens`, called here directly (through its `nt` dispatch the
    // one-token rows ran ~4% slower)
    let mut buf = std::mem::MaybeUninit::<[u8; 256 * MAX_BLOCKS]>::uninit();
    let ap = buf.as_mut_ptr() as *mut u8;
    permute_act(a, nb, ap);
    tokens::<1>(n, rows, out.len(), &[a], ap, out)
}

/// Most tokens of `iq3_s_rows_tokens`.
pub const ROWS_T: usize = 4;

/// `out[r·nt + t]` = `iq3_s_dot(n, row r, acts[t])` bitwise, for `nr` consecutive rows and
/// nt = `acts.len()` ≤ `ROWS_T` tokens (decode batches, short verify windows): each block
/// decoded once for the tokens, their activations permuted once per call.
///
/// # Safety
/// As `iq3_s_rows_perm`; `rows` holds `nr` rows, every activation `n / 256` Q8_K blocks,
/// `out` `nr · nt` values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vbmi,avx512bitalg")]
pub(in crate::quant::dot) unsafe fn iq3_s_rows_tokens(
    n: usize,
    rows: &[u8],
    nr: usize,
    acts: &[&[u8]],
    out: &mut [f32],
) {
    let (nb, nt) = (n / 256, acts.len());
    let rb = WB * nb;
    assert!(nt <= ROWS_T && out.len() >= nr * nt && rows.len() >= nr * rb);
    if nb * nt > MAX_BLOCKS {
        // the multi-token kernel row by row (its results are these bitwise)
        let grid = Permute::load();
        for (r, w) in rows.chunks_exact(rb).take(nr).enumerate() {
            multi_with::<false, _>(&grid, n, w, acts, &mut out[r * nt..(r + 1) * nt]);
        }
        return;
    }
    // Not zeroed: permute_act writes the 256·nb bytes of each token read. One 16 KB buffer
    // for all the tokens (a 64 KB frame's stack probes cost the one-token kernel 5%).
    let mut buf = std::mem::MaybeUninit::<[u8; 256 * MAX_BLOCKS]>::uninit();
    let ap = buf.as_mut_ptr() as *mut u8;
    for (t, a) in acts.iter().enumerate() {
        permute_act(a, nb, ap.add(256 * nb * t));
    }
    match nt {
        0 => {}
        1 => tokens::<1>(n, rows, nr, acts, ap, out),
        2 => tokens::<2>(n, rows, nr, acts, ap, out),
        3 => tokens::<3>(n, rows, nr, acts, ap, out),
        _ => tokens::<ROWS_T>(n, rows, nr, acts, ap, out),
    }
}

/// `iq3_s_rows_tokens` for exactly `N` tokens (their permuted quants at `ap`, 256 · nb bytes
/// apart).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vbmi,avx512bitalg")]
#[inline]
unsafe fn tokens<const N: usize>(
    n: usize,
    rows: &[u8],
    nr: usize,
    acts: &[&[u8]],
    ap: *const u8,
    out: &mut [f32],
) {
    use crate::quant::dot::avx2::pf;
    let nb = n / 256;
    let rb = WB * nb;
    let k = consts();
    let dist = pf::distance();
    for (r, w) in rows.chunks_exact(rb).take(nr).enumerate() {
        let mut acc = [_mm256_setzero_ps(); N];
        for b in 0..nb {
            pf::ahead(w, WB * b, dist, WB);
            let dec = decode(&k, w.as_ptr().add(WB * b));
            let dw = h2f(w, WB * b);
            for (t, acc) in acc.iter_mut().enumerate() {
                let l = lanes(&dec, ap.add(256 * (nb * t + b)));
                let d = dw * da(acts[t], b);
                *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(l), *acc);
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            out[r * N + t] = hsum8(*acc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dot::tests::{random_act, random_row, Rng};
    use crate::quant::dot::{cpu, kernel_for, Isa};
    use crate::quant::GgmlType;

    /// Every row (and every row and token of the rows × tokens kernel) is bitwise the scalar
    /// kernel's (ggml's order): blocks
    /// holding every grid index at every position (block k: index (k + 7·e) mod 512 at entry
    /// e), all signs set, the largest scales, random blocks; activations random and at ±127
    /// (the i16 sums' bound); rows of 1, 3, 8, 17 and 65 blocks (17 × 4 tokens and 65 past
    /// `MAX_BLOCKS`: the multi-token kernel's path) in runs of 1, 5 and 64 rows.
    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks bitalg"]
    fn iq3_s_rows_perm_equals_scalar() {
        assert!(
            cpu::has_vbmi_bitalg(),
            "this test needs AVX-512 VBMI and BITALG"
        );
        let w = GgmlType::IQ3S;
        let scalar = kernel_for(Isa::Scalar, w).unwrap();
        let mut rng = Rng::new(0x3e5);
        for nb in [1usize, 3, 8, 17, MAX_BLOCKS + 1] {
            let n = 256 * nb;
            let mut rows: Vec<u8> = Vec::new();
            for r in 0..64 {
                let mut row = random_row(w, n, &mut rng);
                for (b, wb) in row.chunks_exact_mut(WB).enumerate() {
                    if r % 4 == 3 {
                        continue; // random blocks as drawn
                    }
                    let k = 64 * r + b;
                    wb[66..74].fill(0);
                    for e in 0..64 {
                        let idx = (k + 7 * e) % 512;
                        wb[2 + e] = idx as u8;
                        wb[66 + e / 8] |= ((idx >> 8) as u8) << (e % 8);
                    }
                    if r % 4 == 1 {
                        wb[74..106].fill(0xff);
                    }
                    if r % 4 == 2 {
                        wb[106..110].fill(0xff);
                    }
                }
                rows.extend(row);
            }
            let mut acts = vec![random_act(w, n, &mut rng), random_act(w, n, &mut rng)];
            for v in [127i8, -127] {
                let mut a = random_act(w, n, &mut rng);
                for ab in a.chunks_exact_mut(AB) {
                    ab[4..260].fill(v as u8);
                }
                acts.push(a);
            }
            let rb = WB * nb;
            // the rows × tokens kernel: every (row, token) of 1–4 tokens, runs of 1, 5, 64 rows
            let refs: Vec<&[u8]> = acts.iter().map(|a| &a[..]).collect();
            for nt in 1..=ROWS_T {
                for run in [1usize, 5, 64] {
                    for (g, rs) in rows.chunks(run * rb).enumerate() {
                        let nr = rs.len() / rb;
                        let mut out = vec![f32::NAN; nr * nt];
                        // SAFETY: as below; `out` holds nr · nt values.
                        unsafe { iq3_s_rows_tokens(n, rs, nr, &refs[..nt], &mut out) };
                        for (i, row) in rs.chunks_exact(rb).enumerate() {
                            for (t, act) in refs[..nt].iter().enumerate() {
                                let (o, want) = (out[i * nt + t], scalar(n, row, act));
                                assert_eq!(
                                    o.to_bits(),
                                    want.to_bits(),
                                    "tokens n={n} nt={nt} run={run} row {} token {t}",
                                    g * run + i
                                );
                            }
                        }
                    }
                }
            }
            for act in &acts {
                for run in [1usize, 5, 64] {
                    for (g, rs) in rows.chunks(run * rb).enumerate() {
                        let mut out = vec![f32::NAN; rs.len() / rb];
                        // SAFETY: the CPU has what the kernel needs (asserted); whole rows.
                        unsafe { iq3_s_rows_perm(n, rs, act, &mut out) };
                        for (i, (o, row)) in out.iter().zip(rs.chunks_exact(rb)).enumerate() {
                            let want = scalar(n, row, act);
                            assert_eq!(
                                o.to_bits(),
                                want.to_bits(),
                                "n={n} run={run} row {}: {o} vs {want}",
                                g * run + i
                            );
                        }
                    }
                }
            }
        }
    }

    /// The order is a permutation, and each register's qwords draw on one chunk.
    #[test]
    fn order_tables() {
        let mut seen = [false; 64];
        for p in 0..64 {
            assert!(!seen[entry(p)]);
            seen[entry(p)] = true;
        }
        let mut w = [false; 256];
        for r in 0..4 {
            for j in 0..64 {
                let wt = weight(r, j);
                assert!(!w[wt]);
                w[wt] = true;
                assert_eq!(wt / 64, chunk(r, j / 8), "register {r} byte {j}");
                assert!(wt / 64 == r / 2 || wt / 64 == r / 2 + 2);
            }
        }
    }
}
