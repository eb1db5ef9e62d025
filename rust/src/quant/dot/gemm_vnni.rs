//! IQ3_S, Q4_K and Q6_K × Q8_K rows × tokens on AVX-512 VNNI registers, for CPUs without AMX
//! tiles (Zen 4/5, Ice Lake): the tiles' scheme, each row's weights decoded once per call and
//! each token's activations laid out once per call, then one `vpdpbusd` per (row, 16 tokens,
//! 4 weights) — no per-(row, token) decode, sign or scale work, which the multi-token kernels
//! (`gemm_iq3s.rs`, `gemm_avx512.rs`) repeat per token. Orders: IQ3_S and Q6_K in ggml's
//! tiled order (`Order::Many`: one exact integer per block, `acc + (f32(Σ)·d)·d_a`); Q4_K in
//! ggml's `vec_dot` order (`Single`: per block `acc + ((d_a·d)·sumi − (d_a·dmin)·summ)`) and
//! its repacked gemm order (`Many`: per pair of sub-blocks c `acc = fma(f32(si_c), d·d_a,
//! acc)`, `accm = fma(f32(sm_c), dmin·d_a, accm)`, then `acc − accm`).
//!
//! Operands of `vpdpbusd` (u8 × s8, four products summed into an i32 lane):
//! - activations, u8: `a + 128` (the byte with its top bit flipped), laid out as the AMX B
//!   tiles are: line `kq` of a (token tile, block) holds, in dword t, token t's four
//!   activations 4kq..4kq+4 (a 16 × 16 dword transpose of the tokens' 64-byte chunks);
//! - weights, s8, broadcast from memory (a dword of four weights per instruction), row r of a
//!   row tile at `a[(blk·R + r)·64 + kq]`: IQ3_S the signed grid value (|v| ≤ 15), Q4_K the
//!   4-bit q, Q6_K `q − 32`.
//!
//! Exactness: per (row, token) and scale group g (a sub-block: 32 weights, Q6_K 16) the
//! kernel forms `raw_g = Σ_{e∈g} v_e·(a_e + 128)` (8 or 4 `vpdpbusd`), then `Σ_g sc_g·raw_g −
//! corr` with `corr = 128·Σ_g sc_g·Σ_{e∈g} v_e` made when the row is packed: exactly the
//! integer `Σ_g sc_g·Σ v·a` of the single-token kernels (IQ3_S `sc = 2s + 1`, Q4_K the 6-bit
//! scale, Q6_K the signed 8-bit one). Bounds: |raw_g| ≤ 32·255·15 (Q4_K, IQ3_S) or 16·255·32,
//! |Σ_g sc_g·raw_g| ≤ 8·63·122400 < 2³¹. Q4_K's `summ = Σ_s m_s·bsum_s` is one `vpdpwssd` per
//! pair of sub-blocks over the tokens' 32-activation sums (≤ 4096 in magnitude, as i16 pairs).
//! Then the float combine of the order, operation for operation, lane t = token t.
//! `gemm::tests::vnni_rows_equal_scalar_bitwise` checks every (row, token) against the
//! scalar single-token kernel.
//!
//! Safety: `available()` checks the CPU (AVX-512 F/BW/VL and VNNI); `MultiDot` calls `rows`
//! only then.

use super::super::common::{f16_at, k4_scales};
use super::gemm_amx::{q4k_chunk, q6k_chunk, transpose16};
use super::gemm_avx512::iq3s512::{Gather, Grid, Permute};
use crate::quant::GgmlType;
use std::arch::x86_64::*;
use std::cell::RefCell;

use super::super::common::Q8K_BYTES as AB;
/// Tokens per register (i32 lanes).
const TOK: usize = 16;
/// Rows per micro-tile: R accumulators per group, R per block and R float sums in registers.
const R: usize = 8;
const _: () = assert!(R == 8, "reduce8 sums eight rows");
/// Dwords (of four weights) per block.
const KQ: usize = 64;
/// Most scale groups per block (Q6_K's 16 sub-blocks).
const NG_MAX: usize = 16;

/// The weight type and float order a kernel runs.
const IQ3S_MANY: u8 = 0;
const Q4K_SINGLE: u8 = 1;
const Q4K_MANY: u8 = 2;
const Q6K_MANY: u8 = 3;

