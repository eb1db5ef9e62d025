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
//! - `llama` with `expert_count > 0` (Mixtral): NORM RoPE, softmax → top-K → renormalize.

use crate::error::{Error, Result};

/// The families the forward pass runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Qwen3Moe,
    Qwen3,
    Qwen2Moe,
    Llama,
}

/// `general.architecture` names, as llama.cpp spells them, and their families.
pub const SUPPORTED: [(&str, Family); 4] = [
    ("qwen3moe", Family::Qwen3Moe),
    ("qwen3", Family::Qwen3),
    ("qwen2moe", Family::Qwen2Moe),
    ("llama", Family::Llama),
];

/// The families the GPU forward pass runs (the others are refused there with a typed error).
pub const GPU_FAMILIES: [Family; 2] = [Family::Qwen3Moe, Family::Qwen3];

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
            routing: Routing::Softmax { norm: true },
            shared_expert: false,
        };
        Ok(match self {
            Family::Qwen3Moe => qwen3,
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
                shared_expert: true,
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

/// The per-file options a family's graph reads from the metadata (`{arch}.<key>`).
pub trait MetaRead {
    fn flag(&self, key: &str) -> Result<Option<bool>>;
    fn count(&self, key: &str) -> Result<Option<usize>>;
    fn present(&self, key: &str) -> bool;
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
    /// Softmax over all E logits (f32), the top K by probability (ties: lower id first);
    /// renormalized to sum 1 when `norm` (ggml's f64 sum clamped at 2^-14). Over the selected
    /// K this is the softmax of their logits (Mixtral's "softmax over the top-K").
    Softmax { norm: bool },
}

impl Routing {
    /// Routes one token: `p` is [E] logits (destroyed), `ids` and `w` are [K].
    pub fn route(&self, p: &mut [f32], ids: &mut [u32], w: &mut [f32]) {
        match *self {
            Routing::Softmax { norm } => {
                crate::quant::vexp::softmax(p, false);
                top_k_taken(p, ids, w);
                if norm {
                    let sum = (w.iter().map(|&v| v as f64).sum::<f64>() as f32).max(6.103_515_6e-5);
                    for v in w.iter_mut() {
                        *v /= sum;
                    }
                }
            }
        }
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
    pub routing: Routing,
    /// A dense shared expert beside the routed ones, scaled by sigmoid(`ffn_gate_inp_shexp`·x).
    pub shared_expert: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_norm_picks_top_k_and_renormalizes() {
        let mut p = [0.0f32, 3.0, 1.0, 3.0, -2.0];
        let (mut ids, mut w) = ([0u32; 2], [0f32; 2]);
        let r = Routing::Softmax { norm: true };
        r.route(&mut p, &mut ids, &mut w);
        assert_eq!(ids, [1, 3]);
        assert!((w[0] - 0.5).abs() < 1e-6 && (w[1] - 0.5).abs() < 1e-6);
    }

    #[test]
    fn softmax_without_norm_keeps_probabilities() {
        let mut p = [0.0f32, 1.0f32.ln(), 2.0f32.ln(), 5.0f32.ln()]; // probs 1,1,2,5 / 9
        let (mut ids, mut w) = ([0u32; 2], [0f32; 2]);
        let r = Routing::Softmax { norm: false };
        r.route(&mut p, &mut ids, &mut w);
        assert_eq!(ids, [3, 2]);
        assert!((w[0] - 5.0 / 9.0).abs() < 1e-6 && (w[1] - 2.0 / 9.0).abs() < 1e-6);
    }

    #[test]
    fn gpu_refuses_cpu_only_families() {
        assert!(Family::Qwen3Moe.require_gpu().is_ok());
        let e = Family::Qwen2Moe.require_gpu().unwrap_err().to_string();
        assert!(e.contains("\"qwen2moe\" runs on the CPU path only") && e.contains("qwen3moe"));
    }

    #[test]
    fn unknown_architecture_names_the_supported_list() {
        let e = Family::from_arch("gpt-oss").unwrap_err().to_string();
        assert!(e.contains("\"gpt-oss\"") && e.contains("qwen3moe, qwen3, qwen2moe, llama"));
    }
}
