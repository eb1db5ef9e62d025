//! The GPU model's KV export/import (`model::kv_blob`).
//!
//! The VRAM cache is [slot][layer][Nkv][C] head rows (`KvLayout`), per stage of the layer
//! split (each stage its own attention layers); a blob holds [L, n, Nkv·D] position rows of
//! every attention layer as the CPU cache does, so the two paths and any two splits exchange
//! blobs of one model and KV type. Each (layer, head) run of n head rows is one copy.

use super::model::GpuModel;
use crate::error::{Error, Result};
use crate::model::kv_blob::{self, KvLayoutId, HEADER_BYTES};

impl GpuModel {
    fn blob_id(&self) -> KvLayoutId {
        let lay = &self.st[0].x.lay;
        KvLayoutId {
            ty: lay.ty,
            n_layer: self.hp.n_attn_layer(),
            row_bytes: lay.n_kv * lay.head_bytes(),
            fingerprint: self.fingerprint,
        }
    }

    /// Per stage: its first attention layer's place in the blob and its attention layers
    /// (its cache holds them; a stage of recurrent layers only has none).
    fn stage_layers(&self) -> Vec<(usize, usize)> {
        let rec = |l: usize| self.hp.ssm.as_ref().is_some_and(|sp| sp.recurrent[l]);
        self.st
            .iter()
            .map(|s| (s.x.kv0, s.x.layers.clone().filter(|&l| !rec(l)).count()))
            .collect()
    }

    /// Byte offset of (slot, layer, head) in stage `s`'s K or V cache (`layer`: its place in
    /// that cache).
    fn head_off(&self, s: usize, slot: usize, layer: usize, head: usize) -> usize {
        let lay = &self.st[s].x.lay;
        slot * lay.slot_stride() + lay.layer_offset(layer) + head * lay.n_ctx * lay.head_bytes()
    }

    /// The slot's first `n` positions as a blob (every stage's layers, in order).
    pub fn kv_export(&self, slot: usize, n: usize) -> Result<Vec<u8>> {
        self.refuse_recurrent("KV export")?;
        let len = self.idle_slot(slot)?;
        if n > len {
            return Err(Error::Input(format!(
                "cannot export {n} positions of slot {slot}: it holds {len}"
            )));
        }
        let id = self.blob_id();
        let (hb, rb) = (self.st[0].x.lay.head_bytes(), id.row_bytes);
        let mut out = vec![0u8; kv_blob::blob_bytes(&id, n)];
        kv_blob::write_header(&id, n, &mut out);
        self.sync_all()?; // the caches as the last step left them
        let mut run = vec![0u8; n * hb]; // [n, D] one head's rows
        let sec = id.n_layer * n * rb;
        for (s, (kv0, nl)) in self.stage_layers().into_iter().enumerate() {
            let x = &self.st[s].x;
            for (c, buf) in [&x.b.kc, &x.b.vc].into_iter().enumerate() {
                let dst = &mut out[HEADER_BYTES + c * sec..][..sec];
                for l in 0..nl {
                    for h in 0..x.lay.n_kv {
                        buf.copy_to_host(self.head_off(s, slot, l, h), &mut run)?;
                        for (p, row) in run.chunks_exact(hb).enumerate() {
                            let o = ((kv0 + l) * n + p) * rb + h * hb;
                            dst[o..o + hb].copy_from_slice(row);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Replaces the slot's KV with a blob of this model and KV type; returns its length.
    pub fn kv_import(&mut self, slot: usize, data: &[u8]) -> Result<usize> {
        self.refuse_recurrent("KV import")?;
        self.idle_slot(slot)?;
        let id = self.blob_id();
        let n = kv_blob::parse(&id, self.cfg.n_ctx, data)?;
        let (hb, rb) = (self.st[0].x.lay.head_bytes(), id.row_bytes);
        self.sync_all()?;
        let mut run = vec![0u8; n * hb];
        let sec = id.n_layer * n * rb;
        for (s, (kv0, nl)) in self.stage_layers().into_iter().enumerate() {
            for c in 0..2 {
                let src = &data[HEADER_BYTES + c * sec..][..sec];
                for l in 0..nl {
                    for h in 0..self.st[s].x.lay.n_kv {
                        for (p, row) in run.chunks_exact_mut(hb).enumerate() {
                            let o = ((kv0 + l) * n + p) * rb + h * hb;
                            row.copy_from_slice(&src[o..o + hb]);
                        }
                        let x = &self.st[s].x;
                        let buf = if c == 0 { &x.b.kc } else { &x.b.vc };
                        if let Err(e) = buf.copy_from_host(self.head_off(s, slot, l, h), &run) {
                            // part of the slot was overwritten: it holds nothing valid now
                            self.lens[slot] = 0;
                            return Err(e);
                        }
                    }
                }
            }
        }
        self.lens[slot] = n;
        Ok(n)
    }
}
