//! AVX-512 (F/BW/VL, with VNNI variants) multi-token kernels: one weight row against up to 8
//! tokens' activations per pass. Each weight block is decoded once into 512-bit registers (64
//! elements each) and dotted against every token's activation block while it is in registers.
//!
//! Bitwise contract (as `gemm_avx2.rs`): per token the kernels form the same exact integer
//! sums as the single-token kernels (integer sums are exact, so any grouping of them is the
//! same value) and then perform the float combine of the order asked for, operation for
//! operation, only vectorised across tokens (lane t of a float register is token t):
//! - Q4_K `Order::Single`: `k_add_min` per block, `acc + ((d_a·d)·si − (d_a·dmin)·sm)`;
//! - Q4_K `Order::Many` (ggml's repacked gemm): per pair of sub-blocks c,
//!   `acc = fma(f32(si_c), d·d_a, acc)`, `accm = fma(f32(sm_c), dmin·d_a, accm)`, then
//!   `acc − accm`;
//! - Q6_K `Single`: ggml's `Fma8` (eight lanes per token, `fma(d_a·d, f32(lanes), acc)`, then
//!   `hsum8`); `Many` (tiled): `acc + (f32(Σ lanes)·d)·d_a`;
//! - Q8_0 (one order): `Fma8`, `fma(d·d_a, f32(lanes), acc)` per 32-element block.
//!
//! The horizontal integer sums of several tokens are done together by transposing adds
//! (`tree16`), which is where the 512-bit kernels gain most over per-token reductions.
//! `gemm::tests` and `tests.rs` check every (row, token) against the single-token kernels
//! bitwise (on CPUs with AVX-512; tests/test_gemm_isa.py compares the ISAs from Python).
//! Safety: `kernel_with` hands kernels out only when `cpu::has_avx512()` (and `has_vnni()` for
//! VNNI ones) holds; callers (`gemm.rs`) have checked that `w` holds `n / block` blocks and
//! every activation as many activation blocks.

use super::super::avx2::{h2f, hsum8, load, load128};
use super::super::avx512::{bcast_shift, join, load512, scale_perms, sign_of};
use super::super::common::k4_scales;
use super::super::{cpu, Order};
use super::gemm_avx2::{da_at, k4_summ4};
use std::arch::x86_64::*;

#[path = "gemm_iq3s512.rs"]
pub(super) mod iq3s512;

use super::super::common::Q8K_BYTES as AB;

pub type MultiFn = unsafe fn(usize, &[u8], &[&[u8]], &mut [f32]);

/// Per 128-bit lane `[a0+a1, a2+a3, b0+b1, b2+b3]` of 128-bit lanes a_k, b_k.
#[inline(always)]
unsafe fn add_lane_pairs(a: __m512i, b: __m512i) -> __m512i {
    _mm512_add_epi32(
        _mm512_shuffle_i32x4::<0x88>(a, b),
        _mm512_shuffle_i32x4::<0xDD>(a, b),
    )
}

/// Four registers whose 128-bit lanes each hold `[x0, x1, x2, x3]` partial sums → one whose
/// lane `4j + i` is the total of input j's element i.
#[inline(always)]
unsafe fn fold4(b: [__m512i; 4]) -> __m512i {
    add_lane_pairs(add_lane_pairs(b[0], b[1]), add_lane_pairs(b[2], b[3]))
}

/// Lane i of the result: the sum of the 16 i32 lanes of `v[i]` (exact integers).
#[inline(always)]
unsafe fn tree16(v: &[__m512i; 16]) -> __m512i {
    let mut a = [_mm512_setzero_si512(); 8];
    for i in 0..8 {
        let (x, y) = (v[2 * i], v[2 * i + 1]);
        a[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y));
    }
    let mut b = [_mm512_setzero_si512(); 4];
    for i in 0..4 {
        let (x, y) = (a[2 * i], a[2 * i + 1]);
        b[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y));
    }
    fold4(b)
}

#[inline(always)]
unsafe fn lo256(v: __m512i) -> __m256i {
    _mm512_castsi512_si256(v)
}

