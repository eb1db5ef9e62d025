//! Scalar reference kernels for float rows and the 32-element (and Q2_0's 64-element)
//! block types. Argument contract of every kernel: `w` holds exactly the weight row of
//! `n` elements and `a` exactly the activation row (see `super::vec_dot`).

use super::common::{
    bf16_at, e8m0_half, f16_at, f32_at, reduce16, reduce8, reduce_4x8, Fma8, Lanes,
};
use crate::quant::tables::{KVALUES_IQ4NL, KVALUES_MXFP4};

/// Float rows: lane `i % 16` accumulates w_i·a_i over the first ⌊n/16⌋·16 elements, the
/// lanes are reduced, and the tail is added in order.
#[inline(always)]
fn float_dot(n: usize, wv: impl Fn(usize) -> f32, av: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [0f32; 16];
    let n16 = n / 16 * 16;
    for i in 0..n16 {
        acc[i % 16] += wv(i) * av(i);
    }
    let mut s = reduce16(&acc);
    for i in n16..n {
        s += wv(i) * av(i);
    }
    s
}

/// ggml's `ggml_vec_dot_f32` (AVX2+FMA build): four 8-lane accumulators over 32-element
/// steps, `acc = fma(w, a, acc)`, reduced by `reduce_4x8`; the tail is added in f64.
pub fn f32_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [[0f32; 8]; 4];
    let n32 = n / 32 * 32;
    for i in 0..n32 {
        let (j, k) = ((i % 32) / 8, i % 8);
        acc[j][k] = f32_at(w, 4 * i).mul_add(f32_at(a, 4 * i), acc[j][k]);
    }
    let mut s = reduce_4x8(&acc) as f64;
    for i in n32..n {
        s += (f32_at(w, 4 * i) * f32_at(a, 4 * i)) as f64;
    }
    s as f32
}

/// The F32 dot of ggml's multi-row matmul (llamafile's tinyBLAS, used when the activation
/// has more than one row and n is a multiple of 8): one 8-lane accumulator,
/// `acc = fma(w, a, acc)`, reduced by `reduce8`; otherwise `f32_dot`.
pub fn f32_dot_many(n: usize, w: &[u8], a: &[u8]) -> f32 {
    if !n.is_multiple_of(8) {
        return f32_dot(n, w, a);
    }
    let mut acc = [0f32; 8];
    for i in 0..n {
        acc[i % 8] = f32_at(w, 4 * i).mul_add(f32_at(a, 4 * i), acc[i % 8]);
    }
    reduce8(&acc)
}

pub fn f16_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    float_dot(n, |i| f16_at(w, 2 * i), |i| f16_at(a, 2 * i))
}

pub fn bf16_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    float_dot(n, |i| bf16_at(w, 2 * i), |i| bf16_at(a, 2 * i))
}

/// Eight partial sums Σ_{e=4k}^{4k+3} q_e·a_e of a 32-element block; `q(e)` gives the
/// weight integer of element e, `a` the 32 activation bytes.
#[inline(always)]
fn partials(q: impl Fn(usize) -> i32, a: &[u8]) -> [i32; 8] {
    let mut p = [0i32; 8];
    for (e, &av) in a.iter().enumerate().take(32) {
        p[e / 4] += q(e) * (av as i8 as i32);
    }
    p
}

/// Low nibble of qs[e] for e < 16, high nibble of qs[e-16] otherwise.
#[inline(always)]
fn nib(qs: &[u8], e: usize) -> i32 {
    (if e < 16 { qs[e] & 15 } else { qs[e - 16] >> 4 }) as i32
}

/// Blocks paired with Q8_0 (34-byte) activation blocks: `bs` weight bytes per block,
/// `scale(wb)` the weight scale, `q(wb, e)` the integer of element e.
#[inline(always)]
fn q8_0_blocks(
    n: usize,
    w: &[u8],
    a: &[u8],
    bs: usize,
    scale: impl Fn(&[u8]) -> f32,
    q: impl Fn(&[u8], usize) -> i32,
) -> f32 {
    let mut lanes = Lanes::new();
    for (b, (wb, ab)) in w
        .chunks_exact(bs)
        .zip(a.chunks_exact(34))
        .take(n / 32)
        .enumerate()
    {
        let p = partials(|e| q(wb, e), &ab[2..]);
        lanes.add_block(b, &p, scale(wb) * f16_at(ab, 0));
    }
    lanes.reduce()
}

