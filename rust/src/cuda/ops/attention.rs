//! Launchers of `cuda/attention.cu`: decode attention (split over the visible positions; the
//! last split to finish merges the partials) and prefill attention (tensor-core tiles), over
//! an f16 or q8_0 cache.
//!
//! Cache layout (`KvLayout`), K and V alike: [slot][layer][Nkv][n_ctx] head rows of D values
//! in the cache type (2·D bytes for f16, D/32·34 for q8_0).
//!
//! Both take a layer's `Mods` (gpt-oss): attention sinks f32 [n_head] (one more logit per
//! head, with no value) and a sliding window (a row at position p sees p − W < j ≤ p).

use super::act::ActOut;
use super::view::{bytes, grid_dim, i32_of, launch, prod, Dv, GRID_X, GRID_YZ};
use crate::cuda::{Arg, Gpu, Stream};
use crate::error::{Error, Result};
use crate::model::KvType;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Head dims the attention kernels are built for.
pub const HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// Most query heads per KV head.
pub const MAX_GROUP: usize = 16;
/// Most query heads per KV head at head dim 256 (the decode kernel's buffers for 16 heads
/// of 256 pass a block's 48 KiB of static shared memory; Qwen3.5 and Qwen3-Next have 8).
pub const MAX_GROUP_D256: usize = 8;
/// Most output dims a prefill block writes (D = 256: two blocks per row block, grid.z).
const PF_DIMS: usize = 128;
/// Most decode splits (partials per head).
pub const MAX_SPLIT: usize = 32;
/// Fewest positions one decode split takes (the kernel's ATT_MIN_CHUNK).
const MIN_CHUNK: usize = 32;
const THREADS: u32 = 128;
const PF_ROWS: usize = 64;

/// A layer's departures from plain causal attention.
#[derive(Clone, Copy, Debug, Default)]
pub struct Mods {
    /// f32 [n_head]: the sinks (None: none).
    pub sinks: Option<Dv>,
    /// W > 0: the window (0: every earlier position).
    pub window: usize,
}

impl Mods {
    /// The kernels' trailing arguments (sinks pointer or null, window), checked.
    fn args(&self, n_head: usize) -> Result<[Arg; 2]> {
        let p = match self.sinks {
            Some(sk) => {
                sk.need("attention sinks", bytes(n_head, 4)?)?;
                sk.ptr
            }
            None => 0,
        };
        Ok([
            Arg::Ptr(p),
            Arg::I32(i32_of("attention window", self.window)?),
        ])
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub ty: KvType,
    pub n_slots: usize,
    pub n_layer: usize,
    pub n_kv: usize,
    pub n_ctx: usize,
    pub d: usize,
}

impl KvLayout {
    /// Checks what the kernels support: f16 or q8_0, D in `HEAD_DIMS`, sizes that fit.
    pub fn new(
        ty: KvType,
        n_slots: usize,
        n_layer: usize,
        n_kv: usize,
        n_ctx: usize,
        d: usize,
    ) -> Result<KvLayout> {
        if matches!(ty, KvType::F32 | KvType::Q4_0) {
            return Err(Error::Config(format!(
                "the GPU KV cache is f16 or q8_0 (kv_type {} runs on the CPU only)",
                ty.name()
            )));
        }
        if !HEAD_DIMS.contains(&d) {
            return Err(Error::Config(format!(
                "the GPU attention kernels take head dims {HEAD_DIMS:?}, not {d}"
            )));
        }
        if n_slots == 0 || n_layer == 0 || n_kv == 0 || n_ctx == 0 {
            return Err(Error::Config(format!(
                "KV cache of {n_slots} slots × {n_layer} layers × {n_kv} heads × {n_ctx} positions"
            )));
        }
        i32_of("n_ctx", n_ctx)?;
        let lay = KvLayout {
            ty,
            n_slots,
            n_layer,
            n_kv,
            n_ctx,
            d,
        };
        prod(&[n_slots, n_layer, n_kv, n_ctx, lay.head_bytes()])
            .map_err(|_| Error::Config(format!("n_ctx {n_ctx} is too large")))?;
        Ok(lay)
    }

    pub fn head_bytes(&self) -> usize {
        match self.ty {
            KvType::F16 => 2 * self.d,
            _ => self.d / 32 * 34,
        }
    }

    /// Bytes of one layer of one slot.
    pub fn layer_bytes(&self) -> usize {
        self.n_kv * self.n_ctx * self.head_bytes()
    }