#[inline(always)]
unsafe fn hi256(v: __m512i) -> __m256i {
    _mm512_extracti64x4_epi64::<1>(v)
}

/// Permutation index tables (lane i of table j), built at compile time.
const fn q4k_idx(vnni: bool) -> [[i16; 32]; 4] {
    let mut o = [[0i16; 32]; 4];
    let mut j = 0;
    while j < 4 {
        let mut i = 0;
        while i < 32 {
            let (k, r) = (i / 8, i % 8);
            o[j][i] = if vnni {
                (4 * j + 2 * (r >= 4) as usize + (k >= 2) as usize) as i16
            } else {
                (2 * j + i / 16) as i16
            };
            i += 1;
        }
        j += 1;
    }
    o
}

/// `q4_k_scales`' tables: VNNI (pairs p = 0, 1; 2, 3 unused) and AVX-512BW (chunks c).
static Q4K_IDX: [[[i16; 32]; 4]; 2] = [q4k_idx(false), q4k_idx(true)];

/// i32 tables: `[t][c]` → `[c][t]` (`q4_k_many`: table h puts c = 2h in lanes 0..8 and
/// 2h+1 in 8..16, slot t of each from lane 4t of the two sources) and Q8_0's slot pairs
/// (table 2 + p: slot 2p in lanes 0..8, 2p+1 in 8..16).
const fn idx32() -> [[i32; 16]; 6] {
    let mut o = [[0i32; 16]; 6];
    let mut i = 0;
    while i < 16 {
        let mut h = 0;
        while h < 2 {
            o[h][i] = (4 * (i % 8) + 2 * h + i / 8) as i32;
            h += 1;
        }
        let mut p = 0;
        while p < 4 {
            o[2 + p][i] = (2 * p + i / 8) as i32;
            p += 1;
        }
        i += 1;
    }
    o
}

static IDX32: [[i32; 16]; 6] = idx32();

#[inline(always)]
unsafe fn ld16(t: &[i16; 32]) -> __m512i {
    _mm512_loadu_si512(t.as_ptr() as *const __m512i)
}

#[inline(always)]
unsafe fn ld32(t: &[i32; 16]) -> __m512i {
    _mm512_loadu_si512(t.as_ptr() as *const __m512i)
}

/// The Q8_K scales d of token slots `t < N` at block b (0 in the unused slots).
#[inline(always)]
unsafe fn das<const N: usize>(a: &[*const u8; N], b: usize) -> __m256 {
    let mut d = [0f32; 8];
    for t in 0..N {
        d[t] = da_at(a[t].add(AB * b));
    }
    _mm256_loadu_ps(d.as_ptr())
}

/// Q4_K: the four 64-element registers of block `wb` (chunk c: low nibbles of qs[32c..] =
/// sub-block 2c in bytes 0..32, high nibbles = sub-block 2c+1 in bytes 32..64).
#[inline(always)]
unsafe fn q4_k_quads(wb: *const u8) -> [__m512i; 4] {
    let m4 = _mm512_set1_epi8(15);
    let mut q = [m4; 4];
    for (c, qc) in q.iter_mut().enumerate() {
        *qc = _mm512_and_si512(bcast_shift(load(wb.add(16 + 32 * c)), 0, 4), m4);
    }
    q
}

