//! Q4_K and IQ3_S × Q8_K on Intel AMX-INT8 tiles (`tdpbusd`, `tdpbssd`): Q4_K in both orders
//! (`Order::Single`, ggml's `vec_dot`; `Order::Many`, its repacked gemm), IQ3_S in ggml's
//! tiled order (`Order::Many`: one exact integer per block; its `vec_dot` order keeps eight
//! lanes per block, which the tiles do not give): many weight rows against many tokens per
//! call, 16 rows × 16 tokens per tile. IQ3_S: the signed grid value times the group scale
//! `ls = 2·s + 1` split `lo + 8·hi` (two `tdpbssd` products, each |v·part| ≤ 105).
//!
//! Exactness: a tile product is an exact integer sum, so every (row, token, block) gets the
//! very integers of the single-token kernel, then the same float operations:
//! - `sumi = Σ_s sc_s·Σ_l q_l·a_l` with the 6-bit scale split as `sc = lo + 8·hi` (lo, hi in
//!   0..8) so that `q·lo` and `q·hi` (≤ 105) fit the tile's u8 operand: two tile products,
//!   `sumi = C_lo + 8·C_hi`;
//! - `summ = Σ_s m_s·bsum_s = Σ_l m_{s(l)}·a_l` (a Q8_K bsum is the exact sum of its 16
//!   quantized activations): a third tile product with the mins spread over their weights;
//! - per block `acc + ((d_a·d)·sumi − (d_a·dmin)·summ)` (`common::k_add_min`), no fusing;
//!   in `Order::Many` the same sums per pair of sub-blocks (one 64-weight chunk: the tiles
//!   stored after each chunk) and the gemm's two fused accumulators.
//!
//! Tiles: A (weights, u8) row r = 64 weights of one chunk of row r, as decoded below; B
//! (activations, s8) in the VNNI layout `B[k/4][4t + k%4] = a_t[k]`: the 16 tokens' 64-byte
//! chunks transposed as a 16 × 16 matrix of dwords, once per call for every row tile; C
//! (i32) `C[r][t]`. The activation tiles of a call live in a per-thread buffer that grows to
//! the largest call and is then reused (no allocation per step).
//!
//! Safety: `available()` checks the CPU (CPUID AMX-TILE/AMX-INT8, AVX-512), the OS (XCR0
//! tile state) and asks Linux for the tile data permission once; the kernel runs only after.

use super::super::common::{f16_at, k4_scales_packed};
use super::gemm_avx512::iq3s512::{grid_chunk, halves};
use crate::quant::GgmlType;
use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

use super::super::common::Q8K_BYTES as AB;
/// Q4_K block bytes: d, dmin (f16) · scales[12] · qs[128].
const WB: usize = 144;
/// IQ3_S block bytes: d (f16) · qs[64] · qh[8] · signs[32] · scales[4].
const IQ3S_WB: usize = 110;
/// Q6_K block bytes: ql[128] · qh[64] · scales[16] (i8) · d (f16).
const Q6K_WB: usize = 210;
/// Rows and tokens per tile.
const TILE: usize = 16;
/// Most A operands per 64-weight chunk (Q6_K's five), the stride of the A tiles.
const OPS: usize = 5;

/// Whether this CPU and OS run AMX-INT8 tiles here (asked once per process).
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(detect)
}

fn detect() -> bool {
    if !super::super::cpu::has_avx512() {
        return false;
    }
    // SAFETY: CPUID leaf 7 exists on every CPU with AVX-512; XGETBV is checked via OSXSAVE.
    unsafe {
        let l7 = __cpuid_count(7, 0);
        let (tile, int8) = (l7.edx >> 24 & 1 == 1, l7.edx >> 25 & 1 == 1);
        let osxsave = __cpuid(1).ecx >> 27 & 1 == 1;
        if !(tile && int8 && osxsave) {
            return false;
        }
        // XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS saves tile state
        if _xgetbv(0) >> 17 & 3 != 3 {
            return false;
        }
    }
    request_tile_permission()
}

