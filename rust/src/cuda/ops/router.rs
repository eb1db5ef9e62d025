//! Launchers of `cuda/router.cu`: softmax → top-k (ties: lower id) → renormalize; top-k of
//! the logits → softmax over the k (gpt-oss); the sigmoid router with a selection bias; a
//! dense FFN's gate scale.

use super::quant_kernels::MMVQ_THREADS;
use super::view::{bytes, grid_dim, i32_of, launch, prod, Dv, GRID_X};
use crate::cuda::{Arg, Gpu, Stream};
use crate::error::{Error, Result};

/// Most experts and most picks the kernel handles (its shared arrays).
pub const MAX_EXPERTS: usize = 1024;
pub const MAX_TOP_K: usize = 64;

/// Per token t < n_tok: p = softmax(logits[t]), ids[t] = the k largest p (descending, ties to
/// the lower id), w[t] = their p, divided by their sum when `norm`.
/// logits: f32 [n_tok, n_expert]; ids: i32 [n_tok, k]; w: f32 [n_tok, k]; `copy` (ids, w)
/// again (a hybrid layer's routing in mapped host memory), or None.
#[allow(clippy::too_many_arguments)]
pub fn topk(
    gpu: &Gpu,
    s: &Stream,
    logits: Dv,
    ids: Dv,
    w: Dv,
    copy: Option<(Dv, Dv)>,
    n_tok: usize,
    n_expert: usize,
    k: usize,
    norm: bool,
) -> Result<()> {
    check_topk_copy([logits, ids, w], copy, n_tok, n_expert, k)?;
    if n_tok == 0 {
        return Ok(());
    }
    let [ci, cw] = copy_args(copy);
    launch(
        gpu,
        s,
        "strata_router_topk",
        (grid_dim("tokens", n_tok, GRID_X)?, 1, 1),
        32,
        &[
            logits.arg(),
            ids.arg(),
            w.arg(),
            ci,
            cw,
            Arg::I32(i32_of("n_expert", n_expert)?),
            Arg::I32(k as i32),
            Arg::I32(norm as i32),
        ],
    )
}

/// `check_topk` for the routing and for its `copy` (ids, w), if any.
fn check_topk_copy(
    out: [Dv; 3],
    copy: Option<(Dv, Dv)>,
    n_tok: usize,
    n_expert: usize,
    k: usize,
) -> Result<()> {
    check_topk(out, n_tok, n_expert, k)?;
    copy.map_or(Ok(()), |(ci, cw)| {
        check_topk([out[0], ci, cw], n_tok, n_expert, k)
    })
}

/// The kernel arguments of the copy's ids and weights: null pointers without one.
fn copy_args(copy: Option<(Dv, Dv)>) -> [Arg; 2] {
    let (i, w) = copy.map_or((0, 0), |(i, w)| (i.ptr, w.ptr));
    [Arg::Ptr(i), Arg::Ptr(w)]
}

/// One token's softmax router fused with its logits (`strata_router_f32_topk`): logits f32
/// [E] = w_r·x, each row summed as the one-token F32 product's row-per-block kernel sums it
/// (`strata_mmvq_f32_r1`), then ids i32 [k], w f32 [k] (and `copy`) as `topk` gives them from
/// those logits: one launch for the two. w_r: f32 [E, H] (H a multiple of 32); x: f32 [H];
/// `done`: i32 [1], zeroed once, the kernel's finish counter (each launch leaves it at zero).
#[allow(clippy::too_many_arguments)]
pub fn f32_topk(
    gpu: &Gpu,
    s: &Stream,
    [w_r, x, logits]: [Dv; 3],
    ids: Dv,
    w: Dv,
    copy: Option<(Dv, Dv)>,
    done: Dv,
    n_embd: usize,
    n_expert: usize,
    k: usize,
    norm: bool,
) -> Result<()> {
    check_topk_copy([logits, ids, w], copy, 1, n_expert, k)?;
    if !n_embd.is_multiple_of(32) || n_embd == 0 {
        return Err(Error::Shape(format!(
            "fused router: hidden {n_embd} is not a multiple of 32"
        )));
    }
    w_r.need("router weights", bytes(prod(&[n_expert, n_embd])?, 4)?)?;
    x.need("router input", bytes(n_embd, 4)?)?;
    done.need("router finish counter", 4)?;
    let [ci, cw] = copy_args(copy);
    launch(
        gpu,
        s,
        "strata_router_f32_topk",
        (grid_dim("experts", n_expert, GRID_X)?, 1, 1),
        MMVQ_THREADS, // the row-per-block product's blocks
        &[
            w_r.arg(),
            Arg::I32(i32_of("items", n_embd / 32)?),
            x.arg(),
            logits.arg(),
            ids.arg(),
            w.arg(),
            ci,
            cw,
            Arg::I32(i32_of("n_expert", n_expert)?),
            Arg::I32(k as i32),
            Arg::I32(norm as i32),
            done.arg(),
        ],
    )
}

