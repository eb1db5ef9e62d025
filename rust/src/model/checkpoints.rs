//! Checkpoints of a hybrid slot's recurrent state (`deltanet`), so that a slot can be cut back
//! to a position after all: a recurrent state cannot be truncated, only restored.
//!
//! A speculative window (an entry with `Logits::Window`) checkpoints the state after each of
//! its tokens; `Model::checkpoint` marks the slot's current position (the engine marks each
//! prompt's end: a prefix-cache point, kept apart from the windows' checkpoints).
//! `Model::truncate` to a checkpointed position restores it and drops the checkpoints past
//! it (a rejected draft's rollback, a prompt sharing a cached prompt). Checkpoints at
//! positions the slot still holds stay valid, so a later truncation to one of them works too.
//!
//! Memory: a checkpoint is one slot's whole state, every recurrent layer's conv state
//! [Kc − 1, C] and delta-rule state [Nv, S, S] in f32 (`SsmParams::state_floats` × Lr × 4
//! bytes); a slot keeps at most `CAP` of them plus one mark, allocated on first use. For
//! Qwen3.5-35B-A3B (30 recurrent layers, Nv = 32, S = 128, C = 8192, Kc = 4): 63 MiB per
//! checkpoint, at most 1 GiB per slot that speculates.

/// The most checkpoints a slot keeps (the oldest are recycled first); a window longer than
/// this keeps its last `CAP` positions.
pub const CAP: usize = 16;

/// One slot's state at `pos` (the positions before it have run).
struct Snap {
    pos: usize,
    conv: Vec<f32>, // [Lr, Kc − 1, C]
    ssm: Vec<f32>,  // [Lr, Nv, S, S]
}

/// Every slot's checkpoints, in ascending positions.
pub struct Checkpoints {
    conv_len: usize,
    ssm_len: usize,
    slots: Vec<Vec<Snap>>,
    marks: Vec<Option<Snap>>, // [slots] the marked position (`mark`)
    spare: Vec<Snap>,         // buffers of dropped checkpoints, reused
}

impl Checkpoints {
    /// For `n_slots` slots whose whole state is `conv_len` + `ssm_len` floats.
    pub fn new(n_slots: usize, conv_len: usize, ssm_len: usize) -> Checkpoints {
        Checkpoints {
            conv_len,
            ssm_len,
            slots: (0..n_slots).map(|_| Vec::new()).collect(),
            marks: (0..n_slots).map(|_| None).collect(),
            spare: Vec::new(),
        }
    }

    /// A window of `t` tokens starts at position `p0` of `slot`: checkpoints at p0 + 1 ..=
    /// p0 + t follow (filled layer by layer by `save`); any past p0 are dropped.
    pub fn begin(&mut self, slot: usize, p0: usize, t: usize) {
        self.drop_after(slot, p0);
        for pos in p0 + 1..=p0 + t {
            let snaps = &mut self.slots[slot];
            let s = if snaps.len() >= CAP {
                snaps.remove(0)
            } else {
                self.spare.pop().unwrap_or_else(|| Snap {
                    pos: 0,
                    conv: vec![0f32; self.conv_len],
                    ssm: vec![0f32; self.ssm_len],
                })
            };
            snaps.push(Snap { pos, ..s });
        }
    }

    /// Copies one recurrent layer's state (`conv`, `ssm`: its parts of the slot's state, at
    /// `conv_at` / `ssm_at` in it) into the checkpoint at `pos`, where there is one.
    pub fn save(
        &mut self,
        slot: usize,
        pos: usize,
        (conv_at, conv): (usize, &[f32]),
        (ssm_at, ssm): (usize, &[f32]),
    ) {
        if let Some(s) = self.slots[slot].iter_mut().rev().find(|s| s.pos == pos) {
            s.conv[conv_at..conv_at + conv.len()].copy_from_slice(conv);
            s.ssm[ssm_at..ssm_at + ssm.len()].copy_from_slice(ssm);
        }
    }

    /// Marks the slot's whole state (`conv`, `ssm`: [Lr, …] each) at `pos`, replacing its
    /// previous mark.
    pub fn mark(&mut self, slot: usize, pos: usize, conv: &[f32], ssm: &[f32]) {
        let mut s = self.marks[slot]
            .take()
            .or_else(|| self.spare.pop())
            .unwrap_or(Snap {
                pos,
                conv: vec![0f32; self.conv_len],
                ssm: vec![0f32; self.ssm_len],
            });
        s.pos = pos;
        s.conv.copy_from_slice(conv);
        s.ssm.copy_from_slice(ssm);
        self.marks[slot] = Some(s);
    }

    /// Restores the slot's state ([Lr, …] each) to its checkpoint or mark at `pos` and drops
    /// the ones past it; false (nothing changed) without one.
    pub fn restore(&mut self, slot: usize, pos: usize, conv: &mut [f32], ssm: &mut [f32]) -> bool {
        let mark = self.marks[slot].as_ref().filter(|s| s.pos == pos);
        let Some(s) = self.slots[slot].iter().find(|s| s.pos == pos).or(mark) else {
            return false;
        };
        conv.copy_from_slice(&s.conv);
        ssm.copy_from_slice(&s.ssm);
        self.drop_after(slot, pos);
        true
    }

    /// Drops the slot's checkpoints and mark past `pos` (their tokens are gone).
    pub fn drop_after(&mut self, slot: usize, pos: usize) {
        let snaps = &mut self.slots[slot];
        while snaps.last().is_some_and(|s| s.pos > pos) {
            self.spare.extend(snaps.pop());
        }
        if self.marks[slot].as_ref().is_some_and(|s| s.pos > pos) {
            self.spare.extend(self.marks[slot].take());
        }
    }

    /// The positions the slot can be restored to, ascending.
    pub fn positions(&self, slot: usize) -> Vec<usize> {
        let mut p: Vec<usize> = self.slots[slot].iter().map(|s| s.pos).collect();
        p.extend(self.marks[slot].as_ref().map(|s| s.pos));
        p.sort_unstable();
        p.dedup();
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restores_a_window_position_and_drops_the_rest() {
        let mut c = Checkpoints::new(1, 2, 1);
        c.begin(0, 10, 3); // positions 11, 12, 13
        for (i, pos) in (11..=13).enumerate() {
            let v = i as f32;
            c.save(0, pos, (0, &[v, v]), (0, &[10.0 + v]));
        }
        let (mut conv, mut ssm) = ([0f32; 2], [0f32; 1]);
        assert!(!c.restore(0, 10, &mut conv, &mut ssm));
        assert!(c.restore(0, 12, &mut conv, &mut ssm));
        assert_eq!((conv, ssm), ([1.0, 1.0], [11.0]));
        assert_eq!(c.positions(0), [11, 12]);
        c.mark(0, 5, &[7.0, 7.0], &[8.0]);
        c.begin(0, 12, CAP + 2); // recycles the oldest window checkpoints, not the mark
        assert_eq!(c.positions(0).len(), CAP + 1);
        assert_eq!(c.positions(0)[0], 5);
        assert_eq!(c.positions(0).last(), Some(&(12 + CAP + 2)));
        assert!(c.restore(0, 5, &mut conv, &mut ssm));
        assert_eq!((conv, ssm, c.positions(0)), ([7.0, 7.0], [8.0], vec![5]));
        c.drop_after(0, 4);
        assert!(c.positions(0).is_empty());
    }
}
