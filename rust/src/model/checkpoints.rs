//! Checkpoints of a hybrid slot's recurrent state (`deltanet`), so that a slot can be cut back
//! to a position after all: a recurrent state cannot be truncated, only restored.
//!
//! A speculative window (an entry with `Logits::Window`) checkpoints the state after each of
//! its tokens; `Model::truncate` to a checkpointed position restores it and drops the
//! checkpoints past it (a rejected draft's rollback). Checkpoints at positions the slot still
//! holds stay valid, so a later truncation to one of them works too.
//!
//! Memory: a checkpoint is one slot's whole state, every recurrent layer's conv state
//! [Kc − 1, C] and delta-rule state [Nv, S, S] in f32 (`SsmParams::state_floats` × Lr × 4
//! bytes); a slot keeps at most `CAP` of them, allocated on its first window. For
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
    spare: Vec<Snap>, // buffers of dropped checkpoints, reused
}

impl Checkpoints {
    /// For `n_slots` slots whose whole state is `conv_len` + `ssm_len` floats.
    pub fn new(n_slots: usize, conv_len: usize, ssm_len: usize) -> Checkpoints {
        Checkpoints {
            conv_len,
            ssm_len,
            slots: (0..n_slots).map(|_| Vec::new()).collect(),
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

    /// Restores the slot's state ([Lr, …] each) to its checkpoint at `pos` and drops the
    /// ones past it; false (nothing changed) without one.
    pub fn restore(&mut self, slot: usize, pos: usize, conv: &mut [f32], ssm: &mut [f32]) -> bool {
        let Some(s) = self.slots[slot].iter().find(|s| s.pos == pos) else {
            return false;
        };
        conv.copy_from_slice(&s.conv);
        ssm.copy_from_slice(&s.ssm);
        self.drop_after(slot, pos);
        true
    }

    /// Drops the slot's checkpoints past `pos` (their tokens are gone).
    pub fn drop_after(&mut self, slot: usize, pos: usize) {
        let snaps = &mut self.slots[slot];
        while snaps.last().is_some_and(|s| s.pos > pos) {
            self.spare.extend(snaps.pop());
        }
    }

    /// The positions the slot can be restored to.
    pub fn positions(&self, slot: usize) -> Vec<usize> {
        self.slots[slot].iter().map(|s| s.pos).collect()
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
        c.begin(0, 12, CAP + 2); // recycles the oldest
        assert_eq!(c.positions(0).len(), CAP);
        assert_eq!(c.positions(0).last(), Some(&(12 + CAP + 2)));
    }
}
