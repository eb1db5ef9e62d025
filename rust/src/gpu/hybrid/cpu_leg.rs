//! A hybrid layer's CPU leg handed to the GPU: the pool computes the layer's CPU pairs
//! (`cpu_now`), their y f32 [T, H] goes to the mapped pinned buffer `pin_y`, and either an add
//! kernel reads it into x or, with the launcher's fusion on, the next layer's attention norm
//! does (`hands_off`, `handoff_buf`: `MoePlacement::handoff_y`); a deferred job's y lands
//! through its own buffers (`land_deferred`).

use super::Hybrid;
use crate::cuda::as_bytes;
use crate::cuda::ops::elementwise;
use crate::cuda::ops::view::Dv;
use crate::error::{Error, Result};
use crate::gpu::defer::Deferrer;
use crate::gpu::launch::Launcher;
use crate::model::compute::MoeInput;
use crate::model::moe_oai::moe_oai;
use crate::tier::vram::cpu_misses;

impl Hybrid {
    /// Whether layer `l`'s CPU part for `t` tokens is left in `pin_y` for the next layer's
    /// attention norm to add (`handoff_y`) instead of an add of its own: with the launcher's
    /// fusion on, a chunk that does not stream, and a next layer on this stage.
    pub(super) fn hands_off(&self, cx: &Launcher, l: usize, t: usize) -> bool {
        cx.fuse && !self.streams(t) && l + 1 < cx.layers.end
    }

    /// Layer `l` had no CPU part for `t` tokens: where the next layer's norm adds `pin_y`,
    /// it holds −0.0 (x + (−0.0) is x, bitwise). Called after the layer's routing event, so
    /// this layer's own norm has read the buffer.
    pub(super) fn no_handoff(&mut self, cx: &Launcher, l: usize, t: usize) {
        if self.hands_off(cx, l, t) {
            let n = t * self.n_embd;
            let neg0 = (-0.0f32).to_ne_bytes();
            for c in self.pin_y.as_mut_slice()[..4 * n].chunks_exact_mut(4) {
                c.copy_from_slice(&neg0);
            }
        }
    }

    /// Deferral: waits for the job in flight (if any) and adds its y f32 [T, H] into `b.x`
    /// on the stream (through `pin_land[0]` at a layer, `pin_land[1]` after the stage's last).
    pub(super) fn land_deferred(&mut self, cx: &Launcher, end: bool) -> Result<()> {
        let Some(job) = self
            .defer
            .as_mut()
            .map(Deferrer::wait)
            .transpose()?
            .flatten()
        else {
            return Ok(());
        };
        let n = job.h.len();
        let Some(pin) = self.pin_land.as_mut().map(|p| &mut p[usize::from(end)]) else {
            return Err(Error::Config("defer_experts: no landing buffers".into()));
        };
        pin.as_mut_slice()[..4 * n].copy_from_slice(as_bytes(&job.y[..n]));
        // x += y read over the link, as `cpu_now`'s add
        elementwise::add(&cx.gpu, &cx.stream, Dv::of(&cx.b.x), Dv::mapped(pin), n)?;
        self.counters.record_handoff((4 * n) as u64);
        Ok(())
    }

    /// Layer `l`'s CPU pairs left in `split.cpu_ids` (the others SKIP) computed by the pool on
    /// this thread for the T tokens of `h`, uploaded and added into `b.x` on the stream.
    pub(super) fn cpu_now(&mut self, cx: &Launcher, l: usize, t: usize) -> Result<()> {
        let (s, b, k, hd) = (&cx.stream, &cx.b, self.top_k, self.n_embd);
        let nk = t * k;
        let y = &mut self.y[..t * hd];
        let layer = self.weights.expert_layer(l);
        match &mut self.oai {
            Some((glu, sc)) => {
                // gpt-oss: the biased experts of the CPU's pairs (the others are SKIP)
                let bias = self.weights.layers[l].exp_bias.as_ref().ok_or_else(|| {
                    Error::Model(format!("layer {l}: gpt-oss experts without their biases"))
                })?;
                let a = MoeInput::new(&self.h, &self.split.cpu_ids, &self.wts, k);
                moe_oai(&*self.compute, &layer, bias, *glu, &a, &[t], sc, y)?;
            }
            None => cpu_misses(
                &*self.compute,
                &layer,
                &self.h,
                &self.split,
                &self.wts,
                k,
                y,
            )?,
        }
        self.pin_y.as_mut_slice()[..4 * t * hd].copy_from_slice(as_bytes(y));
        // x += y_miss read over the link from the pinned buffer (one kernel: no copy to
        // queue first; or the next layer's attention norm adds it: `hands_off`); ordered
        // after moe_down on the stream; pin_y is rewritten only after the next layer's event,
        // which the stream reaches after this add
        let pin_y = &self.pin_y;
        let fold = self.hands_off(cx, l, t);
        let add = || match fold {
            true => Ok(()),
            false => elementwise::add(&cx.gpu, s, Dv::of(&b.x), Dv::mapped(pin_y), t * hd),
        };
        match self.chain.as_mut() {
            Some(c) => c.around_add(s, add)?,
            None => add()?,
        }
        self.counters.record_handoff((8 * nk + 8 * t * hd) as u64);
        Ok(())
    }

    /// `pin_y` where the previous layer (routed, on this stage) left its CPU part there for
    /// layer `l`'s attention norm (`hands_off`), else None.
    pub(super) fn handoff_buf(&self, cx: &Launcher, l: usize, t: usize) -> Option<Dv> {
        let prev = l.checked_sub(1).filter(|&p| p >= cx.layers.start);
        prev.filter(|&p| cx.w.layer(p).routed() && self.hands_off(cx, p, t))
            .map(|_| Dv::mapped(&self.pin_y))
    }
}