#[cfg(target_os = "linux")]
fn request_tile_permission() -> bool {
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    const SYS_ARCH_PRCTL: i64 = 158;
    let ret: i64;
    // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) only changes this process's
    // permission to use the tile state; it touches no memory of ours.
    unsafe {
        asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL => ret,
             in("rdi") ARCH_REQ_XCOMP_PERM, in("rsi") XFEATURE_XTILEDATA,
             lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_permission() -> bool {
    false
}

/// Tile configuration (palette 1): tmm0–4 the C tiles (16 × 64 bytes of i32), tmm5 A,
/// tmm6 B, all 16 rows × 64 bytes.
#[repr(C, align(64))]
struct TileCfg([u8; 64]);

const fn tile_cfg() -> TileCfg {
    let mut c = [0u8; 64];
    c[0] = 1; // palette
    let mut t = 0;
    while t < 7 {
        c[16 + 2 * t] = 64; // colsb (u16, little-endian)
        c[48 + t] = 16; // rows
        t += 1;
    }
    TileCfg(c)
}

static CFG: TileCfg = tile_cfg();

/// The 64-byte-aligned scratch of one call: the B tiles of every (token tile, block, chunk)
/// and the A tiles of one row tile's block.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

/// Per-thread scratch: the call's B tiles, the two A buffers (`rows_kernel`; made once: as
/// an array on the stack they were 40 KB zeroed per call, 2% of a prompt) and its float
/// accumulators `acc[r][t]` of one row tile (these grow to the largest call, then are
/// reused); `b_key` = (blocks, tokens, first and last activation's address) of the
/// activations `b` holds.
struct Scratch {
    b: Vec<Line>,
    a: Vec<Line>,
    acc: Vec<f32>,
    b_key: [usize; 4],
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch {
            b: Vec::new(),
            a: Vec::new(),
            acc: Vec::new(),
            b_key: [0; 4],
        })
    };
}

/// `C_k += A · B` (tmm k, tmm5, tmm6): u8 × s8 (`tdpbusd`) or s8 × s8 (`tdpbssd`).
#[inline(always)]
unsafe fn tdp(k: usize, signed: bool) {
    macro_rules! arms {
        ($($k:literal),*) => {
            match (signed, k) {
                $((false, $k) => asm!(concat!("tdpbusd tmm", $k, ", tmm5, tmm6"), options(nostack)),
                  (true, $k) => asm!(concat!("tdpbssd tmm", $k, ", tmm5, tmm6"), options(nostack)),)*
                _ => unreachable!("C tile {k}"),
            }
        };
    }
    arms!(0, 1, 2, 3, 4)
}

#[inline(always)]
unsafe fn tile_load<const T: u8>(p: *const u8) {
    match T {
        5 => asm!("tileloadd tmm5, [{0} + {1}]", in(reg) p, in(reg) 64usize, options(nostack)),
        _ => asm!("tileloadd tmm6, [{0} + {1}]", in(reg) p, in(reg) 64usize, options(nostack)),
    }
}

#[inline(always)]
unsafe fn tile_store_c(k: usize, p: *mut u8) {
    macro_rules! arms {
        ($($k:literal),*) => {
            match k {
                $($k => asm!(concat!("tilestored [{0} + {1}], tmm", $k), in(reg) p, in(reg) 64usize,
                             options(nostack)),)*
                _ => unreachable!("C tile {k}"),
            }
        };
    }
    arms!(0, 1, 2, 3, 4)
}

/// 16 × 16 dword transpose: `out[j]` lane t = `rows[t]` lane j.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn transpose16(r: &[__m512i; 16]) -> [__m512i; 16] {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    // per 128-bit lane l: u[4q + k] holds column 4l + k of rows 4q..4q+4
    let mut u = [_mm512_setzero_si512(); 16];
    for q in 0..4 {
        let (a, b, c, d) = (t[4 * q], t[4 * q + 1], t[4 * q + 2], t[4 * q + 3]);
        u[4 * q] = _mm512_unpacklo_epi64(a, c);
        u[4 * q + 1] = _mm512_unpackhi_epi64(a, c);
        u[4 * q + 2] = _mm512_unpacklo_epi64(b, d);
        u[4 * q + 3] = _mm512_unpackhi_epi64(b, d);
    }
    let mut o = [_mm512_setzero_si512(); 16];
    for k in 0..4 {
        let v = _mm512_shuffle_i32x4::<0x88>(u[k], u[4 + k]);
        let w = _mm512_shuffle_i32x4::<0x88>(u[8 + k], u[12 + k]);
        let v2 = _mm512_shuffle_i32x4::<0xDD>(u[k], u[4 + k]);
        let w2 = _mm512_shuffle_i32x4::<0xDD>(u[8 + k], u[12 + k]);
        o[k] = _mm512_shuffle_i32x4::<0x88>(v, w);
        o[8 + k] = _mm512_shuffle_i32x4::<0xDD>(v, w);
        o[4 + k] = _mm512_shuffle_i32x4::<0x88>(v2, w2);
        o[12 + k] = _mm512_shuffle_i32x4::<0xDD>(v2, w2);
    }
    o
}

