//! The KV cache: a fixed number of sequences (slots), each with room for `n_ctx` positions.
//!
//! Layout per slot and per K/V: [L, C, Nkv·D] rows in the cache type (L = layers,
//! C = n_ctx, Nkv·D = one position's keys or values for all KV heads). Rows are stored as
//! ggml blocks: F32, F16 (the default, as llama.cpp stores its cache), Q8_0 or Q4_0 (the CPU
//! path only; written by ggml's reference quantizer, as llama.cpp writes its cache).
//! Memory is allocated zeroed at creation, so the OS commits pages only as positions fill.

use super::kv_blob::{self, KvLayoutId, HEADER_BYTES};
use crate::error::{Error, Result};
use crate::quant::dequant::f16_at;
use crate::quant::dot::quantize_act;
use crate::quant::GgmlType;
use half::f16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
    Q8_0,
    Q4_0,
}

impl KvType {
    pub fn parse(s: &str) -> Result<KvType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            "q4_0" => Ok(KvType::Q4_0),
            _ => Err(Error::Config(format!(
                "kv_type {s:?} is not one of f32, f16, q8_0, q4_0"
            ))),
        }
    }

    pub fn ggml(self) -> GgmlType {
        match self {
            KvType::F32 => GgmlType::F32,
            KvType::F16 => GgmlType::F16,
            KvType::Q8_0 => GgmlType::Q8_0,
            KvType::Q4_0 => GgmlType::Q4_0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }
}

/// Writes `x` as one row of type `ty`.
pub fn store_row(ty: KvType, x: &[f32], out: &mut [u8]) -> Result<()> {
    match ty {
        KvType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
            }
            Ok(())
        }
        KvType::F32 | KvType::Q8_0 => quantize_act(ty.ggml(), x, out),
        KvType::Q4_0 => {
            quantize_q4_0(x, out);
            Ok(())
        }
    }
}

/// The Walsh-Hadamard rotations llama.cpp applies to a quantized cache (its `attn_rot_k` /
/// `attn_rot_v`, on by default there): (K's block, V's block) in elements, K's the largest
/// power of two from 64 that divides the head dim D, V's 64; None for a cache stored as is.
/// The queries are rotated as the keys (q·k is unchanged: the rotation is orthonormal) and
/// each head's attention output as the values (the rotation is its own inverse). Strata
/// rotates its q4_0 cache (a CPU-path type); its q8_0 cache is stored as the GPU kernels store
/// theirs, unrotated (CPU and GPU caches are interchangeable: `kv_export`).
pub fn rot_sizes(ty: KvType, d: usize) -> Option<(usize, usize)> {
    if ty != KvType::Q4_0 || !d.is_multiple_of(64) {
        return None;
    }
    let mut k = 64;
    while d.is_multiple_of(2 * k) {
        k *= 2;
    }
    Some((k, 64))
}

/// Each `n`-element block of `x` through the orthonormal Walsh-Hadamard transform in ggml's
/// order (`ggml_compute_forward_fwht`): scaled by 1/√n first, then the butterflies
/// (u + v, u − v) at strides 1, 2, 4, … n/2.
pub fn fwht(x: &mut [f32], n: usize) {
    let scale = 1.0 / (n as f32).sqrt();
    for b in x.chunks_exact_mut(n) {
        b.iter_mut().for_each(|v| *v *= scale);
        let mut len = 1;
        while len < n {
            for i in (0..n).step_by(2 * len) {
                for j in i..i + len {
                    let (u, v) = (b[j], b[j + len]);
                    b[j] = u + v;
                    b[j + len] = u - v;
                }
            }
            len <<= 1;
        }
    }
}

/// Stores one position's keys and values ([Nkv·D] each, D = `d`) as `ty`, rotated first
/// where `rot_sizes` says so.
pub fn store_kv(
    ty: KvType,
    d: usize,
    (k, v): (&[f32], &[f32]),
    (kc, vc): (&mut [u8], &mut [u8]),
) -> Result<()> {
    let Some((nk, nv)) = rot_sizes(ty, d) else {
        store_row(ty, k, kc)?;
        return store_row(ty, v, vc);
    };
    let mut x = k.to_vec();
    fwht(&mut x, nk);
    store_row(ty, &x, kc)?;
    x.copy_from_slice(v);
    fwht(&mut x, nv);
    store_row(ty, &x, vc)
}

