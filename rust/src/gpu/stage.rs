//! One stage of the layer split (`split.rs`, docs/PROTOCOL.md): its own `Launcher` (its
//! layers' dense weights, its KV cache, its buffers and stream, on its device), its own MoE
//! placement (every expert in VRAM, or its own hybrid tier: expert slots, fences, driver) and
//! its own decode graphs. One stage is the whole model; several stages run a step one after
//! the other, the activations hopping between them (`pipeline.rs`).
//!
//! The stages are built one after the other (`build`), each measuring the memory its own
//! buffers took, so that the hybrid tiers of stages that share a device plan with their
//! share of its memory.

use super::gdn_state::GdnState;
use super::hybrid::Hybrid;
use super::hybrid_cfg::{HybridConfig, HybridShared, StagePart};
use super::launch::{Bufs, Launcher, Seg, DECODE_MAX_TOKENS};
use super::placement::{MoePlacement, VramExperts};
use super::split::{self, SplitInputs};
use super::step::rows;
use super::weights::GpuWeights;
use crate::cuda::ops::attention::{self, KvLayout};
use crate::cuda::ops::quant::QuantOps;
use crate::cuda::ops::quant_shared::{self, Branches};
use crate::cuda::{Gpu, Graph};
use crate::error::{Error, Result};
use crate::model::weights::{LayerWeights, Weights};
use crate::model::{HParams, ModelConfig};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Buffers besides the weights and the KV cache that the automatic hybrid decision assumes
/// (activations, scratch, the CUDA context's own needs).
pub(super) const BUFFER_ALLOWANCE: usize = 512 << 20;

/// The captured steps besides the decode steps of S one-token pieces: one piece of t rows,
/// 2 ≤ t ≤ `DECODE_MAX_TOKENS` (a speculative window of one sequence, as the decode
/// attention runs it), at `graphs[n_slots + t − 2]`.
const WINDOW_GRAPHS: usize = DECODE_MAX_TOKENS - 1;

static WINDOW_GRAPHS_ON: AtomicBool = AtomicBool::new(true);

/// Whether GPU models opened from now on capture windows' steps as graphs (the default) or
/// run them kernel by kernel (the same results: for A/B timings); returns the previous
/// setting.
pub fn set_window_graphs(on: bool) -> bool {
    WINDOW_GRAPHS_ON.swap(on, Ordering::Relaxed)
}

/// A captured step on one stage (a decode step of S one-token pieces, or one piece of a few
/// rows: `Stage::graph_key`): one graph (its layers; for one row on the last stage with the
/// final norm and the head of its row), or per layer
/// (attention, router and the placement's `pre`; its `resident` experts, None for a layer
/// without routed experts) for a placement with host work between layers.
pub(super) enum StepGraph {
    Whole(Graph),
    PerLayer(Vec<(Graph, Option<Graph>)>),
}

pub(super) struct Stage {
    pub x: Launcher,
    /// Where the stage's routed experts run.
    pub moe: Box<dyn MoePlacement>,
    /// [n_slots + WINDOW_GRAPHS] the graph of the decode step of S one-token pieces at S - 1,
    /// then those of one piece of t = 2.. rows (`graph_key`).
    pub graphs: Vec<Option<StepGraph>>,
    /// [n_slots + WINDOW_GRAPHS] such steps run so far without the graph (the first one runs
    /// eagerly: it resolves every kernel and checks the step before it is captured).
    pub eager_steps: Vec<usize>,
    /// Windows' steps are captured too (`set_window_graphs` at the model's opening).
    pub window_graphs: bool,
}

/// Where the stages run: `gpus[s]` (a device may repeat: one GPU as several stages), cut by
/// `layer_split` ("auto" or boundaries, `split::strategy`), with at most `pipeline_windows`
/// windows in flight.
#[derive(Clone, Debug)]
pub struct SplitConfig {
    pub gpus: Vec<usize>,
    pub layer_split: String,
    pub pipeline_windows: usize,
    /// How activations hop between stages (`pipeline.rs`).
    pub hop: HopKind,
}

