//! `Launcher`: what one chunk's kernel launches use — the GPU, the compute stream, the quant
//! kernels, the weights in VRAM, the KV layout and the buffers (`Bufs`). The kernel sequence
//! itself is `step.rs`; where the routed experts run is the MoE placement's (`placement.rs`).
//!
//! Legend: T = tokens in a chunk (≤ chunk = min(max_chunk, n_ctx), or the hybrid placement's
//! streamed chunk when longer: the buffers hold the longer), H = hidden, Nh / Nkv =
//! query / KV heads, D = head dim, E = experts, K = experts used, F = expert FFN width,
//! V = vocab, C = n_ctx.
//! S = sequences (pieces) in a step (≤ n_slots); a piece is T_p consecutive rows of the step.
//! Every per-call value the kernels need (each piece's pos0 and slot, the token ids) sits in
//! one device buffer (`params` i32 [2·S + T]: S (pos0, slot) pairs, then the T token ids)
//! written before the launches, so a decode step of S one-token pieces is captured once as a
//! CUDA graph and replayed for any slots and positions.

use super::weights::GpuWeights;
use crate::cuda::ops::attention::{self, KvLayout};
use crate::cuda::ops::quant::{self, QuantOps};
use crate::cuda::ops::quant_shared::Branches;
use crate::cuda::ops::view::{bytes, prod};
use crate::cuda::{DevBuf, Gpu, Stream};
use crate::error::Result;
use crate::model::ops::Rope;
use crate::model::HParams;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Chunks of at most this many tokens use the decode attention kernel (split over the
/// positions); longer ones the prefill kernel.
pub const DECODE_MAX_TOKENS: usize = 8;
/// Logit rows computed per output-head launch (bounds the logits buffer).
pub(super) const LOGIT_ROWS: usize = 64;

/// One piece of a step: rows `r0 .. r0 + t` of the step's buffers, one sequence's tokens;
/// its (pos0, slot) pair is the piece's index in `params`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Seg {
    pub r0: usize,
    pub t: usize,
}

pub(super) struct Bufs {
    pub params: DevBuf,      // i32 [2·S + T]: S (pos0, slot) pairs, token ids
    pub x: DevBuf,           // f32 [T, H] residual stream
    pub h: DevBuf,           // f32 [T, H] normed block input
    pub o: DevBuf,           // f32 [T, H] attention output projection
    pub q: DevBuf,           // f32 [T, Nh·D]
    pub att: DevBuf,         // f32 [T, Nh·D]
    pub k: DevBuf,           // f32 [T, Nkv·D]
    pub v: DevBuf,           // f32 [T, Nkv·D]
    pub router: DevBuf,      // f32 [T, E]
    pub router_done: DevBuf, // i32 [1] zero: the fused decode router's finish counter
    pub ids: DevBuf,         // i32 [T, K]
    pub wts: DevBuf,         // f32 [T, K]
    pub act: DevBuf,         // f32 [T, K, F]
    pub ffn_act: DevBuf,     // f32 [T, Fd]: a dense FFN's silu(gate)·up (`ffn.rs`)
    pub ffn_logit: DevBuf,   // f32 [T] its gate logit
    pub ffn_wts: DevBuf,     // f32 [T] its per-row scale
    pub ffn_ones: DevBuf,    // f32 [T] ones (an ungated FFN's scale)
    pub ffn_ids: DevBuf,     // i32 [T] zeros (every row takes the one-expert table's entry 0)
    pub scratch: DevBuf,     // the quant kernels' scratch
    pub part_o: DevBuf,      // decode attention partials
    pub part_ml: DevBuf,
    pub logits: DevBuf, // f32 [LOGIT_ROWS, V]
    pub kc: DevBuf,     // K cache (KvLayout)
    pub vc: DevBuf,     // V cache
    pub cos: DevBuf,    // f32 [C, n_rot/2]
    pub sin: DevBuf,    // f32 [C, n_rot/2]
}

/// i32 words of `params` for steps of `t` rows over at most `n_seq` pieces.
pub(super) fn params_len(n_seq: usize, t: usize) -> usize {
    2 * n_seq.max(1) + t
}

fn alloc_f32(gpu: &Gpu, dims: &[usize]) -> Result<DevBuf> {
    gpu.alloc(bytes(prod(dims)?, 4)?)
}