/// ggml's AVX2 order (`Fma8`): per block `fma(d_w·d_a, lane partials, acc)`.
pub fn q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = Fma8::new();
    for (wb, ab) in w.chunks_exact(34).zip(a.chunks_exact(34)).take(n / 32) {
        let p = partials(|e| wb[2 + e] as i8 as i32, &ab[2..]);
        acc.add_ints(f16_at(wb, 0) * f16_at(ab, 0), &p);
    }
    acc.reduce()
}

pub fn q4_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    q8_0_blocks(
        n,
        w,
        a,
        18,
        |wb| f16_at(wb, 0),
        |wb, e| nib(&wb[2..], e) - 8,
    )
}

/// Q5_0: d f16; qh u32 (bit e is element e's 5th bit); qs[16].
pub fn q5_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    q8_0_blocks(
        n,
        w,
        a,
        22,
        |wb| f16_at(wb, 0),
        |wb, e| {
            let qh = u32::from_le_bytes([wb[2], wb[3], wb[4], wb[5]]);
            (nib(&wb[6..], e) | (((qh >> e) & 1) as i32) << 4) - 16
        },
    )
}

pub fn iq4_nl(n: usize, w: &[u8], a: &[u8]) -> f32 {
    q8_0_blocks(
        n,
        w,
        a,
        18,
        |wb| f16_at(wb, 0),
        |wb, e| KVALUES_IQ4NL[nib(&wb[2..], e) as usize] as i32,
    )
}

/// MXFP4: e u8 (E8M0); qs[16]. Block scale = 2^(e-128)·d_a, applied to doubled E2M1 ints.
pub fn mxfp4(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut lanes = Lanes::new();
    for (b, (wb, ab)) in w
        .chunks_exact(17)
        .zip(a.chunks_exact(34))
        .take(n / 32)
        .enumerate()
    {
        let p = partials(
            |e| KVALUES_MXFP4[nib(&wb[1..], e) as usize] as i32,
            &ab[2..],
        );
        lanes.add_block(b, &p, e8m0_half(wb[0]) * f16_at(ab, 0));
    }
    lanes.reduce()
}

/// Blocks paired with Q8_1 (36-byte: d, s, qs) activations: y = d·q + m, so the dot is
/// lanes(d_w·d_a·Σq·a) + Σ_blocks m·s, the second sum taken in block order.
#[inline(always)]
fn q8_1_blocks(n: usize, w: &[u8], a: &[u8], bs: usize, q: impl Fn(&[u8], usize) -> i32) -> f32 {
    let mut lanes = Lanes::new();
    let mut ms = 0f32;
    for (b, (wb, ab)) in w
        .chunks_exact(bs)
        .zip(a.chunks_exact(36))
        .take(n / 32)
        .enumerate()
    {
        let p = partials(|e| q(wb, e), &ab[4..]);
        lanes.add_block(b, &p, f16_at(wb, 0) * f16_at(ab, 0));
        ms += f16_at(wb, 2) * f16_at(ab, 2);
    }
    lanes.reduce() + ms
}

pub fn q4_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    q8_1_blocks(n, w, a, 20, |wb, e| nib(&wb[4..], e))
}

/// Q5_1: d f16; m f16; qh u32; qs[16].
pub fn q5_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    q8_1_blocks(n, w, a, 24, |wb, e| {
        let qh = u32::from_le_bytes([wb[4], wb[5], wb[6], wb[7]]);
        nib(&wb[8..], e) | (((qh >> e) & 1) as i32) << 4
    })
}

/// Q2_0 (18 bytes per 64): d f16; qs[16]. Element 4k + j is ((qs[k] >> 2j) & 3) − 1 (layout
/// probed from ggml's own `dequantize_row_q2_0`). Each 32-element half pairs with one Q8_0
/// activation block and counts as one block of the lane scheme.
pub fn q2_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut lanes = Lanes::new();
    for (b, ab) in a.chunks_exact(34).take(n / 32).enumerate() {
        let wb = &w[18 * (b / 2)..18 * (b / 2) + 18];
        let qs = &wb[2 + 8 * (b % 2)..10 + 8 * (b % 2)];
        let p = partials(|e| ((qs[e / 4] >> (2 * (e % 4))) & 3) as i32 - 1, &ab[2..]);
        lanes.add_block(b, &p, f16_at(wb, 0) * f16_at(ab, 0));
    }
    lanes.reduce()
}