/// The activation hop between two stages: `Auto` copies device to device on one device and
/// through page-locked host memory across devices; `ThroughHost` always goes through host
/// memory (the cross-device hop, testable on one device).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HopKind {
    #[default]
    Auto,
    ThroughHost,
}

impl HopKind {
    /// "auto" | "host".
    pub fn parse(s: &str) -> Result<HopKind> {
        match s {
            "auto" => Ok(HopKind::Auto),
            "host" => Ok(HopKind::ThroughHost),
            o => Err(Error::Config(format!(
                "split_hop {o:?} is not one of \"auto\", \"host\""
            ))),
        }
    }
}

impl Default for SplitConfig {
    /// One stage on GPU 0: today's single-GPU model.
    fn default() -> Self {
        SplitConfig {
            gpus: vec![0],
            layer_split: "auto".into(),
            pipeline_windows: 1,
            hop: HopKind::Auto,
        }
    }
}

impl SplitConfig {
    /// `gpus` as a setting: comma-separated device ordinals ("0", "0,0", "0,1").
    pub fn parse_gpus(spec: &str) -> Result<Vec<usize>> {
        let spec = spec.trim();
        let out: std::result::Result<Vec<usize>, _> =
            spec.split(',').map(|p| p.trim().parse::<usize>()).collect();
        match out {
            Ok(v) if !v.is_empty() => Ok(v),
            _ => Err(Error::Config(format!(
                "gpus: {spec:?} is not a list of device numbers like \"0\" or \"0,0\""
            ))),
        }
    }
}

/// Each stage's share of `max` expert slots, by its routed layers (`routed[s]`), rounded so
/// that they add up to `max`.
pub(super) fn slot_shares(max: usize, routed: &[usize]) -> Vec<usize> {
    let all = routed.iter().sum::<usize>().max(1);
    let round = |c: usize| (max * c + all / 2) / all;
    let mut cum = 0;
    routed
        .iter()
        .map(|&n| {
            let a = round(cum);
            cum += n;
            round(cum) - a
        })
        .collect()
}

/// Weight bytes of a layer (dense and experts): what the auto split weighs.
fn layer_bytes(l: &LayerWeights) -> u64 {
    let mut n = [
        &l.wq, &l.wk, &l.wv, &l.wo, &l.router, &l.gate, &l.up, &l.down,
    ]
    .iter()
    .map(|t| t.nbytes)
    .sum::<usize>();
    if let Some(sh) = &l.shared {
        n += sh.gate.nbytes + sh.up.nbytes + sh.down.nbytes;
    }
    if let Some(dn) = &l.deltanet {
        n += dn.qkv.nbytes + dn.gate.nbytes + dn.out.nbytes;
        n += dn.ba.iter().map(|t| t.nbytes).sum::<usize>();
    }
    n as u64
}

/// The per-call sizes every stage's buffers share.
pub(super) struct StageSizes {
    /// Rows of the buffers (the longer of the chunk and the streamed chunk).
    pub t: usize,
    pub rec_bytes: usize,
}

/// What `build` returns: the stages, and the hybrid placement's shared state (None: every
/// weight in VRAM).
pub(super) struct Built {
    pub stages: Vec<Stage>,
    pub shared: Option<HybridShared>,
}