impl Bufs {
    /// The buffers for steps of `t` rows over at most `lay.n_slots` pieces and the KV cache
    /// of layout `lay` (zeroed: a never-written position holds zeros, not garbage), on
    /// `stream`, which is idle after.
    pub(super) fn new(
        gpu: &Gpu,
        stream: &Stream,
        hp: &HParams,
        lay: &KvLayout,
        t: usize,
        n_ctx: usize,
        n_split: usize,
    ) -> Result<Bufs> {
        let (hd, qd, kvd) = (hp.n_embd, hp.q_dim(), hp.kv_dim());
        let (e, k, f) = (hp.n_expert, hp.n_expert_used, hp.n_ff_exp);
        let fd = hp.n_ff_shexp.max(hp.n_ff_dense).max(1); // the dense FFNs' widest
        let td = t.min(DECODE_MAX_TOKENS);
        let (po, pml) = attention::part_bytes(td, hp.n_head, n_split, hp.head_dim)?;
        let vd = hp.ssm.as_ref().map_or(0, |sp| sp.v_dim()); // the DeltaNet output's width
        let scratch = [hd, qd, vd]
            .iter()
            .map(|&kk| quant::scratch_bytes(kk, t))
            .chain([
                quant::moe_scratch_bytes(hd, f, k, t),
                quant::moe_scratch_bytes(hd, fd, 1, t),
            ])
            .max()
            .unwrap_or(0);
        // cos/sin of every position, from the CPU path's table (exact parity of the angles)
        let rope = Rope::new(hp);
        let half = hp.n_rot / 2;
        let mut cos = vec![0f32; n_ctx * half];
        let mut sin = vec![0f32; n_ctx * half];
        for p in 0..n_ctx {
            let r = p * half..(p + 1) * half;
            rope.table(p, &mut cos[r.clone()], &mut sin[r]);
        }
        let b = Bufs {
            params: gpu.alloc(bytes(params_len(lay.n_slots, t), 4)?)?,
            x: alloc_f32(gpu, &[t, hd])?,
            h: alloc_f32(gpu, &[t, hd])?,
            o: alloc_f32(gpu, &[t, hd])?,
            q: alloc_f32(gpu, &[t, qd])?,
            att: alloc_f32(gpu, &[t, qd])?,
            k: alloc_f32(gpu, &[t, kvd])?,
            v: alloc_f32(gpu, &[t, kvd])?,
            router: alloc_f32(gpu, &[t, e])?,
            router_done: gpu.upload_pod(&[0i32])?,
            ids: alloc_f32(gpu, &[t, k])?,
            wts: alloc_f32(gpu, &[t, k])?,
            act: alloc_f32(gpu, &[t, k, f])?,
            ffn_act: alloc_f32(gpu, &[t, fd])?,
            ffn_logit: alloc_f32(gpu, &[t])?,
            ffn_wts: alloc_f32(gpu, &[t])?,
            ffn_ones: gpu.upload_pod(&vec![1f32; t])?,
            ffn_ids: alloc_f32(gpu, &[t])?,
            scratch: gpu.alloc(scratch)?,
            part_o: gpu.alloc(po)?,
            part_ml: gpu.alloc(pml)?,
            logits: alloc_f32(gpu, &[LOGIT_ROWS.min(t), hp.n_vocab])?,
            kc: gpu.alloc(lay.total())?,
            vc: gpu.alloc(lay.total())?,
            cos: gpu.upload_pod(&cos)?,
            sin: gpu.upload_pod(&sin)?,
        };
        b.kc.zero(stream)?;
        b.vc.zero(stream)?;
        b.part_ml.zero(stream)?; // the decode kernel's finish counters start at zero
        b.ffn_ids.zero(stream)?;
        stream.sync()?;
        Ok(b)
    }
}

/// What the launches of one chunk use (read-only during a step: the MoE placement borrows it
/// beside its own state).
pub(super) struct Launcher {
    pub gpu: Arc<Gpu>,
    pub stream: Stream,
    pub q: QuantOps,
    pub w: GpuWeights,
    pub hp: HParams,
    pub lay: KvLayout,
    pub b: Bufs,
    /// Position splits of the decode attention kernel.
    pub n_split: usize,
    /// [n_layer] each attention layer's place among the model's attention layers (a hybrid
    /// family's recurrent layers keep none: their entries are unused).
    pub kv_of: Vec<usize>,
    /// The stage's layers (`split.rs`; one stage: every layer), and the place of its first
    /// attention layer among the model's (its KV cache holds its own layers only).
    pub layers: Range<usize>,
    pub kv0: usize,
    /// A hybrid family's recurrent state and DeltaNet scratch (`gdn_state`).
    pub rec: Option<super::gdn_state::GdnState>,
    /// Side streams for the one-token projections that share a quantized x (Q/K/V, a
    /// DeltaNet layer's four): parallel branches of the decode graphs.
    pub br: Branches,
    /// Whether the decode chain's producers do their consumers' first step (`set_fusion`
    /// when the model opened): the attention norm and the decode attention quantize their
    /// outputs for the products that read them (`act::ActOut`), and the attention norm adds
    /// the hybrid placement's CPU part (`MoePlacement::handoff_y`).
    pub fuse: bool,
}

static FUSION: AtomicBool = AtomicBool::new(true);

/// Whether GPU models opened from now on fuse the decode chain's producer and consumer
/// kernels (the default) or run each step in a kernel of its own (the same results, more
/// launches: for A/B timings and the device test that checks the two bitwise); returns the
/// previous setting.
pub fn set_fusion(on: bool) -> bool {
    FUSION.swap(on, Ordering::Relaxed)
}

pub(super) fn fusion() -> bool {
    FUSION.load(Ordering::Relaxed)
}

impl Launcher {
    /// Whether this stage embeds the tokens (the first) / runs the final norm and head (the last).
    pub(super) fn first(&self) -> bool {
        self.layers.start == 0
    }

    pub(super) fn last(&self) -> bool {
        self.layers.end == self.hp.n_layer
    }
}
