//! Activation quantization and `dot(weight row, quantized activation)`.
//!
//! For each weight type the activation is quantized to the type ggml pairs it with
//! (`GgmlType::vec_dot_type`: Q8_0, Q8_1 or Q8_K; identity for float types), exactly as
//! ggml rounds, so results agree with llama.cpp. The scalar functions are the reference;
//! SIMD versions are chosen once at run time by CPU feature detection.

use super::types::GgmlType;
use crate::error::{Error, Result};
use half::f16;

/// Bytes of the quantized activation for a weight type `w` and a row of `n` elements.
pub fn act_bytes(w: GgmlType, n: usize) -> Option<usize> {
    w.vec_dot_type().row_bytes(n)
}

/// Quantize the activation row `x` into the format `act` (a `vec_dot_type`).
pub fn quantize_act(act: GgmlType, x: &[f32], out: &mut [u8]) -> Result<()> {
    let need = act.row_bytes(x.len()).ok_or_else(|| {
        Error::Quant(format!(
            "{} elements is not whole {} blocks",
            x.len(),
            act.name()
        ))
    })?;
    if out.len() != need {
        return Err(Error::Quant(format!(
            "activation buffer is {} bytes, expected {need}",
            out.len()
        )));
    }
    match act {
        GgmlType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::Q8_0 => quantize_q8_0(x, out),
        other => {
            return Err(Error::Quant(format!(
                "activation type {} is not implemented",
                other.name()
            )))
        }
    }
    Ok(())
}

fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        // As ggml's x86 CPU path computes it (what llama.cpp runs): id = 127/amax and
        // round-half-to-even (_mm256_round_ps nearest), not the reference's 1/d and roundf.
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        ob[0..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for (j, v) in xb.iter().enumerate() {
            ob[2 + j] = ((v * id).round_ties_even() as i32) as i8 as u8;
        }
    }
}

/// Whether `w` has a dot kernel.
pub fn supports(w: GgmlType) -> bool {
    matches!(w, GgmlType::F32 | GgmlType::Q8_0)
}

/// `Σ_i w[i]·a[i]` over `n` elements; `w_row` holds the weight row in its own type and
/// `act` the activation quantized with `quantize_act(w.vec_dot_type(), ..)`.
/// Panics on unsupported types: callers check `supports` when the model loads.
#[inline]
pub fn vec_dot(w: GgmlType, n: usize, w_row: &[u8], act: &[u8]) -> f32 {
    match w {
        GgmlType::F32 => {
            let mut s = 0f32;
            for i in 0..n {
                let a = f32::from_le_bytes(w_row[4 * i..4 * i + 4].try_into().unwrap());
                let b = f32::from_le_bytes(act[4 * i..4 * i + 4].try_into().unwrap());
                s += a * b;
            }
            s
        }
        GgmlType::Q8_0 => {
            let mut s = 0f32;
            for (wb, ab) in w_row
                .chunks_exact(34)
                .zip(act.chunks_exact(34))
                .take(n / 32)
            {
                let mut isum = 0i32;
                for j in 0..32 {
                    isum += (wb[2 + j] as i8 as i32) * (ab[2 + j] as i8 as i32);
                }
                s += isum as f32
                    * f16::from_bits(u16::from_le_bytes([wb[0], wb[1]])).to_f32()
                    * f16::from_bits(u16::from_le_bytes([ab[0], ab[1]])).to_f32();
            }
            s
        }
        other => panic!("no dot kernel for {}", other.name()),
    }
}
