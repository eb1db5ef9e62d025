//! Hand-built blocks per family, with expected values worked out from docs/FORMATS.md §2.
//! (The bit-exact comparison against gguf-py and ggml is tests/test_dequant.py.)

use super::*;
use crate::quant::tables::{IQ1S_GRID, IQ2XXS_GRID, KVALUES_IQ4NL};

fn deq(ty: GgmlType, src: &[u8]) -> Vec<f32> {
    let n = src.len() / ty.type_size() * ty.block_size();
    let mut out = vec![f32::NAN; n];
    dequantize_blocks(ty, src, &mut out).unwrap();
    out
}

const ONE: [u8; 2] = [0x00, 0x3c]; // f16 1.0
const TWO: [u8; 2] = [0x00, 0x40]; // f16 2.0
const HALF: [u8; 2] = [0x00, 0x38]; // f16 0.5

#[test]
fn f16_widening_keeps_nan_payloads() {
    assert_eq!(f16_to_f32(0x3c00), 1.0);
    assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
    assert_eq!(
        f16_to_f32(0x83ff).to_bits(),
        (-(1023.0 * 2f32.powi(-24))).to_bits()
    );
    assert_eq!(f16_to_f32(0x8000).to_bits(), 0x8000_0000);
    assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
    assert_eq!(f16_to_f32(0x7c01).to_bits(), 0x7f80_2000); // signalling NaN stays signalling
    assert_eq!(f16_to_f32(0xfe00).to_bits(), 0xffc0_0000);
    assert_eq!(f16_to_f32(0x7bff), 65504.0);
    for h in 0..=u16::MAX {
        let x = f16_to_f32(h);
        if !x.is_nan() {
            assert_eq!(x, half::f16::from_bits(h).to_f32(), "{h:#x}");
        }
    }
}

#[test]
fn legacy_blocks() {
    // Q4_0: d = 2, qs[0] = 0x9F → element 0 nib 15 → 2·7; element 16 nib 9 → 2·1.
    let mut b = vec![0u8; 18];
    b[..2].copy_from_slice(&TWO);
    b[2] = 0x9f;
    let y = deq(GgmlType::Q4_0, &b);
    assert_eq!((y[0], y[16], y[1]), (14.0, 2.0, -16.0));
    // Q4_1: d = 0.5, m = 1: y = 0.5·nib + 1.
    let mut b = vec![0u8; 20];
    b[..2].copy_from_slice(&HALF);
    b[2..4].copy_from_slice(&ONE);
    b[4] = 0x3a;
    let y = deq(GgmlType::Q4_1, &b);
    assert_eq!((y[0], y[16], y[1]), (6.0, 2.5, 1.0));
    // Q5_0: bit 4 of element 17 from qh bit 17.
    let mut b = vec![0u8; 22];
    b[..2].copy_from_slice(&ONE);
    b[2..6].copy_from_slice(&(1u32 << 17).to_le_bytes());
    b[6 + 1] = 0x20;
    let y = deq(GgmlType::Q5_0, &b);
    assert_eq!((y[1], y[17], y[0]), (-16.0, 2.0, -16.0));
    // Q5_1: y = d·q + m, element 0 with bit 4 set.
    let mut b = vec![0u8; 24];
    b[..2].copy_from_slice(&TWO);
    b[2..4].copy_from_slice(&HALF);
    b[4] = 1;
    b[8] = 0x03;
    let y = deq(GgmlType::Q5_1, &b);
    assert_eq!((y[0], y[1]), (2.0 * 19.0 + 0.5, 0.5));
    // Q8_0 and IQ4_NL.
    let mut b = vec![0u8; 34];
    b[..2].copy_from_slice(&HALF);
    b[2] = 0x81; // -127
    assert_eq!(deq(GgmlType::Q8_0, &b)[0], -63.5);
    let mut b = vec![0u8; 18];
    b[..2].copy_from_slice(&ONE);
    b[2] = 0xf0;
    let y = deq(GgmlType::IQ4NL, &b);
    assert_eq!(
        (y[0], y[16]),
        (KVALUES_IQ4NL[0] as f32, KVALUES_IQ4NL[15] as f32)
    );
}