/// Block bytes of KIND's weight type.
const fn block_bytes(kind: u8) -> usize {
    match kind {
        IQ3S_MANY => 110,
        Q6K_MANY => 210,
        _ => 144,
    }
}

/// Dwords per scale group of KIND (Q6_K: sub-blocks of 16 weights).
const fn group_kq(kind: u8) -> usize {
    if kind == Q6K_MANY {
        4
    } else {
        8
    }
}

/// Whether this CPU runs the kernels.
pub fn available() -> bool {
    super::super::cpu::has_vnni()
}

/// Per-thread scratch, grown to the largest call and then reused: per (token tile, block)
/// the B lines, the tokens' 32-activation sums as i16 pairs (`bs`, 4 lines) and d; one row
/// tile's packed weights per (block, row) `i = blk·R + r`: `a` (64 dwords), the group scales
/// `sc[i·16 + g]`, `corr[i·4 + c]` (per pair of sub-blocks c for Q4_K's `Many`, else the
/// block's at c = 0), Q4_K's mins as i16 pairs `mins[i·4 + p]`, d and dmin; `b_key` =
/// (blocks, tokens, first and last activation's address) of the activations `b` holds.
struct Scratch {
    b: Vec<__m512i>,
    bs: Vec<__m512i>,
    da: Vec<f32>,
    a: Vec<i32>,
    sc: Vec<i32>,
    corr: Vec<i32>,
    mins: Vec<i32>,
    d: Vec<f32>,
    dmin: Vec<f32>,
    /// `pack_a`'s correction sums before their reduction: `w[(blk·4 + c)·R + r]`.
    w: Vec<__m512i>,
    b_key: [usize; 4],
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch {
            b: Vec::new(),
            bs: Vec::new(),
            da: Vec::new(),
            a: Vec::new(),
            sc: Vec::new(),
            corr: Vec::new(),
            mins: Vec::new(),
            d: Vec::new(),
            dmin: Vec::new(),
            w: Vec::new(),
            b_key: [0; 4],
        })
    };
}

/// Lays out tokens `acts` (`nb` Q8_K blocks each): `b[(tt·nb + blk)·64 + kq]` = the line of
/// token tile tt, block blk, dword kq (`a + 128` as u8; missing tokens hold a = 0);
/// `bs[(tt·nb + blk)·4 + p]` dword t = token t's sums of sub-blocks 2p (low i16) and 2p + 1
/// (high i16), laid out only for Q4_K (`sums`: the other types never read them);
/// `da[(tt·nb + blk)·16 + t]` = token 16·tt + t's d (0 for missing ones).
#[target_feature(enable = "avx512f")]
unsafe fn pack_b(acts: &[&[u8]], nb: usize, sums: bool, s: &mut Scratch) {
    let flip = _mm512_set1_epi8(-128);
    let i16_at = |a: &[u8], o: usize| i16::from_le_bytes([a[o], a[o + 1]]) as i32;
    for (tt, toks) in acts.chunks(TOK).enumerate() {
        for blk in 0..nb {
            let at = (tt * nb + blk) * TOK;
            for t in 0..TOK {
                s.da[at + t] = toks.get(t).map_or(0.0, |a| {
                    f32::from_le_bytes(a[AB * blk..AB * blk + 4].try_into().unwrap())
                });
            }
            if sums {
                let mut pairs = [[0i32; TOK]; 4];
                for (t, a) in toks.iter().enumerate() {
                    let ab = &a[AB * blk..AB * blk + AB];
                    for (p, row) in pairs.iter_mut().enumerate() {
                        // sub-block j's sum: bsums 2j and 2j + 1 (of 16 activations each)
                        let sum = |j: usize| i16_at(ab, 260 + 4 * j) + i16_at(ab, 262 + 4 * j);
                        row[t] = (sum(2 * p) & 0xffff) | sum(2 * p + 1) << 16;
                    }
                }
                for (p, row) in pairs.iter().enumerate() {
                    s.bs[(tt * nb + blk) * 4 + p] = _mm512_loadu_si512(row.as_ptr() as *const _);
                }
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
                    s.b[base + j] = _mm512_xor_si512(*v, flip);
                }
            }
        }
    }
}

