//! The VRAM residency table: (layer, expert) → slot and slot → (layer, expert), the initial
//! fill order, and the per-(layer, projection) pointer tables the grouped expert kernels read
//! (`cuda::ops::quant::moe_gate_up/moe_down`: device u64 `[n_expert]`, 0 = not resident, the
//! kernel writes zeros for that pair and the CPU computes it).
//!
//! The host table is the truth; the device copy is the flat pointer array `[layer][proj][expert]`
//! (`PtrTables`), rewritten entry by entry as slots change (`entries`), stream-ordered before
//! the first step that may read the new value (docs/TIERS_VRAM.md).

use super::budget::{ExpertShape, Proj, VramPlan};
use crate::error::{Error, Result};
use crate::tier::profile::Profile;

/// `(layer, expert)`.
pub type Key = (u32, u32);

const NONE: u32 = u32::MAX;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VramTable {
    n_layer: usize,
    n_expert: usize,
    /// `[layer][expert]` → slot, `NONE` when not resident.
    slot_of: Vec<u32>,
    /// slot → key, `None` when the slot holds no published expert.
    owner: Vec<Option<Key>>,
    resident_per_layer: Vec<u32>,
}

impl VramTable {
    pub fn new(n_layer: usize, n_expert: usize, n_slots: usize) -> VramTable {
        VramTable {
            n_layer,
            n_expert,
            slot_of: vec![NONE; n_layer * n_expert],
            owner: vec![None; n_slots],
            resident_per_layer: vec![0; n_layer],
        }
    }

    pub fn n_layer(&self) -> usize {
        self.n_layer
    }

    pub fn n_expert(&self) -> usize {
        self.n_expert
    }

    pub fn n_slots(&self) -> usize {
        self.owner.len()
    }

    fn idx(&self, (l, e): Key) -> Option<usize> {
        ((l as usize) < self.n_layer && (e as usize) < self.n_expert)
            .then(|| l as usize * self.n_expert + e as usize)
    }

    /// The slot holding `key`, if resident (published).
    #[inline]
    pub fn slot(&self, layer: usize, expert: u32) -> Option<u32> {
        if layer >= self.n_layer || expert as usize >= self.n_expert {
            return None;
        }
        let s = self.slot_of[layer * self.n_expert + expert as usize];
        (s != NONE).then_some(s)
    }

    pub fn owner(&self, slot: u32) -> Option<Key> {
        self.owner.get(slot as usize).copied().flatten()
    }

    pub fn resident_in_layer(&self, layer: usize) -> u32 {
        self.resident_per_layer.get(layer).copied().unwrap_or(0)
    }

    pub fn resident(&self) -> usize {
        self.owner.iter().filter(|o| o.is_some()).count()
    }

    /// `[layer][expert]` flattened: true where resident.
    pub fn resident_mask(&self) -> Vec<bool> {
        self.slot_of.iter().map(|&s| s != NONE).collect()
    }

    /// Publish `key` in `slot`. The slot must be empty and the key not resident elsewhere.
    pub fn map(&mut self, key: Key, slot: u32) -> Result<()> {
        let i = self
            .idx(key)
            .ok_or_else(|| Error::Config(format!("expert {key:?} is out of range")))?;
        match self.owner.get(slot as usize) {
            None => return Err(Error::Config(format!("slot {slot} is out of range"))),
            Some(Some(k)) => return Err(Error::Config(format!("slot {slot} already holds {k:?}"))),
            Some(None) => {}
        }
        if self.slot_of[i] != NONE {
            return Err(Error::Config(format!(
                "expert {key:?} is already in slot {}",
                self.slot_of[i]
            )));
        }
        self.slot_of[i] = slot;
        self.owner[slot as usize] = Some(key);
        self.resident_per_layer[key.0 as usize] += 1;
        Ok(())
    }

    /// Unpublish whatever `slot` holds; returns it.
    pub fn unmap(&mut self, slot: u32) -> Option<Key> {
        let key = self.owner.get_mut(slot as usize)?.take()?;
        let i = self.idx(key).expect("mapped keys are in range");
        self.slot_of[i] = NONE;
        self.resident_per_layer[key.0 as usize] -= 1;
        Some(key)
    }
}

