//! Launchers of `cuda/rope.cu`: RoPE NEOX with a host-made cos/sin table, and the attention
//! block's fused per-head step (Q/K/V biases, q/k RMSNorm, NEOX or NORM rotation, K/V rows
//! into the cache).

use super::attention::KvLayout;
use super::view::{bytes, grid_dim, i32_of, launch, prod, Dv, GRID_X, GRID_YZ};
use crate::cuda::{Arg, Gpu, Stream};
use crate::error::{Error, Result};
use crate::model::KvType;

/// x: f32 [n_tok, n_head, d] rotated in place at positions sp[0] + t; cos, sin: f32
/// [n_pos, n_rot/2] (rows past n_pos are never read); sp: device i32 [2] (pos0, slot).
#[allow(clippy::too_many_arguments)]
pub fn neox(
    gpu: &Gpu,
    s: &Stream,
    x: Dv,
    cos: Dv,
    sin: Dv,
    sp: Dv,
    n_tok: usize,
    n_head: usize,
    d: usize,
    n_rot: usize,
    n_pos: usize,
) -> Result<()> {
    if n_rot == 0 || !n_rot.is_multiple_of(2) || n_rot > d {
        return Err(Error::Config(format!(
            "rope: n_rot {n_rot} must be even and in 2..={d}"
        )));
    }
    x.need("rope x", bytes(prod(&[n_tok, n_head, d])?, 4)?)?;
    let tab = bytes(prod(&[n_pos, n_rot / 2])?, 4)?;
    cos.need("rope cos", tab)?;
    sin.need("rope sin", tab)?;
    sp.need("rope step params", 8)?;
    if n_tok == 0 || n_head == 0 {
        return Ok(());
    }
    launch(
        gpu,
        s,
        "strata_rope_neox",
        (
            grid_dim("heads", n_head, GRID_X)?,
            grid_dim("tokens", n_tok, GRID_YZ)?,
            1,
        ),
        32,
        &[
            x.arg(),
            cos.arg(),
            sin.arg(),
            sp.arg(),
            Arg::I32(i32_of("n_head", n_head)?),
            Arg::I32(i32_of("d", d)?),
            Arg::I32(n_rot as i32),
            Arg::I32(i32_of("n_pos", n_pos)?),
        ],
    )
}

/// A family's per-head options of the fused step: the q/k RMSNorm weights `[qn, kn]` f32 [d]
/// (None: no norm), the Q/K/V biases `[qb, kb, vb]` f32 [n_head·d], [n_kv·d], [n_kv·d]
/// (None: none), and the rotated pairs (`neox`: (i, i + n_rot/2), else (2i, 2i + 1)).
#[derive(Clone, Copy, Debug)]
pub struct QkvBlock {
    pub norm: Option<[Dv; 2]>,
    pub bias: Option<[Dv; 3]>,
    pub neox: bool,
}

/// The per-head step of the attention block for n_tok tokens at positions sp[0] + t of slot
/// sp[1]: q, k, v heads get their biases (`blk.bias`); q heads are RMS-normed (`blk.norm`)
/// and rotated in place; k heads normed, rotated and written to layer `layer` of the K cache;
/// v rows written to the V cache.
/// q: f32 [n_tok, n_head, d]; k, v: f32 [n_tok, n_kv, d]; cos, sin: f32 [n_ctx, n_rot/2];
/// kc, vc: the whole caches (`lay`).
#[allow(clippy::too_many_arguments)]
pub fn qkv(
    gpu: &Gpu,
    s: &Stream,
    lay: &KvLayout,
    layer: usize,
    q: Dv,
    k: Dv,
    v: Dv,
    blk: QkvBlock,
    cos: Dv,
    sin: Dv,
    sp: Dv,
    kc: Dv,
    vc: Dv,
    n_tok: usize,
    n_head: usize,
    n_rot: usize,
    eps: f32,
) -> Result<()> {
    let d = lay.d;
    lay.check(layer, kc, vc)?;
    if d > 256 || n_rot == 0 || !n_rot.is_multiple_of(2) || n_rot > d {
        return Err(Error::Config(format!(
            "rope qkv: head dim {d} (≤ 256) and n_rot {n_rot} (even, ≤ d)"
        )));
    }
    q.need("rope q", bytes(prod(&[n_tok, n_head, d])?, 4)?)?;
    let kvb = bytes(prod(&[n_tok, lay.n_kv, d])?, 4)?;
    k.need("rope k", kvb)?;
    v.need("rope v", kvb)?;
    let null = Arg::Ptr(0);
    let norm = match blk.norm {
        Some([qn, kn]) => {
            qn.need("q norm", bytes(d, 4)?)?;
            kn.need("k norm", bytes(d, 4)?)?;
            [qn.arg(), kn.arg()]
        }
        None => [null, null],
    };
    let bias = match blk.bias {
        Some([qb, kb, vb]) => {
            qb.need("q bias", bytes(prod(&[n_head, d])?, 4)?)?;
            kb.need("k bias", bytes(prod(&[lay.n_kv, d])?, 4)?)?;
            vb.need("v bias", bytes(prod(&[lay.n_kv, d])?, 4)?)?;
            [qb.arg(), kb.arg(), vb.arg()]
        }
        None => [null, null, null],
    };
    let tab = bytes(prod(&[lay.n_ctx, n_rot / 2])?, 4)?;
    cos.need("rope cos", tab)?;
    sin.need("rope sin", tab)?;
    sp.need("rope step params", 8)?;
    if n_tok == 0 {
        return Ok(());
    }
    let name = match lay.ty {
        KvType::F16 => "strata_rope_qkv_f16",
        KvType::Q8_0 => "strata_rope_qkv_q8_0",
        KvType::F32 | KvType::Q4_0 => unreachable!("KvLayout refuses f32 and q4_0"),
    };
    let off = lay.layer_offset(layer) as u64;
    let [qn, kn] = norm;
    let [qb, kb, vb] = bias;
    launch(
        gpu,
        s,
        name,
        (
            grid_dim("heads", n_head + 2 * lay.n_kv, GRID_X)?,
            grid_dim("tokens", n_tok, GRID_YZ)?,
            1,
        ),
        32,
        &[
            q.arg(),
            k.arg(),
            v.arg(),
            qn,
            kn,
            qb,
            kb,
            vb,
            cos.arg(),
            sin.arg(),
            sp.arg(),
            Arg::Ptr(kc.ptr + off),
            Arg::Ptr(vc.ptr + off),
            Arg::U64(lay.slot_stride() as u64),
            Arg::I32(i32_of("n_head", n_head)?),
            Arg::I32(i32_of("n_kv", lay.n_kv)?),
            Arg::I32(d as i32),
            Arg::I32(n_rot as i32),
            Arg::I32(blk.neox as i32),
            Arg::I32(i32_of("n_ctx", lay.n_ctx)?),
            Arg::F32(eps),
        ],
    )
}
