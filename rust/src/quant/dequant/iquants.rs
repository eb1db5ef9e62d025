//! The i-quant super-blocks (256 elements): IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
//! IQ1_M, IQ4_XS (docs/FORMATS.md §2). Grids come from `tables.rs`; byte k of an entry is element k.
//! Order of operations as in gguf-py: `db = (d·(0.5 + s))·k`, then `y = (db·grid)·sign`.

use super::{f16_at, f16_to_f32, for_blocks, u16_at, u32_at};
use crate::quant::tables::{
    IQ1S_DELTA, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID,
    KSIGNS_IQ2XS, KVALUES_IQ4NL,
};

/// The sign bits to apply to `db·grid`: none when db is NaN. Grid values are finite and
/// non-zero, so `db·grid` is NaN exactly when db is, and gguf-py's `·(−1)` keeps a NaN's sign;
/// otherwise multiplying by −1 is exactly a sign flip.
#[inline]
fn live_signs(db: f32, signs: u8) -> u8 {
    if db.is_nan() {
        0
    } else {
        signs
    }
}

/// Eight outputs `(db·grid[k])·(sign bit k ? −1 : 1)` from an 8-byte grid entry.
#[inline]
fn grid8(y: &mut [f32], db: f32, grid: u64, signs: u8) {
    let (g, s) = (grid.to_le_bytes(), live_signs(db, signs));
    for k in 0..8 {
        y[k] = f32::from_bits((db * g[k] as f32).to_bits() ^ (((s >> k) & 1) as u32) << 31);
    }
}

/// Four outputs from a 4-byte grid entry, using sign bits `shift..shift + 4`.
#[inline]
fn grid4(y: &mut [f32], db: f32, grid: u32, signs: u8, shift: usize) {
    let (g, s) = (grid.to_le_bytes(), live_signs(db, signs) >> shift);
    for k in 0..4 {
        y[k] = f32::from_bits((db * g[k] as f32).to_bits() ^ (((s >> k) & 1) as u32) << 31);
    }
}

/// d f16 | qs u16[32]. Per 32-group g: u32 words a0 (4 grid indices), a1 (4×7 sign bits,
/// 4-bit scale at the top); db = d·(0.5 + (a1 >> 28))·0.25.
pub fn iq2_xxs(src: &[u8], dst: &mut [f32]) {
    for_blocks::<66, 256>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for g in 0..8 {
            let (a0, a1) = (u32_at(b, 2 + 8 * g), u32_at(b, 6 + 8 * g));
            let db = d * (0.5 + (a1 >> 28) as f32) * 0.25;
            for l in 0..4 {
                let grid = IQ2XXS_GRID[((a0 >> (8 * l)) & 255) as usize];
                let signs = KSIGNS_IQ2XS[((a1 >> (7 * l)) & 127) as usize];
                let o = 32 * g + 8 * l;
                grid8(&mut y[o..o + 8], db, grid, signs);
            }
        }
    });
}

/// The 16 4-bit scales of IQ2_XS/IQ2_S (`scales[8]`): nibble i, low first, as `0.25·d·(0.5+s)`.
#[inline]
fn iq2_db(d: f32, scales: &[u8], i: usize) -> f32 {
    let s = (scales[i / 2] >> (4 * (i % 2))) & 15;
    d * (0.5 + s as f32) * 0.25
}

/// d f16 | qs u16[32] | scales[8]. Entry i: low 9 bits index iq2xs_grid, high 7 ksigns;
/// entries 2s, 2s+1 share scale nibble s.
pub fn iq2_xs(src: &[u8], dst: &mut [f32]) {
    for_blocks::<74, 256>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for i in 0..32 {
            let q = u16_at(b, 2 + 2 * i);
            let db = iq2_db(d, &b[66..74], i / 2);
            let grid = IQ2XS_GRID[(q & 511) as usize];
            grid8(
                &mut y[8 * i..8 * i + 8],
                db,
                grid,
                KSIGNS_IQ2XS[(q >> 9) as usize],
            );
        }
    });
}

/// d f16 | qs[32] | signs[32] | qh[8] | scales[8]. Entry i: index qs[i] | 2 bits of
/// qh[i/4] << 8 into iq2s_grid, sign byte signs[i]; entries 2s, 2s+1 share scale nibble s.
pub fn iq2_s(src: &[u8], dst: &mut [f32]) {
    for_blocks::<82, 256>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for i in 0..32 {
            let hi = ((b[66 + i / 4] >> (2 * (i % 4))) & 3) as usize;
            let db = iq2_db(d, &b[74..82], i / 2);
            let grid = IQ2S_GRID[b[2 + i] as usize | hi << 8];
            grid8(&mut y[8 * i..8 * i + 8], db, grid, b[34 + i]);
        }
    });
}