#[test]
fn k_quant_blocks() {
    // Q2_K: element 128 + 32·1 + 17 = 177 uses qs[32 + 17] bits 2..3 and scales[8 + 2 + 1].
    let mut b = vec![0u8; 84];
    b[80..82].copy_from_slice(&TWO);
    b[82..84].copy_from_slice(&ONE);
    b[11] = 0x53; // sc 3, min 5
    b[16 + 49] = 0b1100;
    let y = deq(GgmlType::Q2K, &b);
    assert_eq!(y[177], 2.0 * 3.0 * 3.0 - 5.0);
    assert_eq!(y[176], -5.0); // same sub-block (l/16 = 1), q = 0
                              // Q3_K: scale 0 = (scales[0] & 15 | (scales[8] & 3) << 4) − 32; hmask bit 0 set → q2.
    let mut b = vec![0u8; 110];
    b[108..110].copy_from_slice(&ONE);
    b[96] = 0x05;
    b[104] = 0x02; // sc0 = 5 | 2<<4 = 37 → 5
    b[0] = 1; // hmask[0] bit 0: element 0 has no −4
    b[32] = 3;
    let y = deq(GgmlType::Q3K, &b);
    assert_eq!((y[0], y[1]), (15.0, -20.0));
    // Q4_K: sub-block 5: sc = (s[9] & 15) | (s[1] >> 6) << 4, m = (s[9] >> 4) | (s[5] >> 6) << 4.
    let mut b = vec![0u8; 144];
    b[..2].copy_from_slice(&ONE);
    b[2..4].copy_from_slice(&HALF);
    b[4 + 9] = 0x23;
    b[4 + 1] = 0x40;
    b[4 + 5] = 0x80;
    b[16 + 64 + 3] = 0x70; // element 32·5 + 3 takes the high nibble of qs[64 + 3]
    let y = deq(GgmlType::Q4K, &b);
    assert_eq!(y[163], 19.0 * 7.0 - 0.5 * 34.0);
    // Q5_K: same scales, plus qh[3] bit 5.
    let mut b2 = vec![0u8; 176];
    b2[..16].copy_from_slice(&b[..16]);
    b2[16 + 3] = 1 << 5;
    b2[48 + 64 + 3] = 0x70;
    assert_eq!(deq(GgmlType::Q5K, &b2)[163], 19.0 * 23.0 - 0.5 * 34.0);
    // Q6_K: element 128 + 96 + 5: ql[64 + 32 + 5] high nibble, qh[32 + 5] bits 6..7, scale 14.
    let mut b = vec![0u8; 210];
    b[208..210].copy_from_slice(&HALF);
    b[192 + 14] = (-3i8) as u8;
    b[64 + 37] = 0xa0;
    b[128 + 37] = 0b1100_0000;
    let y = deq(GgmlType::Q6K, &b);
    assert_eq!(y[229], 0.5 * -3.0 * ((10 | 3 << 4) - 32) as f32);
}