/// Block `wb`'s (one block of KIND) weights, chunk c (64 weights) in register c: the signed
/// bytes the tiles multiply (`.0`) and the operand of the correction's `vpdpbusd` against
/// the scale bytes (`.1`: the same signed bytes for IQ3_S and Q4_K, Q6_K's unsigned 6-bit q,
/// `v + 32`).
#[inline(always)]
unsafe fn weights<const KIND: u8, G: Grid>(grid: &G, wb: &[u8]) -> ([__m512i; 4], [__m512i; 4]) {
    let zero = _mm512_setzero_si512();
    match KIND {
        IQ3S_MANY => {
            let dec = grid.decode(wb);
            let v = std::array::from_fn(|c| {
                _mm512_mask_sub_epi8(dec.grid[c], dec.sign[c], zero, dec.grid[c])
            });
            (v, v)
        }
        Q6K_MANY => {
            let q: [__m512i; 4] = std::array::from_fn(|c| q6k_chunk(wb, c));
            (q.map(|x| _mm512_sub_epi8(x, _mm512_set1_epi8(32))), q)
        }
        _ => {
            let q = std::array::from_fn(|c| q4k_chunk(wb, c));
            (q, q)
        }
    }
}

/// Chunk c's scale bytes: byte e the scale of the group holding weight 64c + e, from `sb`
/// (the block's group scales as bytes 0..NG in every 128-bit lane).
#[inline(always)]
unsafe fn chunk_scale_bytes<const KIND: u8>(c: usize, sb: __m512i) -> __m512i {
    // 128-bit lane q (weights 16q..16q+16 of the chunk) holds group 4c + q (Q6_K's groups
    // of 16) or 2c + q/2 (groups of 32)
    let g = |q: usize| {
        let g = if KIND == Q6K_MANY {
            4 * c + q
        } else {
            2 * c + q / 2
        };
        (g as i32) * 0x0101_0101
    };
    // dword j of the index: four copies of its lane's group byte
    let idx: [i32; 16] = std::array::from_fn(|j| g(j / 4));
    let idx = _mm512_loadu_si512(idx.as_ptr() as *const _);
    _mm512_shuffle_epi8(sb, idx)
}

/// The sums of each of eight registers' 16 i32 lanes (exact: the integers they hold are far
/// from overflow): a transposing tree, 23 instructions for the eight against ~9 each alone.
#[inline(always)]
unsafe fn reduce8(v: &[__m512i]) -> [i32; 8] {
    // per pair (2k, 2k+1): quarters 0–1 row 2k's halves added, quarters 2–3 row 2k+1's
    let p: [__m512i; 4] = std::array::from_fn(|k| {
        let (x, y) = (v[2 * k], v[2 * k + 1]);
        _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0x44>(x, y),
            _mm512_shuffle_i32x4::<0xEE>(x, y),
        )
    });
    // quarter q: row q's (and 4 + q's) four partial sums
    let q: [__m512i; 2] = std::array::from_fn(|h| {
        let (a, b) = (p[2 * h], p[2 * h + 1]);
        _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0x88>(a, b),
            _mm512_shuffle_i32x4::<0xDD>(a, b),
        )
    });
    let e = _mm512_add_epi32(
        _mm512_unpacklo_epi64(q[0], q[1]),
        _mm512_unpackhi_epi64(q[0], q[1]),
    );
    // lane 4q: row q's sum, lane 4q + 2: row 4 + q's
    let f = _mm512_add_epi32(e, _mm512_shuffle_epi32::<0b10_11_00_01>(e));
    let mut l = [0i32; 16];
    _mm512_storeu_si512(l.as_mut_ptr() as *mut _, f);
    std::array::from_fn(|r| if r < 4 { l[4 * r] } else { l[4 * (r - 4) + 2] })
}

