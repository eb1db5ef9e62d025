//! The 256-element k-quant super-blocks: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (docs/FORMATS.md §2).
//! Sub-block scales are multiplied into d first (`dl = d·sc`, `ml = dmin·m`), then
//! `y = dl·q − ml`, the order gguf-py uses.

use super::{f16_at, for_blocks, sub_nan_first};

/// scales[16] | qs[64] | d f16 | dmin f16. Element 128h + 32j + l:
/// q = (qs[32h + l] >> 2j) & 3, sc = scales[8h + 2j + l/16], y = d·(sc & 15)·q − dmin·(sc >> 4).
pub fn q2_k(src: &[u8], dst: &mut [f32]) {
    for_blocks::<84, 256>(src, dst, |b, y| {
        let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
        for s in 0..16 {
            let sc = b[s];
            let dl = d * (sc & 15) as f32;
            let ml = dmin * (sc >> 4) as f32;
            let (h, j, l0) = (s / 8, (s % 8) / 2, 16 * (s % 2));
            for l in l0..l0 + 16 {
                let q = (b[16 + 32 * h + l] >> (2 * j)) & 3;
                y[128 * h + 32 * j + l] = sub_nan_first(dl * q as f32, ml);
            }
        }
    });
}

/// The 16 signed 6-bit scales of Q3_K (scales[12] at `sc`), each − 32.
#[inline]
fn q3_k_scales(sc: &[u8]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (s, o) in out.iter_mut().enumerate() {
        let low4 = if s < 8 { sc[s] & 15 } else { sc[s - 8] >> 4 };
        let hi2 = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        *o = (low4 | hi2 << 4) as i32 - 32;
    }
    out
}

/// hmask[32] | qs[64] | scales[12] | d f16. Element e = 128h + 32j + l:
/// q = ((qs[32h + l] >> 2j) & 3) − (hmask[l] bit (4h + j) ? 0 : 4), y = (d·sc[e/16])·q.
pub fn q3_k(src: &[u8], dst: &mut [f32]) {
    for_blocks::<110, 256>(src, dst, |b, y| {
        let d = f16_at(b, 108);
        let scales = q3_k_scales(&b[96..108]);
        for (s, &sc) in scales.iter().enumerate() {
            let dl = d * sc as f32;
            let (h, j, l0) = (s / 8, (s % 8) / 2, 16 * (s % 2));
            for l in l0..l0 + 16 {
                let q2 = ((b[32 + 32 * h + l] >> (2 * j)) & 3) as i32;
                let hb = (b[l] >> (4 * h + j)) & 1;
                let q = q2 - if hb == 0 { 4 } else { 0 };
                y[128 * h + 32 * j + l] = dl * q as f32;
            }
        }
    });
}

/// `get_scale_min_k4`: the 6-bit (scale, min) of sub-block k from scales[12].
#[inline]
fn scale_min_k4(k: usize, s: &[u8]) -> (u8, u8) {
    if k < 4 {
        (s[k] & 63, s[k + 4] & 63)
    } else {
        (
            (s[k + 4] & 15) | ((s[k - 4] >> 6) << 4),
            (s[k + 4] >> 4) | ((s[k] >> 6) << 4),
        )
    }
}

/// d f16 | dmin f16 | scales[12] | qs[128]. Sub-block k (32 elements) takes nibble k%2 of
/// qs[32(k/2) + l]; y = (d·sc_k)·q − dmin·m_k.
pub fn q4_k(src: &[u8], dst: &mut [f32]) {
    for_blocks::<144, 256>(src, dst, |b, y| {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        for k in 0..8 {
            let (sc, m) = scale_min_k4(k, &b[4..16]);
            let (d1, m1) = (d * sc as f32, dmin * m as f32);
            let (qs, shift) = (&b[16 + 32 * (k / 2)..16 + 32 * (k / 2) + 32], 4 * (k % 2));
            for (l, &q) in qs.iter().enumerate() {
                y[32 * k + l] = sub_nan_first(d1 * ((q >> shift) & 15) as f32, m1);
            }
        }
    });
}

/// d f16 | dmin f16 | scales[12] | qh[32] | qs[128]. As Q4_K, plus bit k of qh[l] as bit 4.
pub fn q5_k(src: &[u8], dst: &mut [f32]) {
    for_blocks::<176, 256>(src, dst, |b, y| {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        for k in 0..8 {
            let (sc, m) = scale_min_k4(k, &b[4..16]);
            let (d1, m1) = (d * sc as f32, dmin * m as f32);
            let (qs, shift) = (&b[48 + 32 * (k / 2)..48 + 32 * (k / 2) + 32], 4 * (k % 2));
            for (l, &q) in qs.iter().enumerate() {
                let q = ((q >> shift) & 15) | ((b[16 + l] >> k) & 1) << 4;
                y[32 * k + l] = sub_nan_first(d1 * q as f32, m1);
            }
        }
    });
}

/// ql[128] | qh[64] | scales i8[16] | d f16. Element 128h + 32k + l:
/// q = nibble (k/2) of ql[64h + 32(k%2) + l] | ((qh[32h + l] >> 2k) & 3) << 4;
/// y = (d·scales[e/16])·(q − 32).
pub fn q6_k(src: &[u8], dst: &mut [f32]) {
    for_blocks::<210, 256>(src, dst, |b, y| {
        let d = f16_at(b, 208);
        for s in 0..16 {
            let ds = d * (b[192 + s] as i8) as f32;
            let (h, k, l0) = (s / 8, (s % 8) / 2, 16 * (s % 2));
            for l in l0..l0 + 16 {
                let lo = (b[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15;
                let hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
                let q = (lo | hi << 4) as i32 - 32;
                y[128 * h + 32 * k + l] = ds * q as f32;
            }
        }
    });
}