/// How `biased_topk` turns a token's logits into the probabilities it weighs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// σ per expert (glm4moe).
    Sigmoid = 0,
    /// Softmax over the experts (ERNIE 4.5).
    Softmax = 1,
}

/// Per token t < n_tok (glm4moe's sigmoid, ERNIE 4.5's softmax routing): p = `gate`
/// (logits[t]), ids[t] = the k largest p + bias (descending, ties to the lower id), w[t] =
/// their p, divided by their sum when `norm` (f64 sum, clamped at 2^-14), times `scale`.
/// logits: f32 [n_tok, n_expert]; bias: f32 [n_expert]; ids: i32 [n_tok, k]; w: f32 [n_tok, k].
#[allow(clippy::too_many_arguments)]
pub fn biased_topk(
    gpu: &Gpu,
    s: &Stream,
    logits: Dv,
    bias: Dv,
    ids: Dv,
    w: Dv,
    n_tok: usize,
    n_expert: usize,
    k: usize,
    gate: Gate,
    norm: bool,
    scale: f32,
) -> Result<()> {
    check_topk([logits, ids, w], n_tok, n_expert, k)?;
    bias.need("router selection bias", bytes(n_expert, 4)?)?;
    if n_tok == 0 {
        return Ok(());
    }
    launch(
        gpu,
        s,
        "strata_router_biased_topk",
        (grid_dim("tokens", n_tok, GRID_X)?, 1, 1),
        32,
        &[
            logits.arg(),
            bias.arg(),
            ids.arg(),
            w.arg(),
            Arg::I32(i32_of("n_expert", n_expert)?),
            Arg::I32(k as i32),
            Arg::I32(gate as i32),
            Arg::I32(norm as i32),
            Arg::F32(scale),
        ],
    )
}

/// Per token t < n_tok (gpt-oss's `Routing::SoftmaxWeight`): ids[t] = the k largest logits
/// (descending, ties to the lower id), w[t] = the softmax over those k.
/// logits: f32 [n_tok, n_expert]; ids: i32 [n_tok, k]; w: f32 [n_tok, k].
#[allow(clippy::too_many_arguments)]
pub fn topk_softmax(
    gpu: &Gpu,
    s: &Stream,
    logits: Dv,
    ids: Dv,
    w: Dv,
    n_tok: usize,
    n_expert: usize,
    k: usize,
) -> Result<()> {
    check_topk([logits, ids, w], n_tok, n_expert, k)?;
    if n_tok == 0 {
        return Ok(());
    }
    launch(
        gpu,
        s,
        "strata_router_topk_softmax",
        (grid_dim("tokens", n_tok, GRID_X)?, 1, 1),
        32,
        &[
            logits.arg(),
            ids.arg(),
            w.arg(),
            Arg::I32(i32_of("n_expert", n_expert)?),
            Arg::I32(k as i32),
        ],
    )
}

/// The routers' limits and buffers: logits f32 [n_tok, n_expert], ids / w [n_tok, k].
fn check_topk([logits, ids, w]: [Dv; 3], n_tok: usize, n_expert: usize, k: usize) -> Result<()> {
    if n_expert == 0 || n_expert > MAX_EXPERTS || k == 0 || k > n_expert.min(MAX_TOP_K) {
        return Err(Error::Config(format!(
            "router: {k} of {n_expert} experts; the GPU router takes up to {MAX_EXPERTS} \
             experts and 1..={MAX_TOP_K} picks"
        )));
    }
    logits.need("router logits", bytes(prod(&[n_tok, n_expert])?, 4)?)?;
    ids.need("router ids", bytes(prod(&[n_tok, k])?, 4)?)?;
    w.need("router weights", bytes(prod(&[n_tok, k])?, 4)?)
}

/// The scale `ffn_gate` computes from a gate logit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateMode {
    /// silu(g)/g (g = 0: 0.5).
    SiluOverX,
    /// σ(g).
    Sigmoid,
}

/// w[i] = the scale of gate logit g[i] for i < n (`GateMode`); g, w: f32 [n].
pub fn ffn_gate(gpu: &Gpu, s: &Stream, g: Dv, w: Dv, n: usize, mode: GateMode) -> Result<()> {
    g.need("ffn gate logits", bytes(n, 4)?)?;
    w.need("ffn gate weights", bytes(n, 4)?)?;
    if n == 0 {
        return Ok(());
    }
    launch(
        gpu,
        s,
        "strata_ffn_gate",
        (grid_dim("rows", n.div_ceil(256), GRID_X)?, 1, 1),
        256,
        &[
            g.arg(),
            w.arg(),
            Arg::I32(i32_of("n", n)?),
            Arg::I32((mode == GateMode::Sigmoid) as i32),
        ],
    )
}