/// Q4_K integer lanes of chunk pair (c, c+1) = (2p, 2p+1) for one token. VNNI: `vpdpbusd`
/// per chunk (each lane |Σ| ≤ 4·15·127, so the i16 pack is exact), then `vpdpwssd` with the
/// scales laid out as the pack leaves the sub-blocks; without: `maddubs` + `madd` per chunk.
/// Either way each 128-bit lane k holds `[x_c, x_c, x_c+1, x_c+1]` partial sums of the scaled
/// chunk sums (`sc` from `q4_k_scales`).
#[inline(always)]
unsafe fn q4_k_pair<const VNNI: bool>(
    q: &[__m512i; 4],
    sc: &[__m512i; 4],
    ap: *const u8,
    p: usize,
) -> __m512i {
    let (c0, c1) = (2 * p, 2 * p + 1);
    let (a0, a1) = (load512(ap.add(64 * c0)), load512(ap.add(64 * c1)));
    if VNNI {
        let z = _mm512_setzero_si512();
        let d0 = _mm512_dpbusd_epi32(z, q[c0], a0);
        let d1 = _mm512_dpbusd_epi32(z, q[c1], a1);
        _mm512_dpwssd_epi32(z, _mm512_packs_epi32(d0, d1), sc[p])
    } else {
        let m0 = _mm512_madd_epi16(_mm512_maddubs_epi16(q[c0], a0), sc[c0]);
        let m1 = _mm512_madd_epi16(_mm512_maddubs_epi16(q[c1], a1), sc[c1]);
        // [x_c ×4, x_c+1 ×4] per 128-bit lane → the VNNI layout [x_c, x_c, x_c+1, x_c+1]
        let s = _mm512_add_epi32(_mm512_unpacklo_epi32(m0, m1), _mm512_unpackhi_epi32(m0, m1));
        _mm512_shuffle_epi32::<0b11_01_10_00>(s)
    }
}

/// The i16 scale registers `q4_k_pair` uses: VNNI, per pair p, lane i of 128-bit lane k =
/// i/8 gets sub-block `4p + 2·(i%8 ≥ 4) + (k ≥ 2)`; else per chunk c, lanes 0..16 sub-block
/// 2c and 16..32 sub-block 2c+1.
#[inline(always)]
unsafe fn q4_k_scales<const VNNI: bool>(sc8: &[u8; 8], idx: &[__m512i; 4]) -> [__m512i; 4] {
    let s = _mm_cvtepu8_epi16(_mm_loadl_epi64(sc8.as_ptr() as *const __m128i));
    let s = _mm512_castsi128_si512(s);
    let mut o = [_mm512_setzero_si512(); 4];
    for j in 0..if VNNI { 2 } else { 4 } {
        o[j] = _mm512_permutexvar_epi16(idx[j], s);
    }
    o
}

#[inline(always)]
unsafe fn q4_k_idx<const VNNI: bool>() -> [__m512i; 4] {
    let t = &Q4K_IDX[usize::from(VNNI)];
    [ld16(&t[0]), ld16(&t[1]), ld16(&t[2]), ld16(&t[3])]
}

/// Q4_K, `Order::Single`: `out[t] = vec_dot(w, a[t])` for the N ≤ 8 token slots.
#[inline(always)]
unsafe fn q4_k_single<const N: usize, const VNNI: bool>(
    n: usize,
    w: &[u8],
    a: [*const u8; N],
) -> [f32; N] {
    let o = q4_k_rows::<1, N, VNNI>(n, [w.as_ptr()], a);
    std::array::from_fn(|t| o[t])
}