/// B tiles of tokens `acts[16·tt ..]` (missing tokens zero): `b[((tt·nb + b)·4 + c)·16 + j]`
/// is row j of the tile of block b, chunk c.
#[target_feature(enable = "avx512f")]
unsafe fn pack_b(acts: &[&[u8]], nb: usize, b: &mut [Line]) {
    for (tt, toks) in acts.chunks(TILE).enumerate() {
        for blk in 0..nb {
            for c in 0..4 {
                let rows: [__m512i; 16] = std::array::from_fn(|t| match toks.get(t) {
                    Some(a) => {
                        _mm512_loadu_si512(a.as_ptr().add(AB * blk + 4 + 64 * c) as *const _)
                    }
                    None => _mm512_setzero_si512(),
                });
                let o = transpose16(&rows);
                let base = ((tt * nb + blk) * 4 + c) * 16;
                for (j, v) in o.iter().enumerate() {
                    _mm512_store_si512(b[base + j].0.as_mut_ptr() as *mut _, *v);
                }
            }
        }
    }
}

/// A tiles of block `blk` of rows `r0..r0 + nr` (rows past `nr` zero): `a[(c·3 + k)·16 + r]`
/// is row r of chunk c's operand k (0: q·lo, 1: q·hi, 2: the mins), bytes 0–31 sub-block 2c
/// (the low nibbles of `qs[32c..32c + 32]`), 32–63 sub-block 2c + 1 (the high ones). Returns
/// the rows' d and dmin.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw")]
unsafe fn pack_a(
    rows: &[u8],
    row_len: usize,
    r0: usize,
    nr: usize,
    blk: usize,
    a: &mut [Line; 4 * OPS * TILE],
) -> ([f32; TILE], [f32; TILE]) {
    let (mut d, mut dm) = ([0f32; TILE], [0f32; TILE]);
    let seven = _mm512_set1_epi16(7);
    // vpshufb indices (per 128-bit lane) over the 8 scale bytes broadcast to every lane:
    // `SC[c]` puts byte 2c zero-extended in the 16-bit lanes of the low 256 bits and byte
    // 2c + 1 in those of the high ones; `MN[c]` the same bytes in both bytes of each lane
    let (sc_idx, mn_idx): ([__m512i; 4], [__m512i; 4]) = (
        std::array::from_fn(|c| {
            halves(
                0xff00u16 as i16 | (2 * c as i16),
                0xff00u16 as i16 | (2 * c + 1) as i16,
            )
        }),
        std::array::from_fn(|c| halves((2 * c as i16) * 257, ((2 * c + 1) as i16) * 257)),
    );
    for r in 0..TILE {
        prefetch_ahead(rows, row_len, r0 + r, blk, WB);
        if r >= nr {
            for k in 0..12 {
                _mm512_store_si512(
                    a[k * TILE + r].0.as_mut_ptr() as *mut _,
                    _mm512_setzero_si512(),
                );
            }
            continue;
        }
        let wb = &rows[(r0 + r) * row_len + WB * blk..][..WB];
        d[r] = f16_at(wb, 0);
        dm[r] = f16_at(wb, 2);
        let (sc, mn) = k4_scales_packed(wb);
        let (scv, mnv) = (_mm512_set1_epi64(sc as i64), _mm512_set1_epi64(mn as i64));
        for c in 0..4 {
            let v = q4k_chunk(wb, c);
            // byte products q·s ≤ 15·7 < 256: a 16-bit multiply of two bytes by the same
            // small s leaves each byte's product in its own byte
            let s16 = _mm512_shuffle_epi8(scv, sc_idx[c]);
            let lo = _mm512_mullo_epi16(v, _mm512_and_si512(s16, seven));
            let hi = _mm512_mullo_epi16(v, _mm512_srli_epi16::<3>(s16));
            let mins = _mm512_shuffle_epi8(mnv, mn_idx[c]);
            let base = c * OPS * TILE + r;
            _mm512_store_si512(a[base].0.as_mut_ptr() as *mut _, lo);
            _mm512_store_si512(a[base + TILE].0.as_mut_ptr() as *mut _, hi);
            _mm512_store_si512(a[base + 2 * TILE].0.as_mut_ptr() as *mut _, mins);
        }
    }
    (d, dm)
}

/// The tiles' sums of one (row tile, token tile): (C_lo, C_hi, C_min) as `c[k·16 + r][t]`.
type CTiles = [[i32; TILE]; OPS * TILE];

