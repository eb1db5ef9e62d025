//! Hyper-parameters from GGUF metadata (docs/FORMATS.md §4, "Metadata") for every family of
//! `arch` (the keys are `{general.architecture}.<key>`, as llama.cpp reads them).
//!
//! Required keys are refused with a `Model` error naming the key; optional keys take the
//! defaults llama.cpp uses. Shapes are cross-checked against the tensors in `weights`.

use super::arch::{Family, Ffn, Graph, MetaRead, Shared};
use super::deltanet::SsmParams;
use crate::error::{Error, Result};
use crate::gguf::{Gguf, Value};

/// RoPE frequency scaling asked for by `rope.scaling.*`.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor` (freq_scale = 1/factor).
    Linear {
        factor: f32,
    },
    /// YaRN (NTK-by-parts interpolation plus attention magnitude scaling).
    Yarn {
        factor: f32,
        orig_ctx: usize,
        beta_fast: f32,
        beta_slow: f32,
        ext_factor: f32,
        attn_factor: f32,
    },
}

#[derive(Clone, Debug)]
pub struct HParams {
    pub arch: String,
    /// The family `arch` names and its graph (`arch`).
    pub family: Family,
    pub graph: Graph,
    /// Trunk layers (the NextN / MTP layers stored after them are not counted).
    pub n_layer: usize,
    /// NextN / MTP layers after the trunk (`nextn_predict_layers`; `blk.{n_layer}` onwards).
    pub n_layer_nextn: usize,
    pub n_ctx_train: usize,
    /// H: hidden size.
    pub n_embd: usize,
    /// Nh, Nkv: query and key/value heads.
    pub n_head: usize,
    pub n_head_kv: usize,
    /// D: head dimension (key_length == value_length).
    pub head_dim: usize,
    /// Dimensions rotated by RoPE (≤ D).
    pub n_rot: usize,
    /// E, K: experts per layer and experts used per token.
    pub n_expert: usize,
    pub n_expert_used: usize,
    /// F: expert feed-forward size (filled from the tensors when the key is absent).
    pub n_ff_exp: usize,
    /// Fs: the shared expert's feed-forward size (0 without a shared expert; filled from the
    /// tensors when the key is absent).
    pub n_ff_shexp: usize,
    /// The leading dense layers' FFN width (`feed_forward_length`; 0 without such layers).
    pub n_ff_dense: usize,
    /// V: vocabulary (rows of token_embd).
    pub n_vocab: usize,
    pub rms_eps: f32,
    pub rope_freq_base: f32,
    pub rope_scaling: RopeScaling,
    /// The recurrent layers of a hybrid family (`Graph::hybrid`); None elsewhere.
    pub ssm: Option<SsmParams>,
}

struct Meta<'a> {
    g: &'a Gguf,
    arch: &'a str,
}

impl Meta<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn get(&self, k: &str) -> Option<&Value> {
        self.g.get(&self.key(k))
    }

    /// An unsigned value; an array is accepted when all its entries are equal (per-layer
    /// head counts in some files).
    fn u(&self, k: &str) -> Result<Option<usize>> {
        let Some(v) = self.get(k) else {
            return Ok(None);
        };
        let bad = || {
            Error::Model(format!(
                "metadata {} must be a non-negative integer, found {}",
                self.key(k),
                v.type_name()
            ))
        };
        match v {
            Value::Array(items) => {
                let vals: Option<Vec<u64>> = items.iter().map(Value::as_u64).collect();
                let vals = vals.ok_or_else(bad)?;
                match vals.first() {
                    Some(&first) if vals.iter().all(|&x| x == first) => Ok(Some(first as usize)),
                    _ => Err(Error::Model(format!(
                        "metadata {} varies per layer ({vals:?}); Strata runs uniform layers only",
                        self.key(k)
                    ))),
                }
            }
            _ => v.as_u64().map(|x| Some(x as usize)).ok_or_else(bad),
        }
    }

    fn req_u(&self, k: &str) -> Result<usize> {
        self.u(k)?
            .ok_or_else(|| Error::Model(format!("required metadata {} is missing", self.key(k))))
    }

    fn f(&self, k: &str) -> Result<Option<f32>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v.as_f64().map(|x| Some(x as f32)).ok_or_else(|| {
                Error::Model(format!(
                    "metadata {} must be a number, found {}",
                    self.key(k),
                    v.type_name()
                ))
            }),
        }
    }

    fn s(&self, k: &str) -> Option<&str> {
        self.get(k).and_then(Value::as_str)
    }
}

impl MetaRead for Meta<'_> {
    fn flag(&self, k: &str) -> Result<Option<bool>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(Error::Model(format!(
                "metadata {} must be a bool, found {}",
                self.key(k),
                v.type_name()
            ))),
        }
    }

    fn count(&self, k: &str) -> Result<Option<usize>> {
        self.u(k)
    }

    fn number(&self, k: &str) -> Result<Option<f32>> {
        self.f(k)
    }

    fn present(&self, k: &str) -> bool {
        self.get(k).is_some()
    }

    fn has_tensor(&self, name: &str) -> bool {
        self.g.tensor(name).is_some()
    }
}