/// One row tile's weights, rows `r0..r0 + R` of `rows` (rows at or past `nr` zero), every
/// block, into the scratch (see `Scratch`). The correction `corr = 128·Σ_g sc_g·Σ_{e∈g} v_e`
/// is one `vpdpbusd` per chunk (the scale bytes against the weights: exact integers), the
/// eight rows' registers of a block summed together (`reduce8`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pack_a<const KIND: u8, G: Grid>(
    grid: &G,
    rows: &[u8],
    row_len: usize,
    r0: usize,
    nr: usize,
    nb: usize,
    s: &mut Scratch,
) {
    let wbytes = block_bytes(KIND);
    // sums kept apart: Q4_K's `Many` corrects per pair of sub-blocks (chunk), the others
    // per block
    let nsum = if KIND == Q4K_MANY { 4 } else { 1 };
    for r in 0..R {
        // the next row tile's row r, while this tile's products run (the rows are read from
        // RAM once per call: unfetched, their first loads stalled the decode)
        if r0 + R + r < nr {
            let next = rows.as_ptr().add((r0 + R + r) * row_len);
            for off in (0..row_len).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(next.add(off) as *const i8);
            }
        }
        for blk in 0..nb {
            let i = blk * R + r;
            let ap = s.a.as_mut_ptr().add(i * KQ) as *mut __m512i;
            let wp = s.w.as_mut_ptr().add(blk * 4 * R + r);
            if r0 + r >= nr {
                for c in 0..4 {
                    _mm512_storeu_si512(ap.add(c), _mm512_setzero_si512());
                    *wp.add(c * R) = _mm512_setzero_si512();
                }
                s.sc[i * NG_MAX..(i + 1) * NG_MAX].fill(0);
                s.corr[i * 4..i * 4 + 4].fill(0);
                s.mins[i * 4..i * 4 + 4].fill(0);
                (s.d[i], s.dmin[i]) = (0.0, 0.0);
                continue;
            }
            let wb = &rows[(r0 + r) * row_len + wbytes * blk..][..wbytes];
            let mut sc = [0i32; NG_MAX];
            let mut sbytes = [0u8; NG_MAX];
            // Q6_K: Σ sc·(q − 32) = Σ sc·q − 32·16·Σ_g sc_g, the second term here
            let mut offset = 0;
            match KIND {
                IQ3S_MANY => {
                    for (g, v) in sc.iter_mut().take(8).enumerate() {
                        *v = 1 + 2 * ((wb[106 + g / 2] >> (4 * (g % 2))) & 15) as i32;
                        sbytes[g] = *v as u8;
                    }
                    s.d[i] = f16_at(wb, 0);
                }
                Q6K_MANY => {
                    for (g, v) in sc.iter_mut().enumerate() {
                        *v = wb[192 + g] as i8 as i32;
                        offset -= 512 * *v;
                    }
                    sbytes.copy_from_slice(&wb[192..208]);
                    s.d[i] = f16_at(wb, 208);
                }
                _ => {
                    let (scb, mb) = k4_scales(wb);
                    for g in 0..8 {
                        sc[g] = scb[g] as i32;
                    }
                    sbytes[..8].copy_from_slice(&scb);
                    for p in 0..4 {
                        s.mins[i * 4 + p] = mb[2 * p] as i32 | (mb[2 * p + 1] as i32) << 16;
                    }
                    (s.d[i], s.dmin[i]) = (f16_at(wb, 0), f16_at(wb, 2));
                }
            }
            s.sc[i * NG_MAX..(i + 1) * NG_MAX].copy_from_slice(&sc);
            s.corr[i * 4] = offset;
            let sb = _mm512_broadcast_i32x4(_mm_loadu_si128(sbytes.as_ptr() as *const _));
            let (v4, u4) = weights::<KIND, G>(grid, wb);
            let mut weighted = [_mm512_setzero_si512(); 4];
            for c in 0..4 {
                _mm512_storeu_si512(ap.add(c), v4[c]);
                let scb = chunk_scale_bytes::<KIND>(c, sb);
                // dword j: Σ of weights 4j..4j+4 of the chunk times their group's scale
                let x = &mut weighted[if nsum == 4 { c } else { 0 }];
                *x = if KIND == Q6K_MANY {
                    _mm512_dpbusd_epi32(*x, u4[c], scb) // q (u8) · sc (s8)
                } else {
                    _mm512_dpbusd_epi32(*x, scb, u4[c]) // sc (u8) · v (s8)
                };
            }
            for (c, w) in weighted.iter().enumerate().take(nsum) {
                *wp.add(c * R) = *w;
            }
        }
    }
    for blk in 0..nb {
        for c in 0..nsum {
            let sums = reduce8(&s.w[(blk * 4 + c) * R..(blk * 4 + c + 1) * R]);
            for (r, v) in sums.iter().enumerate() {
                let o = &mut s.corr[(blk * R + r) * 4 + c];
                *o = 128 * (*v + if c == 0 { *o } else { 0 });
            }
        }
    }
}