/// Q4_K, `Order::Single`, R rows × N tokens (R·N ≤ 8): lane `r·N + t` of the result is
/// `vec_dot(w[r], a[t])`. Each row's block is decoded once for the N tokens, each token's
/// activation block loaded (from L1) once per row, and the R·N slots' integer sums (si and
/// sm) reduced together (`tree16`: its 16 inputs all used when R·N = 8, as in a decode
/// batch of 2 or 4 sequences). Every slot's float combine is the single-token kernel's.
#[inline(always)]
unsafe fn q4_k_rows<const R: usize, const N: usize, const VNNI: bool>(
    n: usize,
    w: [*const u8; R],
    a: [*const u8; N],
) -> [f32; 8] {
    debug_assert!(R * N <= 8);
    let idx = q4_k_idx::<VNNI>();
    let mut acc = _mm256_setzero_ps();
    // the next R rows (the caller's next call: its rows follow these back to back)
    let ahead = R * 144 * (n / 256);
    for b in 0..n / 256 {
        let mut v = [_mm512_setzero_si512(); 16];
        let mut d = [0f32; R];
        let mut dmin = [0f32; R];
        for r in 0..R {
            // Row r's block b of the next call: without the hints these rows (an expert two
            // or more of a decode batch's tokens share) streamed at a fifth of the one-token
            // kernels' rate (`q4_k_rows4` prefetches; a hint never faults past the matrix).
            let next = w[r].wrapping_add(144 * b + ahead);
            for l in [0, 64, 128] {
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(l) as *const i8);
            }
            let wb = std::slice::from_raw_parts(w[r].add(144 * b), 144);
            let (sc8, mins) = k4_scales(wb);
            let sc = q4_k_scales::<VNNI>(&sc8, &idx);
            let q = q4_k_quads(wb.as_ptr());
            // i16 lane k = min of sub-block k/2, against the 16 bsums
            let mn = _mm_loadl_epi64(mins.as_ptr() as *const __m128i);
            let mv = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));
            for t in 0..N {
                let ab = a[t].add(AB * b);
                v[r * N + t] = if VNNI {
                    _mm512_add_epi32(
                        q4_k_pair::<true>(&q, &sc, ab.add(4), 0),
                        q4_k_pair::<true>(&q, &sc, ab.add(4), 1),
                    )
                } else {
                    // one sum over the block, so no lane layout is needed
                    let mut s = _mm512_setzero_si512();
                    for c in 0..4 {
                        let p = _mm512_maddubs_epi16(q[c], load512(ab.add(4 + 64 * c)));
                        s = _mm512_add_epi32(s, _mm512_madd_epi16(p, sc[c]));
                    }
                    s
                };
                v[8 + r * N + t] = _mm512_zextsi256_si512(_mm256_madd_epi16(mv, load(ab.add(260))));
            }
            (d[r], dmin[r]) = (h2f(wb, 0), h2f(wb, 2));
        }
        // lanes 0..8: si of each slot, 8..16: sm (exact integers)
        let r = _mm512_cvtepi32_ps(tree16(&v));
        let (si, sm) = (
            _mm512_castps512_ps256(r),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(r))),
        );
        let (da, wd, wm) = if R == 1 {
            (das(&a, b), _mm256_set1_ps(d[0]), _mm256_set1_ps(dmin[0]))
        } else {
            // slot s = r·N + t: token t's d_a, row r's d and dmin (lanes 0..4: d, 4..8: dmin)
            let mut wdm = [0f32; 8];
            wdm[..R].copy_from_slice(&d);
            wdm[4..4 + R].copy_from_slice(&dmin);
            let wdm = _mm256_loadu_ps(wdm.as_ptr());
            let idx = |f: fn(usize) -> i32| {
                _mm256_setr_epi32(f(0), f(1), f(2), f(3), f(4), f(5), f(6), f(7))
            };
            (
                _mm256_permutevar8x32_ps(das(&a, b), idx(|s| (s % N) as i32)),
                _mm256_permutevar8x32_ps(wdm, idx(|s| (s / N).min(3) as i32)),
                _mm256_permutevar8x32_ps(wdm, idx(|s| 4 + (s / N).min(3) as i32)),
            )
        };
        let dd = _mm256_mul_ps(da, wd);
        let dm = _mm256_mul_ps(da, wm);
        // as common::k_add_min: acc + (dd·si − dm·sm), per slot
        acc = _mm256_add_ps(
            acc,
            _mm256_sub_ps(_mm256_mul_ps(dd, si), _mm256_mul_ps(dm, sm)),
        );
    }
    let mut o = [0f32; 8];
    _mm256_storeu_ps(o.as_mut_ptr(), acc);
    o
}

