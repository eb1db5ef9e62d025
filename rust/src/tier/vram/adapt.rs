//! The adaptive tier's choice: every `adapt_every` steps, up to `adapt_swaps` of the most-routed
//! missing experts (decayed counts, `RoutingCounters`) replace clearly colder residents.
//!
//! Hysteresis: a missing expert with decayed count `c_in` replaces a resident with `c_out`
//! only if `c_in ≥ ratio·c_out + margin` (defaults 1.5 and 2 hits). An expert that just came in
//! therefore stays until some missing expert is routed 1.5× as often plus two hits, so two
//! experts of similar heat never trade places back and forth; with decay, a resident that
//! stops being routed loses half its count every half-life and is replaced once it has cooled
//! enough. Free slots are filled first (`c_out` = 0, the margin still applies: an expert
//! routed fewer than `margin` times is not worth a copy).

use super::table::{Key, VramTable};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptConfig {
    /// Steps between choices (0: never adapt).
    pub every: u32,
    /// Most swaps per choice.
    pub swaps: u32,
    /// `c_in ≥ ratio·c_out + margin`.
    pub ratio: f32,
    pub margin: f32,
}

impl Default for AdaptConfig {
    fn default() -> Self {
        AdaptConfig {
            every: 16,
            swaps: 4,
            ratio: 1.5,
            margin: 2.0,
        }
    }
}

impl AdaptConfig {
    /// Whether the tier chooses after step number `step` (1-based count of finished steps).
    pub fn due(&self, step: u64) -> bool {
        self.every > 0 && self.swaps > 0 && step > 0 && step.is_multiple_of(self.every as u64)
    }
}

/// One planned swap: `into` goes into `slot`, evicting `out` (None: the slot was free).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Swap {
    pub slot: u32,
    pub out: Option<Key>,
    pub into: Key,
    pub c_in: f32,
    pub c_out: f32,
}

/// Choose the swaps. `counts` is `[layer][expert]` decayed counts (`RoutingCounters::snapshot`);
/// `evictable` are the slots that may change now (`SlotFences::evictable`: Ready or Free, with
/// their key); `pending` are keys already on their way in; `has_experts(l)` says whether layer
/// `l` has routed experts. Deterministic: candidates hottest first (ties: lower (layer,
/// expert)), victims free slots first, then coldest first (ties: higher (layer, expert)).
pub fn choose(
    table: &VramTable,
    counts: &[f32],
    evictable: &[(u32, Option<Key>)],
    pending: &[Key],
    has_experts: impl Fn(usize) -> bool,
    cfg: &AdaptConfig,
) -> Vec<Swap> {
    let ne = table.n_expert();
    if cfg.swaps == 0 || ne == 0 || counts.len() != table.n_layer() * ne {
        return Vec::new();
    }
    let n = cfg.swaps as usize;
    // The hottest missing experts (a partial selection would do; n_layer·n_expert is ≤ ~10⁴).
    let mut cand: Vec<(f32, Key)> = counts
        .iter()
        .enumerate()
        .filter(|&(_, &c)| c > 0.0 && c >= cfg.margin)
        .map(|(i, &c)| (c, ((i / ne) as u32, (i % ne) as u32)))
        .filter(|&(_, (l, e))| {
            has_experts(l as usize)
                && table.slot(l as usize, e).is_none()
                && !pending.contains(&(l, e))
        })
        .collect();
    cand.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    cand.truncate(n);
    let count_of = |(l, e): Key| counts[l as usize * ne + e as usize];
    let mut victims: Vec<(f32, u32, Option<Key>)> = evictable
        .iter()
        .map(|&(s, k)| (k.map_or(-1.0, count_of), s, k))
        .collect();
    victims.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.2.cmp(&a.2)).then(a.1.cmp(&b.1)));
    let mut out = Vec::new();
    for (&(c_in, into), &(c_out, slot, k)) in cand.iter().zip(&victims) {
        let c_out = c_out.max(0.0);
        if c_in < cfg.ratio * c_out + cfg.margin {
            break; // both lists are sorted: every later pair is closer still
        }
        out.push(Swap {
            slot,
            out: k,
            into,
            c_in,
            c_out,
        });
    }
    out
}
