//! Weights of every family (`arch`) as zero-copy views into the GGUF map (docs/FORMATS.md §4, "Tensors").
//!
//! Matrices are referenced by their tensor info and resolved to byte slices of the mmap on
//! use; nothing is copied except the small norm vectors, converted once to f32. Every tensor
//! is checked at load: present, of the expected shape, and of a type Strata can run.
//!
//! The dense `qwen3` runs as qwen3moe with one expert: `ffn_gate`/`ffn_up` (F, H) and
//! `ffn_down` (H, F) are the same bytes as stacked experts (1, F, H) / (1, H, F), and the
//! router is any finite F32 (1, H) row (softmax over one logit is exactly 1, so every token
//! takes expert 0 with weight 1): `ffn_norm` itself, read in place.
//! Shapes in numpy order: H = hidden, V = vocab, Nh·D / Nkv·D = q / kv width, E = experts,
//! F = expert FFN width, Fs = shared expert FFN width.
//! Which tensors a layer has follows the family's graph (`arch::Graph`): Q/K/V/O biases, q/k
//! norms, attention sinks, the router and expert biases and the shared expert are loaded
//! where the graph names them and must then be present.

use super::arch::{Experts, Ffn, Shared};
use super::compute::{ExpertLayer, QExperts, QMatrix};
use super::deltanet::DeltaNetWeights;
use super::hparams::HParams;
use super::moe_oai::ExpertBias;
use crate::error::{Error, Result};
use crate::gguf::{Gguf, TensorInfo};
use crate::quant::{self, dot, GgmlType};
use std::sync::Arc;

pub struct LayerWeights {
    pub attn_norm: Vec<f32>, // [H]
    pub wq: TensorInfo,      // (Nh·D, H)
    pub wk: TensorInfo,      // (Nkv·D, H)
    pub wv: TensorInfo,      // (Nkv·D, H)
    pub wo: TensorInfo,      // (H, Nh·D)
    /// [D] each, where the graph has q/k norms.
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Q, K, V biases [Nh·D], [Nkv·D], [Nkv·D], where the graph has them.
    pub qkv_bias: Option<[Vec<f32>; 3]>,
    pub ffn_norm: Vec<f32>, // [H]
    pub router: TensorInfo, // (E, H)
    pub gate: TensorInfo,   // (E, F, H)
    pub up: TensorInfo,     // (E, F, H)
    pub down: TensorInfo,   // (E, H, F)
    /// A leading dense layer (`Graph::dense_lead`): gate/up/down hold its one FFN
    /// (1, Fd, H) / (1, H, Fd), run as plain matrices; `router` is unused.
    pub dense_ffn: bool,
    /// The selection bias [E] of `Routing::SigmoidBias` / `SoftmaxBias` (`exp_probs_b.bias`).
    pub exp_probs_b: Option<Vec<f32>>,
    pub shared: Option<SharedExpert>,
    /// `attn_output.bias` [H], where the graph has it (`Graph::o_bias`).
    pub o_bias: Option<Vec<f32>>,
    /// `attn_sinks` [Nh], where the graph has them (`Graph::sinks`).
    pub sinks: Option<Vec<f32>>,
    /// `ffn_gate_inp.bias` [E], where the graph has it (`Graph::router_bias`).
    pub router_bias: Option<Vec<f32>>,
    /// The experts' biases (`Experts::OaiBiased`).
    pub exp_bias: Option<ExpertBias>,
    /// A recurrent layer of a hybrid family: its Gated DeltaNet mixer stands in for
    /// attention, and `wq`/`wk`/`wv`/`wo` are empty (0 × 0) and unused.
    pub deltanet: Option<Box<DeltaNetWeights>>,
}

/// A dense SwiGLU expert every token takes, scaled by sigmoid(gate_inp·x) where it has a gate.
pub struct SharedExpert {
    pub gate_inp: Option<TensorInfo>, // (1, H): ffn_gate_inp_shexp, [H] in the file
    /// The gate is σ(x) (`Shared::Sigmoid`), else silu(x)/x.
    pub sigmoid: bool,
    pub gate: TensorInfo, // (Fs, H)
    pub up: TensorInfo,   // (Fs, H)
    pub down: TensorInfo, // (H, Fs)
}

pub struct Weights {
    pub gguf: Arc<Gguf>,
    pub token_embd: TensorInfo, // (V, H)
    pub output_norm: Vec<f32>,  // [H]
    pub output: TensorInfo,     // (V, H): output.weight, or token_embd when tied
    pub layers: Vec<LayerWeights>,
    /// The NextN / MTP layer after the trunk, where the file has one (`mtp`).
    pub mtp: Option<super::mtp::MtpWeights>,
}