/// Row r's (sumi, summ) of `c` for the 16 tokens, as floats: `C_lo + 8·C_hi` and `C_min`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn sums(c: &CTiles, r: usize) -> (__m512, __m512) {
    let ld = |k: usize| _mm512_loadu_si512(c[k * TILE + r].as_ptr() as *const _);
    let si = _mm512_add_epi32(ld(0), _mm512_slli_epi32::<3>(ld(1)));
    (_mm512_cvtepi32_ps(si), _mm512_cvtepi32_ps(ld(2)))
}

/// Row r's Q6_K block sums of `c` for the 16 tokens, as floats:
/// `C0 + 4·C1 + 16·C2 + 64·C3 − 32·C4` (exact i32).
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn q6k_sum(c: &CTiles, r: usize) -> __m512 {
    let ld = |k: usize| _mm512_loadu_si512(c[k * TILE + r].as_ptr() as *const _);
    let s = _mm512_add_epi32(ld(0), _mm512_slli_epi32::<2>(ld(1)));
    let s = _mm512_add_epi32(s, _mm512_slli_epi32::<4>(ld(2)));
    let s = _mm512_add_epi32(s, _mm512_slli_epi32::<6>(ld(3)));
    _mm512_cvtepi32_ps(_mm512_sub_epi32(s, _mm512_slli_epi32::<5>(ld(4))))
}

/// Zero the C tiles, add the first `NOPS` operands of chunks `chunks` of the block (A in `a`,
/// B from `bt[base..]`; operand k signed where bit k of `SIGNED` is set), store them to `c`.
#[inline(always)]
unsafe fn products<const SIGNED: u8, const NOPS: usize>(
    a: &[Line],
    bt: &[Line],
    base: usize,
    chunks: std::ops::Range<usize>,
    c: &mut CTiles,
) {
    asm!(
        "tilezero tmm0",
        "tilezero tmm1",
        "tilezero tmm2",
        "tilezero tmm3",
        "tilezero tmm4",
        options(nostack)
    );
    for ch in chunks {
        tile_load::<6>(bt[base + ch * 16].0.as_ptr());
        for k in 0..NOPS {
            tile_load::<5>(a[(ch * OPS + k) * TILE].0.as_ptr());
            tdp(k, SIGNED >> k & 1 == 1);
        }
    }
    for k in 0..NOPS {
        tile_store_c(k, c[k * TILE].as_mut_ptr() as *mut u8);
    }
}

/// A tiles of IQ3_S block `blk` of rows `r0..r0 + nr` (rows past `nr` zero):
/// `a[(c·3 + k)·16 + r]` = row r's 64 weights of chunk c (groups 2c, 2c+1), signed, times the
/// group scale's low (k = 0: `ls & 7`) or high (k = 1: `ls >> 3`) part, `ls = 2·s + 1 ≤ 31`
/// (|grid·part| ≤ 15·7 fits s8). Returns the rows' d.
/// The group scales' parts are made in vector registers (one broadcast of the block's four
/// scale bytes, per chunk a byte shuffle and shifts): on the GPU host's Xeon 23.0 / 27.0 ns
/// per (row, block) against 26.2 / 41.5 for scalar code and broadcasts per chunk (two runs,
/// both in one process; `timing::amx_iq3s_timing`).
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw")]
unsafe fn pack_a_iq3s(
    rows: &[u8],
    row_len: usize,
    r0: usize,
    nr: usize,
    blk: usize,
    a: &mut [Line; 4 * OPS * TILE],
) -> [f32; TILE] {
    let mut d = [0f32; TILE];
    let zero = _mm512_setzero_si512();
    // i16 lanes: byte c of each 128-bit lane's broadcast scale word, zero-extended
    let idx: [__m512i; 4] = std::array::from_fn(|c| _mm512_set1_epi16(0xff00u16 as i16 | c as i16));
    // lanes 0..16 (group 2c) the low nibble, lanes 16..32 (group 2c + 1) the high one
    let shift = halves(0, 4);
    let (m15, m3, one) = (
        _mm512_set1_epi16(15),
        _mm512_set1_epi16(3),
        _mm512_set1_epi16(1),
    );
    for r in 0..TILE {
        prefetch_ahead(rows, row_len, r0 + r, blk, IQ3S_WB);
        if r >= nr {
            for c in 0..4 {
                for k in 0..2 {
                    _mm512_store_si512(a[(c * OPS + k) * TILE + r].0.as_mut_ptr() as *mut _, zero);
                }
            }
            continue;
        }
        let wb = &rows[(r0 + r) * row_len + IQ3S_WB * blk..][..IQ3S_WB];
        d[r] = f16_at(wb, 0);
        let sc = _mm512_set1_epi32(i32::from_le_bytes(wb[106..110].try_into().unwrap()));
        for c in 0..4 {
            let (mag, sign) = grid_chunk(wb, c);
            // s = the group's 4-bit scale; ls = 2s + 1 = 8·(s >> 2) + ((2s + 1) & 7)
            let s = _mm512_shuffle_epi8(sc, idx[c]);
            let s = _mm512_and_si512(_mm512_srlv_epi16(s, shift), m15);
            let lo_part = _mm512_or_si512(_mm512_slli_epi16::<1>(_mm512_and_si512(s, m3)), one);
            let hi_part = _mm512_srli_epi16::<2>(s);
            // byte products mag·part ≤ 105: the 16-bit multiply keeps each in its byte
            let lo = _mm512_mullo_epi16(mag, lo_part);
            let hi = _mm512_mullo_epi16(mag, hi_part);
            let lo = _mm512_mask_sub_epi8(lo, sign, zero, lo);
            let hi = _mm512_mask_sub_epi8(hi, sign, zero, hi);
            _mm512_store_si512(a[(c * OPS) * TILE + r].0.as_mut_ptr() as *mut _, lo);
            _mm512_store_si512(a[(c * OPS + 1) * TILE + r].0.as_mut_ptr() as *mut _, hi);
        }
    }
    d
}