    pub fn slot_stride(&self) -> usize {
        self.n_layer * self.layer_bytes()
    }

    /// Bytes of each of the K and V caches.
    pub fn total(&self) -> usize {
        self.n_slots * self.slot_stride()
    }

    pub fn layer_offset(&self, layer: usize) -> usize {
        layer * self.layer_bytes()
    }

    pub(crate) fn check(&self, layer: usize, kc: Dv, vc: Dv) -> Result<()> {
        if layer >= self.n_layer {
            return Err(Error::Shape(format!(
                "layer {layer} of a cache of {} layers",
                self.n_layer
            )));
        }
        kc.need("K cache", self.total())?;
        vc.need("V cache", self.total())
    }

    fn group(&self, n_head: usize) -> Result<usize> {
        let most = max_group(self.d);
        if n_head == 0 || !n_head.is_multiple_of(self.n_kv) || n_head / self.n_kv > most {
            return Err(Error::Config(format!(
                "{n_head} query heads over {} KV heads: the GPU kernels take whole groups of \
                 at most {most} at head dim {}",
                self.n_kv, self.d
            )));
        }
        Ok(n_head / self.n_kv)
    }

    fn tag(&self) -> &'static str {
        match self.ty {
            KvType::F16 => "f16",
            _ => "q8_0",
        }
    }
}

/// Most query heads per KV head the kernels take at head dim `d`.
pub fn max_group(d: usize) -> usize {
    if d > 128 {
        MAX_GROUP_D256
    } else {
        MAX_GROUP
    }
}

/// Decode splits for a cache of `n_ctx` positions: about two waves of blocks at full length,
/// each split at least MIN_CHUNK positions.
pub fn n_split(gpu: &Gpu, n_kv: usize, n_ctx: usize) -> usize {
    let waves = (2 * gpu.sm_count() as usize).div_ceil(n_kv.max(1));
    waves.min(n_ctx.div_ceil(MIN_CHUNK)).clamp(1, MAX_SPLIT)
}

/// Bytes of the decode partials: (acc f32 [n_tok, n_head, n_split, d]; per token, i32
/// [n_head] finish counters then (max, sum) f32 [n_head, n_split, 2], so a token's part does
/// not move with n_tok). The second buffer must be zeroed once before its first use
/// (`DevBuf::zero`); every decode launch leaves its counters at zero again.
pub fn part_bytes(n_tok: usize, n_head: usize, n_split: usize, d: usize) -> Result<(usize, usize)> {
    let ml = prod(&[n_tok, n_head, n_split, 2])?;
    Ok((
        bytes(prod(&[n_tok, n_head, n_split, d])?, 4)?,
        bytes(
            ml.checked_add(prod(&[n_tok, n_head])?)
                .ok_or_else(|| Error::Shape("decode partials overflow".into()))?,
            4,
        )?,
    ))
}

/// Decode attention of q f32 [n_tok, n_head, d] (tokens at positions sp[0] + t of slot sp[1],
/// their K/V already in layer `layer` of the cache) into out f32 [n_tok, n_head, d], through
/// the partials part_o / part_ml (`part_bytes`; part_ml zeroed before the first call). One
/// launch: grid (n_split, n_kv, n_tok), of which the blocks the live length needs work.
#[allow(clippy::too_many_arguments)]
pub fn decode(
    gpu: &Gpu,
    s: &Stream,
    lay: &KvLayout,
    layer: usize,
    q: Dv,
    kc: Dv,
    vc: Dv,
    sp: Dv,
    part_o: Dv,
    part_ml: Dv,
    out: Dv,
    n_tok: usize,
    n_head: usize,
    n_split: usize,
    scale: f32,
) -> Result<()> {
    let m = Mods::default();
    decode_mods(
        gpu, s, lay, layer, q, kc, vc, sp, part_o, part_ml, out, n_tok, n_head, n_split, scale, m,
        None,
    )
}

