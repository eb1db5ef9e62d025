//! The architecture layer: which families the forward pass runs, and the graph of each as a
//! choice among shared building blocks, fixed at load from `general.architecture`.
//!
//! Every family is a pre-norm decoder: per layer `x += attn(rms_norm(x))`, then
//! `x += ffn(rms_norm(x))`. The blocks differ only in the options a `Graph` names:
//! - attention: RoPE layout (NEOX halves or NORM adjacent pairs), Q/K/V bias, per-head q/k
//!   RMSNorm;
//! - FFN: routed SwiGLU experts with a `Routing` strategy, an optional shared expert with a
//!   sigmoid gate (`ffn_*_shexp`, `ffn_gate_inp_shexp`), or the dense FFN run as one expert.
//!
//! The families and their llama.cpp graphs (src/models/<family>.cpp):
//! - `qwen3moe`: NEOX RoPE, q/k norm, softmax → top-K → renormalize;
//! - `qwen3`: qwen3moe with one dense FFN (one expert, weight 1);
//! - `qwen2moe`: NEOX RoPE, Q/K/V bias, softmax → top-K (renormalized only when
//!   `expert_weights_norm` says so), shared expert;
//! - `llama` with `expert_count > 0` (Mixtral): NORM RoPE, softmax → top-K → renormalize;
//! - `glm4moe`: NEOX RoPE (partial, as `rope.dimension_count` says), Q/K/V bias, q/k norm
//!   where the file has it, FFN norm named `post_attention_norm`, leading dense layers
//!   (`leading_dense_block_count`), sigmoid routing with the selection bias `exp_probs_b`,
//!   `expert_weights_norm` and `expert_weights_scale`, an ungated shared expert; the NextN
//!   layers after the trunk (`nextn_predict_layers`) are not run;
//! - `gpt-oss`: NEOX RoPE (YaRN as the file says), Q/K/V/O biases, attention sinks,
//!   sliding-window attention on the layers `attention.sliding_window_pattern` names (default
//!   2: even layers), FFN norm named `post_attention_norm`, router bias, top-K of the logits
//!   with a softmax over the K (`Routing::SoftmaxWeight`), experts with biases and the
//!   clamped SwiGLU (`Experts::OaiBiased`).
//! - `qwen3vlmoe` (Qwen3-VL's MoE language model, text only): qwen3moe's graph; its
//!   interleaved M-RoPE sections (`rope.dimension_sections`) all get a text token's one
//!   position, which makes them NEOX RoPE, and its deepstack inputs come only with image
//!   embeddings, which Strata does not take;
//! - `ernie4_5-moe`: NORM RoPE, Q/K/V bias where the file has it, leading dense layers, softmax
//!   routing with the selection bias `exp_probs_b`, renormalized, × `expert_weights_scale`,
//!   an ungated shared expert (ERNIE 4.5's MoE; every layer past the dense ones has experts:
//!   `interleave_moe_layer_step` other than 1 is refused);
//! - `ernie4_5` (ERNIE 4.5's dense models, the MoE ones' drafts): ernie4_5-moe's attention
//!   with one dense FFN (one expert, weight 1);
//! - `qwen3next`, `qwen35moe` (hybrids, `deltanet`): Gated DeltaNet layers where
//!   `attention.recurrent_layers` says (else every layer but each `full_attention_interval`-th),
//!   gated full attention with q/k norm and partial NEOX RoPE in the others, the FFN norm named
//!   `post_attention_norm`, softmax → top-K → renormalize, a shared expert scaled by
//!   σ(`ffn_gate_inp_shexp`·x). qwen35moe's M-RoPE sections (`rope.dimension_sections`) all get
//!   a text token's one position, which makes them NEOX RoPE. The MTP layers after the trunk
//!   (`nextn_predict_layers`) are not run.

use super::deltanet::{BetaAlpha, HeadOrder, Hybrid};
use crate::error::{Error, Result};

/// The families the forward pass runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Qwen3Moe,
    Qwen3,
    Qwen2Moe,
    Llama,
    Glm4Moe,
    GptOss,
    Qwen3Next,
    Qwen35Moe,
    Ernie45Moe,
    Qwen3VlMoe,
    Ernie45,
}