/// `out[r·nt + t] = vec_dot(row r, acts[t])` (Q4_K, `Order::Single`) for `nr` consecutive
/// rows of `row_len` bytes and nt ≤ 4 tokens: row pairs (nt 3–4) or quads (nt ≤ 2) through
/// `q4_k_rows`, the rows left over one at a time.
macro_rules! q4k_rows_pass {
    ($vnni:expr, $feat:literal) => {{
        #[target_feature(enable = $feat)]
        unsafe fn run(n: usize, rows: &[u8], nr: usize, acts: &[&[u8]], out: &mut [f32]) {
            let nt = acts.len();
            assert!(nt <= 4 && out.len() >= nr * nt && rows.len() >= nr * 144 * (n / 256));
            let rl = 144 * (n / 256);
            let row = |r: usize| rows.as_ptr().add(r * rl);
            let tok = |i: usize| acts[if i < nt { i } else { 0 }].as_ptr();
            let mut r = 0;
            macro_rules! go {
                ($R:literal, $N:literal) => {{
                    while nr - r >= $R {
                        let o = q4_k_rows::<$R, $N, { $vnni }>(
                            n,
                            std::array::from_fn(|k| row(r + k)),
                            std::array::from_fn(tok),
                        );
                        for k in 0..$R {
                            out[(r + k) * nt..(r + k + 1) * nt]
                                .copy_from_slice(&o[k * $N..k * $N + nt]);
                        }
                        r += $R;
                    }
                }};
            }
            if nt <= 2 {
                go!(4, 2);
            } else {
                go!(2, 4);
            }
            go!(1, 4);
        }
        run as RowsFn
    }};
}

/// A rows × tokens kernel: `(n, rows, nr, acts, out)`, `out[r·nt + t]` (see `rows_kernel`).
pub type RowsFn = unsafe fn(usize, &[u8], usize, &[&[u8]], &mut [f32]);

/// The rows × tokens kernel of `w` in `order` for at most 4 tokens (decode batches and short
/// verify windows), where one exists: Q4_K `Order::Single`; IQ3_S `Order::Single` on CPUs
/// with VBMI and BITALG (`iq3s512::iq3_s_rows_tokens`).
pub fn rows_kernel(w: crate::quant::GgmlType, order: Order) -> Option<RowsFn> {
    rows_kernel_with(w, order, cpu::has_vnni())
}

/// `rows_kernel`'s VNNI variant, or (`vnni` false) its AVX-512BW one; None where the CPU
/// cannot run it or the type has none (the tests run both; IQ3_S has one kernel for both).
pub fn rows_kernel_with(w: crate::quant::GgmlType, order: Order, vnni: bool) -> Option<RowsFn> {
    if (w, order) == (crate::quant::GgmlType::IQ3S, Order::Single) && cpu::has_vbmi_bitalg() {
        const _: () = assert!(super::ROWS_MAX_T <= iq3s512::ROWS_T);
        return Some(iq3s512::iq3_s_rows_tokens as RowsFn);
    }
    if !cpu::has_avx512()
        || (vnni && !cpu::has_vnni())
        || (w, order) != (crate::quant::GgmlType::Q4K, Order::Single)
    {
        return None;
    }
    Some(if vnni {
        q4k_rows_pass!(true, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
    } else {
        q4k_rows_pass!(false, "avx2,fma,f16c,avx512f,avx512bw,avx512vl")
    })
}

/// Q4_K, `Order::Many` (ggml's repacked gemm order, `avx2_k::q4_k_gemm`).
#[inline(always)]
unsafe fn q4_k_many<const N: usize, const VNNI: bool>(
    n: usize,
    w: &[u8],
    a: [*const u8; N],
) -> [f32; N] {
    let idx = q4_k_idx::<VNNI>();
    // [t][c] (lane 4t + c of slots 0..4, then 4..8) → [c][t]: c in lanes 0..8, c+1 in 8..16
    let tr = [ld32(&IDX32[0]), ld32(&IDX32[1])];
    let (mut acc, mut accm) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for b in 0..n / 256 {
        let wb = &w[144 * b..144 * b + 144];
        let (sc8, mins) = k4_scales(wb);
        let sc = q4_k_scales::<VNNI>(&sc8, &idx);
        let q = q4_k_quads(wb.as_ptr());
        let mv = _mm_cvtepu8_epi16(_mm_loadl_epi64(mins.as_ptr() as *const __m128i));
        let mut si = [_mm512_setzero_si512(); 8];
        let mut sm = [_mm_setzero_si128(); 8];
        for t in 0..N {
            let ab = a[t].add(AB * b);
            let x = q4_k_pair::<VNNI>(&q, &sc, ab.add(4), 0);
            let y = q4_k_pair::<VNNI>(&q, &sc, ab.add(4), 1);
            // per 128-bit lane [si_0, si_1, si_2, si_3] partial sums
            let (xf, yf) = (_mm512_castsi512_ps(x), _mm512_castsi512_ps(y));
            si[t] = _mm512_add_epi32(
                _mm512_castps_si512(_mm512_shuffle_ps::<0b10_00_10_00>(xf, yf)),
                _mm512_castps_si512(_mm512_shuffle_ps::<0b11_01_11_01>(xf, yf)),
            );
            sm[t] = k4_summ4(mv, ab);
        }
        let s0 = fold4([si[0], si[1], si[2], si[3]]);
        let s1 = fold4([si[4], si[5], si[6], si[7]]);
        let (m0, m1) = (join4(&sm, 0), join4(&sm, 4));
        let da = das(&a, b);
        let dd = _mm256_mul_ps(_mm256_set1_ps(h2f(wb, 0)), da);
        let dm = _mm256_mul_ps(_mm256_set1_ps(h2f(wb, 2)), da);
        for tc in tr {
            let s = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(s0, tc, s1));
            let m = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(m0, tc, m1));
            for half in [lo256ps(s), hi256ps(s)] {
                acc = _mm256_fmadd_ps(half, dd, acc);
            }
            for half in [lo256ps(m), hi256ps(m)] {
                accm = _mm256_fmadd_ps(half, dm, accm);
            }
        }
    }
    let mut o = [0f32; 8];
    _mm256_storeu_ps(o.as_mut_ptr(), _mm256_sub_ps(acc, accm));
    std::array::from_fn(|t| o[t])
}