/// `decode` with a layer's `Mods`; with `act`, the output rows also quantized for the output
/// projection (each block its G heads' rows: G·d whole activation items).
#[allow(clippy::too_many_arguments)]
pub fn decode_mods(
    gpu: &Gpu,
    s: &Stream,
    lay: &KvLayout,
    layer: usize,
    q: Dv,
    kc: Dv,
    vc: Dv,
    sp: Dv,
    part_o: Dv,
    part_ml: Dv,
    out: Dv,
    n_tok: usize,
    n_head: usize,
    n_split: usize,
    scale: f32,
    mods: Mods,
    act: Option<ActOut>,
) -> Result<()> {
    lay.check(layer, kc, vc)?;
    let g = lay.group(n_head)?;
    if n_split == 0 || n_split > MAX_SPLIT {
        return Err(Error::Config(format!(
            "decode attention: n_split {n_split} outside 1..={MAX_SPLIT}"
        )));
    }
    let d = lay.d;
    let qb = bytes(prod(&[n_tok, n_head, d])?, 4)?;
    q.need("attention q", qb)?;
    out.need("attention out", qb)?;
    let (po, pml) = part_bytes(n_tok, n_head, n_split, d)?;
    part_o.need("attention partials", po)?;
    part_ml.need("attention partial max/sum", pml)?;
    sp.need("attention step params", 8)?;
    let [sinks, window] = mods.args(n_head)?;
    // each KV head's query heads over hs blocks: G/hs heads a block
    let hs = head_split(g, d, act);
    let gb = g / hs;
    let [qout, kind] = ActOut::args(act, n_tok, n_head * d, gb * d, "attention activations")?;
    if n_tok == 0 {
        return Ok(());
    }
    let name = format!(
        "strata_attn_decode_{}_d{d}_g{}",
        lay.tag(),
        if gb <= 8 { 8 } else { 16 }
    );
    let off = lay.layer_offset(layer) as u64;
    let t = grid_dim("tokens", n_tok, GRID_YZ)?;
    launch(
        gpu,
        s,
        &name,
        (
            n_split as u32,
            grid_dim("KV heads", lay.n_kv * hs, GRID_YZ)?,
            t,
        ),
        THREADS,
        &[
            q.arg(),
            Arg::Ptr(kc.ptr + off),
            Arg::Ptr(vc.ptr + off),
            Arg::U64(lay.slot_stride() as u64),
            sp.arg(),
            part_o.arg(),
            part_ml.arg(),
            out.arg(),
            Arg::I32(i32_of("n_head", n_head)?),
            Arg::I32((lay.n_kv * hs) as i32),
            Arg::I32(lay.n_ctx as i32),
            Arg::I32(n_split as i32),
            Arg::F32(scale),
            sinks,
            window,
            qout,
            kind,
            Arg::I32(hs as i32),
        ],
    )
}

static HEAD_SPLIT: AtomicUsize = AtomicUsize::new(0);

/// Over how many blocks the decode kernel spreads each KV head's query heads (0: the
/// default, `head_split`'s choice; 1: one block per KV head, as before the split): for A/B
/// timings of launches and graphs captured from now on; returns the previous setting. Every
/// choice gives the same logits, bitwise.
pub fn set_head_split(n: usize) -> usize {
    HEAD_SPLIT.swap(n, Ordering::Relaxed)
}

/// The decode kernel's blocks per KV head for G query heads of dim `d` (and the output's
/// quantization `act`): the set value where it divides G and keeps whole activation items
/// per block, else the most of {4, 2, 1} that does and leaves each block at least 2 heads
/// (short contexts: more blocks share the step; the K/V rows are read once per block).
fn head_split(g: usize, d: usize, act: Option<ActOut>) -> usize {
    let ok = |hs: usize| g.is_multiple_of(hs) && act.is_none_or(|a| a.fits(g / hs * d));
    match HEAD_SPLIT.load(Ordering::Relaxed) {
        0 => [4, 2]
            .into_iter()
            .find(|&hs| g / hs >= 2 && ok(hs))
            .unwrap_or(1),
        n if ok(n) => n,
        _ => 1,
    }
}

/// Prefill attention (tensor cores, causal, GQA) of q f32 [n_tok, n_head, d] into out f32
/// [n_tok, n_head, d]; positions and slot as for `decode`.
#[allow(clippy::too_many_arguments)]
pub fn prefill(
    gpu: &Gpu,
    s: &Stream,
    lay: &KvLayout,
    layer: usize,
    q: Dv,
    kc: Dv,
    vc: Dv,
    sp: Dv,
    out: Dv,
    n_tok: usize,
    n_head: usize,
    scale: f32,
) -> Result<()> {
    let m = Mods::default();
    prefill_mods(
        gpu, s, lay, layer, q, kc, vc, sp, out, n_tok, n_head, scale, m,
    )
}