/// `general.architecture` names, as llama.cpp spells them, and their families.
pub const SUPPORTED: [(&str, Family); 11] = [
    ("qwen3moe", Family::Qwen3Moe),
    ("qwen3", Family::Qwen3),
    ("qwen2moe", Family::Qwen2Moe),
    ("llama", Family::Llama),
    ("glm4moe", Family::Glm4Moe),
    ("gpt-oss", Family::GptOss),
    ("qwen3next", Family::Qwen3Next),
    ("qwen35moe", Family::Qwen35Moe),
    ("ernie4_5-moe", Family::Ernie45Moe),
    ("qwen3vlmoe", Family::Qwen3VlMoe),
    ("ernie4_5", Family::Ernie45),
];

/// The families the GPU forward pass runs (the others are refused there with a typed error).
pub const GPU_FAMILIES: [Family; 11] = [
    Family::Qwen3Moe,
    Family::Qwen3,
    Family::Qwen2Moe,
    Family::Llama,
    Family::Glm4Moe,
    Family::Qwen3Next,
    Family::Qwen35Moe,
    Family::GptOss,
    Family::Ernie45Moe,
    Family::Qwen3VlMoe,
    Family::Ernie45,
];

/// The supported names, comma separated (for error messages).
pub fn supported_list() -> String {
    SUPPORTED.map(|(n, _)| n).join(", ")
}

impl Family {
    /// The family of an architecture name; a `Model` error naming it and the supported list
    /// otherwise.
    pub fn from_arch(arch: &str) -> Result<Family> {
        SUPPORTED
            .iter()
            .find(|(n, _)| *n == arch)
            .map(|&(_, f)| f)
            .ok_or_else(|| {
                Error::Model(format!(
                    "architecture {arch:?} is not supported; Strata runs: {}",
                    supported_list()
                ))
            })
    }