impl HParams {
    /// Reads the hyper-parameters; `n_vocab` and `n_ff_exp` (when absent) are completed by
    /// the weight loader from tensor shapes.
    pub fn from_gguf(g: &Gguf) -> Result<HParams> {
        let arch = g
            .architecture()
            .ok_or_else(|| Error::Model("metadata general.architecture is missing".to_string()))?;
        let family = Family::from_arch(arch)?;
        let m = Meta { g, arch };
        let graph = family.graph(&m)?;
        let n_embd = m.req_u("embedding_length")?;
        let n_head = m.req_u("attention.head_count")?;
        let n_head_kv = m.u("attention.head_count_kv")?.unwrap_or(n_head);
        let default_hd = n_embd.checked_div(n_head).unwrap_or(0);
        let head_dim = m.u("attention.key_length")?.unwrap_or(default_hd);
        let v_dim = m.u("attention.value_length")?.unwrap_or(head_dim);
        let n_ff = m.u("feed_forward_length")?;
        let dense = graph.ffn == Ffn::DenseAsOneExpert;
        let (n_expert, n_expert_used) = if dense {
            (1, 1) // the dense FFN as one expert every token uses
        } else {
            (m.req_u("expert_count")?, m.req_u("expert_used_count")?)
        };
        let n_ff_exp = match m.u("expert_feed_forward_length")? {
            _ if dense => m.req_u("feed_forward_length")?,
            Some(v) => v,
            // llama.cpp's llama graph sizes its experts by feed_forward_length itself; the
            // qwen families by feed_forward_length / expert_used_count.
            None => match n_ff {
                Some(f) if family == Family::Llama => f,
                Some(f) if n_expert_used > 0 => f / n_expert_used,
                _ => 0, // taken from the expert tensors
            },
        };
        let rms_eps = m.f("attention.layer_norm_rms_epsilon")?.ok_or_else(|| {
            Error::Model(format!(
                "required metadata {} is missing",
                m.key("attention.layer_norm_rms_epsilon")
            ))
        })?;
        let n_nextn = m.u("nextn_predict_layers")?.unwrap_or(0);
        let mut hp = HParams {
            arch: arch.to_string(),
            family,
            graph,
            // The NextN (MTP) layers stored after the trunk run only as a drafter (`mtp`).
            n_layer: m.req_u("block_count")?.saturating_sub(n_nextn),
            n_layer_nextn: n_nextn,
            n_ctx_train: m.u("context_length")?.unwrap_or(0),
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_rot: m.u("rope.dimension_count")?.unwrap_or(head_dim),
            n_expert,
            n_expert_used,
            n_ff_exp,
            n_ff_shexp: match graph.shared {
                Shared::None => 0,
                Shared::Gated | Shared::Sigmoid => {
                    m.u("expert_shared_feed_forward_length")?.unwrap_or(0)
                }
                Shared::Plain => n_ff_exp * m.u("expert_shared_count")?.unwrap_or(0),
            },
            n_ff_dense: match graph.dense_lead {
                0 => 0,
                _ => m.req_u("feed_forward_length")?,
            },
            n_vocab: 0,
            rms_eps,
            rope_freq_base: m.f("rope.freq_base")?.unwrap_or(10000.0),
            rope_scaling: Self::scaling(&m)?,
            ssm: None,
        };
        if graph.hybrid.is_some() {
            hp.ssm = Some(Self::ssm(&m, hp.n_layer)?);
        }
        if v_dim != head_dim {
            return Err(Error::Model(format!(
                "key_length {head_dim} differs from value_length {v_dim}; Strata runs equal sizes"
            )));
        }
        hp.check()?;
        Ok(hp)
    }

    /// The DeltaNet hyper-parameters and the recurrent layers: `attention.recurrent_layers`
    /// (one bool per block, MTP layers included) or, without it, every layer l with
    /// (l + 1) mod `full_attention_interval` (default 4) ≠ 0 (llama.cpp's loader).
    fn ssm(m: &Meta<'_>, n_layer: usize) -> Result<SsmParams> {
        let recurrent = match m.get("attention.recurrent_layers") {
            Some(Value::Array(items)) => {
                let flags: Option<Vec<bool>> = items
                    .iter()
                    .map(|v| match v {
                        Value::Bool(b) => Some(*b),
                        _ => None,
                    })
                    .collect();
                match flags {
                    Some(f) if f.len() >= n_layer => f[..n_layer].to_vec(),
                    _ => {
                        return Err(Error::Model(format!(
                            "metadata {} must be {n_layer} or more bools",
                            m.key("attention.recurrent_layers")
                        )))
                    }
                }
            }
            Some(v) => {
                return Err(Error::Model(format!(
                    "metadata {} must be an array of bools, found {}",
                    m.key("attention.recurrent_layers"),
                    v.type_name()
                )))
            }
            None => {
                let every = m.u("full_attention_interval")?.unwrap_or(4).max(1);
                (0..n_layer).map(|l| (l + 1) % every != 0).collect()
            }
        };
        let sp = SsmParams {
            d_conv: m.req_u("ssm.conv_kernel")?,
            d_state: m.req_u("ssm.state_size")?,
            n_k: m.req_u("ssm.group_count")?,
            n_v: m.req_u("ssm.time_step_rank")?,
            recurrent,
        };
        sp.check()?;
        let inner = m.req_u("ssm.inner_size")?;
        if inner != sp.v_dim() {
            return Err(Error::Model(format!(
                "ssm.inner_size {inner} differs from ssm.time_step_rank × ssm.state_size {}",
                sp.v_dim()
            )));
        }
        Ok(sp)
    }