/// Names of the types that have dot kernels (what Strata runs).
pub fn runnable_types() -> String {
    GgmlType::ALL
        .iter()
        .filter(|t| dot::supports(**t))
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

fn tensor<'a>(g: &'a Gguf, name: &str) -> Result<&'a TensorInfo> {
    let t = g.tensor(name).ok_or_else(|| {
        Error::Model(format!(
            "tensor {name} is missing (the file's architecture needs it; fused \
             ffn_gate_up_exps/attn_qkv layouts are not supported)"
        ))
    })?;
    // an empty weight is no weight: refused here, before any row of it is read
    if t.dims.contains(&0) {
        return Err(Error::Model(format!(
            "tensor {name} has shape {:?}: a dimension of 0",
            t.shape()
        )));
    }
    Ok(t)
}

/// Checks a tensor's ggml `ne` against `want` (fastest first) and its type.
fn check(t: &TensorInfo, want: &[usize], needs_dot: bool) -> Result<()> {
    let got: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
    // As llama.cpp's loader: dimensions past those expected must be 1 ([8, 1] is a vector
    // of 8: ERNIE 4.5's converter writes its selection bias so).
    let dim = |v: &[usize], i: usize| v.get(i).copied().unwrap_or(1);
    if (0..got.len().max(want.len())).any(|i| dim(&got, i) != dim(want, i)) {
        let rev = |v: &[usize]| v.iter().rev().copied().collect::<Vec<_>>();
        return Err(Error::Model(format!(
            "tensor {} has shape {:?}, expected {:?} from the metadata",
            t.name,
            rev(&got),
            rev(want)
        )));
    }
    if needs_dot && !dot::supports(t.ty) {
        return Err(Error::Model(format!(
            "tensor {} has type {}, which Strata cannot run yet; Strata runs: {}",
            t.name,
            t.ty.name(),
            runnable_types()
        )));
    }
    if t.ty.row_bytes(want[0]).is_none() {
        return Err(Error::Model(format!(
            "tensor {}: rows of {} elements are not whole {} blocks",
            t.name,
            want[0],
            t.ty.name()
        )));
    }
    Ok(())
}

pub(super) fn matrix(g: &Gguf, name: &str, rows: usize, cols: usize) -> Result<TensorInfo> {
    let t = tensor(g, name)?;
    check(t, &[cols, rows], true)?;
    Ok(t.clone())
}

fn experts(g: &Gguf, name: &str, e: usize, rows: usize, cols: usize) -> Result<TensorInfo> {
    let t = tensor(g, name)?;
    check(t, &[cols, rows, e], true)?;
    Ok(t.clone())
}

/// A dense FFN matrix (rows, cols) as a stack of one expert (1, rows, cols): same bytes.
fn one_expert(g: &Gguf, name: &str, rows: usize, cols: usize) -> Result<TensorInfo> {
    let mut t = matrix(g, name, rows, cols)?;
    t.dims.push(1);
    Ok(t)
}

/// The router of a one-expert layer: the F32 vector `name` [H] viewed as a (1, H) matrix.
fn one_expert_router(g: &Gguf, name: &str, h: usize) -> Result<TensorInfo> {
    let mut t = tensor(g, name)?.clone();
    check(&t, &[h], false)?;
    if t.ty != GgmlType::F32 {
        return Err(Error::Model(format!(
            "tensor {name} has type {}; the dense FFN's router reads it as F32",
            t.ty.name()
        )));
    }
    t.dims.push(1);
    Ok(t)
}

/// The empty (0 × 0) matrix standing for a recurrent layer's absent attention projections.
fn absent(name: String) -> TensorInfo {
    TensorInfo {
        name,
        ty: GgmlType::F32,
        dims: vec![0, 0],
        shard: 0,
        offset: 0,
        nbytes: 0,
    }
}

/// A one-row matrix (1, H) from a tensor stored as [H] or (1, H).
fn one_row(g: &Gguf, name: &str, h: usize) -> Result<TensorInfo> {
    let mut t = tensor(g, name)?.clone();
    if t.dims.len() == 1 {
        t.dims.push(1);
    }
    check(&t, &[h, 1], true)?;
    Ok(t)
}

pub(super) fn vector(g: &Gguf, name: &str, n: usize) -> Result<Vec<f32>> {
    floats(g, name, &[n])
}

/// A small tensor of ggml shape `ne` (fastest first) converted to f32.
pub(super) fn floats(g: &Gguf, name: &str, ne: &[usize]) -> Result<Vec<f32>> {
    let t = tensor(g, name)?;
    check(t, ne, false)?;
    let mut v = vec![0f32; ne.iter().product()];
    quant::dequantize(t.ty, g.data(t), &mut v).map_err(|e| {
        Error::Model(format!(
            "tensor {} has type {}, which Strata cannot convert: {e}",
            t.name,
            t.ty.name()
        ))
    })?;
    Ok(v)
}