/// Q6_K block `wb`'s chunk c (weights 64c..64c+64) as the 6-bit q (0–63), one byte each in
/// weight order.
#[target_feature(enable = "avx2,avx512f")]
#[inline]
pub(super) unsafe fn q6k_chunk(wb: &[u8], c: usize) -> __m512i {
    let (m4, m2) = (_mm256_set1_epi8(15), _mm256_set1_epi8(3));
    // weights 64c..64c+32 from ql[64h..] and qh bits (2j, 2j+1) with h = c/2, j = 2·(c%2);
    // weights 64c+32.. from ql[64h+32..] and qh bits (2j+2, 2j+3)
    let h = c / 2;
    let ql = |o: usize| _mm256_loadu_si256(wb.as_ptr().add(64 * h + o) as *const _);
    let qh = _mm256_loadu_si256(wb.as_ptr().add(128 + 32 * h) as *const _);
    let (lo_nib, hi_nib) = if c.is_multiple_of(2) {
        (_mm256_and_si256(ql(0), m4), _mm256_and_si256(ql(32), m4))
    } else {
        (
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql(0)), m4),
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql(32)), m4),
        )
    };
    let qh_at = |sh: i32| {
        let v = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(sh));
        _mm256_slli_epi16::<4>(_mm256_and_si256(v, m2))
    };
    let sh = 4 * (c % 2) as i32;
    let first = _mm256_or_si256(lo_nib, qh_at(sh));
    let second = _mm256_or_si256(hi_nib, qh_at(sh + 2));
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(first), second)
}

/// Q4_K block `wb`'s chunk c (weights 64c..64c+64: sub-block 2c the low nibbles of
/// `qs[32c..32c + 32]`, 2c + 1 the high ones) as the 4-bit q, one byte each in weight order.
#[target_feature(enable = "avx2,avx512f")]
#[inline]
pub(super) unsafe fn q4k_chunk(wb: &[u8], c: usize) -> __m512i {
    let nib = _mm256_set1_epi8(15);
    let q = _mm256_loadu_si256(wb.as_ptr().add(16 + 32 * c) as *const _);
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_and_si256(q, nib)),
        _mm256_and_si256(_mm256_srli_epi16::<4>(q), nib),
    )
}