/// Builds the stages of `split` for the model `w` (types checked by the caller): the layer
/// ranges, then per stage its weights, KV cache, buffers and placement. With `hybrid` (and,
/// when it is `only_if_needed`, a model that does not fit whole on the devices), the expert
/// tensors stay in RAM and each stage's share of its device holds expert slots.
pub(super) fn build(
    hp: &HParams,
    w: Weights,
    cfg: &ModelConfig,
    sc: &SplitConfig,
    hybrid: Option<HybridConfig>,
    sz: &StageSizes,
) -> Result<Built> {
    if sc.gpus.is_empty() {
        return Err(Error::Config("gpus: no device".into()));
    }
    let gpus = sc
        .gpus
        .iter()
        .map(|&o| Gpu::open(o))
        .collect::<Result<Vec<_>>>()?;
    // free memory of each device before anything is allocated
    let mut free0 = BTreeMap::new();
    for g in &gpus {
        if let std::collections::btree_map::Entry::Vacant(e) = free0.entry(g.ordinal()) {
            e.insert(g.mem_info()?.0);
        }
    }
    let lb: Vec<u64> = w.layers.iter().map(layer_bytes).collect();
    let free = |d: usize| free0.get(&d).copied().unwrap_or(0) as u64;
    let ranges = split::strategy(&sc.layer_split)?.split(&SplitInputs {
        layer_bytes: &lb,
        gpus: &sc.gpus,
        free: &free,
    })?;
    let n_attn = |r: &Range<usize>| {
        r.clone()
            .filter(|&l| !hp.ssm.as_ref().is_some_and(|sp| sp.recurrent[l]))
            .count()
    };
    let lay_of = |r: &Range<usize>| {
        // a stage of recurrent layers only still gets a one-layer cache (KvLayout needs one)
        KvLayout::new(
            cfg.kv_type,
            cfg.n_slots,
            n_attn(r).max(1),
            hp.n_head_kv,
            cfg.n_ctx,
            hp.head_dim,
        )
    };
    let kv_total: usize = ranges
        .iter()
        .map(|r| lay_of(r).map(|l| 2 * l.total()))
        .sum::<Result<usize>>()?;
    let hybrid = hybrid.filter(|h| {
        let need = w.expert_bytes() + w.non_expert_bytes() + kv_total + sz.rec_bytes;
        let avail: usize = free0
            .values()
            .map(|f| f.saturating_sub((h.reserve_mib as usize) << 20))
            .sum();
        !h.only_if_needed || need + BUFFER_ALLOWANCE > avail
    });
    let w = Arc::new(w);
    let shared = hybrid
        .as_ref()
        .map(|h| HybridShared::new(h, w.clone(), hp, cfg.n_slots));
    let recurrent = |l: usize| hp.ssm.as_ref().is_some_and(|sp| sp.recurrent[l]);
    // each layer's place among the attention layers
    let kv_of: Vec<usize> = (0..hp.n_layer)
        .scan(0, |n, l| {
            let i = *n;
            *n += usize::from(!recurrent(l));
            Some(i)
        })
        .collect();
    let routed = |r: &Range<usize>| r.clone().filter(|&l| !w.layers[l].dense_ffn).count();
    let routed_per_stage: Vec<usize> = ranges.iter().map(routed).collect();
    let max_slots = hybrid
        .as_ref()
        .and_then(|h| h.max_slots)
        .map(|m| slot_shares(m, &routed_per_stage));
    let mut stages = Vec::with_capacity(ranges.len());
    for (s, r) in ranges.iter().enumerate() {
        let gpu = gpus[s].clone();
        let free_before = gpu.mem_info()?.0;
        let stream = gpu.stream()?;
        let q = QuantOps::new(&gpu)?;
        let weights = GpuWeights::upload_stage(&gpu, &w, shared.is_none(), r.clone())?;
        let lay = lay_of(r)?;
        let n_split = attention::n_split(&gpu, hp.n_head_kv, cfg.n_ctx);
        let b = Bufs::new(&gpu, &stream, hp, &lay, sz.t, cfg.n_ctx, n_split)?;
        let rec = match (hp.graph.hybrid, &hp.ssm) {
            (Some(hy), Some(sp)) => {
                // every recurrent layer's state (indexed by the layer's place among them);
                // the stage touches its own layers' only
                let (q_dim, n) = (hp.q_dim(), cfg.n_slots);
                Some(GdnState::new(
                    &gpu,
                    &stream,
                    sp.clone(),
                    hy,
                    n,
                    sz.t,
                    q_dim,
                )?)
            }
            _ => None,
        };
        let br = Branches::new(&gpu, quant_shared::SIDE_STREAMS)?;
        let x = Launcher {
            br,
            gpu,
            stream,
            q,
            w: weights,
            hp: hp.clone(),
            lay,
            b,
            n_split,
            kv0: kv_of[r.start],
            kv_of: kv_of.clone(),
            layers: r.clone(),
            rec,
            fuse: super::launch::fusion(),
        };
        let moe: Box<dyn MoePlacement> = match (&hybrid, &shared) {
            (Some(h), Some(sh)) => {
                // the stage's share of its device: its layers' bytes among the device's stages'
                let dev = sc.gpus[s];
                let bytes = |r: &Range<usize>| lb[r.clone()].iter().sum::<u64>();
                let on_dev: u64 = ranges
                    .iter()
                    .zip(&sc.gpus)
                    .filter(|(_, &g)| g == dev)
                    .map(|(r, _)| bytes(r))
                    .sum();
                let share = match on_dev {
                    0 => 1.0,
                    d => bytes(r) as f64 / d as f64,
                };
                let part = StagePart {
                    layers: r.clone(),
                    last: s + 1 == ranges.len(),
                    share,
                    free0: free0.get(&dev).copied().unwrap_or(0),
                    free_before,
                    dense_bytes: x.w.bytes,
                    kv_bytes: 2 * x.lay.total(),
                    max_slots: max_slots.as_ref().map(|m| m[s]),
                    n_seq: cfg.n_slots,
                    shared: sh,
                };
                Box::new(Hybrid::new(&x.gpu, hp, sz.t, h, part)?)
            }
            _ => Box::new(VramExperts),
        };
        stages.push(Stage {
            x,
            moe,
            graphs: (0..cfg.n_slots + WINDOW_GRAPHS).map(|_| None).collect(),
            eager_steps: vec![0; cfg.n_slots + WINDOW_GRAPHS],
            window_graphs: WINDOW_GRAPHS_ON.load(Ordering::Relaxed),
        });
    }
    Ok(Built { stages, shared })
}

