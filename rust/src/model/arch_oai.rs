//! The gpt-oss graph (llama.cpp's src/models/openai-moe.cpp, `gpt-oss` in GGUF files): the
//! options of `arch::Graph` it sets, and the per-file keys that would ask for more than
//! Strata runs, refused by name.

use super::arch::{Experts, Graph, MetaRead, Routing, Swa};
use crate::error::{Error, Result};

/// `ggml_swiglu_oai`'s constants as llama.cpp's `build_moe_ffn` passes them (the converter
/// writes neither; HF's `swiglu_alpha` / `swiglu_limit` defaults are the same).
pub const SWIGLU_ALPHA: f32 = 1.702;
pub const SWIGLU_LIMIT: f32 = 7.0;

/// gpt-oss over the base (qwen3moe) graph; `meta` reads `gpt-oss.<key>`.
pub fn graph(meta: &dyn MetaRead, base: Graph) -> Result<Graph> {
    let window = meta.count("attention.sliding_window")?.ok_or_else(|| {
        Error::Model("required metadata gpt-oss.attention.sliding_window is missing".into())
    })?;
    if window == 0 {
        return Err(Error::Model(
            "gpt-oss.attention.sliding_window is 0; a window holds at least one position".into(),
        ));
    }
    if meta.present("rope.freq_base_swa") {
        return Err(Error::Model(
            "gpt-oss.rope.freq_base_swa is set; Strata runs one RoPE base for every layer".into(),
        ));
    }
    match meta.number("expert_weights_scale")? {
        None => {}
        Some(s) if s == 0.0 || s == 1.0 => {}
        Some(s) => {
            return Err(Error::Model(format!(
                "gpt-oss.expert_weights_scale {s}: Strata runs unscaled expert weights"
            )))
        }
    }
    Ok(Graph {
        qk_norm: false,
        qkv_bias: true,
        ffn_norm: "post_attention_norm",
        routing: Routing::SoftmaxWeight,
        o_bias: true,
        sinks: true,
        swa: Some(Swa {
            window,
            pattern: meta.count("attention.sliding_window_pattern")?.unwrap_or(2),
        }),
        router_bias: true,
        experts: Experts::OaiBiased {
            alpha: SWIGLU_ALPHA,
            limit: SWIGLU_LIMIT,
        },
        ..base
    })
}