/// Layer `l`'s weights (`blk.{l}.*`), as the family's graph names them; `l` ≥ `hp.n_layer` is
/// a NextN / MTP layer (an attention layer: no DeltaNet mixer, never a leading dense one).
pub(super) fn load_layer(g: &Gguf, hp: &HParams, l: usize) -> Result<LayerWeights> {
    let h = hp.n_embd;
    let gr = hp.graph;
    let dense = gr.ffn == Ffn::DenseAsOneExpert;
    let fs = hp.n_ff_shexp;
    let (qd, kvd, d, e, f) = (
        hp.q_dim(),
        hp.kv_dim(),
        hp.head_dim,
        hp.n_expert,
        hp.n_ff_exp,
    );
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    let b = |s: &str| format!("blk.{l}.{s}.bias");
    let qkv_bias = match gr.qkv_bias {
        true => Some([
            vector(g, &b("attn_q"), qd)?,
            vector(g, &b("attn_k"), kvd)?,
            vector(g, &b("attn_v"), kvd)?,
        ]),
        false => None,
    };
    let lead = l < gr.dense_lead;
    let shared = match gr.shared {
        Shared::None => None,
        _ if lead => None,
        sh => Some(SharedExpert {
            gate_inp: match sh {
                Shared::Gated | Shared::Sigmoid => Some(one_row(g, &n("ffn_gate_inp_shexp"), h)?),
                _ => None,
            },
            sigmoid: sh == Shared::Sigmoid,
            gate: matrix(g, &n("ffn_gate_shexp"), fs, h)?,
            up: matrix(g, &n("ffn_up_shexp"), fs, h)?,
            down: matrix(g, &n("ffn_down_shexp"), h, fs)?,
        }),
    };
    let exp_probs_b = match gr.routing {
        r if r.has_selection_bias() && !lead => Some(vector(g, &b("exp_probs_b"), e)?),
        _ => None,
    };
    let (one, fl, fnorm) = (
        dense || lead,
        if lead { hp.n_ff_dense } else { f },
        gr.ffn_norm,
    );
    // A hybrid's recurrent layer: its DeltaNet weights, no attention.
    let deltanet = match (gr.hybrid, &hp.ssm) {
        (Some(hy), Some(sp)) if sp.recurrent.get(l) == Some(&true) => {
            let index = sp.recurrent[..l].iter().filter(|&&r| r).count();
            Some(Box::new(DeltaNetWeights::load(g, l, index, h, sp, hy.ba)?))
        }
        _ => None,
    };
    let attn = deltanet.is_none();
    let qk = |s: &str| match gr.qk_norm && attn {
        true => vector(g, &n(s), d).map(Some),
        false => Ok(None),
    };
    let opt = |on: bool, name: String, n: usize| match on {
        true => vector(g, &name, n).map(Some),
        false => Ok(None),
    };
    let exp_bias = match gr.experts {
        Experts::OaiBiased { .. } if !lead && !dense => Some(ExpertBias {
            gate: floats(g, &b("ffn_gate_exps"), &[f, e])?,
            up: floats(g, &b("ffn_up_exps"), &[f, e])?,
            down: floats(g, &b("ffn_down_exps"), &[h, e])?,
        }),
        _ => None,
    };
    // A hybrid's attention projects q and its output gate: (Nh·2D, H).
    let q_rows = if gr.hybrid.is_some() { 2 * qd } else { qd };
    let proj = |s: &str, rows, cols| match attn {
        true => matrix(g, &n(s), rows, cols),
        false => Ok(absent(n(s))),
    };
    Ok(LayerWeights {
        o_bias: opt(gr.o_bias, b("attn_output"), h)?,
        sinks: opt(gr.sinks, n("attn_sinks"), hp.n_head)?,
        router_bias: opt(gr.router_bias && !lead && !dense, b("ffn_gate_inp"), e)?,
        exp_bias,
        attn_norm: vector(g, &n("attn_norm"), h)?,
        wq: proj("attn_q", q_rows, h)?,
        wk: proj("attn_k", kvd, h)?,
        wv: proj("attn_v", kvd, h)?,
        wo: proj("attn_output", h, qd)?,
        q_norm: qk("attn_q_norm")?,
        k_norm: qk("attn_k_norm")?,
        qkv_bias,
        ffn_norm: vector(g, &n(fnorm), h)?,
        router: if one {
            one_expert_router(g, &n(fnorm), h)?
        } else {
            matrix(g, &n("ffn_gate_inp"), e, h)?
        },
        gate: if one {
            one_expert(g, &n("ffn_gate"), fl, h)?
        } else {
            experts(g, &n("ffn_gate_exps"), e, f, h)?
        },
        up: if one {
            one_expert(g, &n("ffn_up"), fl, h)?
        } else {
            experts(g, &n("ffn_up_exps"), e, f, h)?
        },
        down: if one {
            one_expert(g, &n("ffn_down"), h, fl)?
        } else {
            experts(g, &n("ffn_down_exps"), e, h, f)?
        },
        dense_ffn: lead,
        exp_probs_b,
        shared,
        deltanet,
    })
}