    pub fn name(self) -> &'static str {
        SUPPORTED
            .iter()
            .find(|(_, f)| *f == self)
            .map_or("?", |(n, _)| n)
    }

    /// The family's graph; `meta` answers the per-file options (see `MetaRead`).
    pub fn graph(self, meta: &dyn MetaRead) -> Result<Graph> {
        let qwen3 = Graph {
            rope: RopeMode::Neox,
            qk_norm: true,
            qkv_bias: false,
            ffn: Ffn::Routed,
            ffn_norm: "ffn_norm",
            routing: Routing::Softmax { norm: true },
            shared: Shared::None,
            dense_lead: 0,
            o_bias: false,
            sinks: false,
            swa: None,
            router_bias: false,
            experts: Experts::Swiglu,
            hybrid: None,
        };
        let hybrid = |heads, ba| Graph {
            ffn_norm: "post_attention_norm",
            shared: Shared::Sigmoid,
            hybrid: Some(Hybrid { heads, ba }),
            ..qwen3
        };
        Ok(match self {
            Family::Qwen3Moe | Family::Qwen3VlMoe => qwen3,
            Family::Qwen3 => Graph {
                ffn: Ffn::DenseAsOneExpert,
                ..qwen3
            },
            Family::Qwen2Moe => Graph {
                qk_norm: false,
                qkv_bias: true,
                // llama.cpp's qwen2moe hard-codes no renormalization; a file that sets
                // expert_weights_norm (HF's norm_topk_prob) gets it.
                routing: Routing::Softmax {
                    norm: meta.flag("expert_weights_norm")?.unwrap_or(false),
                },
                shared: Shared::Gated,
                ..qwen3
            },
            Family::Llama => {
                if meta.count("expert_count")?.unwrap_or(0) == 0 {
                    return Err(Error::Model(
                        "llama files without experts (expert_count = 0) are dense models; \
                         Strata runs the Mixtral-style llama (expert_count > 0)"
                            .into(),
                    ));
                }
                if meta.present("attention.scale") {
                    return Err(Error::Model(
                        "llama.attention.scale is set; Strata runs the 1/sqrt(head_dim) scale"
                            .into(),
                    ));
                }
                Graph {
                    rope: RopeMode::Norm,
                    qk_norm: false,
                    ..qwen3
                }
            }
            Family::Glm4Moe => {
                // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE: 0 (unset) reads as sigmoid.
                let gating = meta.count("expert_gating_func")?.unwrap_or(0);
                if gating != 0 && gating != 2 {
                    return Err(Error::Model(format!(
                        "glm4moe.expert_gating_func {gating}: Strata runs sigmoid gating (2)"
                    )));
                }
                let groups = meta.count("expert_group_count")?.unwrap_or(1);
                if groups > 1 {
                    return Err(Error::Model(format!(
                        "glm4moe.expert_group_count {groups}: Strata runs ungrouped routing (1)"
                    )));
                }
                Graph {
                    qk_norm: meta.has_tensor("blk.0.attn_q_norm.weight"),
                    qkv_bias: true,
                    ffn_norm: "post_attention_norm",
                    routing: Routing::SigmoidBias {
                        norm: meta.flag("expert_weights_norm")?.unwrap_or(false),
                        scale: weights_scale(meta)?,
                    },
                    shared: plain_shared(meta)?,
                    dense_lead: meta.count("leading_dense_block_count")?.unwrap_or(0),
                    ..qwen3
                }
            }
            Family::Ernie45Moe => {
                let step = meta.count("interleave_moe_layer_step")?.unwrap_or(1);
                if step != 1 {
                    return Err(Error::Model(format!(
                        "ernie4_5-moe.interleave_moe_layer_step {step}: Strata runs experts in \
                         every layer past the leading dense ones (1)"
                    )));
                }
                Graph {
                    rope: RopeMode::Norm,
                    qk_norm: false,
                    qkv_bias: meta.has_tensor("blk.0.attn_q.bias"),
                    // llama.cpp's ernie4_5-moe: softmax gating, renormalized (its graph
                    // passes norm = true whatever the file says)
                    routing: Routing::SoftmaxBias {
                        scale: weights_scale(meta)?,
                    },
                    shared: plain_shared(meta)?,
                    dense_lead: meta.count("leading_dense_block_count")?.unwrap_or(0),
                    ..qwen3
                }
            }
            Family::Ernie45 => Graph {
                rope: RopeMode::Norm,
                qk_norm: false,
                qkv_bias: meta.has_tensor("blk.0.attn_q.bias"),
                ffn: Ffn::DenseAsOneExpert,
                ..qwen3
            },
            Family::GptOss => super::arch_oai::graph(meta, qwen3)?,
            Family::Qwen3Next => hybrid(HeadOrder::Grouped, BetaAlpha::Fused),
            Family::Qwen35Moe => hybrid(HeadOrder::Tiled, BetaAlpha::Split),
        })
    }

    /// Refuses families the GPU path does not run yet.
    pub fn require_gpu(self) -> Result<()> {
        if GPU_FAMILIES.contains(&self) {
            return Ok(());
        }
        Err(Error::Model(format!(
            "architecture {:?} runs on the CPU path only; the GPU and hybrid paths run: {}",
            self.name(),
            GPU_FAMILIES.map(Family::name).join(", ")
        )))
    }
}

/// An ungated shared expert where `expert_shared_count` is set (glm4moe, ernie4_5-moe).
fn plain_shared(meta: &dyn MetaRead) -> Result<Shared> {
    Ok(match meta.count("expert_shared_count")?.unwrap_or(0) {
        0 => Shared::None,
        _ => Shared::Plain,
    })
}

/// `expert_weights_scale`: 0 or absent is no scaling (llama.cpp).
fn weights_scale(meta: &dyn MetaRead) -> Result<f32> {
    Ok(match meta.number("expert_weights_scale")? {
        Some(s) if s != 0.0 => s,
        _ => 1.0,
    })
}

/// The per-file options a family's graph reads from the metadata (`{arch}.<key>`).
pub trait MetaRead {
    fn flag(&self, key: &str) -> Result<Option<bool>>;
    fn count(&self, key: &str) -> Result<Option<usize>>;
    fn number(&self, key: &str) -> Result<Option<f32>>;
    fn present(&self, key: &str) -> bool;
    /// Whether the file has the tensor `name`.
    fn has_tensor(&self, name: &str) -> bool;
}

/// Where RoPE's rotated pairs lie in a head (llama.cpp's `LLAMA_ROPE_TYPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// (i, i + n_rot/2): qwen families.
    Neox,
    /// (2i, 2i + 1): llama.
    Norm,
}