/// `sm[k0..k0+4]` as the four 128-bit lanes of one register.
#[inline(always)]
unsafe fn join4(sm: &[__m128i; 8], k0: usize) -> __m512i {
    let v = _mm512_castsi128_si512(sm[k0]);
    let v = _mm512_inserti32x4::<1>(v, sm[k0 + 1]);
    let v = _mm512_inserti32x4::<2>(v, sm[k0 + 2]);
    _mm512_inserti32x4::<3>(v, sm[k0 + 3])
}

#[inline(always)]
unsafe fn lo256ps(v: __m512) -> __m256 {
    _mm512_castps512_ps256(v)
}

#[inline(always)]
unsafe fn hi256ps(v: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
}

/// Q6_K (210-byte blocks), either order.
#[inline(always)]
unsafe fn q6_k<const N: usize, const MANY: bool>(
    n: usize,
    w: &[u8],
    a: [*const u8; N],
) -> [f32; N] {
    let idx = scale_perms();
    let (m4, m3) = (_mm512_set1_epi8(15), _mm512_set1_epi8(3));
    let mut accv = [_mm256_setzero_ps(); N];
    let mut acc = _mm256_setzero_ps();
    for b in 0..n / 256 {
        let wb = &w[210 * b..210 * b + 210];
        let wp = wb.as_ptr();
        let sc16 = _mm256_cvtepi8_epi16(load128(wp.add(192)));
        let sc512 = _mm512_castsi256_si512(sc16);
        // register m = elements 64m..64m+64 (quarters 2m%4, +1 of half m/2)
        let mut q = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            let ql = load512(wp.add(64 * h));
            let qh = load(wp.add(128 + 32 * h));
            let hb01 = _mm512_and_si512(bcast_shift(qh, 0, 2), m3);
            let hb23 = _mm512_and_si512(bcast_shift(qh, 4, 6), m3);
            q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16(hb01, 4));
            q[2 * h + 1] = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                _mm512_slli_epi16(hb23, 4),
            );
        }
        let mut s = [_mm512_setzero_si512(); 4];
        for m in 0..4 {
            s[m] = _mm512_permutexvar_epi16(idx[m], sc512);
        }
        let d = h2f(wb, 208);
        let mut v = [_mm512_setzero_si512(); 16];
        for t in 0..N {
            let ab = a[t].add(AB * b);
            let mut sumv = _mm512_setzero_si512();
            for m in 0..4 {
                let p = _mm512_maddubs_epi16(q[m], load512(ab.add(4 + 64 * m)));
                sumv = _mm512_add_epi32(sumv, _mm512_madd_epi16(p, s[m]));
            }
            let msum = _mm256_madd_epi16(sc16, load(ab.add(260)));
            if MANY {
                v[t] = sumv;
                v[8 + t] = _mm512_zextsi256_si512(msum);
            } else {
                // ggml's eight lanes: both 256-bit halves, less 32·(scale·bsum)
                let l8 = _mm256_add_epi32(lo256(sumv), hi256(sumv));
                let lanes = _mm256_sub_epi32(l8, _mm256_slli_epi32::<5>(msum));
                let dd = _mm256_set1_ps(da_at(ab) * d);
                accv[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(lanes), accv[t]);
            }
        }
        if MANY {
            let r = tree16(&v);
            let si = _mm256_sub_epi32(lo256(r), _mm256_slli_epi32::<5>(hi256(r)));
            let f = _mm256_mul_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(d));
            // as tiled_kernel!: acc + (f32(Σ lanes)·d)·d_a
            acc = _mm256_add_ps(acc, _mm256_mul_ps(f, das(&a, b)));
        }
    }
    if MANY {
        let mut o = [0f32; 8];
        _mm256_storeu_ps(o.as_mut_ptr(), acc);
        std::array::from_fn(|t| o[t])
    } else {
        let mut o = [0f32; N];
        for t in 0..N {
            o[t] = hsum8(accv[t]);
        }
        o
    }
}