impl Weights {
    /// Loads and checks every tensor; completes `hp.n_vocab` and (if absent) `hp.n_ff_exp`.
    pub fn load(gguf: Arc<Gguf>, hp: &mut HParams) -> Result<Weights> {
        let g = &*gguf;
        let h = hp.n_embd;
        let te = tensor(g, "token_embd.weight")?;
        if te.dims.len() != 2 || te.dims[0] as usize != h {
            return Err(Error::Model(format!(
                "tensor token_embd.weight has shape {:?}, expected (n_vocab, {h})",
                te.shape()
            )));
        }
        hp.n_vocab = te.dims[1] as usize;
        check(te, &[h, hp.n_vocab], false)?;
        // The embedding is read by dequantizing rows: check the type converts.
        let mut row = vec![0f32; h];
        let rb = te.ty.row_bytes(h).unwrap_or(0);
        quant::dequantize(te.ty, &g.data(te)[..rb], &mut row).map_err(|e| {
            Error::Model(format!(
                "tensor token_embd.weight has type {}, which Strata cannot convert: {e}",
                te.ty.name()
            ))
        })?;
        let gr = hp.graph;
        let moe0 = gr.dense_lead; // the first layer with experts
        if hp.n_ff_exp == 0 {
            let t = tensor(g, &format!("blk.{moe0}.ffn_gate_exps.weight"))?;
            hp.n_ff_exp = t.dims.get(1).copied().unwrap_or(0) as usize;
        }
        if gr.shared != Shared::None && hp.n_ff_shexp == 0 {
            let t = tensor(g, &format!("blk.{moe0}.ffn_gate_shexp.weight"))?;
            hp.n_ff_shexp = t.dims.get(1).copied().unwrap_or(0) as usize;
        }
        let output = match g.tensor("output.weight") {
            Some(_) => matrix(g, "output.weight", hp.n_vocab, h)?,
            None => matrix(g, "token_embd.weight", hp.n_vocab, h)?,
        };
        let layers = (0..hp.n_layer)
            .map(|l| load_layer(g, hp, l))
            .collect::<Result<Vec<_>>>()?;
        let mtp = super::mtp::MtpWeights::load(g, hp)?;
        Ok(Weights {
            token_embd: te.clone(),
            output_norm: vector(g, "output_norm.weight", h)?,
            output,
            layers,
            mtp,
            gguf,
        })
    }

    /// A 2-D tensor as a matrix view (rows = ne[1], cols = ne[0]).
    pub fn mat(&self, t: &TensorInfo) -> QMatrix<'_> {
        QMatrix {
            ty: t.ty,
            data: self.gguf.data(t),
            rows: t.dims[1] as usize,
            cols: t.dims[0] as usize,
        }
    }

    pub(super) fn exps(&self, t: &TensorInfo) -> QExperts<'_> {
        QExperts {
            ty: t.ty,
            data: self.gguf.data(t),
            n_expert: t.dims[2] as usize,
            rows: t.dims[1] as usize,
            cols: t.dims[0] as usize,
            slabs: None,
        }
    }

    pub fn expert_layer(&self, l: usize) -> ExpertLayer<'_> {
        let lw = &self.layers[l];
        ExpertLayer {
            gate: self.exps(&lw.gate),
            up: self.exps(&lw.up),
            down: self.exps(&lw.down),
        }
    }

    /// Bytes of the routed-expert tensors, and of everything else in the file.
    pub fn expert_bytes(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| !l.dense_ffn)
            .map(|l| l.gate.nbytes + l.up.nbytes + l.down.nbytes)
            .sum()
    }

    pub fn non_expert_bytes(&self) -> usize {
        let total: usize = self.gguf.tensors().iter().map(|t| t.nbytes).sum();
        total - self.expert_bytes()
    }

    /// Dequantizes token `id`'s embedding row into `out` [H].
    pub fn embed(&self, id: usize, out: &mut [f32]) -> Result<()> {
        let t = &self.token_embd;
        let rb = t.ty.row_bytes(out.len()).unwrap_or(0);
        let data = self.gguf.data(t);
        quant::dequantize(t.ty, &data[id * rb..(id + 1) * rb], out)
    }
}
