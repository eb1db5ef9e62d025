//! A hybrid family's recurrent state in VRAM (the GPU side of `model::deltanet`'s state;
//! kernels in cuda/deltanet.cu, launched by `gdn`).
//!
//! Each slot's state is one device buffer of `sb` floats: every recurrent layer's conv state
//! [Kc − 1, C], then every recurrent layer's delta-rule state [Nv, S, S] (the CPU path's
//! order). Checkpoints work as the CPU path's (`model::checkpoints`): a speculative window
//! (`Logits::Window`) saves the state after each of its tokens (inside the kernels, at
//! snapshot pos mod `CAP` of the slot's checkpoint area), `mark` copies the state at the
//! slot's length to the area's last snapshot (a prefix-cache point), `restore` copies a
//! snapshot back. The area [CAP + 1, sb] is allocated on a slot's first window or mark.
//!
//! Legend: T = rows of the step, H = hidden, C = conv channels, Nk / Nv = key / value heads,
//! S = head size, Kc = conv width, Lr = recurrent layers.

use crate::cuda::ops::deltanet::{Heads, StateAt};
use crate::cuda::ops::view::{bytes, prod, Dv};
use crate::cuda::{DevBuf, Gpu, PinnedBuf, Stream};
use crate::error::Result;
use crate::model::checkpoints::CAP;
use crate::model::deltanet::{Hybrid, SsmParams};

/// Every slot's recurrent state, its checkpoints, and the mixer's scratch for T rows.
pub(super) struct GdnState {
    pub sp: SsmParams,
    pub opts: Hybrid,
    /// Floats of one slot's state.
    pub sb: usize,
    st: Vec<DevBuf>,         // [slots] sb floats each
    st_tab: DevBuf,          // u64 [slots] their addresses
    ck: Vec<Option<DevBuf>>, // [slots] [CAP + 1, sb] checkpoint areas
    ck_tab: DevBuf,          // u64 [slots] their addresses (0: none)
    flags: DevBuf,           // i32 [slots] per piece of the step: save checkpoints
    pin_flags: PinnedBuf,
    /// [slots] the window positions held in the checkpoint area (at pos mod CAP), ascending.
    pos: Vec<Vec<usize>>,
    /// [slots] the marked position (snapshot CAP).
    mark: Vec<Option<usize>>,
    pub qkv: DevBuf,   // f32 [T, C]
    pub z: DevBuf,     // f32 [T, Nv·S]
    pub ba: DevBuf,    // f32 [T, 2·Nv]
    pub gates: DevBuf, // f32 [T, Nv, 2]
    pub core: DevBuf,  // f32 [T, Nv·S]
    /// The gated attention's q projection f32 [T, Nh·2D] and output gate f32 [T, Nh·D].
    pub qg: DevBuf,
    pub gate: DevBuf,
}

fn alloc_f32(gpu: &Gpu, dims: &[usize]) -> Result<DevBuf> {
    gpu.alloc(bytes(prod(dims)?, 4)?)
}

impl GdnState {
    /// Zeroed states for `n_slots` slots and scratch for `t` rows (`q_dim` = Nh·D).
    pub fn new(
        gpu: &Gpu,
        s: &Stream,
        sp: SsmParams,
        opts: Hybrid,
        n_slots: usize,
        t: usize,
        q_dim: usize,
    ) -> Result<GdnState> {
        sp.check()?;
        let lr = sp.recurrent.iter().filter(|&&r| r).count();
        let (cs, ss) = sp.state_floats();
        let sb = lr * (cs + ss);
        let st = (0..n_slots)
            .map(|_| alloc_f32(gpu, &[sb]))
            .collect::<Result<Vec<_>>>()?;
        for b in &st {
            b.zero(s)?;
        }
        let tab: Vec<u64> = st.iter().map(DevBuf::ptr).collect();
        let n = n_slots.max(1);
        let (c, vd, nv) = (sp.conv_dim(), sp.v_dim(), sp.n_v);
        let g = GdnState {
            st_tab: gpu.upload_pod(&tab)?,
            st,
            ck: (0..n_slots).map(|_| None).collect(),
            ck_tab: gpu.upload_pod(&vec![0u64; n])?,
            flags: gpu.upload_pod(&vec![0i32; n])?,
            pin_flags: gpu.host_alloc(4 * n)?,
            pos: vec![Vec::new(); n_slots],
            mark: vec![None; n_slots],
            qkv: alloc_f32(gpu, &[t, c])?,
            z: alloc_f32(gpu, &[t, vd])?,
            ba: alloc_f32(gpu, &[t, 2 * nv])?,
            gates: alloc_f32(gpu, &[t, nv, 2])?,
            core: alloc_f32(gpu, &[t, vd])?,
            qg: alloc_f32(gpu, &[t, 2 * q_dim])?,
            gate: alloc_f32(gpu, &[t, q_dim])?,
            sb,
            sp,
            opts,
        };
        s.sync()?;
        Ok(g)
    }