#[test]
fn i_quant_blocks() {
    // IQ2_XXS group 1, 8-group 2: grid index byte 2 of a0, signs (a1 >> 14) & 127.
    let mut b = vec![0u8; 66];
    b[..2].copy_from_slice(&ONE);
    let a0: u32 = 5 << 16;
    let a1: u32 = (3 << 28) | (1 << 14); // scale 3; ksigns[1] = 0x81: elements 0 and 7 negative
    b[10..14].copy_from_slice(&a0.to_le_bytes());
    b[14..18].copy_from_slice(&a1.to_le_bytes());
    let y = deq(GgmlType::IQ2XXS, &b);
    let g = IQ2XXS_GRID[5].to_le_bytes();
    let db = 3.5 * 0.25;
    assert_eq!(y[48], -db * g[0] as f32);
    assert_eq!(y[49], db * g[1] as f32);
    assert_eq!(y[55], -db * g[7] as f32);
    // IQ1_S group 0: qh = scale 2, delta negative, entry 1 index high bits 3.
    let mut b = vec![0u8; 50];
    b[..2].copy_from_slice(&ONE);
    let qh: u16 = 0x8000 | (2 << 12) | (3 << 3);
    b[34..36].copy_from_slice(&qh.to_le_bytes());
    b[3] = 7;
    let y = deq(GgmlType::IQ1S, &b);
    let g = IQ1S_GRID[3 << 8 | 7].to_le_bytes();
    assert_eq!(y[8], 5.0 * ((g[0] as i8) as f32 - 0.125));
    // IQ4_XS group 3: ls = (scales_l[1] >> 4) | ((scales_h >> 6) & 3) << 4.
    let mut b = vec![0u8; 136];
    b[..2].copy_from_slice(&ONE);
    b[2..4].copy_from_slice(&(2u16 << 6).to_le_bytes());
    b[5] = 0x10; // ls = 1 | 32 → dl = 1
    b[8 + 48] = 0x2f;
    let y = deq(GgmlType::IQ4XS, &b);
    assert_eq!(
        (y[96], y[112]),
        (KVALUES_IQ4NL[15] as f32, KVALUES_IQ4NL[2] as f32)
    );
}

#[test]
fn misc_blocks() {
    // TQ2_0: element 128 + 32·2 + 1 = (qs[33] >> 4) & 3.
    let mut b = vec![0u8; 66];
    b[64..66].copy_from_slice(&TWO);
    b[33] = 0b10_0000;
    let y = deq(GgmlType::TQ2_0, &b);
    assert_eq!((y[193], y[0]), (2.0, -2.0));
    // TQ1_0: byte 0x00 → trits all 0 → −d; 242 = 3⁵−1 → t = 2 for n = 0.
    let mut b = vec![0u8; 54];
    b[52..54].copy_from_slice(&ONE);
    b[0] = 242;
    let y = deq(GgmlType::TQ1_0, &b);
    assert_eq!((y[0], y[1]), (1.0, -1.0));
    // MXFP4: e = 128 → half scale 2^0 = 1 → y = kvalues (doubled E2M1).
    let mut b = vec![0u8; 17];
    b[0] = 128;
    b[1] = 0xf7;
    let y = deq(GgmlType::MXFP4, &b);
    assert_eq!((y[0], y[16]), (12.0, -12.0));
    // NVFP4: d[1] = 0x38 (E4M3 1.0) → scale 0.5; 0x7f → 0.
    let mut b = vec![0u8; 36];
    b[1] = 0x38;
    b[2] = 0x7f;
    b[4 + 8] = 0x76;
    b[4 + 16] = 0x77;
    let y = deq(GgmlType::NVFP4, &b);
    assert_eq!((y[16], y[24], y[32]), (4.0, 6.0, 0.0));
    // BF16 / F32.
    assert_eq!(deq(GgmlType::BF16, &[0x80, 0x3f]), [1.0]);
    assert_eq!(deq(GgmlType::F32, &1.5f32.to_le_bytes()), [1.5]);
}

#[test]
fn unsupported_and_bad_lengths_are_errors() {
    for ty in [
        GgmlType::Q8_1,
        GgmlType::Q8K,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
    ] {
        let src = vec![0u8; ty.type_size()];
        let mut dst = vec![0f32; ty.block_size()];
        assert!(matches!(
            dequantize_blocks(ty, &src, &mut dst),
            Err(Error::Quant(_))
        ));
    }
    let mut dst = vec![0f32; 32];
    assert!(dequantize_blocks(GgmlType::Q4_0, &[0u8; 17], &mut dst).is_err());
    assert!(dequantize_blocks(GgmlType::Q4_0, &[0u8; 18], &mut dst[..31]).is_err());
    assert!(crate::quant::dequantize(GgmlType::Q4K, &[0u8; 144], &mut dst).is_err());
}
