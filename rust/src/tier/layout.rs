//! Where each expert's bytes are in the GGUF file(s).
//!
//! A MoE layer stores its experts stacked: `blk.N.ffn_{gate,up,down}_exps.weight` with ggml
//! dims `{cols, rows, n_expert}` (docs/FORMATS.md §4), so expert `x` of a tensor is the contiguous
//! slab `[x·slab, (x+1)·slab)` with `slab = nbytes / n_expert`. Layers without stacked experts
//! (dense layers of some models) have no entry.

use crate::error::{Error, Result};
use crate::gguf::{Gguf, TensorInfo, Value};

/// One expert's slab inside one stacked tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slab {
    pub shard: usize,
    /// Absolute byte offset of expert 0's slab in the shard file.
    pub base: usize,
    /// Bytes per expert.
    pub bytes: usize,
}

impl Slab {
    pub fn offset(&self, expert: usize) -> usize {
        self.base + expert * self.bytes
    }
}

/// The three stacked tensors of one MoE layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerSlabs {
    pub gate: Slab,
    pub up: Slab,
    pub down: Slab,
}

impl LayerSlabs {
    /// gate + up + down bytes of one expert.
    pub fn expert_bytes(&self) -> usize {
        self.gate.bytes + self.up.bytes + self.down.bytes
    }
}

#[derive(Clone, Debug)]
pub struct ExpertLayout {
    pub arch: String,
    pub n_expert: usize,
    /// Per layer: `None` for a layer without stacked experts.
    pub layers: Vec<Option<LayerSlabs>>,
}

fn meta_u(g: &Gguf, key: &str) -> Result<usize> {
    match g.get(key).and_then(Value::as_u64) {
        Some(v) if v > 0 && v < (1 << 24) => Ok(v as usize),
        Some(v) => Err(Error::Model(format!("{key} = {v} is implausible"))),
        None => Err(Error::Model(format!(
            "{}: metadata key {key} is missing; not a MoE model?",
            g.path().display()
        ))),
    }
}

fn slab(t: &TensorInfo, n_expert: usize) -> Result<Slab> {
    let ok =
        t.dims.len() == 3 && t.dims[2] as usize == n_expert && t.nbytes.is_multiple_of(n_expert);
    if !ok {
        return Err(Error::Model(format!(
            "{}: dims {:?} do not stack {n_expert} experts on the last axis",
            t.name, t.dims
        )));
    }
    Ok(Slab {
        shard: t.shard,
        base: t.offset,
        bytes: t.nbytes / n_expert,
    })
}

impl ExpertLayout {
    pub fn from_gguf(g: &Gguf) -> Result<ExpertLayout> {
        let arch = g
            .architecture()
            .ok_or_else(|| Error::Model("general.architecture is missing".into()))?
            .to_string();
        // The NextN (MTP) layers stored after the trunk are not run (`model::HParams`).
        let nextn = g
            .get(&format!("{arch}.nextn_predict_layers"))
            .and_then(Value::as_u64)
            .unwrap_or(0) as usize;
        let n_layer = meta_u(g, &format!("{arch}.block_count"))?.saturating_sub(nextn);
        let n_expert = meta_u(g, &format!("{arch}.expert_count"))?;
        let mut layers = Vec::with_capacity(n_layer);
        for i in 0..n_layer {
            let name = |part: &str| format!("blk.{i}.ffn_{part}_exps.weight");
            if g.tensor(&name("gate_up")).is_some() {
                return Err(Error::Model(format!(
                    "{}: fused {} is not supported yet",
                    g.path().display(),
                    name("gate_up")
                )));
            }
            let found = (
                g.tensor(&name("gate")),
                g.tensor(&name("up")),
                g.tensor(&name("down")),
            );
            layers.push(match found {
                (Some(ga), Some(u), Some(d)) => Some(LayerSlabs {
                    gate: slab(ga, n_expert)?,
                    up: slab(u, n_expert)?,
                    down: slab(d, n_expert)?,
                }),
                (None, None, None) => None,
                _ => {
                    return Err(Error::Model(format!(
                        "layer {i} has only some of ffn_gate_exps / ffn_up_exps / ffn_down_exps"
                    )))
                }
            });
        }
        if layers.iter().all(Option::is_none) {
            return Err(Error::Model(format!(
                "{}: no layer has stacked experts (ffn_*_exps); not a MoE model",
                g.path().display()
            )));
        }
        Ok(ExpertLayout {
            arch,
            n_expert,
            layers,
        })
    }

    pub fn n_layer(&self) -> usize {
        self.layers.len()
    }

    pub fn layer(&self, layer: usize) -> Option<&LayerSlabs> {
        self.layers.get(layer).and_then(Option::as_ref)
    }

    /// gate+up+down bytes of one expert of `layer` (0 for a layer without experts).
    pub fn expert_bytes(&self, layer: usize) -> usize {
        self.layer(layer).map_or(0, LayerSlabs::expert_bytes)
    }

    /// Every expert's bytes, all layers.
    pub fn total_bytes(&self) -> u64 {
        (0..self.n_layer())
            .map(|l| self.expert_bytes(l) as u64 * self.n_expert as u64)
            .sum()
    }

    /// Every (layer, expert) that has bytes, layer-major (file order).
    pub fn all_experts(&self) -> Vec<(u32, u32)> {
        let mut v = Vec::new();
        for l in 0..self.n_layer() {
            if self.layer(l).is_some() {
                v.extend((0..self.n_expert as u32).map(|e| (l as u32, e)));
            }
        }
        v
    }
}
