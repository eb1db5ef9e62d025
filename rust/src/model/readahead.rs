//! Read-ahead in the forward pass: while layer l's experts run on the pool, prefetch threads
//! fault in the mapped experts layer l+1 will most likely route to.
//!
//! The guess: layer l+1's router applied to the residual stream as it is before layer l's
//! experts (`x` after layer l's attention), normed with layer l+1's `ffn_norm`: a [E × H]
//! matvec per token, the cost of one router. Each token's top-K experts by those logits are
//! queued (`Prefetcher::prefetch`, never blocks). When the layer then runs, every distinct
//! mapped expert it uses is counted as a hit, late or miss, and a miss gets an asynchronous
//! `madvise(WILLNEED)` at once, so its pages are read in parallel rather than one fault at a
//! time by the pool.
//!
//! Legend: T = tokens in the chunk, H = hidden, E = experts, K = experts used per token.

use super::compute::Compute;
use super::ops::rms_norm;
use super::weights::Weights;
use crate::error::Result;
use crate::tier::{PrefetchStats, Prefetcher, Residency};
use std::sync::Arc;

pub struct Readahead {
    pf: Prefetcher,
    res: Arc<Residency>,
    h: Vec<f32>,      // [T, H] x normed with the next layer's ffn_norm
    logits: Vec<f32>, // [T, E] the next layer's router logits
    pick: Vec<u32>,   // [T·(K+extra)] the guessed experts
    /// Experts guessed per token beyond the K the router will pick.
    extra: usize,
}

impl Readahead {
    /// `threads` prefetch threads over `res`, guessing `K + extra` experts per token; scratch
    /// for chunks of up to `max_t` tokens.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        res: Arc<Residency>,
        threads: usize,
        extra: usize,
        max_t: usize,
        hidden: usize,
        n_expert: usize,
        k: usize,
    ) -> std::io::Result<Readahead> {
        // Queue room for two layers of a full chunk's distinct experts.
        let depth = (2 * n_expert).max(64);
        Ok(Readahead {
            pf: Prefetcher::start(res.clone(), threads, depth)?,
            res,
            h: vec![0.0; max_t * hidden],
            logits: vec![0.0; max_t * n_expert],
            pick: Vec::with_capacity(max_t * (k + extra)),
            extra,
        })
    }

    /// Queue the experts layer `next` most likely routes the `t` tokens of `x` ([T, H]) to.
    #[allow(clippy::too_many_arguments)]
    pub fn guess(
        &mut self,
        compute: &dyn Compute,
        w: &Weights,
        next: usize,
        x: &[f32],
        t: usize,
        k: usize,
        eps: f32,
    ) -> Result<()> {
        let Some(lw) = w.layers.get(next) else {
            return Ok(());
        };
        if self.res.layout().layer(next).is_none() {
            return Ok(());
        }
        let hd = lw.ffn_norm.len();
        let e = self.res.layout().n_expert;
        for i in 0..t {
            let r = i * hd..(i + 1) * hd;
            rms_norm(&x[r.clone()], &lw.ffn_norm, eps, &mut self.h[r]);
        }
        // [T, E] = h · router_nextᵀ
        compute.matmul(
            &w.mat(&lw.router),
            &self.h[..t * hd],
            t,
            &mut self.logits[..t * e],
        )?;
        if let Some(b) = &lw.router_bias {
            super::blocks::add_bias_rows(&mut self.logits[..t * e], b); // gpt-oss
        }
        self.pick.clear();
        for i in 0..t {
            top_k(
                &self.logits[i * e..(i + 1) * e],
                k + self.extra,
                &mut self.pick,
            );
        }
        self.pf.prefetch(next, &self.pick);
        Ok(())
    }

    /// Count the use of one distinct expert of `layer`; a mapped expert nobody read ahead
    /// gets its readahead started now (asynchronous, does not wait).
    pub fn used(&self, layer: usize, expert: usize) {
        if self.pf.note_use(layer, expert) {
            self.res.advise(layer, expert);
        }
    }

    /// The chunk is done: drop what is still queued for it.
    pub fn end_step(&self) {
        self.pf.end_step();
    }

    pub fn stats(&self) -> PrefetchStats {
        self.pf.stats()
    }
}

/// Append the indices of the `k` largest of `v` (ties: lower index first).
fn top_k(v: &[f32], k: usize, out: &mut Vec<u32>) {
    let start = out.len();
    for _ in 0..k.min(v.len()) {
        let mut best: Option<usize> = None;
        for (j, &x) in v.iter().enumerate() {
            if out[start..].contains(&(j as u32)) {
                continue;
            }
            if best.is_none_or(|b| x > v[b]) {
                best = Some(j);
            }
        }
        match best {
            Some(b) => out.push(b as u32),
            None => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::top_k;

    #[test]
    fn top_k_picks_the_largest_first() {
        let mut out = vec![99];
        top_k(&[0.5, 3.0, -1.0, 3.0, 2.0], 3, &mut out);
        assert_eq!(out, [99, 1, 3, 4]);
        let mut out = Vec::new();
        top_k(&[1.0, 2.0], 5, &mut out);
        assert_eq!(out, [1, 0]);
    }
}