/// How a layer's FFN tensors are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ffn {
    /// Stacked experts `ffn_{gate,up,down}_exps` with the router `ffn_gate_inp`.
    Routed,
    /// One dense `ffn_{gate,up,down}` run as a single expert every token takes with weight 1.
    DenseAsOneExpert,
}

/// How router logits become each token's K experts and weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Routing {
    /// The top K logits (ties: lower id first), weighted by the softmax over those K
    /// (llama.cpp's `LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT`, gpt-oss).
    SoftmaxWeight,
    /// Softmax over all E logits (f32), the top K by probability (ties: lower id first);
    /// renormalized to sum 1 when `norm` (ggml's f64 sum clamped at 2^-14). Over the selected
    /// K this is the softmax of their logits (Mixtral's "softmax over the top-K").
    Softmax { norm: bool },
    /// σ(logit) per expert; the top K by σ + the layer's selection bias `exp_probs_b` [E],
    /// weighted by their unbiased σ, renormalized when `norm`, then × `scale` (skipped when 1).
    SigmoidBias { norm: bool, scale: f32 },
    /// Softmax over all E logits; the top K by p + `exp_probs_b` [E], weighted by their
    /// unbiased p, renormalized, then × `scale` (skipped when 1): ERNIE 4.5.
    SoftmaxBias { scale: f32 },
}

impl Routing {
    /// Routes one token: `p` is [E] logits (destroyed), `bias` the layer's selection bias
    /// [E] where the strategy has one, `ids` and `w` are [K].
    pub fn route(&self, p: &mut [f32], bias: Option<&[f32]>, ids: &mut [u32], w: &mut [f32]) {
        match *self {
            Routing::Softmax { norm } => {
                crate::quant::vexp::softmax(p, false);
                top_k_taken(p, ids, w);
                if norm {
                    renormalize(w);
                }
            }
            Routing::SoftmaxWeight => {
                top_k_taken(p, ids, w);
                crate::quant::vexp::softmax(w, false);
            }
            Routing::SigmoidBias { norm, scale } => {
                for v in p.iter_mut() {
                    *v = 1.0 / (1.0 + (-*v).exp());
                }
                pick_biased(p, bias, ids, w, norm, scale);
            }
            Routing::SoftmaxBias { scale } => {
                crate::quant::vexp::softmax(p, false);
                pick_biased(p, bias, ids, w, true, scale);
            }
        }
    }

    /// Whether the routing reads a selection bias (`exp_probs_b`).
    pub fn has_selection_bias(&self) -> bool {
        matches!(
            self,
            Routing::SigmoidBias { .. } | Routing::SoftmaxBias { .. }
        )
    }
}

/// The top K of `p` [E] by p + `bias` (ties: lower id first), weighted by their unbiased p,
/// renormalized when `norm`, then × `scale` (skipped when 1).
fn pick_biased(
    p: &[f32],
    bias: Option<&[f32]>,
    ids: &mut [u32],
    w: &mut [f32],
    norm: bool,
    scale: f32,
) {
    // Selection by p + bias (ties: lower id first); the weights are the unbiased p.
    let score = |j: usize| p[j] + bias.map_or(0.0, |b| b[j]);
    for slot in 0..ids.len() {
        let mut best: Option<(usize, f32)> = None;
        for j in 0..p.len() {
            if ids[..slot].contains(&(j as u32)) {
                continue;
            }
            let v = score(j);
            if best.is_none_or(|(_, bv)| v > bv) {
                best = Some((j, v));
            }
        }
        let j = best.map_or(0, |(j, _)| j);
        ids[slot] = j as u32;
        w[slot] = p[j];
    }
    if norm {
        renormalize(w);
    }
    if scale != 1.0 {
        for v in w.iter_mut() {
            *v *= scale;
        }
    }
}

/// `w /= Σw` as ggml: the sum in f64 (`ggml_vec_sum_f32`), rounded, clamped below at 2^-14.
fn renormalize(w: &mut [f32]) {
    let sum = (w.iter().map(|&v| v as f64).sum::<f64>() as f32).max(6.103_515_6e-5);
    for v in w.iter_mut() {
        *v /= sum;
    }
}

