//! The DeltaNet recurrence (`deltanet`) of a step's pieces split by key head over the
//! compute's tasks (`Compute::for_each`): a task is (piece, key head Kh) and runs the piece's
//! tokens in order on the conv channels of Kh's q and k and of the value heads that read Kh
//! (their v), then those value heads' delta rule and gated norm. Channels, heads and slots are
//! disjoint between tasks and each one's arithmetic is `deltanet::recur`'s, so the state and
//! the output are bit for bit the serial loop's whatever the schedule.
//!
//! Pieces whose tokens save state checkpoints (speculative windows) stay on the serial loop:
//! a checkpoint is the whole layer's state after each token.
//!
//! Shapes (as `deltanet`): qkv [R', C] with C = 2·Nk·S + Nv·S (q, k, v), z and core
//! [R', Nv·S], ba [R', 2·Nv]; a slot's conv state [Lr, Kc − 1, C], its delta-rule state
//! [Lr, Nv, S(v), S(k)].

use super::batch::Piece;
use super::compute::Compute;
use super::deltanet::{
    conv_channel, gate_rows, gated_norm_head, gates, head_step, l2_norm, DeltaNetWeights, Hybrid,
    SsmParams,
};
use super::deltanet_chunk::{chunk, ChunkScratch, ChunkTasks, CHUNK};
use crate::error::Result;

/// One layer's recurrence over a step (`deltanet::Recurrent::mix`'s arguments).
pub struct Heads<'a> {
    pub sp: &'a SsmParams,
    pub opts: Hybrid,
    pub dw: &'a DeltaNetWeights,
    pub eps: f32,
    /// R': the step's rows.
    pub t: usize,
    /// The chunked form for long pieces (`deltanet_chunk`), when on.
    pub chunk: Option<&'a ChunkTasks>,
}

/// A buffer the tasks share, each writing its own disjoint ranges.
#[derive(Clone, Copy)]
struct Shared(*mut f32);
// SAFETY: tasks touch disjoint channels, heads and slots (module doc), and `for_each` returns
// only after every task has finished.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// The slots' state vectors, each task touching only its own slot's (one piece a slot).
#[derive(Clone, Copy)]
struct SharedVecs(*mut Vec<f32>);
// SAFETY: as `Shared`; the vectors are not resized while the tasks run.
unsafe impl Sync for SharedVecs {}
unsafe impl Send for SharedVecs {}

impl SharedVecs {
    /// Floats from `off` of slot `slot`'s vector.
    /// Safety: `slot` indexes the list and its vector holds more than `off` floats.
    unsafe fn at(self, slot: usize, off: usize) -> Shared {
        Shared((*self.0.add(slot)).as_mut_ptr().add(off))
    }
}