/// A tiles of Q6_K block `blk` of rows `r0..r0 + nr` (rows past `nr` zero): per chunk c
/// (weights 64c.., sub-blocks 4c..4c+4 of 16) the 6-bit q (0–63) times the pieces of the
/// signed 8-bit sub-block scale `sc = p0 + 4·p1 + 16·p2 + 64·p3` (p0–p2 in 0..4: `q·p` ≤ 189,
/// u8; p3 in −2..2: `q·p3` in −126..63, s8), and (k = 4) the scale itself spread over its 16
/// weights (s8): `Σ sc·(q − 32)·a = C0 + 4·C1 + 16·C2 + 64·C3 − 32·C4`, the block's exact sum
/// of ggml's lanes (`q6_k_lanes`; a Q8_K bsum is the exact sum of its 16 activations).
/// Returns the rows' d.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw")]
unsafe fn pack_a_q6k(
    rows: &[u8],
    row_len: usize,
    r0: usize,
    nr: usize,
    blk: usize,
    a: &mut [Line; 4 * OPS * TILE],
) -> [f32; TILE] {
    let mut d = [0f32; TILE];
    let zero = _mm512_setzero_si512();
    // byte i of 128-bit lane L: L
    let l = |x: i64| x * 0x0101_0101_0101_0101;
    let lane_no = _mm512_setr_epi64(0, 0, l(1), l(1), l(2), l(2), l(3), l(3));
    for r in 0..TILE {
        prefetch_ahead(rows, row_len, r0 + r, blk, Q6K_WB);
        if r >= nr {
            for k in 0..4 * OPS {
                _mm512_store_si512(a[k * TILE + r].0.as_mut_ptr() as *mut _, zero);
            }
            continue;
        }
        let wb = &rows[(r0 + r) * row_len + Q6K_WB * blk..][..Q6K_WB];
        d[r] = f16_at(wb, 208);
        let scb = _mm512_broadcast_i32x4(_mm_loadu_si128(wb.as_ptr().add(192) as *const _));
        for c in 0..4 {
            let q = q6k_chunk(wb, c);
            // the four sub-blocks' scales: per byte (128-bit lane L = sub-block 4c + L, every
            // lane holding the 16 scales), and per i16 lane (sign-extended)
            let idx = _mm512_add_epi8(_mm512_set1_epi8(4 * c as i8), lane_no);
            let spread = _mm512_shuffle_epi8(scb, idx);
            let sv = _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(spread));
            let three = _mm512_set1_epi16(3);
            let base = c * OPS * TILE + r;
            let parts = [
                _mm512_and_si512(sv, three),
                _mm512_and_si512(_mm512_srai_epi16::<2>(sv), three),
                _mm512_and_si512(_mm512_srai_epi16::<4>(sv), three),
            ];
            for (k, part) in parts.into_iter().enumerate() {
                let p = _mm512_mullo_epi16(q, part);
                _mm512_store_si512(a[base + k * TILE].0.as_mut_ptr() as *mut _, p);
            }
            // q·|p3|, negated where p3 < 0, i.e. where the scale is (the byte products do not
            // borrow across bytes)
            let p3 = _mm512_mullo_epi16(q, _mm512_abs_epi16(_mm512_srai_epi16::<6>(sv)));
            let p3 = _mm512_mask_sub_epi8(p3, _mm512_movepi8_mask(spread), zero, p3);
            _mm512_store_si512(a[base + 3 * TILE].0.as_mut_ptr() as *mut _, p3);
            _mm512_store_si512(a[base + 4 * TILE].0.as_mut_ptr() as *mut _, spread);
        }
    }
    d
}

/// The A tiles of step `s` = (row tile s / nb, block s % nb) of `rows` (`nr` rows of `nb`
/// blocks of KIND's type) into `a`: the rows' d (and Q4_K's dmin).
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw")]
#[inline]
unsafe fn pack_any<const KIND: u8>(
    rows: &[u8],
    row_len: usize,
    nr: usize,
    nb: usize,
    s: usize,
    a: &mut [Line; 4 * OPS * TILE],
) -> ([f32; TILE], [f32; TILE]) {
    let (r0, blk) = (s / nb * TILE, s % nb);
    let rn = (nr - r0).min(TILE);
    match KIND {
        IQ3S_MANY => (pack_a_iq3s(rows, row_len, r0, rn, blk, a), [0f32; TILE]),
        Q6K_MANY => (pack_a_q6k(rows, row_len, r0, rn, blk, a), [0f32; TILE]),
        _ => pack_a(rows, row_len, r0, rn, blk, a),
    }
}

/// Row tiles ahead that a pack prefetches its rows' block for: a call's weights are read from
/// RAM once, so they are fetched while the tiles before theirs run. 1, 2, 4 and 8 timed alike
/// from RAM (`amx_q4k_cold_timing`, AMX VM 12-07); the prompt figures were taken with 8.
const AHEAD_TILES: usize = 8;