/// Q8_0 (34-byte blocks, one order: `Fma8`). Token slots pair up in one register (slot 2p in
/// lanes 0..8, 2p+1 in 8..16); the weight block is broadcast to both halves, its absolute
/// values and sign mask shared by all slots.
#[inline(always)]
unsafe fn q8_0<const N: usize, const VNNI: bool>(
    n: usize,
    w: &[u8],
    a: [*const u8; N],
) -> [f32; N] {
    let pairs = N.div_ceil(2);
    let sel = [
        ld32(&IDX32[2]),
        ld32(&IDX32[3]),
        ld32(&IDX32[4]),
        ld32(&IDX32[5]),
    ];
    let mut acc = [_mm512_setzero_ps(); 4];
    let wp = w.as_ptr();
    for b in 0..n / 32 {
        let wz = _mm512_broadcast_i64x4(load(wp.add(34 * b + 2)));
        let absw = _mm512_abs_epi8(wz);
        // the activation scales of all slots at once (exact f16 → f32), times the weight's
        let mut h = [0u16; 8];
        for t in 0..N {
            h[t] = (a[t].add(34 * b) as *const u16).read_unaligned();
        }
        let da = _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i));
        let dv = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(h2f(w, 34 * b)), da));
        for p in 0..pairs {
            let x = load(a[2 * p].add(34 * b + 2));
            let y = if 2 * p + 1 < N {
                load(a[2 * p + 1].add(34 * b + 2))
            } else {
                _mm256_setzero_si256()
            };
            let s = sign_of(join(x, y), wz);
            let lanes = if VNNI {
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), absw, s)
            } else {
                _mm512_madd_epi16(_mm512_maddubs_epi16(absw, s), _mm512_set1_epi16(1))
            };
            let d = _mm512_permutexvar_ps(sel[p], dv);
            acc[p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lanes), acc[p]);
        }
    }
    let mut o = [0f32; N];
    for t in 0..N {
        let v = acc[t / 2];
        o[t] = hsum8(if t % 2 == 0 { lo256ps(v) } else { hi256ps(v) });
    }
    o
}