impl Heads<'_> {
    /// Runs the pieces that are not windows (`windows[j]` false or absent; the serial loop
    /// runs the windows). No allocation: a window's tasks return at once. A step's pieces
    /// are on distinct slots (`batch::check_batch`), so their states are disjoint.
    pub fn run(
        &self,
        compute: &dyn Compute,
        io: (&mut [f32], &[f32], &[f32], &mut [f32]),
        states: (&mut [Vec<f32>], &mut [Vec<f32>]),
        pieces: &[Piece],
        windows: &[bool],
    ) -> Result<()> {
        let (sp, dw) = (self.sp, self.dw);
        let (c, vd) = (sp.conv_dim(), sp.v_dim());
        let (cs, ss) = sp.state_floats();
        let (qkv, z, ba, core) = io;
        assert!(qkv.len() >= self.t * c && core.len() >= self.t * vd && z.len() >= self.t * vd);
        let (conv, ssm) = states;
        let i = dw.index;
        assert!(pieces.iter().all(|p| {
            p.slot < conv.len()
                && p.slot < ssm.len()
                && conv[p.slot].len() >= (i + 1) * cs
                && ssm[p.slot].len() >= (i + 1) * ss
        }));
        let (qkv_p, core_p) = (Shared(qkv.as_mut_ptr()), Shared(core.as_mut_ptr()));
        // [slot] every slot's state vectors; a task takes this layer's part of its slot's
        let (conv_v, ssm_v) = (SharedVecs(conv.as_mut_ptr()), SharedVecs(ssm.as_mut_ptr()));
        let nk = sp.n_k;
        let window = |j: usize| windows.get(j).copied().unwrap_or(false);
        // a piece long enough (and no window) runs chunked, on the second pass below
        let chunked = |j: usize| {
            let p: &Piece = &pieces[j];
            !window(j) && self.chunk.is_some_and(|c| p.t >= c.min_tokens.max(2))
        };
        let dst_of = |p: &Piece| {
            // SAFETY: p.slot indexes both state lists and its vectors hold layer i (asserted).
            unsafe {
                Dst {
                    qkv: qkv_p,
                    core: core_p,
                    conv: conv_v.at(p.slot, i * cs),
                    ssm: ssm_v.at(p.slot, i * ss),
                }
            }
        };
        let task = |u: usize| {
            let (j, kh) = (u / nk, u % nk);
            if window(j) || chunked(j) {
                return;
            }
            let p = &pieces[j];
            let dst = dst_of(p);
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: the CPU has FMA; the pointers' extents are checked above and the
                // ranges are disjoint between tasks (module doc).
                unsafe { self.piece_head_fma(p, kh, dst, z, ba) };
                return;
            }
            // SAFETY: as above.
            unsafe { self.piece_head(p, kh, dst, z, ba) };
        };
        let units = pieces.len() * nk;
        compute.for_each(units, &task)?;
        let Some(ct) = self.chunk else {
            return Ok(());
        };
        if !(0..pieces.len()).any(chunked) {
            return Ok(());
        }
        // the chunked pieces: task kk takes units kk, kk + tasks, … with its own scratch
        let tasks = units.min(ct.scratch.len());
        let task = |kk: usize| {
            let Ok(mut sc) = ct.scratch[kk].lock() else {
                return;
            };
            for u in (kk..units).step_by(tasks) {
                let (j, kh) = (u / nk, u % nk);
                if !chunked(j) {
                    continue;
                }
                let (p, dst) = (&pieces[j], dst_of(&pieces[j]));
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU has FMA; as the recurrent pass's.
                    unsafe { self.piece_head_chunked_fma(p, kh, dst, z, ba, &mut sc) };
                    continue;
                }
                // SAFETY: as the recurrent pass's.
                unsafe { self.piece_head_chunked(p, kh, dst, z, ba, &mut sc) };
            }
        };
        compute.for_each(tasks, &task)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "fma")]
    unsafe fn piece_head_chunked_fma(
        &self,
        p: &Piece,
        kh: usize,
        dst: Dst,
        z: &[f32],
        ba: &[f32],
        sc: &mut ChunkScratch,
    ) {
        self.piece_head_chunked(p, kh, dst, z, ba, sc)
    }

    /// Piece `p`'s tokens on key head `kh` in the chunked form: the conv and the q/k norms
    /// of every row, then each value head's chunks (`deltanet_chunk::chunk`) and gated norm.
    /// Safety: as `piece_head`'s.
    #[inline(always)]
    unsafe fn piece_head_chunked(
        &self,
        p: &Piece,
        kh: usize,
        dst: Dst,
        z: &[f32],
        ba: &[f32],
        sc: &mut ChunkScratch,
    ) {
        let (sp, dw) = (self.sp, self.dw);
        let (s, nk, nv) = (sp.d_state, sp.n_k, sp.n_v);
        let (c, vd) = (sp.conv_dim(), sp.v_dim());
        let heads = self.opts.heads;
        debug_assert_eq!(sc.head_size(), s);
        let slice =
            |ptr: *mut f32, at: usize, n: usize| std::slice::from_raw_parts_mut(ptr.add(at), n);
        let (q0, k0) = (kh * s, nk * s + kh * s);
        let mine = |hv: &usize| heads.k_head(*hv, nk, nv) == kh;
        for r in p.r0..p.r0 + p.t {
            self.conv_norm_row(dst.qkv.0.add(r * c), kh, dst.conv);
        }
        for c0 in (0..p.t).step_by(CHUNK) {
            let n = CHUNK.min(p.t - c0);
            let rows = p.r0 + c0..p.r0 + c0 + n;
            for (i, r) in rows.clone().enumerate() {
                let x = dst.qkv.0.add(r * c);
                sc.q[i * s..(i + 1) * s].copy_from_slice(slice(x, q0, s));
                sc.k[i * s..(i + 1) * s].copy_from_slice(slice(x, k0, s));
            }
            for hv in (0..nv).filter(mine) {
                for (i, r) in rows.clone().enumerate() {
                    let x = dst.qkv.0.add(r * c);
                    sc.v[i * s..(i + 1) * s].copy_from_slice(slice(x, 2 * nk * s + hv * s, s));
                    let (b, a) = gate_rows(sp, self.opts.ba, ba, r, self.t);
                    (sc.beta[i], sc.g[i]) = gates(dw, hv, b.at(hv), a.at(hv));
                }
                chunk(slice(dst.ssm.0, hv * s * s, s * s), n, sc);
                for (i, r) in rows.clone().enumerate() {
                    let o = slice(dst.core.0, r * vd + hv * s, s);
                    o.copy_from_slice(&sc.o[i * s..(i + 1) * s]);
                    let zh = &z[r * vd + hv * s..r * vd + (hv + 1) * s];
                    gated_norm_head(o, zh, &dw.norm, self.eps);
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "fma")]
    unsafe fn piece_head_fma(&self, p: &Piece, kh: usize, dst: Dst, z: &[f32], ba: &[f32]) {
        self.piece_head(p, kh, dst, z, ba)
    }

    /// Piece `p`'s tokens on key head `kh` and its value heads.
    /// Safety: `dst` points at the step's qkv and core rows and at the piece's slot's states
    /// of this layer; no other task touches this (slot, key head)'s channels and heads.
    #[inline(always)]
    unsafe fn piece_head(&self, p: &Piece, kh: usize, dst: Dst, z: &[f32], ba: &[f32]) {
        let (sp, dw) = (self.sp, self.dw);
        let (s, nk, nv) = (sp.d_state, sp.n_k, sp.n_v);
        let (c, vd) = (sp.conv_dim(), sp.v_dim());
        let heads = self.opts.heads;
        let slice =
            |ptr: *mut f32, at: usize, n: usize| std::slice::from_raw_parts_mut(ptr.add(at), n);
        for r in p.r0..p.r0 + p.t {
            let x = dst.qkv.0.add(r * c);
            self.conv_norm_row(x, kh, dst.conv);
            let (q0, k0) = (kh * s, nk * s + kh * s);
            let (qh, kk) = (&*slice(x, q0, s), &*slice(x, k0, s));
            let (b, a) = gate_rows(sp, self.opts.ba, ba, r, self.t);
            for hv in (0..nv).filter(|&hv| heads.k_head(hv, nk, nv) == kh) {
                let vh = &*slice(x, 2 * nk * s + hv * s, s);
                let m = slice(dst.ssm.0, hv * s * s, s * s);
                let o = slice(dst.core.0, r * vd + hv * s, s);
                head_step(dw, hv, qh, kk, vh, b.at(hv), a.at(hv), m, o);
                let zh = &z[r * vd + hv * s..r * vd + (hv + 1) * s];
                gated_norm_head(o, zh, &dw.norm, self.eps);
            }
        }
    }

    /// One row's conv (`x` [C], this row's projections, in place) on the channels of key
    /// head `kh`'s q and k and of the value heads that read it, advancing the conv state
    /// `conv` [Kc − 1, C]; then q and k L2-normed.
    /// Safety: `x` points at a row of C floats and `conv` at the slot's layer conv state; no
    /// other task touches these channels.
    #[inline(always)]
    unsafe fn conv_norm_row(&self, x: *mut f32, kh: usize, conv: Shared) {
        let (sp, dw) = (self.sp, self.dw);
        let (s, nk, nv, kc, c) = (sp.d_state, sp.n_k, sp.n_v, sp.d_conv, sp.conv_dim());
        let channels = |ch0: usize| {
            for ch in ch0..ch0 + s {
                let wc = &dw.conv[ch * kc..(ch + 1) * kc];
                *x.add(ch) = conv_channel(conv.0, c, ch, wc, *x.add(ch));
            }
        };
        let (q0, k0) = (kh * s, nk * s + kh * s);
        channels(q0);
        channels(k0);
        for hv in (0..nv).filter(|&hv| self.opts.heads.k_head(hv, nk, nv) == kh) {
            channels(2 * nk * s + hv * s);
        }
        l2_norm(std::slice::from_raw_parts_mut(x.add(q0), s), self.eps);
        l2_norm(std::slice::from_raw_parts_mut(x.add(k0), s), self.eps);
    }
}

/// Where one task writes.
#[derive(Clone, Copy)]
struct Dst {
    qkv: Shared,
    core: Shared,
    conv: Shared,
    ssm: Shared,
}
