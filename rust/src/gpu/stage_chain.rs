//! A stage's part of a step as a chain of layers the host drives: `Stage::begin_layers`,
//! `Stage::next_layer` until it returns false, `Stage::end_layers`. Layer l is two parts:
//! (a) its attention block and router (launches; or its captured per-layer graph), (b) its
//! routed experts as the placement runs them — for the hybrid tier the host waits for the
//! routing there and the CPU pool computes the misses. A chain queues (a) of layer l + 1
//! right after (b) of layer l, so the stage's stream receives its launches in the same order
//! whoever drives it.
//!
//! Two chains on two stages may be driven alternately (`flight.rs`, pipelined windows in the
//! hybrid mode): while the host serves one chain's (b), the GPU runs the other chain's queued
//! (a), so each chain's GPU part leaves the host's critical path. Each stage keeps its own
//! stream, buffers and placement, so a stage's results are bitwise the same alone or beside
//! another.

use super::launch::Seg;
use super::stage::{Stage, StepGraph};
use super::step::rows;
use crate::cuda::ops::view::Dv;
use crate::cuda::Graph;
use crate::error::{Error, Result};

/// How the chain's layers are launched.
enum Mode {
    /// A whole-step graph was launched at `begin_layers` (true: it included the head).
    Done(bool),
    /// Kernel by kernel (`Launcher::layer_attn`, `Launcher::layer_moe`).
    Eager { host: Option<[Dv; 3]> },
    /// The per-layer graphs at `graphs[key]`.
    PerLayer { key: usize },
}

/// Where a stage's part of a step stands: layer `l`'s part (a) is queued, its (b) is next.
pub(super) struct Chain {
    mode: Mode,
    l: usize,
    t: usize, // R' rows
    /// A step of a captured shape that ran eagerly (counted at the end: its graph follows).
    eager_key: Option<usize>,
}

impl Stage {
    /// Begins the stage's part of a step over the pieces `segs` (`params` written, the
    /// activations here): a step of a captured shape (`Stage::graph_key`: a decode step of
    /// one-token pieces, or a window of a few rows) replays its graph(s) when `graph_ok`
    /// (captured after its first step of that shape ran eagerly; a capture the driver
    /// refuses goes to `graph_error`). A whole-step graph is launched now; otherwise the
    /// first layer's part (a) is queued (the first stage embeds the tokens first).
    pub(super) fn begin_layers(
        &mut self,
        segs: &[Seg],
        graph_ok: bool,
        graph_error: &mut Option<String>,
    ) -> Result<Chain> {
        let key = self.graph_key(segs).filter(|_| graph_ok);
        let graphed = key.is_some_and(|k| self.graphs[k].is_some() || self.eager_steps[k] > 0);
        if let Some(k) = key.filter(|_| graphed) {
            if self.graphs[k].is_none() {
                self.capture(k, segs, graph_error)?;
            }
        }
        let g = key
            .filter(|_| graphed && graph_error.is_none())
            .and_then(|k| self.graphs[k].as_ref().map(|g| (k, g)));
        let (x, t, l) = (&self.x, rows(segs), self.x.layers.start);
        let (mode, eager_key) = match g {
            Some((_, StepGraph::Whole(g))) => {
                g.launch(&x.stream)?;
                (Mode::Done(t == 1 && x.last()), None)
            }
            Some((key, StepGraph::PerLayer(_))) => (Mode::PerLayer { key }, None),
            None => (
                Mode::Eager {
                    host: self.moe.host_out(t),
                },
                key,
            ),
        };
        let mut c = Chain {
            mode,
            l,
            t,
            eager_key,
        };
        if !matches!(c.mode, Mode::Done(_)) {
            if x.first() {
                x.embed(t, segs.len())?;
            }
            self.layer_part_a(&mut c, segs)?;
        }
        Ok(c)
    }

    /// Layer `c.l`'s part (b), then the next layer's part (a); false when the chain has no
    /// layer left (nothing is launched then).
    pub(super) fn next_layer(&mut self, c: &mut Chain, segs: &[Seg]) -> Result<bool> {
        if matches!(c.mode, Mode::Done(_)) || c.l >= self.x.layers.end {
            return Ok(false);
        }
        let (x, moe) = (&self.x, &mut *self.moe);
        match &c.mode {
            Mode::PerLayer { key } => {
                if let Some(r) = &per_layer(&self.graphs, *key)?[c.l - x.layers.start].1 {
                    moe.moe(x, c.l, c.t, Some(r))?;
                }
            }
            _ => x.layer_moe(c.l, c.t, moe)?,
        }
        c.l += 1;
        if c.l < self.x.layers.end {
            self.layer_part_a(c, segs)?;
        }
        Ok(c.l < self.x.layers.end)
    }

    /// The chain's end (every layer queued): the placement's `layers_done`. True when the
    /// launches included the final norm and head of row 0 (the last stage, S = 1, one graph).
    pub(super) fn end_layers(&mut self, c: Chain) -> Result<bool> {
        if let Mode::Done(head) = c.mode {
            return Ok(head);
        }
        self.moe.layers_done(&self.x)?;
        if let Some(k) = c.eager_key {
            self.eager_steps[k] += 1;
        }
        Ok(false)
    }

    /// Layer `c.l`'s part (a).
    fn layer_part_a(&mut self, c: &mut Chain, segs: &[Seg]) -> Result<()> {
        let (x, moe) = (&self.x, &mut *self.moe);
        match &c.mode {
            Mode::Eager { host } => x.layer_attn(c.l, segs, *host, moe),
            Mode::PerLayer { key } => per_layer(&self.graphs, *key)?[c.l - x.layers.start]
                .0
                .launch(&x.stream),
            Mode::Done(_) => Ok(()),
        }
    }
}

/// The per-layer graphs at `graphs[key]`.
fn per_layer(graphs: &[Option<StepGraph>], key: usize) -> Result<&[(Graph, Option<Graph>)]> {
    match graphs.get(key) {
        Some(Some(StepGraph::PerLayer(gs))) => Ok(gs),
        _ => Err(Error::Config(format!("no per-layer graphs at {key}"))),
    }
}