/// Every (layer, expert) of the layers that have experts, in the order slots are filled at
/// start: with a profile, hottest first across all layers (ties in layer-major order, as
/// `Profile::order`); without, expert-major (expert 0 of every layer, then expert 1, …) so
/// every layer gets the same share.
pub fn fill_order(
    layers: &[Option<ExpertShape>],
    n_expert: usize,
    profile: Option<&Profile>,
) -> Vec<Key> {
    let has = |l: u32| layers.get(l as usize).is_some_and(Option::is_some);
    match profile {
        Some(p) => p.order().into_iter().filter(|&(l, _)| has(l)).collect(),
        None => (0..n_expert as u32)
            .flat_map(|e| (0..layers.len() as u32).map(move |l| (l, e)))
            .filter(|&(l, _)| has(l))
            .collect(),
    }
}

/// The initial assignment: the first `n_slots` keys of `order` into slots 0, 1, …
pub fn initial_assignment(order: &[Key], n_slots: usize) -> Vec<(u32, Key)> {
    order
        .iter()
        .take(n_slots)
        .enumerate()
        .map(|(s, &k)| (s as u32, k))
        .collect()
}

/// Device address of projection `p` of the expert in `slot`, for a layer of shape `shape`:
/// `base + slot·slot_bytes + offset(p)`.
#[inline]
pub fn slot_addr(base: u64, slot_bytes: u64, slot: u32, shape: &ExpertShape, p: Proj) -> u64 {
    base + slot as u64 * slot_bytes + shape.offset(p)
}

/// The flat pointer array the device holds: `[layer][proj][expert]` u64 addresses, 0 where
/// the expert is not resident (and for layers without experts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtrTables {
    pub n_layer: usize,
    pub n_expert: usize,
    pub base: u64,
    pub slot_bytes: u64,
    pub ptrs: Vec<u64>,
}

impl PtrTables {
    /// Build every table from `table` for slots at `base` (device address of slot 0).
    pub fn build(table: &VramTable, plan: &VramPlan, base: u64) -> PtrTables {
        let (nl, ne) = (table.n_layer(), table.n_expert());
        let mut t = PtrTables {
            n_layer: nl,
            n_expert: ne,
            base,
            slot_bytes: plan.slot_bytes,
            ptrs: vec![0; nl * 3 * ne],
        };
        for l in 0..nl {
            let Some(shape) = plan.shape(l) else { continue };
            for e in 0..ne as u32 {
                if let Some(s) = table.slot(l, e) {
                    for p in Proj::ALL {
                        let i = t.index(l, p, e);
                        t.ptrs[i] = slot_addr(base, plan.slot_bytes, s, shape, p);
                    }
                }
            }
        }
        t
    }

    /// Index of (layer, proj, expert) in `ptrs`.
    #[inline]
    pub fn index(&self, layer: usize, p: Proj, expert: u32) -> usize {
        (layer * 3 + p as usize) * self.n_expert + expert as usize
    }

    /// The `[n_expert]` table of one (layer, projection): what the kernel's `ptrs` argument
    /// points at (device address `tables_base + 8·index(layer, p, 0)`).
    pub fn layer(&self, layer: usize, p: Proj) -> &[u64] {
        let i = self.index(layer, p, 0);
        &self.ptrs[i..i + self.n_expert]
    }

    /// The three entries of `key` when it is published in `slot` (`Some`) or unpublished
    /// (`None`): `(index, value)` pairs, applied to `ptrs` and returned for the device copy.
    pub fn set(&mut self, plan: &VramPlan, (l, e): Key, slot: Option<u32>) -> [(usize, u64); 3] {
        let shape = plan.shape(l as usize);
        Proj::ALL.map(|p| {
            let i = self.index(l as usize, p, e);
            let v = match (slot, shape) {
                (Some(s), Some(sh)) => slot_addr(self.base, self.slot_bytes, s, sh, p),
                _ => 0,
            };
            self.ptrs[i] = v;
            (i, v)
        })
    }
}
