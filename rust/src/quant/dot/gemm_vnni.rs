//! IQ3_S × Q8_K rows × tokens in ggml's tiled order (`Order::Many`: one exact integer per
//! block, then `acc + (f32(Σ)·d)·d_a`) on AVX-512 VNNI registers, for CPUs without AMX tiles
//! (Zen 4/5, Ice Lake): the tiles' scheme, each row's weights decoded once per call and each
//! token's activations laid out once per call, then one `vpdpbusd` per (row, 16 tokens, 4
//! weights) — no per-(row, token) decode, sign or scale work, which the multi-token kernels
//! (`gemm_iq3s.rs`, `gemm_iq3s512.rs`) repeat per token.
//!
//! Operands of `vpdpbusd` (u8 × s8, four products summed into an i32 lane):
//! - activations, u8: `a + 128` (the byte with its top bit flipped), laid out as the AMX B
//!   tiles are: line `kq` of a (token tile, block) holds, in dword t, token t's four
//!   activations 4kq..4kq+4 (a 16 × 16 dword transpose of the tokens' 64-byte chunks);
//! - weights, s8: the signed grid value v (|v| ≤ 15), broadcast from memory (a dword of four
//!   weights per instruction), row r of a row tile at `a[(blk·R + r)·64 + kq]`.
//!
//! Exactness: per (row, token, block) `I = Σ_g ls_g·Σ_{e∈g} v_e·a_e` (`ls = 2s + 1`), the block's
//! integer of the single-token kernel (`iq3_s_ints`' eight lanes summed), is formed as
//! `Σ_g ls_g·raw_g − corr` with `raw_g = Σ_{e∈g} v_e·(a_e + 128)` (one group = 8 `vpdpbusd`)
//! and `corr = 128·Σ_g ls_g·Σ_{e∈g} v_e` made when the row is packed. Bounds: |raw_g| ≤
//! 32·255·15, |Σ_g ls_g·raw_g| ≤ 31·8·122400 < 2³¹. Then the float combine of the order,
//! operation for operation (`acc + (f32(I)·d)·d_a`), lane t = token t.
//! `gemm::tests::vnni_rows_equal_scalar_bitwise` checks every (row, token) against the
//! scalar single-token kernel.
//!
//! Safety: `available()` checks the CPU (AVX-512 F/BW/VL and VNNI); `MultiDot` calls `rows`
//! only then.

use super::super::common::f16_at;
use super::gemm_amx::transpose16;
use super::gemm_avx512::iq3s512::{Gather, Grid, Permute};
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Q8_K block bytes: d (f32) · qs[256] (i8) · bsums[16] (i16).
const AB: usize = 292;
/// IQ3_S block bytes: d (f16) · qs[64] · qh[8] · signs[32] · scales[4].
const WB: usize = 110;
/// Tokens per register (i32 lanes).
const TOK: usize = 16;
/// Rows per micro-tile: R accumulators per group, R per block and R float sums in registers.
const R: usize = 8;
/// Dwords (of four weights) per block.
const KQ: usize = 64;

/// Whether this CPU runs the kernel.
pub fn available() -> bool {
    super::super::cpu::has_vnni()
}

/// Per-thread scratch, grown to the largest call and then reused: the B lines of every
/// (token tile, block), the tokens' d per (token tile, block), and one row tile's packed
/// weights (`a`), group scales (`ls`), corrections and d per block; `b_key` = (blocks,
/// tokens, first and last activation's address) of the activations `b` holds.
struct Scratch {
    b: Vec<__m512i>,
    da: Vec<f32>,
    a: Vec<i32>,
    ls: Vec<i32>,
    corr: Vec<i32>,
    d: Vec<f32>,
    b_key: [usize; 4],
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch {
            b: Vec::new(),
            da: Vec::new(),
            a: Vec::new(),
            ls: Vec::new(),
            corr: Vec::new(),
            d: Vec::new(),
            b_key: [0; 4],
        })
    };
}