    /// Bytes of one slot's state.
    pub fn slot_bytes(&self) -> usize {
        4 * self.sb
    }

    /// Empties the slot's state (a sequence starting over) and its checkpoints.
    pub fn reset(&mut self, s: &Stream, slot: usize) -> Result<()> {
        self.st[slot].zero(s)?;
        self.drop_after(slot, 0);
        Ok(())
    }

    /// The slot's checkpoint area, allocated (and its address published) on first use.
    fn area(&mut self, gpu: &Gpu, s: &Stream, slot: usize) -> Result<&DevBuf> {
        if self.ck[slot].is_none() {
            let b = alloc_f32(gpu, &[CAP + 1, self.sb])?;
            self.ck_tab.write(s, slot, &[b.ptr()])?;
            self.ck[slot] = Some(b);
        }
        Ok(self.ck[slot].as_ref().expect("allocated above"))
    }

    /// The step's pieces (slot, first position, rows, is a window): a window's slot gets its
    /// checkpoints at p0 + 1 ..= p0 + t (those past p0 dropped first); the pieces' flags are
    /// written to the device, ordered before the step's kernels on `s` (the pinned staging is
    /// rewritten only after the step's sync).
    pub fn begin_step(
        &mut self,
        gpu: &Gpu,
        s: &Stream,
        pieces: impl Iterator<Item = (usize, usize, usize, bool)>,
    ) -> Result<()> {
        let mut n = 0;
        for (i, (slot, p0, t, window)) in pieces.enumerate() {
            if window {
                self.area(gpu, s, slot)?;
                self.drop_after(slot, p0);
                let held = &mut self.pos[slot];
                for p in p0 + 1..=p0 + t {
                    held.retain(|&q| q % CAP != p % CAP);
                    held.push(p);
                }
            }
            let f = i32::from(window).to_ne_bytes();
            self.pin_flags.as_mut_slice()[4 * i..4 * i + 4].copy_from_slice(&f);
            n = i + 1;
        }
        self.flags.write_async(s, 0, &self.pin_flags, 0, 4 * n)
    }

    /// Marks the slot's current state as its state at `pos` (replacing its previous mark).
    pub fn mark(&mut self, gpu: &Gpu, s: &Stream, slot: usize, pos: usize) -> Result<()> {
        let sb = 4 * self.sb;
        self.area(gpu, s, slot)?;
        let area = self.ck[slot].as_ref().expect("allocated above");
        area.copy_from(s, CAP * sb, &self.st[slot], 0, sb)?;
        self.mark[slot] = Some(pos);
        Ok(())
    }

    /// Restores the slot's state at `pos` from a checkpoint and drops those past it; false
    /// (nothing changed) without one.
    pub fn restore(&mut self, s: &Stream, slot: usize, pos: usize) -> Result<bool> {
        let snap = if self.pos[slot].contains(&pos) {
            pos % CAP
        } else if self.mark[slot] == Some(pos) {
            CAP
        } else {
            return Ok(false);
        };
        let sb = 4 * self.sb;
        if let Some(area) = &self.ck[slot] {
            self.st[slot].copy_from(s, 0, area, snap * sb, sb)?;
        }
        self.drop_after(slot, pos);
        Ok(true)
    }

    /// Drops the slot's checkpoints and mark past `pos`.
    pub fn drop_after(&mut self, slot: usize, pos: usize) {
        self.pos[slot].retain(|&p| p <= pos);
        if self.mark[slot].is_some_and(|m| m > pos) {
            self.mark[slot] = None;
        }
    }

    /// The positions the slot can be restored to, ascending.
    pub fn positions(&self, slot: usize) -> Vec<usize> {
        let mut p = self.pos[slot].clone();
        p.extend(self.mark[slot]);
        p.sort_unstable();
        p.dedup();
        p
    }

    pub fn heads(&self) -> Heads {
        Heads {
            s: self.sp.d_state,
            nk: self.sp.n_k,
            nv: self.sp.n_v,
        }
    }

    /// Piece `i`'s state at `off` floats into its slot's.
    pub fn at(&self, params: Dv, i: usize, off: usize) -> Result<StateAt> {
        Ok(StateAt {
            st_tab: Dv::of(&self.st_tab),
            ck_tab: Dv::of(&self.ck_tab),
            sp: params.sub(8 * i, 8)?,
            ck: Dv::of(&self.flags).sub(4 * i, 4)?,
            sb: self.sb,
            off,
            cap: CAP,
        })
    }
}