/// `prefill` with a layer's `Mods`.
#[allow(clippy::too_many_arguments)]
pub fn prefill_mods(
    gpu: &Gpu,
    s: &Stream,
    lay: &KvLayout,
    layer: usize,
    q: Dv,
    kc: Dv,
    vc: Dv,
    sp: Dv,
    out: Dv,
    n_tok: usize,
    n_head: usize,
    scale: f32,
    mods: Mods,
) -> Result<()> {
    lay.check(layer, kc, vc)?;
    let g = lay.group(n_head)?;
    let d = lay.d;
    let qb = bytes(prod(&[n_tok, n_head, d])?, 4)?;
    q.need("attention q", qb)?;
    out.need("attention out", qb)?;
    sp.need("attention step params", 8)?;
    let [sinks, window] = mods.args(n_head)?;
    if n_tok == 0 {
        return Ok(());
    }
    let rows = prod(&[n_tok, g])?;
    i32_of("tokens × group", rows)?;
    let off = lay.layer_offset(layer) as u64;
    launch(
        gpu,
        s,
        &format!("strata_attn_prefill_{}_d{d}", lay.tag()),
        (
            grid_dim("row blocks", rows.div_ceil(PF_ROWS), GRID_X)?,
            grid_dim("KV heads", lay.n_kv, GRID_YZ)?,
            d.div_ceil(PF_DIMS) as u32,
        ),
        THREADS,
        &[
            q.arg(),
            Arg::Ptr(kc.ptr + off),
            Arg::Ptr(vc.ptr + off),
            Arg::U64(lay.slot_stride() as u64),
            sp.arg(),
            out.arg(),
            Arg::I32(n_tok as i32),
            Arg::I32(i32_of("n_head", n_head)?),
            Arg::I32(lay.n_kv as i32),
            Arg::I32(lay.n_ctx as i32),
            Arg::F32(scale),
            sinks,
            window,
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_sizes_and_refusals() {
        let l = KvLayout::new(KvType::Q8_0, 2, 3, 4, 100, 128).unwrap();
        assert_eq!(l.head_bytes(), 136);
        assert_eq!(l.layer_bytes(), 4 * 100 * 136);
        assert_eq!(l.slot_stride(), 3 * l.layer_bytes());
        assert_eq!(l.total(), 2 * l.slot_stride());
        assert_eq!(l.layer_offset(2), 2 * l.layer_bytes());
        assert_eq!(
            KvLayout::new(KvType::F16, 1, 1, 1, 8, 64)
                .unwrap()
                .head_bytes(),
            128
        );
        assert!(matches!(
            KvLayout::new(KvType::F32, 1, 1, 1, 8, 64),
            Err(Error::Config(_))
        ));
        assert!(matches!(
            KvLayout::new(KvType::F16, 1, 1, 1, 8, 96),
            Err(Error::Config(_))
        ));
        assert!(KvLayout::new(KvType::F16, 0, 1, 1, 8, 64).is_err());
        assert!(KvLayout::new(KvType::F16, usize::MAX / 2, 4, 4, 1 << 20, 128).is_err());
        assert_eq!(l.group(8).unwrap(), 2);
        assert!(l.group(6).is_err() && l.group(4 * 17).is_err() && l.group(0).is_err());
        // head dim 256: groups of at most 8 (Qwen3.5: 16 query heads over 2)
        let wide = KvLayout::new(KvType::Q8_0, 1, 1, 2, 64, 256).unwrap();
        assert_eq!(wide.head_bytes(), 8 * 34);
        assert_eq!(wide.group(16).unwrap(), 8);
        assert!(matches!(wide.group(2 * 16), Err(Error::Config(_))));
        let small = Dv { ptr: 0, len: 10 };
        assert!(matches!(l.check(0, small, small), Err(Error::Shape(_))));
        let big = Dv {
            ptr: 0,
            len: l.total(),
        };
        assert!(l.check(2, big, big).is_ok());
        assert!(matches!(l.check(3, big, big), Err(Error::Shape(_))));
    }

    #[test]
    fn part_sizes() {
        assert_eq!(
            part_bytes(2, 4, 3, 64).unwrap(),
            (2 * 4 * 3 * 64 * 4, (2 * 4 * 3 * 2 + 2 * 4) * 4)
        );
        assert!(part_bytes(usize::MAX, 2, 2, 64).is_err());
    }
}