/// ggml's reference Q4_0 quantizer (`quantize_row_q4_0_ref`): per block of 32, the element of
/// largest magnitude maps to -8, d = it / -8, each element to min(15, trunc(x / d + 8.5)); the
/// first 16 in the low nibbles, the last 16 in the high ones. `out`: whole 18-byte blocks.
pub fn quantize_q4_0(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(18)) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        ob[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for j in 0..16 {
            // `as i8` truncates toward zero as C's (int8_t) cast does (values in 0.5..16.5)
            let lo = ((xb[j] * id + 8.5) as i8).min(15) as u8;
            let hi = ((xb[16 + j] * id + 8.5) as i8).min(15) as u8;
            ob[2 + j] = lo | (hi << 4);
        }
    }
}

/// `out += p · row` over one head's D elements stored as `ty` (F32 or F16).
#[inline]
pub fn axpy_row(ty: KvType, p: f32, row: &[u8], out: &mut [f32]) {
    match ty {
        KvType::F32 => {
            for (o, c) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o += p * f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        KvType::F16 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o += p * f16_at(row, 2 * i);
            }
        }
        // the quantized caches are attended in ggml's flash-attention order instead
        // (attention.rs `attend_online`), which adds each value row as ggml does
        KvType::Q8_0 | KvType::Q4_0 => unreachable!("axpy_row: a quantized cache"),
    }
}

struct Slot {
    len: usize,
    k: Vec<u8>,
    v: Vec<u8>,
}

pub struct KvCache {
    pub ty: KvType,
    pub n_layer: usize,
    pub n_ctx: usize,
    /// Elements per position per layer (Nkv·D) and their bytes in `ty`.
    pub row: usize,
    pub row_bytes: usize,
    /// Bytes of one head's D elements.
    pub head_bytes: usize,
    pub head_dim: usize,
    slots: Vec<Slot>,
}

impl KvCache {
    pub fn new(
        ty: KvType,
        n_layer: usize,
        n_ctx: usize,
        n_head_kv: usize,
        head_dim: usize,
        n_slots: usize,
    ) -> Result<KvCache> {
        if n_slots == 0 || n_ctx == 0 {
            return Err(Error::Config(format!(
                "n_slots ({n_slots}) and n_ctx ({n_ctx}) must be > 0"
            )));
        }
        let head_bytes = ty.ggml().row_bytes(head_dim).ok_or_else(|| {
            Error::Config(format!(
                "kv_type {} needs a head dimension that is a multiple of {}, not {head_dim}",
                ty.name(),
                ty.ggml().block_size()
            ))
        })?;
        let row_bytes = head_bytes * n_head_kv;
        let per = n_layer
            .checked_mul(n_ctx)
            .and_then(|x| x.checked_mul(row_bytes))
            .ok_or_else(|| Error::Config(format!("n_ctx {n_ctx} is too large")))?;
        let slots = (0..n_slots)
            .map(|_| {
                Ok(Slot {
                    len: 0,
                    k: zeroed(per)?,
                    v: zeroed(per)?,
                })
            })
            .collect::<Result<Vec<Slot>>>()?;
        Ok(KvCache {
            ty,
            n_layer,
            n_ctx,
            row: n_head_kv * head_dim,
            row_bytes,
            head_bytes,
            head_dim,
            slots,
        })
    }

    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    /// Bytes the cache holds when every slot is full.
    pub fn bytes(&self) -> usize {
        self.slots.iter().map(|s| s.k.len() + s.v.len()).sum()
    }

    fn slot_ref(&self, slot: usize) -> Result<&Slot> {
        self.slots.get(slot).ok_or_else(|| {
            Error::Input(format!(
                "slot {slot} does not exist (the cache has {} slots)",
                self.slots.len()
            ))
        })
    }

