//! The 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL (docs/FORMATS.md §2,
//! "Legacy 32-element blocks"). Element j takes the low nibble of qs[j], element j+16 the
//! high nibble.

use super::{add_nan_first, f16_at, for_blocks, u32_at};
use crate::quant::tables::KVALUES_IQ4NL;

/// d f16 | qs[16] → y = d·(nib − 8).
pub fn q4_0(src: &[u8], dst: &mut [f32]) {
    for_blocks::<18, 32>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for j in 0..16 {
            let q = b[2 + j];
            y[j] = d * ((q & 15) as i32 - 8) as f32;
            y[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
        }
    });
}

/// d f16 | m f16 | qs[16] → y = d·nib + m.
pub fn q4_1(src: &[u8], dst: &mut [f32]) {
    for_blocks::<20, 32>(src, dst, |b, y| {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for j in 0..16 {
            let q = b[4 + j];
            y[j] = add_nan_first(d * (q & 15) as f32, m);
            y[j + 16] = add_nan_first(d * (q >> 4) as f32, m);
        }
    });
}

/// The 5-bit values of a Q5 block: low nibbles from qs, bit 4 from the LE u32 qh.
#[inline]
fn q5_values(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 15) | (((qh >> j) & 1) as u8) << 4;
        q[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) as u8) << 4;
    }
    q
}

/// d f16 | qh u32 | qs[16] → y = d·(q − 16).
pub fn q5_0(src: &[u8], dst: &mut [f32]) {
    for_blocks::<22, 32>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        let q = q5_values(u32_at(b, 2), &b[6..22]);
        for (o, &q) in y.iter_mut().zip(q.iter()) {
            *o = d * (q as i32 - 16) as f32;
        }
    });
}

/// d f16 | m f16 | qh u32 | qs[16] → y = d·q + m.
pub fn q5_1(src: &[u8], dst: &mut [f32]) {
    for_blocks::<24, 32>(src, dst, |b, y| {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        let q = q5_values(u32_at(b, 4), &b[8..24]);
        for (o, &q) in y.iter_mut().zip(q.iter()) {
            *o = add_nan_first(d * q as f32, m);
        }
    });
}

/// d f16 | qs i8[32] → y = qs·d.
pub fn q8_0(src: &[u8], dst: &mut [f32]) {
    for_blocks::<34, 32>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for (o, &q) in y.iter_mut().zip(b[2..].iter()) {
            *o = (q as i8) as f32 * d;
        }
    });
}

/// d f16 | qs[16] → y = d·kvalues_iq4nl[nib].
pub fn iq4_nl(src: &[u8], dst: &mut [f32]) {
    for_blocks::<18, 32>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for j in 0..16 {
            let q = b[2 + j];
            y[j] = d * KVALUES_IQ4NL[(q & 15) as usize] as f32;
            y[j + 16] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
        }
    });
}