/// The R rows of the packed tile against one token tile (`b`, `bs`, `da` from its block 0):
/// per row the 16 tokens' results in KIND's order.
#[inline(always)]
unsafe fn tile<const KIND: u8>(
    nb: usize,
    s: &Scratch,
    b: *const __m512i,
    bs: *const __m512i,
    da: *const f32,
) -> [__m512; R] {
    let gk = group_kq(KIND);
    let zero = _mm512_setzero_si512();
    let mut accf = [_mm512_setzero_ps(); R];
    for blk in 0..nb {
        let ab = s.a.as_ptr().add(blk * R * KQ);
        let bb = b.add(blk * KQ);
        let scb = s.sc.as_ptr().add(blk * R * NG_MAX);
        let dav = _mm512_loadu_ps(da.add(blk * TOK));
        let mut s1 = [zero; R];
        for g in 0..KQ / gk {
            let mut acc = [zero; R];
            for q in 0..gk {
                let kq = gk * g + q;
                let bv = _mm512_load_si512(bb.add(kq));
                for (r, x) in acc.iter_mut().enumerate() {
                    *x = _mm512_dpbusd_epi32(*x, bv, _mm512_set1_epi32(*ab.add(r * KQ + kq)));
                }
            }
            for (r, x) in s1.iter_mut().enumerate() {
                let sc = _mm512_set1_epi32(*scb.add(r * NG_MAX + g));
                *x = _mm512_add_epi32(*x, _mm512_mullo_epi32(acc[r], sc));
            }
            if KIND == Q4K_MANY && g % 2 == 1 {
                // pair c's sumi: acc = fma(f32(si_c), d·d_a, acc)
                for (r, f) in accf.iter_mut().enumerate() {
                    let i = blk * R + r;
                    let corr = _mm512_set1_epi32(s.corr[i * 4 + g / 2]);
                    let si = _mm512_cvtepi32_ps(_mm512_sub_epi32(s1[r], corr));
                    *f = _mm512_fmadd_ps(si, _mm512_mul_ps(dav, _mm512_set1_ps(s.d[i])), *f);
                    s1[r] = zero;
                }
            }
        }
        if KIND == Q4K_MANY {
            continue;
        }
        for (r, f) in accf.iter_mut().enumerate() {
            let i = blk * R + r;
            let si = _mm512_cvtepi32_ps(_mm512_sub_epi32(s1[r], _mm512_set1_epi32(s.corr[i * 4])));
            if KIND == Q4K_SINGLE {
                let mut sm = zero;
                for p in 0..4 {
                    let m = _mm512_set1_epi32(s.mins[i * 4 + p]);
                    sm = _mm512_dpwssd_epi32(sm, *bs.add(blk * 4 + p), m);
                }
                let dd = _mm512_mul_ps(dav, _mm512_set1_ps(s.d[i]));
                let dm = _mm512_mul_ps(dav, _mm512_set1_ps(s.dmin[i]));
                let t = _mm512_sub_ps(
                    _mm512_mul_ps(dd, si),
                    _mm512_mul_ps(dm, _mm512_cvtepi32_ps(sm)),
                );
                *f = _mm512_add_ps(*f, t);
            } else {
                let v = _mm512_mul_ps(_mm512_mul_ps(si, _mm512_set1_ps(s.d[i])), dav);
                *f = _mm512_add_ps(*f, v);
            }
        }
    }
    if KIND == Q4K_MANY {
        // the mins' accumulator, independent of `acc`: accm = fma(f32(sm_c), dmin·d_a, accm)
        for (r, f) in accf.iter_mut().enumerate() {
            let mut accm = _mm512_setzero_ps();
            for blk in 0..nb {
                let i = blk * R + r;
                let dm = _mm512_mul_ps(
                    _mm512_loadu_ps(da.add(blk * TOK)),
                    _mm512_set1_ps(s.dmin[i]),
                );
                for c in 0..4 {
                    let m = _mm512_set1_epi32(s.mins[i * 4 + c]);
                    let sm = _mm512_dpwssd_epi32(zero, *bs.add(blk * 4 + c), m);
                    accm = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sm), dm, accm);
                }
            }
            *f = _mm512_sub_ps(*f, accm);
        }
    }
    accf
}