/// Prefetch (into L2) block `blk` (`wb` bytes) of row `r0 + r + AHEAD_TILES·16`, the row a
/// pack `AHEAD_TILES` row tiles later reads there (one hint per row, spread through the pack
/// so as not to fill the line buffers at once). The row may lie past the call's rows (the
/// later runs that the pool calls with) or past the matrix: a prefetch never faults.
#[inline(always)]
fn prefetch_ahead(rows: &[u8], row_len: usize, r: usize, blk: usize, wb: usize) {
    let p = rows
        .as_ptr()
        .wrapping_add((r + AHEAD_TILES * TILE) * row_len + blk * wb);
    let mut off = 0;
    while off < wb {
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(off) as *const i8) };
        off += 64;
    }
    // SAFETY: as above (the block's last line, where it starts past a line boundary)
    unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(wb - 1) as *const i8) };
}

/// Whether `rows_kernel` packs a step ahead: always, except where the timing test turns it
/// off to compare.
#[inline(always)]
fn lookahead() -> bool {
    #[cfg(test)]
    {
        timing::LOOKAHEAD.load(std::sync::atomic::Ordering::Relaxed)
    }
    #[cfg(not(test))]
    {
        true
    }
}

/// The weight type and float order a `rows_kernel` runs.
const K4_SINGLE: u8 = 0;
const K4_MANY: u8 = 1;
const IQ3S_MANY: u8 = 2;
const Q6K_MANY: u8 = 3;