/// The K largest entries of `p` by value (ties: lower index first) with their values; each
/// taken entry is set to -inf.
fn top_k_taken(p: &mut [f32], ids: &mut [u32], w: &mut [f32]) {
    for (id, wt) in ids.iter_mut().zip(w.iter_mut()) {
        let mut best = 0;
        for (j, &v) in p.iter().enumerate() {
            if v > p[best] {
                best = j;
            }
        }
        *id = best as u32;
        *wt = p[best];
        p[best] = f32::NEG_INFINITY;
    }
}

/// A family's graph: the blocks each layer is made of.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Graph {
    pub rope: RopeMode,
    /// `attn_q_norm` / `attn_k_norm` [D]: RMSNorm of each head of q and k before RoPE.
    pub qk_norm: bool,
    /// `attn_{q,k,v}.bias` [Nh·D] / [Nkv·D] added after the projections.
    pub qkv_bias: bool,
    pub ffn: Ffn,
    /// The name of the FFN's input RMSNorm (`blk.N.<name>.weight`).
    pub ffn_norm: &'static str,
    pub routing: Routing,
    pub shared: Shared,
    /// Layers 0..dense_lead run one dense SwiGLU FFN `ffn_{gate,up,down}` (width
    /// `feed_forward_length`) instead of experts.
    pub dense_lead: usize,
    /// `attn_output.bias` [H] added after the output projection.
    pub o_bias: bool,
    /// `attn_sinks` [Nh]: per head, one more logit in the attention softmax, with no value.
    pub sinks: bool,
    /// Sliding-window attention on some layers.
    pub swa: Option<Swa>,
    /// `ffn_gate_inp.bias` [E] added to the router logits.
    pub router_bias: bool,
    pub experts: Experts,
    /// A hybrid family (`deltanet`): DeltaNet layers where `HParams::ssm` says, gated
    /// attention in the others.
    pub hybrid: Option<Hybrid>,
}

impl Graph {
    /// The attention window of layer `l`: Some(W) when its query at position p sees only
    /// the keys at p - W < position ≤ p (llama.cpp's LLAMA_SWA_TYPE_STANDARD).
    pub fn window(&self, l: usize) -> Option<usize> {
        self.swa.filter(|s| s.covers(l)).map(|s| s.window)
    }
}

/// Sliding-window attention: `window` positions on the layers the pattern names
/// (llama.cpp's `set_swa_pattern` without a dense first layer: layer l is windowed when
/// `l % pattern < pattern - 1`, every layer when `pattern` is 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Swa {
    pub window: usize,
    pub pattern: usize,
}

impl Swa {
    pub fn covers(&self, l: usize) -> bool {
        self.pattern == 0 || l % self.pattern < self.pattern - 1
    }
}

/// The routed experts' FFN.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Experts {
    /// `down(silu(gate·x) ⊙ up·x)`, the pool's fused kernel.
    Swiglu,
    /// gpt-oss: biases on gate, up and down (`ffn_{gate,up,down}_exps.bias`) and
    /// `ggml_swiglu_oai`: g' = min(g, limit), u' = clamp(u, ±limit),
    /// `g'·σ(alpha·g') · (u' + 1)` (`model::moe_oai`).
    OaiBiased { alpha: f32, limit: f32 },
}