impl Stage {
    /// Where the step over the pieces `segs` keeps its captured graph(s) in `graphs`: S − 1
    /// for S one-token pieces (a decode step), n_slots + t − 2 for one piece of
    /// 2 ≤ t ≤ `DECODE_MAX_TOKENS` rows (a window; not on a stage with a recurrent state,
    /// whose windows checkpoint it per token). Every kernel of such a step takes the pieces'
    /// positions and slots from `params` on the device, so one capture serves every step of
    /// that shape. None: the step runs kernel by kernel.
    pub(super) fn graph_key(&self, segs: &[Seg]) -> Option<usize> {
        let n_dec = self.graphs.len() - WINDOW_GRAPHS;
        match segs {
            _ if segs.iter().all(|s| s.t == 1) => {
                (1..=n_dec).contains(&segs.len()).then(|| segs.len() - 1)
            }
            [one]
                if self.window_graphs
                    && self.x.rec.is_none()
                    && (2..=DECODE_MAX_TOKENS).contains(&one.t) =>
            {
                Some(n_dec + one.t - 2)
            }
            _ => None,
        }
    }

    /// The step shape whose graphs `graph_key` keeps at `key`: ("decode", S) for S one-token
    /// pieces, ("window", t) for one piece of t rows.
    pub(super) fn graph_shape(&self, key: usize) -> (&'static str, usize) {
        let n_dec = self.graphs.len() - WINDOW_GRAPHS;
        match key < n_dec {
            true => ("decode", key + 1),
            false => ("window", key - n_dec + 2),
        }
    }