/// `out[r·nt + t] = dot(row r, acts[t])` for the `nr` rows of `rows` (each n weights of `w`)
/// and the `nt = acts.len()` tokens. Q4_K in `Order::Single` (`many` false: per block
/// `acc + ((d_a·d)·sumi − (d_a·dmin)·summ)`) or `Order::Many` (per pair of sub-blocks, i.e.
/// per 64-weight chunk, `acc = fma(f32(si), d·d_a, acc)`, `accm = fma(f32(sm), dmin·d_a,
/// accm)`, then `acc − accm`, as `scalar_k::q4_k_gemm`); IQ3_S and Q6_K in `Order::Many`
/// (ggml's tiled order: per block `acc + (f32(Σ)·d)·d_a`, Σ the block's exact integer sum).
/// `keep_b`: as `MultiDot::rows_call_keep`'s `same_acts`. Panics for another type or order.
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
    match (w, many) {
        (GgmlType::Q4K, false) => rows_kernel::<K4_SINGLE>(n, rows, nr, acts, out, keep_b),
        (GgmlType::Q4K, true) => rows_kernel::<K4_MANY>(n, rows, nr, acts, out, keep_b),
        (GgmlType::IQ3S, true) => rows_kernel::<IQ3S_MANY>(n, rows, nr, acts, out, keep_b),
        (GgmlType::Q6K, true) => rows_kernel::<Q6K_MANY>(n, rows, nr, acts, out, keep_b),
        _ => panic!("no AMX rows kernel for {} (many: {many})", w.name()),
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
/// `keep_b`: the caller's promise that `acts` hold the same bytes as at this thread's last
/// call (their B tiles are reused when that call's blocks, tokens and addresses match).
unsafe fn rows_kernel<const KIND: u8>(
    n: usize,
    rows: &[u8],
    nr: usize,
    acts: &[&[u8]],
    out: &mut [f32],
    keep_b: bool,
) {
    const { assert!(KIND <= Q6K_MANY) };
    let tiled = KIND == IQ3S_MANY || KIND == Q6K_MANY;
    let many = KIND == K4_MANY;
    let (nb, nt) = (n / 256, acts.len());
    let row_len = match KIND {
        IQ3S_MANY => IQ3S_WB,
        Q6K_MANY => Q6K_WB,
        _ => WB,
    } * nb;
    assert!(rows.len() >= nr * row_len && out.len() == nr * nt);
    let ntt = nt.div_ceil(TILE);
    // acc[r][t] (and, for MANY, accm[r][t] after it)
    let per = TILE * ntt * TILE;
    SCRATCH.with(|cell| {
        let Scratch {
            b: bt,
            a: abuf,
            acc,
            b_key,
        } = &mut *cell.borrow_mut();
        let need = ntt * nb * 4 * TILE;
        if bt.len() < need {
            bt.resize(need, Line([0; 64]));
        }
        if acc.len() < 2 * per {
            acc.resize(2 * per, 0.0);
        }
        let key = [
            nb,
            nt,
            acts[0].as_ptr() as usize,
            acts[nt - 1].as_ptr() as usize,
        ];
        if !keep_b || *b_key != key {
            pack_b(acts, nb, bt);
            *b_key = key;
        }
        asm!("ldtilecfg [{0}]", in(reg) CFG.0.as_ptr(), options(nostack));
        // Two A buffers: step s = (row tile, block) is packed while step s − 1's products
        // run, so the tile loads read lines stored a whole pack earlier (a tile load right
        // after the vector stores of its lines waited for them to drain).
        const AN: usize = 4 * OPS * TILE;
        abuf.resize(2 * AN, Line([0; 64]));
        let (a_lo, a_hi) = abuf.split_at_mut(AN);
        let a2: [&mut [Line; AN]; 2] = [a_lo.try_into().unwrap(), a_hi.try_into().unwrap()];
        let steps = nr.div_ceil(TILE) * nb;
        let pack_step =
            |s: usize, a: &mut [Line; AN]| pack_any::<KIND>(rows, row_len, nr, nb, s, a);
        let mut next = if lookahead() {
            pack_step(0, a2[0])
        } else {
            ([0f32; TILE], [0f32; TILE])
        };
        let mut c: CTiles = [[0i32; TILE]; OPS * TILE];
        for r0 in (0..nr).step_by(TILE) {
            let rn = (nr - r0).min(TILE);
            acc[..2 * per].iter_mut().for_each(|v| *v = 0.0);
            for blk in 0..nb {
                let s = r0 / TILE * nb + blk;
                let (d, dm) = if lookahead() {
                    let cur = next;
                    if s + 1 < steps {
                        next = pack_step(s + 1, a2[(s + 1) % 2]);
                    }
                    cur
                } else {
                    pack_step(s, a2[s % 2])
                };
                let a = &a2[s % 2][..];
                for tt in 0..ntt {
                    // da of the tile's 16 tokens (0 for missing ones)
                    let mut da = [0f32; TILE];
                    for (t, v) in da.iter_mut().enumerate() {
                        if let Some(a) = acts.get(tt * TILE + t) {
                            *v = f32::from_le_bytes(a[AB * blk..AB * blk + 4].try_into().unwrap());
                        }
                    }
                    let dav = _mm512_loadu_ps(da.as_ptr());
                    let base = (tt * nb + blk) * 4 * 16;
                    let accp = acc.as_mut_ptr();
                    let pa = |r: usize| accp.add((r * ntt + tt) * TILE);
                    if tiled {
                        if KIND == Q6K_MANY {
                            products::<0b11000, 5>(a, bt, base, 0..4, &mut c);
                        } else {
                            products::<0b11, 2>(a, bt, base, 0..4, &mut c);
                        }
                        for r in 0..rn {
                            let si = if KIND == Q6K_MANY {
                                q6k_sum(&c, r)
                            } else {
                                sums(&c, r).0
                            };
                            let p = pa(r);
                            let v = _mm512_mul_ps(_mm512_mul_ps(si, _mm512_set1_ps(d[r])), dav);
                            _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), v));
                        }
                    } else if many {
                        for ch in 0..4 {
                            products::<0, 3>(a, bt, base, ch..ch + 1, &mut c);
                            for r in 0..rn {
                                let (si, sm) = sums(&c, r);
                                // d·d_a and dmin·d_a (IEEE products commute)
                                let dd = _mm512_mul_ps(dav, _mm512_set1_ps(d[r]));
                                let dmv = _mm512_mul_ps(dav, _mm512_set1_ps(dm[r]));
                                let (p, pm) = (pa(r), pa(r).add(per));
                                _mm512_storeu_ps(p, _mm512_fmadd_ps(si, dd, _mm512_loadu_ps(p)));
                                _mm512_storeu_ps(pm, _mm512_fmadd_ps(sm, dmv, _mm512_loadu_ps(pm)));
                            }
                        }
                    } else {
                        products::<0, 3>(a, bt, base, 0..4, &mut c);
                        for r in 0..rn {
                            let (si, sm) = sums(&c, r);
                            let dd = _mm512_mul_ps(dav, _mm512_set1_ps(d[r]));
                            let dmv = _mm512_mul_ps(dav, _mm512_set1_ps(dm[r]));
                            let p = pa(r);
                            let v = _mm512_add_ps(
                                _mm512_loadu_ps(p),
                                _mm512_sub_ps(_mm512_mul_ps(dd, si), _mm512_mul_ps(dmv, sm)),
                            );
                            _mm512_storeu_ps(p, v);
                        }
                    }
                }
            }
            for r in 0..rn {
                let o = &mut out[(r0 + r) * nt..(r0 + r + 1) * nt];
                for (t, v) in o.iter_mut().enumerate() {
                    let i = r * ntt * TILE + t;
                    *v = if many { acc[i] - acc[per + i] } else { acc[i] };
                }
            }
        }
        asm!("tilerelease", options(nostack));
    });
}

#[cfg(test)]
#[path = "gemm_amx_timing.rs"]
mod timing;