/// `out[r·nt + t] = dot(row r, acts[t])` for the `nr` rows of `rows` (n weights of `w` each)
/// and the `nt = acts.len()` tokens, in the order `many` selects (see the module text).
/// `keep_b`: as `MultiDot::rows_call_keep`'s `same_acts` (the activations' layout is reused
/// when the last call's blocks, tokens and addresses match). Panics for a type and order
/// without a kernel (`gemm::tiles_have`).
///
/// # Safety
/// `available()` is true; every row holds `n / 256` blocks of `w` and every activation
/// `n / 256` Q8_K blocks; `out.len() == nr · nt`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows(
    w: GgmlType,
    many: bool,
    n: usize,
    rows: &[u8],
    nr: usize,
    acts: &[&[u8]],
    out: &mut [f32],
    keep_b: bool,
) {
    let args = (n, rows, nr, acts, out, keep_b);
    match (w, many) {
        (GgmlType::IQ3S, true) if super::super::cpu::has_vbmi() => rows_iq3s_vbmi(args),
        (GgmlType::IQ3S, true) => rows_iq3s_gather(args),
        (GgmlType::Q4K, false) => rows_k::<Q4K_SINGLE>(args),
        (GgmlType::Q4K, true) => rows_k::<Q4K_MANY>(args),
        (GgmlType::Q6K, true) => rows_k::<Q6K_MANY>(args),
        _ => panic!("no VNNI rows kernel for {} (many: {many})", w.name()),
    }
}

/// `rows`' arguments after the type and order.
type Args<'a, 'b> = (usize, &'a [u8], usize, &'a [&'b [u8]], &'a mut [f32], bool);

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn rows_iq3s_gather(a: Args) {
    rows_with::<IQ3S_MANY, _>(&Gather, a)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn rows_iq3s_vbmi(a: Args) {
    rows_with::<IQ3S_MANY, _>(&Permute::load(), a)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_k<const KIND: u8>(a: Args) {
    // (the grid strategy is unused by the K types)
    rows_with::<KIND, _>(&Gather, a)
}

#[inline(always)]
unsafe fn rows_with<const KIND: u8, G: Grid>(grid: &G, (n, rows, nr, acts, out, keep_b): Args) {
    let (nb, nt) = (n / 256, acts.len());
    let row_len = block_bytes(KIND) * nb;
    assert!(nt > 0 && rows.len() >= nr * row_len && out.len() == nr * nt);
    let ntt = nt.div_ceil(TOK);
    SCRATCH.with(|cell| {
        let s = &mut *cell.borrow_mut();
        if s.b.len() < ntt * nb * KQ {
            s.b.resize(ntt * nb * KQ, _mm512_setzero_si512());
            s.bs.resize(ntt * nb * 4, _mm512_setzero_si512());
            s.da.resize(ntt * nb * TOK, 0.0);
        }
        if s.a.len() < nb * R * KQ {
            s.a.resize(nb * R * KQ, 0);
            s.sc.resize(nb * R * NG_MAX, 0);
            s.corr.resize(nb * R * 4, 0);
            s.mins.resize(nb * R * 4, 0);
            s.d.resize(nb * R, 0.0);
            s.dmin.resize(nb * R, 0.0);
            s.w.resize(nb * 4 * R, _mm512_setzero_si512());
        }
        let key = [
            nb,
            nt,
            acts[0].as_ptr() as usize,
            acts[nt - 1].as_ptr() as usize,
        ];
        if !keep_b || s.b_key != key {
            pack_b(acts, nb, KIND == Q4K_SINGLE || KIND == Q4K_MANY, s);
            s.b_key = key;
        }
        for r0 in (0..nr).step_by(R) {
            pack_a::<KIND, G>(grid, rows, row_len, r0, nr, nb, s);
            let rn = (nr - r0).min(R);
            for tt in 0..ntt {
                let f = tile::<KIND>(
                    nb,
                    s,
                    s.b.as_ptr().add(tt * nb * KQ),
                    s.bs.as_ptr().add(tt * nb * 4),
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