/// A dense SwiGLU expert beside the routed ones (`ffn_{gate,up,down}_shexp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shared {
    None,
    /// Scaled by sigmoid(`ffn_gate_inp_shexp`·x) (qwen2moe).
    Gated,
    /// Added as is (glm4moe).
    Plain,
    /// Scaled by σ(`ffn_gate_inp_shexp`·x) (qwen3next, qwen35moe: ggml_sigmoid).
    Sigmoid,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_norm_picks_top_k_and_renormalizes() {
        let mut p = [0.0f32, 3.0, 1.0, 3.0, -2.0];
        let (mut ids, mut w) = ([0u32; 2], [0f32; 2]);
        let r = Routing::Softmax { norm: true };
        r.route(&mut p, None, &mut ids, &mut w);
        assert_eq!(ids, [1, 3]);
        assert!((w[0] - 0.5).abs() < 1e-6 && (w[1] - 0.5).abs() < 1e-6);
    }

    #[test]
    fn softmax_without_norm_keeps_probabilities() {
        let mut p = [0.0f32, 1.0f32.ln(), 2.0f32.ln(), 5.0f32.ln()]; // probs 1,1,2,5 / 9
        let (mut ids, mut w) = ([0u32; 2], [0f32; 2]);
        let r = Routing::Softmax { norm: false };
        r.route(&mut p, None, &mut ids, &mut w);
        assert_eq!(ids, [3, 2]);
        assert!((w[0] - 5.0 / 9.0).abs() < 1e-6 && (w[1] - 2.0 / 9.0).abs() < 1e-6);
    }

    #[test]
    fn sigmoid_bias_selects_by_biased_score_and_weighs_unbiased() {
        let mut p = [0.0f32, 2.0, 1.0, -1.0]; // σ: 0.5, 0.881, 0.731, 0.269
        let bias = [0.0f32, -1.0, 0.0, 1.0]; // selection: 0.5, -0.119, 0.731, 1.269
        let (mut ids, mut w) = ([0u32; 2], [0f32; 2]);
        let r = Routing::SigmoidBias {
            norm: false,
            scale: 2.0,
        };
        r.route(&mut p, Some(&bias), &mut ids, &mut w);
        assert_eq!(ids, [3, 2]);
        let s = |x: f32| 1.0 / (1.0 + (-x).exp());
        assert!((w[0] - 2.0 * s(-1.0)).abs() < 1e-6 && (w[1] - 2.0 * s(1.0)).abs() < 1e-6);
    }

    #[test]
    fn softmax_bias_selects_by_biased_probability_and_renormalizes() {
        let mut p = [0.0f32, 2.0, 1.0, -1.0];
        let bias = [0.0f32, -1.0, 0.0, 1.0];
        let (mut ids, mut w) = ([0u32; 2], [0f32; 2]);
        Routing::SoftmaxBias { scale: 1.0 }.route(&mut p, Some(&bias), &mut ids, &mut w);
        // p = (1, e², e, e⁻¹) / Σ = (.087, .644, .237, .032); + bias: (.087, −.356, .237, 1.032)
        assert_eq!(ids, [3, 2]);
        let (a, b) = ((-1.0f32).exp(), 1.0f32.exp());
        assert!((w[0] - a / (a + b)).abs() < 1e-6 && (w[1] - b / (a + b)).abs() < 1e-6);
    }

    #[test]
    fn softmax_weight_picks_top_logits_and_softmaxes_them() {
        let mut p = [0.5f32, 2.0, -1.0, 1.0];
        let (mut ids, mut w) = ([0u32; 2], [0f32; 2]);
        Routing::SoftmaxWeight.route(&mut p, None, &mut ids, &mut w);
        assert_eq!(ids, [1, 3]);
        let e = 1.0f32.exp(); // weights e^2 / (e^2 + e^1), e^1 / (e^2 + e^1)
        assert!((w[0] - e / (e + 1.0)).abs() < 1e-6 && (w[1] - 1.0 / (e + 1.0)).abs() < 1e-6);
    }

    #[test]
    fn swa_pattern_follows_llama_cpp() {
        let s = Swa {
            window: 4,
            pattern: 2,
        };
        assert_eq!(
            (0..4).map(|l| s.covers(l)).collect::<Vec<_>>(),
            [true, false, true, false]
        );
        let all = Swa { pattern: 0, ..s };
        assert!((0..3).all(|l| all.covers(l)));
    }

    #[test]
    fn gpu_refuses_cpu_only_families() {
        for f in [
            Family::Qwen3Moe,
            Family::Qwen2Moe,
            Family::Llama,
            Family::Glm4Moe,
            Family::Qwen3Next,
            Family::Qwen35Moe,
            Family::GptOss,
            Family::Ernie45Moe,
            Family::Qwen3VlMoe,
            Family::Ernie45,
        ] {
            assert!(f.require_gpu().is_ok(), "{f:?}");
        }
    }

    #[test]
    fn unknown_architecture_names_the_supported_list() {
        let e = Family::from_arch("grok").unwrap_err().to_string();
        assert!(
            e.contains("\"grok\"")
                && e.contains(
                    "qwen3moe, qwen3, qwen2moe, llama, glm4moe, gpt-oss, qwen3next, qwen35moe, \
                     ernie4_5-moe, qwen3vlmoe, ernie4_5"
                )
        );
    }
}