/// Runs `$k::<N, $flag>` over `acts` in passes of 8 token slots (4 for the last ≤ 4), the
/// unused slots of a pass pointing at its first token (computed, not stored), under the
/// target features `$feat`.
macro_rules! passes {
    ($k:ident, $flag:expr, $feat:literal) => {{
        #[target_feature(enable = $feat)]
        unsafe fn run(n: usize, w: &[u8], acts: &[&[u8]], out: &mut [f32]) {
            let mut t = 0;
            while t < acts.len() {
                let m = (acts.len() - t).min(8);
                let p = |i: usize| acts[t + if i < m { i } else { 0 }].as_ptr();
                if m > 4 {
                    let r = $k::<8, { $flag }>(n, w, std::array::from_fn(p));
                    out[t..t + m].copy_from_slice(&r[..m]);
                } else {
                    let r = $k::<4, { $flag }>(n, w, std::array::from_fn(p));
                    out[t..t + m].copy_from_slice(&r[..m]);
                }
                t += m;
            }
        }
        run as MultiFn
    }};
}

/// The AVX-512 multi-token kernel for `w` in `order`, with the VNNI variants where this CPU
/// has VNNI.
pub fn kernel(w: crate::quant::GgmlType, order: Order) -> Option<MultiFn> {
    // Q8_0 keeps the AVX2 kernel: its AVX-512 variants ran at 0.6-0.7x of it on the device
    // host's Xeon (bench/bench_gemm_isa.py, docs/BENCHMARKS.md); tests still reach them.
    if w == crate::quant::GgmlType::Q8_0 {
        return None;
    }
    // IQ3_S's tiled order keeps the AVX2 kernel too: its 8-token vectorised float combine ran
    // it at 1/0.93 of the AVX-512 one on an AMX Xeon (bench/bench_gemm_isa.py, 1 thread, 32
    // tokens); rows of ≥ 12 tokens in that order take the AMX tiles where the CPU has them.
    if (w, order) == (crate::quant::GgmlType::IQ3S, Order::Many) {
        return None;
    }
    kernel_with(w, order, cpu::has_vnni())
}

/// The kernel for `w` in `order`, VNNI variants only when `vnni` (tests check both); None
/// when the CPU lacks AVX-512 (or VNNI when asked for).
pub fn kernel_with(w: crate::quant::GgmlType, order: Order, vnni: bool) -> Option<MultiFn> {
    use crate::quant::GgmlType::*;
    if !cpu::has_avx512() || (vnni && !cpu::has_vnni()) {
        return None;
    }
    Some(match (w, order, vnni) {
        (Q4K, Order::Single, true) => passes!(
            q4_k_single,
            true,
            "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
        ),
        (Q4K, Order::Single, false) => {
            passes!(
                q4_k_single,
                false,
                "avx2,fma,f16c,avx512f,avx512bw,avx512vl"
            )
        }
        (Q4K, Order::Many, true) => passes!(
            q4_k_many,
            true,
            "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
        ),
        (Q4K, Order::Many, false) => {
            passes!(q4_k_many, false, "avx2,fma,f16c,avx512f,avx512bw,avx512vl")
        }
        (Q6K, Order::Single, _) => {
            passes!(q6_k, false, "avx2,fma,f16c,avx512f,avx512bw,avx512vl")
        }
        (Q6K, Order::Many, _) => passes!(q6_k, true, "avx2,fma,f16c,avx512f,avx512bw,avx512vl"),
        (Q8_0, _, true) => passes!(
            q8_0,
            true,
            "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
        ),
        (Q8_0, _, false) => passes!(q8_0, false, "avx2,fma,f16c,avx512f,avx512bw,avx512vl"),
        // (no VNNI form: `vpdpbusd` would leave the group scale to a `vpmulld` per 64 weights,
        // where `vpmaddwd` applies it in the pairing add)
        // (the grid permuted out of registers where the CPU has VBMI; iq3s512's tests compare
        // both lookups)
        (IQ3S, Order::Single, _) if cpu::has_vbmi() => {
            iq3s512::iq3_s_multi_vbmi::<false> as MultiFn
        }
        (IQ3S, Order::Many, _) if cpu::has_vbmi() => iq3s512::iq3_s_multi_vbmi::<true> as MultiFn,
        (IQ3S, Order::Single, _) => iq3s512::iq3_s_multi::<false> as MultiFn,
        (IQ3S, Order::Many, _) => iq3s512::iq3_s_multi::<true> as MultiFn,
        _ => return None,
    })
}