    /// Layers with a KV cache: all but the recurrent ones.
    pub fn n_attn_layer(&self) -> usize {
        match &self.ssm {
            Some(sp) => sp.recurrent.iter().filter(|&&r| !r).count(),
            None => self.n_layer,
        }
    }

    fn scaling(m: &Meta<'_>) -> Result<RopeScaling> {
        let ty = m.s("rope.scaling.type").unwrap_or("none");
        let factor = m.f("rope.scaling.factor")?.unwrap_or(1.0);
        if ty == "none" || (ty != "yarn" && factor == 1.0) {
            return Ok(RopeScaling::None);
        }
        if !(factor.is_finite() && factor > 0.0) {
            return Err(Error::Model(format!(
                "metadata {} = {factor} is not a positive number",
                m.key("rope.scaling.factor")
            )));
        }
        match ty {
            "linear" => Ok(RopeScaling::Linear { factor }),
            "yarn" => Ok(RopeScaling::Yarn {
                factor,
                orig_ctx: m
                    .u("rope.scaling.original_context_length")?
                    .or(m.u("context_length")?)
                    .unwrap_or(0),
                beta_fast: m.f("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                beta_slow: m.f("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
                ext_factor: m.f("rope.scaling.yarn_ext_factor")?.unwrap_or(1.0),
                attn_factor: m
                    .f("rope.scaling.yarn_attn_factor")?
                    .or(m.f("rope.scaling.attn_factor")?)
                    .unwrap_or(1.0),
            }),
            other => Err(Error::Model(format!(
                "rope.scaling.type {other:?} is not supported; Strata runs none, linear, yarn"
            ))),
        }
    }

    fn check(&self) -> Result<()> {
        let bad = |what: String| Err(Error::Model(what));
        if self.n_layer == 0 || self.n_embd == 0 || self.n_head == 0 || self.head_dim == 0 {
            return bad(format!(
                "block_count, embedding_length, head_count and key_length must be > 0 ({} {} {} {})",
                self.n_layer, self.n_embd, self.n_head, self.head_dim
            ));
        }
        // sizes from the file are bounded before any product of them is taken (a wrapped
        // product would pass every shape check and size the buffers)
        let widths = [
            ("block_count", self.n_layer, 1 << 16),
            ("embedding_length", self.n_embd, 1 << 20),
            ("head_count", self.n_head, 1 << 16),
            ("head_count_kv", self.n_head_kv, 1 << 16),
            ("key_length", self.head_dim, 1 << 12),
            ("expert_count", self.n_expert, 1 << 16),
        ];
        for (name, v, cap) in widths {
            if v > cap {
                return bad(format!(
                    "{name} {v} is past the largest Strata runs ({cap})"
                ));
            }
        }
        if self.n_head * self.head_dim > 1 << 24 {
            return bad(format!(
                "head_count × key_length {} × {} is past the largest Strata runs (2^24)",
                self.n_head, self.head_dim
            ));
        }
        if self.graph.dense_lead >= self.n_layer {
            return bad(format!(
                "leading_dense_block_count {} leaves no MoE layer of {}",
                self.graph.dense_lead, self.n_layer
            ));
        }
        if self.n_head_kv == 0 || !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad(format!(
                "head_count {} is not a multiple of head_count_kv {}",
                self.n_head, self.n_head_kv
            ));
        }
        if self.n_rot == 0 || self.n_rot > self.head_dim || !self.n_rot.is_multiple_of(2) {
            return bad(format!(
                "rope.dimension_count {} must be even and in 2..={}",
                self.n_rot, self.head_dim
            ));
        }
        if self.n_expert == 0 || self.n_expert_used == 0 || self.n_expert_used > self.n_expert {
            return bad(format!(
                "expert_used_count {} must be in 1..=expert_count {}",
                self.n_expert_used, self.n_expert
            ));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0) {
            return bad(format!(
                "layer_norm_rms_epsilon {} must be > 0",
                self.rms_eps
            ));
        }
        if !(self.rope_freq_base.is_finite() && self.rope_freq_base > 0.0) {
            return bad(format!(
                "rope.freq_base {} must be > 0",
                self.rope_freq_base
            ));
        }
        Ok(())
    }

    /// Nh·D, the width of q and of the attention output.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Nkv·D, the width of k, v and of one KV-cache row.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}