/// Lays out tokens `acts` (`nb` Q8_K blocks each): `b[(tt·nb + blk)·64 + kq]` = the line of
/// token tile tt, block blk, dword kq (`a + 128` as u8; missing tokens hold a = 0), and
/// `da[(tt·nb + blk)·16 + t]` = token 16·tt + t's d (0 for missing ones).
#[target_feature(enable = "avx512f")]
unsafe fn pack_b(acts: &[&[u8]], nb: usize, b: &mut [__m512i], da: &mut [f32]) {
    let flip = _mm512_set1_epi8(-128);
    for (tt, toks) in acts.chunks(TOK).enumerate() {
        for blk in 0..nb {
            let at = (tt * nb + blk) * TOK;
            for t in 0..TOK {
                da[at + t] = toks.get(t).map_or(0.0, |a| {
                    f32::from_le_bytes(a[AB * blk..AB * blk + 4].try_into().unwrap())
                });
            }
            for c in 0..4 {
                let rows: [__m512i; 16] = std::array::from_fn(|t| match toks.get(t) {
                    Some(a) => {
                        _mm512_loadu_si512(a.as_ptr().add(AB * blk + 4 + 64 * c) as *const _)
                    }
                    None => _mm512_setzero_si512(),
                });
                let o = transpose16(&rows);
                let base = (tt * nb + blk) * KQ + 16 * c;
                for (j, v) in o.iter().enumerate() {
                    b[base + j] = _mm512_xor_si512(*v, flip);
                }
            }
        }
    }
}

/// One row tile's weights, rows `r0..r0 + R` of `rows` (rows at or past `nr` zero), every
/// block: the signed grid values (`a[(blk·R + r)·64 ..]`, 256 bytes), the group scales
/// `ls[(blk·R + r)·8 + g]`, `corr[blk·R + r]` (see the module text) and `d[blk·R + r]`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pack_a<G: Grid>(
    grid: &G,
    rows: &[u8],
    row_len: usize,
    r0: usize,
    nr: usize,
    nb: usize,
    s: &mut Scratch,
) {
    let ones = _mm512_set1_epi8(1);
    for blk in 0..nb {
        for r in 0..R {
            let i = blk * R + r;
            let ap = s.a.as_mut_ptr().add(i * KQ) as *mut __m512i;
            if r0 + r >= nr {
                for c in 0..4 {
                    _mm512_storeu_si512(ap.add(c), _mm512_setzero_si512());
                }
                s.ls[i * 8..i * 8 + 8].fill(0);
                (s.corr[i], s.d[i]) = (0, 0.0);
                continue;
            }
            let wb = &rows[(r0 + r) * row_len + WB * blk..][..WB];
            let dec = grid.decode(wb);
            let mut weighted = _mm512_setzero_si512();
            for c in 0..4 {
                let (mag, sign) = (dec.grid[c], dec.sign[c]);
                let v = _mm512_mask_sub_epi8(mag, sign, _mm512_setzero_si512(), mag);
                _mm512_storeu_si512(ap.add(c), v);
                // dword j: Σ of weights 4j..4j+4 of the chunk; lanes 0–7 group 2c, 8–15 2c+1
                let sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, v);
                let sb = wb[106 + c] as i32;
                let (l0, l1) = (1 + 2 * (sb & 15), 1 + 2 * (sb >> 4));
                s.ls[i * 8 + 2 * c] = l0;
                s.ls[i * 8 + 2 * c + 1] = l1;
                let lsv = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_set1_epi32(l0)),
                    _mm256_set1_epi32(l1),
                );
                weighted = _mm512_add_epi32(weighted, _mm512_mullo_epi32(sums, lsv));
            }
            s.corr[i] = 128 * _mm512_reduce_add_epi32(weighted);
            s.d[i] = f16_at(wb, 0);
        }
    }
}

/// The R rows of the packed tile against one token tile (`b` from its block 0, `da` its d
/// per block): per row the 16 tokens' float sums in the tiled order.
#[inline(always)]
unsafe fn tile(nb: usize, s: &Scratch, b: *const __m512i, da: *const f32) -> [__m512; R] {
    let mut accf = [_mm512_setzero_ps(); R];
    for blk in 0..nb {
        let ab = s.a.as_ptr().add(blk * R * KQ);
        let bb = b.add(blk * KQ);
        let lsb = s.ls.as_ptr().add(blk * R * 8);
        let mut s1 = [_mm512_setzero_si512(); R];
        for g in 0..8 {
            let mut acc = [_mm512_setzero_si512(); R];
            for q in 0..8 {
                let kq = 8 * g + q;
                let bv = _mm512_load_si512(bb.add(kq));
                for (r, x) in acc.iter_mut().enumerate() {
                    *x = _mm512_dpbusd_epi32(*x, bv, _mm512_set1_epi32(*ab.add(r * KQ + kq)));
                }
            }
            for (r, x) in s1.iter_mut().enumerate() {
                let ls = _mm512_set1_epi32(*lsb.add(r * 8 + g));
                *x = _mm512_add_epi32(*x, _mm512_mullo_epi32(acc[r], ls));
            }
        }
        let dav = _mm512_loadu_ps(da.add(blk * TOK));
        for (r, f) in accf.iter_mut().enumerate() {
            let i = blk * R + r;
            let si = _mm512_cvtepi32_ps(_mm512_sub_epi32(s1[r], _mm512_set1_epi32(s.corr[i])));
            let v = _mm512_mul_ps(_mm512_mul_ps(si, _mm512_set1_ps(s.d[i])), dav);
            *f = _mm512_add_ps(*f, v);
        }
    }
    accf
}

