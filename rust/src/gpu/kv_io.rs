//! The GPU model's KV export/import (`model::kv_blob`).
//!
//! The VRAM cache is [slot][layer][Nkv][C] head rows (`KvLayout`); a blob holds
//! [L, n, Nkv·D] position rows as the CPU cache does, so the two paths exchange blobs of
//! one model and KV type. Each (layer, head) run of n head rows is one copy.

use super::model::GpuModel;
use crate::error::{Error, Result};
use crate::model::kv_blob::{self, KvLayoutId, HEADER_BYTES};

impl GpuModel {
    /// A `Config` error when the layers are split into several stages (each holds its own
    /// layers' KV; the blob is not assembled from them yet).
    fn refuse_stages(&self, what: &str) -> Result<()> {
        match self.n_stages() {
            1 => Ok(()),
            n => Err(Error::Config(format!(
                "{what} is not supported with the layers split into {n} stages (gpus)"
            ))),
        }
    }

    fn blob_id(&self) -> KvLayoutId {
        KvLayoutId {
            ty: self.st[0].x.lay.ty,
            n_layer: self.st[0].x.lay.n_layer,
            row_bytes: self.st[0].x.lay.n_kv * self.st[0].x.lay.head_bytes(),
            fingerprint: self.fingerprint,
        }
    }

    /// Byte offset of (slot, layer, head) in the K or V cache.
    fn head_off(&self, slot: usize, layer: usize, head: usize) -> usize {
        let lay = &self.st[0].x.lay;
        slot * lay.slot_stride() + lay.layer_offset(layer) + head * lay.n_ctx * lay.head_bytes()
    }

    /// The slot's first `n` positions as a blob.
    pub fn kv_export(&self, slot: usize, n: usize) -> Result<Vec<u8>> {
        self.refuse_recurrent("KV export")?;
        self.refuse_stages("KV export")?;
        let len = self.slot_len(slot)?;
        if n > len {
            return Err(Error::Input(format!(
                "cannot export {n} positions of slot {slot}: it holds {len}"
            )));
        }
        let id = self.blob_id();
        let (hb, rb) = (self.st[0].x.lay.head_bytes(), id.row_bytes);
        let mut out = vec![0u8; kv_blob::blob_bytes(&id, n)];
        kv_blob::write_header(&id, n, &mut out);
        self.st[0].x.stream.sync()?; // the cache as the last step left it
        let mut run = vec![0u8; n * hb]; // [n, D] one head's rows
        let sec = id.n_layer * n * rb;
        for (c, buf) in [&self.st[0].x.b.kc, &self.st[0].x.b.vc]
            .into_iter()
            .enumerate()
        {
            let dst = &mut out[HEADER_BYTES + c * sec..][..sec];
            for l in 0..id.n_layer {
                for h in 0..self.st[0].x.lay.n_kv {
                    buf.copy_to_host(self.head_off(slot, l, h), &mut run)?;
                    for (p, row) in run.chunks_exact(hb).enumerate() {
                        let o = (l * n + p) * rb + h * hb;
                        dst[o..o + hb].copy_from_slice(row);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Replaces the slot's KV with a blob of this model and KV type; returns its length.
    pub fn kv_import(&mut self, slot: usize, data: &[u8]) -> Result<usize> {
        self.refuse_recurrent("KV import")?;
        self.refuse_stages("KV import")?;
        self.slot_len(slot)?;
        let id = self.blob_id();
        let n = kv_blob::parse(&id, self.cfg.n_ctx, data)?;
        let (hb, rb) = (self.st[0].x.lay.head_bytes(), id.row_bytes);
        self.st[0].x.stream.sync()?;
        let mut run = vec![0u8; n * hb];
        let sec = id.n_layer * n * rb;
        for (c, buf) in [&self.st[0].x.b.kc, &self.st[0].x.b.vc]
            .into_iter()
            .enumerate()
        {
            let src = &data[HEADER_BYTES + c * sec..][..sec];
            for l in 0..id.n_layer {
                for h in 0..self.st[0].x.lay.n_kv {
                    for (p, row) in run.chunks_exact_mut(hb).enumerate() {
                        let o = (l * n + p) * rb + h * hb;
                        row.copy_from_slice(&src[o..o + hb]);
                    }
                    if let Err(e) = buf.copy_from_host(self.head_off(slot, l, h), &run) {
                        // part of the slot was overwritten: it holds nothing valid now
                        self.lens[slot] = 0;
                        return Err(e);
                    }
                }
            }
        }
        self.lens[slot] = n;
        Ok(n)
    }
}