    pub fn check_slot(&self, slot: usize) -> Result<()> {
        self.slot_ref(slot).map(|_| ())
    }

    /// Positions the slot holds.
    pub fn len(&self, slot: usize) -> Result<usize> {
        Ok(self.slot_ref(slot)?.len)
    }

    /// Keeps the first `n` positions (a prefix to reuse); `n` above the length is an error.
    pub fn truncate(&mut self, slot: usize, n: usize) -> Result<()> {
        let len = self.len(slot)?;
        if n > len {
            return Err(Error::Input(format!(
                "cannot truncate slot {slot} to {n} positions: it holds {len}"
            )));
        }
        self.slots[slot].len = n;
        Ok(())
    }

    /// Empties the slot.
    pub fn free(&mut self, slot: usize) -> Result<()> {
        self.truncate(slot, 0)
    }

    /// Marks positions [len, len + n) as filled (after the forward pass wrote them).
    pub(crate) fn set_len(&mut self, slot: usize, n: usize) {
        self.slots[slot].len = n;
    }

    fn at(&self, layer: usize, pos: usize) -> usize {
        (layer * self.n_ctx + pos) * self.row_bytes
    }

    /// Stores one position's keys and values ([Nkv·D] each).
    pub fn write(
        &mut self,
        slot: usize,
        layer: usize,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<()> {
        let d = self.head_dim;
        let (ty, kc, vc) = self.rows_mut(slot, layer, pos, 1)?;
        store_kv(ty, d, (k, v), (kc, vc))
    }

    /// The storage of positions [p0, p0 + n) of one layer of the slot, K and V: [n, Nkv·D]
    /// rows of `ty` as bytes, to be written (`rows_par::store_kv_rows`).
    pub fn rows_mut(
        &mut self,
        slot: usize,
        layer: usize,
        p0: usize,
        n: usize,
    ) -> Result<(KvType, &mut [u8], &mut [u8])> {
        if slot >= self.slots.len() || layer >= self.n_layer || p0 + n > self.n_ctx {
            return Err(Error::Shape(format!(
                "KV rows {p0}..{} of layer {layer}, slot {slot}: the cache holds {} slots, \
                 {} layers, {} positions",
                p0 + n,
                self.slots.len(),
                self.n_layer,
                self.n_ctx
            )));
        }
        let (o, b) = (self.at(layer, p0), n * self.row_bytes);
        let s = &mut self.slots[slot];
        Ok((self.ty, &mut s.k[o..o + b], &mut s.v[o..o + b]))
    }

    /// Keys and values of one layer for positions [0, n): [n, Nkv·D] rows as bytes.
    pub fn layer(&self, slot: usize, layer: usize, n: usize) -> (&[u8], &[u8]) {
        let o = self.at(layer, 0);
        let end = o + n * self.row_bytes;
        let s = &self.slots[slot];
        (&s.k[o..end], &s.v[o..end])
    }

    /// The first `n` positions of the slot (every layer's K and V) as a `kv_blob`.
    pub fn export(&self, slot: usize, n: usize, fingerprint: u64) -> Result<Vec<u8>> {
        let len = self.len(slot)?;
        if n > len {
            return Err(Error::Input(format!(
                "cannot export {n} positions of slot {slot}: it holds {len}"
            )));
        }
        let id = self.layout_id(fingerprint);
        let mut out = vec![0u8; kv_blob::blob_bytes(&id, n)];
        kv_blob::write_header(&id, n, &mut out);
        let sec = self.n_layer * n * self.row_bytes;
        let (kd, vd) = out[HEADER_BYTES..].split_at_mut(sec);
        let s = &self.slots[slot];
        for l in 0..self.n_layer {
            let (o, b) = (self.at(l, 0), n * self.row_bytes);
            kd[l * b..(l + 1) * b].copy_from_slice(&s.k[o..o + b]);
            vd[l * b..(l + 1) * b].copy_from_slice(&s.v[o..o + b]);
        }
        Ok(out)
    }

    /// Replaces the slot's contents with a `kv_blob` (checked first: nothing changes when it
    /// is refused); returns its position count.
    pub fn import(&mut self, slot: usize, data: &[u8], fingerprint: u64) -> Result<usize> {
        self.check_slot(slot)?;
        let id = self.layout_id(fingerprint);
        let n = kv_blob::parse(&id, self.n_ctx, data)?;
        let sec = self.n_layer * n * self.row_bytes;
        let (kd, vd) = data[HEADER_BYTES..].split_at(sec);
        for l in 0..self.n_layer {
            let (o, b) = (self.at(l, 0), n * self.row_bytes);
            let s = &mut self.slots[slot];
            s.k[o..o + b].copy_from_slice(&kd[l * b..(l + 1) * b]);
            s.v[o..o + b].copy_from_slice(&vd[l * b..(l + 1) * b]);
        }
        self.slots[slot].len = n;
        Ok(n)
    }

    pub fn layout_id(&self, fingerprint: u64) -> KvLayoutId {
        KvLayoutId {
            ty: self.ty,
            n_layer: self.n_layer,
            row_bytes: self.row_bytes,
            fingerprint,
        }
    }
}

/// `n` zero bytes, or `Error::Config` where the allocator cannot give them (a context too
/// large for the machine is refused, not an abort). Zeroed by the allocator, as `vec![0; n]`
/// is: pages are touched only as the cache fills.
fn zeroed(n: usize) -> Result<Vec<u8>> {
    zeroed_vec::<u8>(n).ok_or_else(|| {
        Error::Config(format!(
            "the KV cache cannot get {n} bytes a slot for K (and as many for V): lower n_ctx \
             or parallel"
        ))
    })
}

/// Types whose all-zero bytes are the value zero.
///
/// # Safety
/// Implement only for such types (plain integers and floats).
pub(crate) unsafe trait ZeroBits: Copy {}
// SAFETY: zero bytes are 0 for each of these.
unsafe impl ZeroBits for u8 {}
// SAFETY: as above.
unsafe impl ZeroBits for u32 {}
// SAFETY: as above (0.0).
unsafe impl ZeroBits for f32 {}

/// `n` zeros, or None where the allocator cannot give them (the caller says what to lower);
/// zeroed by the allocator, as `vec![0; n]` is.
pub(crate) fn zeroed_vec<T: ZeroBits>(n: usize) -> Option<Vec<T>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<T>(n).ok()?;
    // SAFETY: the layout's size is n · size_of::<T>() > 0 (T is no zero-sized type).
    let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` owns n zeroed T (valid values: ZeroBits) allocated with T's array layout
    // of length n: a Vec of length and capacity n frees it with that same layout.
    Some(unsafe { Vec::from_raw_parts(p, n, n) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_sizes_follow_llama_cpp() {
        // K: the largest power of two from 64 dividing D; V: 64; q4_0 only, D a multiple of 64
        assert_eq!(rot_sizes(KvType::Q4_0, 128), Some((128, 64)));
        assert_eq!(rot_sizes(KvType::Q4_0, 256), Some((256, 64)));
        assert_eq!(rot_sizes(KvType::Q4_0, 192), Some((64, 64)));
        assert_eq!(rot_sizes(KvType::Q4_0, 96), None);
        assert_eq!(rot_sizes(KvType::Q8_0, 128), None);
        assert_eq!(rot_sizes(KvType::F16, 128), None);
    }

    #[test]
    fn the_rotation_is_orthonormal_and_its_own_inverse() {
        let x: Vec<f32> = (0..256)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        for n in [64, 128, 256] {
            let mut y = x.clone();
            fwht(&mut y, n);
            let norm = |v: &[f32]| v.iter().map(|a| (*a as f64).powi(2)).sum::<f64>();
            assert!((norm(&y) - norm(&x)).abs() <= 1e-4 * norm(&x));
            fwht(&mut y, n);
            for (a, b) in x.iter().zip(&y) {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
                    "n = {n}: {a} vs {b}"
                );
            }
        }
    }
}