/// `out[r·nt + t] = dot(row r, acts[t])` for the `nr` IQ3_S rows of `rows` (n weights each)
/// and the `nt = acts.len()` tokens, in ggml's tiled order. `keep_b`: as
/// `MultiDot::rows_call_keep`'s `same_acts` (the activations' layout is reused when the last
/// call's blocks, tokens and addresses match).
///
/// # Safety
/// `available()` is true; every row holds `n / 256` IQ3_S blocks and every activation
/// `n / 256` Q8_K blocks; `out.len() == nr · nt`.
pub unsafe fn rows(
    n: usize,
    rows: &[u8],
    nr: usize,
    acts: &[&[u8]],
    out: &mut [f32],
    keep_b: bool,
) {
    if super::super::cpu::has_vbmi() {
        rows_vbmi(n, rows, nr, acts, out, keep_b)
    } else {
        rows_gather(n, rows, nr, acts, out, keep_b)
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn rows_gather(
    n: usize,
    w: &[u8],
    nr: usize,
    acts: &[&[u8]],
    out: &mut [f32],
    keep_b: bool,
) {
    rows_with(&Gather, n, w, nr, acts, out, keep_b)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn rows_vbmi(n: usize, w: &[u8], nr: usize, acts: &[&[u8]], out: &mut [f32], keep_b: bool) {
    rows_with(&Permute::load(), n, w, nr, acts, out, keep_b)
}

#[inline(always)]
unsafe fn rows_with<G: Grid>(
    grid: &G,
    n: usize,
    rows: &[u8],
    nr: usize,
    acts: &[&[u8]],
    out: &mut [f32],
    keep_b: bool,
) {
    let (nb, nt) = (n / 256, acts.len());
    let row_len = WB * nb;
    assert!(nt > 0 && rows.len() >= nr * row_len && out.len() == nr * nt);
    let ntt = nt.div_ceil(TOK);
    SCRATCH.with(|cell| {
        let s = &mut *cell.borrow_mut();
        if s.b.len() < ntt * nb * KQ {
            s.b.resize(ntt * nb * KQ, _mm512_setzero_si512());
        }
        if s.da.len() < ntt * nb * TOK {
            s.da.resize(ntt * nb * TOK, 0.0);
        }
        if s.a.len() < nb * R * KQ {
            s.a.resize(nb * R * KQ, 0);
            s.ls.resize(nb * R * 8, 0);
            s.corr.resize(nb * R, 0);
            s.d.resize(nb * R, 0.0);
        }
        let key = [
            nb,
            nt,
            acts[0].as_ptr() as usize,
            acts[nt - 1].as_ptr() as usize,
        ];
        if !keep_b || s.b_key != key {
            pack_b(acts, nb, &mut s.b, &mut s.da);
            s.b_key = key;
        }
        for r0 in (0..nr).step_by(R) {
            pack_a(grid, rows, row_len, r0, nr, nb, s);
            let rn = (nr - r0).min(R);
            for tt in 0..ntt {
                let f = tile(
                    nb,
                    s,
                    s.b.as_ptr().add(tt * nb * KQ),
                    s.da.as_ptr().add(tt * nb * TOK),
                );
                let tn = (nt - tt * TOK).min(TOK);
                let m: __mmask16 = ((1u32 << tn) - 1) as __mmask16;
                for (r, v) in f.iter().enumerate().take(rn) {
                    let o = out.as_mut_ptr().add((r0 + r) * nt + tt * TOK);
                    _mm512_mask_storeu_ps(o, m, *v);
                }
            }
        }
    });
}