    /// Captures the stage's part of the step over the pieces `segs` into `graphs[key]`: as
    /// one graph (its layers; for one row on the last stage also the final norm and head),
    /// or per layer when the placement works on the host between layers. A capture the
    /// driver refuses is recorded in `graph_error` and steps run kernel by kernel from then
    /// on; an error of the step itself is returned.
    pub(super) fn capture(
        &mut self,
        key: usize,
        segs: &[Seg],
        graph_error: &mut Option<String>,
    ) -> Result<()> {
        let (x, moe) = (&self.x, &mut self.moe);
        if moe.host_per_layer() {
            return self.capture_per_layer(key, segs, graph_error);
        }
        x.stream.begin_capture()?;
        let mut body = x.layers(segs, &mut **moe);
        if rows(segs) == 1 && x.last() {
            body = body
                .and_then(|()| x.final_norm(0, 0, 1))
                .and_then(|()| x.head(0, 1));
        }
        let g = x.stream.end_capture();
        body?;
        match g {
            Ok(g) => self.graphs[key] = Some(StepGraph::Whole(g)),
            Err(e) => *graph_error = Some(e.to_string()),
        }
        Ok(())
    }

    /// The per-layer graphs of the step over `segs` (of T rows): (attention, router, the
    /// placement's `pre`; its `resident` experts, for a layer with routed experts) (its host
    /// work runs between them).
    fn capture_per_layer(
        &mut self,
        key: usize,
        segs: &[Seg],
        graph_error: &mut Option<String>,
    ) -> Result<()> {
        let (x, moe) = (&self.x, &mut self.moe);
        let n = rows(segs); // T
        let host = moe.host_out(n);
        let mut gs = Vec::with_capacity(x.w.layers.len());
        for l in x.layers.clone() {
            let routed = x.w.layer(l).routed();
            let mut pair = Vec::with_capacity(2);
            for part in 0..1 + routed as usize {
                x.stream.begin_capture()?;
                let body = match part {
                    // the placement's `pre` copies what the router did not write itself
                    0 => x
                        .attn_router(l, segs, host, moe.handoff_y(x, l, n))
                        .and_then(|copied| {
                            if routed && !copied {
                                moe.pre(x, l, n)
                            } else {
                                Ok(())
                            }
                        }),
                    _ => moe.resident(x, l, n),
                };
                let g = x.stream.end_capture();
                body?;
                match g {
                    Ok(g) => pair.push(g),
                    Err(e) => {
                        *graph_error = Some(e.to_string());
                        return Ok(());
                    }
                }
            }
            let mut it = pair.into_iter();
            let a = it
                .next()
                .ok_or_else(|| Error::Config("a layer's graph was not captured".into()))?;
            gs.push((a, it.next()));
        }
        self.graphs[key] = Some(StepGraph::PerLayer(gs));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_shares_follow_the_routed_layers_and_add_up() {
        assert_eq!(slot_shares(6, &[3]), vec![6]);
        assert_eq!(slot_shares(6, &[1, 2]), vec![2, 4]);
        assert_eq!(slot_shares(24, &[2, 1]), vec![16, 8]);
        assert_eq!(slot_shares(7, &[1, 1, 1]), vec![2, 3, 2]);
        assert_eq!(slot_shares(0, &[1, 2]), vec![0, 0]);
        for (m, r) in [(5, vec![3, 4, 1]), (100, vec![7, 0, 13]), (1, vec![1, 1])] {
            assert_eq!(slot_shares(m, &r).iter().sum::<usize>(), m);
        }
    }

    #[test]
    fn gpus_parse_as_device_numbers() {
        assert_eq!(SplitConfig::parse_gpus("0").unwrap(), vec![0]);
        assert_eq!(SplitConfig::parse_gpus(" 0, 0,1 ").unwrap(), vec![0, 0, 1]);
        for bad in ["", "x", "0,", "-1", "0;1"] {
            let e = SplitConfig::parse_gpus(bad).unwrap_err();
            assert!(
                matches!(e, Error::Config(ref m) if m.starts_with("gpus")),
                "{e}"
            );
        }
    }
}