/// d f16 | qs[64] grid indices | u32[8] sign/scale words. Group g: db = d·(0.5 + (w >> 28))·0.5;
/// 8-group l uses ksigns[(w >> 7l) & 127] and grid entries qs[8g + 2l], qs[8g + 2l + 1].
pub fn iq3_xxs(src: &[u8], dst: &mut [f32]) {
    for_blocks::<98, 256>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for g in 0..8 {
            let w = u32_at(b, 66 + 4 * g);
            let db = d * (0.5 + (w >> 28) as f32) * 0.5;
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[((w >> (7 * l)) & 127) as usize];
                let o = 32 * g + 8 * l;
                let g1 = IQ3XXS_GRID[b[2 + 8 * g + 2 * l] as usize];
                let g2 = IQ3XXS_GRID[b[2 + 8 * g + 2 * l + 1] as usize];
                grid4(&mut y[o..o + 4], db, g1, signs, 0);
                grid4(&mut y[o + 4..o + 8], db, g2, signs, 4);
            }
        }
    });
}

/// d f16 | qs[64] | qh[8] | signs[32] | scales[4]. Group g: db = d·(1 + 2·nibble g);
/// entry k: index qs[k] | (qh[k/8] bit k%8) << 8 into iq3s_grid; sign byte per 8 elements.
pub fn iq3_s(src: &[u8], dst: &mut [f32]) {
    for_blocks::<110, 256>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for g in 0..8 {
            let s = (b[106 + g / 2] >> (4 * (g % 2))) & 15;
            let db = d * (1 + 2 * s as u32) as f32;
            for k in 8 * g..8 * g + 8 {
                let hi = ((b[66 + k / 8] >> (k % 8)) & 1) as usize;
                let grid = IQ3S_GRID[b[2 + k] as usize | hi << 8];
                let signs = b[74 + k / 2];
                grid4(&mut y[4 * k..4 * k + 4], db, grid, signs, 4 * (k % 2));
            }
        }
    });
}

/// Eight outputs `dl·(grid[k] + delta)` from an IQ1 ternary grid entry.
#[inline]
fn grid_iq1(y: &mut [f32], dl: f32, idx: usize, delta: f32) {
    let g = IQ1S_GRID[idx].to_le_bytes();
    for k in 0..8 {
        y[k] = dl * ((g[k] as i8) as f32 + delta);
    }
}

/// d f16 | qs[32] | qh u16[8]. Group g: dl = d·(2·((qh >> 12) & 7) + 1), delta by qh bit 15;
/// entry l: index qs[4g + l] | ((qh >> 3l) & 7) << 8.
pub fn iq1_s(src: &[u8], dst: &mut [f32]) {
    for_blocks::<50, 256>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for g in 0..8 {
            let qh = u16_at(b, 34 + 2 * g);
            let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
            let delta = if qh & 0x8000 == 0 {
                IQ1S_DELTA
            } else {
                -IQ1S_DELTA
            };
            for l in 0..4 {
                let idx = b[2 + 4 * g + l] as usize | (((qh >> (3 * l)) & 7) as usize) << 8;
                let o = 32 * g + 8 * l;
                grid_iq1(&mut y[o..o + 8], dl, idx, delta);
            }
        }
    });
}

/// qs[32] | qh[16] | scales u16[4]. d is the f16 made of the four top nibbles of scales;
/// half k of group g: dl = d·(2·((sc[g/2] >> (6(g%2) + 3k)) & 7) + 1); entry e = 4g + 2k + t:
/// nibble t of qh[2g + k] gives 3 index bits and the delta sign (bit 3).
pub fn iq1_m(src: &[u8], dst: &mut [f32]) {
    for_blocks::<56, 256>(src, dst, |b, y| {
        let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
        let d = f16_to_f32(
            (sc[0] >> 12) | ((sc[1] >> 8) & 0xf0) | ((sc[2] >> 4) & 0xf00) | (sc[3] & 0xf000),
        );
        for g in 0..8 {
            for k in 0..2 {
                let s = (sc[g / 2] >> (6 * (g % 2) + 3 * k)) & 7;
                let dl = d * (2 * s + 1) as f32;
                let qh = b[32 + 2 * g + k];
                for t in 0..2 {
                    let e = 4 * g + 2 * k + t;
                    let nib = (qh >> (4 * t)) & 15;
                    let idx = b[e] as usize | ((nib & 7) as usize) << 8;
                    let delta = if nib & 8 == 0 {
                        IQ1S_DELTA
                    } else {
                        -IQ1S_DELTA
                    };
                    grid_iq1(&mut y[8 * e..8 * e + 8], dl, idx, delta);
                }
            }
        }
    });
}

/// d f16 | scales_h u16 | scales_l[4] | qs[128]. Group g: ls = 4 bits of scales_l | 2 bits of
/// scales_h << 4, dl = d·(ls − 32); 16 bytes, low nibbles first: y = dl·kvalues_iq4nl[nib].
pub fn iq4_xs(src: &[u8], dst: &mut [f32]) {
    for_blocks::<136, 256>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        let sh = u16_at(b, 2);
        for g in 0..8 {
            let lo = (b[4 + g / 2] >> (4 * (g % 2))) & 15;
            let hi = ((sh >> (2 * g)) & 3) as u8;
            let dl = d * ((lo | hi << 4) as i32 - 32) as f32;
            for j in 0..16 {
                let q = b[8 + 16 * g + j];
                y[32 * g + j] = dl * KVALUES_IQ4NL[(q & 15) as usize] as f32;
                y[32 * g + 16 + j] = dl * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
            }
        }
    });
}
