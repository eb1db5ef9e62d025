//! Budget, residency table, pointer tables, the adaptive choice, the miss split and counters.

use super::*;
use crate::tier::counters::RoutingCounters;
use crate::tier::profile::{ModelId, Profile};

fn shape(g: u64, u: u64, d: u64) -> Option<ExpertShape> {
    Some(ExpertShape {
        gate: g,
        up: u,
        down: d,
    })
}

fn inputs(free_mib: u64, budget: Option<u64>) -> BudgetInputs {
    BudgetInputs {
        free_bytes: free_mib << 20,
        reserve_mib: 700,
        budget_mib: budget,
        dense_bytes: 100 << 20,
        kv_bytes: 50 << 20,
        buffer_bytes: 10 << 20,
        n_expert: 8,
        // Layer 1 has no experts; layer 2's down is larger (a Q6_K down in a Q4_K model).
        layers: vec![shape(1000, 1000, 1000), None, shape(1000, 1000, 1500)],
    }
}

#[test]
fn budget_is_free_minus_reserve_and_slots_take_the_rest() {
    let p = plan(&inputs(1000, None)).unwrap();
    assert_eq!(p.budget_bytes, 300 << 20);
    assert_eq!(p.fixed_bytes, 160 << 20);
    // Parts 256-aligned: 1024 + 1024 + 1536.
    assert_eq!(p.slot_bytes, 3584);
    assert_eq!(p.n_experts, 16);
    // (140 MiB / 3584) slots would be thousands: capped at the experts there are.
    assert_eq!(p.n_slots, 16);
    assert_eq!(p.expert_bytes_total, 8 * 3000 + 8 * 3500);

    let mut inp = inputs(1000, None);
    inp.dense_bytes = (140 << 20) - 3 * 3584 + 10; // leaves room for 2 whole slots, not 3
    inp.kv_bytes = 0;
    inp.buffer_bytes = 160 << 20;
    let p = plan(&inp).unwrap();
    assert_eq!(p.n_slots, 2, "{p:?}");
    assert!(p.fixed_bytes + p.slots_bytes() <= p.budget_bytes);
    assert!(p.fixed_bytes + (p.n_slots as u64 + 1) * p.slot_bytes > p.budget_bytes);
}

#[test]
fn a_second_staging_area_only_where_the_slots_keep_their_count() {
    let mut inp = inputs(1000, None);
    inp.dense_bytes = (140 << 20) - 10 * 3584 + 100; // room for 9 whole slots
    inp.kv_bytes = 0;
    inp.buffer_bytes = 160 << 20;
    let p = plan(&inp).unwrap();
    assert_eq!(p.n_slots, 9);
    // 100 bytes spare: 3 slots' worth more costs 3 slots (the extra does not fit the spare)
    let q = budget::with_extra(&p, 3 * 3584, None, 6).unwrap();
    assert_eq!((q.n_slots, q.fixed_bytes), (6, p.fixed_bytes + 3 * 3584));
    assert!(q.fixed_bytes + q.slots_bytes() <= q.budget_bytes);
    assert!(budget::with_extra(&p, 3 * 3584, None, 7).is_none());
    // the slots asked for (vram_slots = 5) still fit: the count is kept
    let q = budget::with_extra(&p, 3 * 3584, Some(5), 5).unwrap();
    assert_eq!(q.n_slots, 5);
    // an extra larger than the whole budget
    assert!(budget::with_extra(&p, 1 << 40, None, 0).is_none());
    // zero extra is the plan itself
    assert_eq!(budget::with_extra(&p, 0, None, 9).unwrap(), p);
}

#[test]
fn budget_setting_and_errors() {
    let p = plan(&inputs(1000, Some(200))).unwrap();
    assert_eq!(p.budget_bytes, 200 << 20);
    // 0 means "from free memory".
    assert_eq!(
        plan(&inputs(1000, Some(0))).unwrap().budget_bytes,
        300 << 20
    );
    let e = plan(&inputs(1000, Some(301))).unwrap_err().to_string();
    assert!(
        e.contains("vram_budget_mib = 301") && e.contains("300 MiB"),
        "{e}"
    );
    let e = plan(&inputs(800, None)).unwrap_err().to_string();
    assert!(
        e.contains("need 160 MiB") && e.contains("budget is 100 MiB"),
        "{e}"
    );
    // Exactly the fixed part: a valid plan with no slots.
    let p = plan(&inputs(860, None)).unwrap();
    assert_eq!(p.n_slots, 0);
}

#[test]
fn budget_for_a_share_of_the_experts() {
    let mut inp = inputs(100_000, None);
    inp.layers = vec![shape(700_000, 700_000, 700_000); 4];
    inp.n_expert = 16;
    let mib = budget::budget_mib_for_share(&inp, 0.25);
    inp.budget_mib = Some(mib);
    let p = plan(&inp).unwrap();
    assert_eq!(p.n_slots, 16, "{p:?}");
    assert!((p.resident_share() - 0.25).abs() < 1e-9);
}

#[test]
fn slot_offsets_are_aligned_and_disjoint() {
    let s = ExpertShape {
        gate: 1000,
        up: 300,
        down: 5,
    };
    assert_eq!(s.offset(Proj::Gate), 0);
    assert_eq!(s.offset(Proj::Up), 1024);
    assert_eq!(s.offset(Proj::Down), 1536);
    assert_eq!(s.record_bytes(), 1792);
    for p in Proj::ALL {
        assert_eq!(s.offset(p) % budget::SLOT_ALIGN, 0);
    }
}

#[test]
fn table_maps_both_ways_and_refuses_conflicts() {
    let mut t = VramTable::new(3, 8, 4);
    t.map((0, 5), 2).unwrap();
    assert_eq!(t.slot(0, 5), Some(2));
    assert_eq!(t.owner(2), Some((0, 5)));
    assert_eq!(t.resident_in_layer(0), 1);
    assert!(t.map((1, 1), 2).is_err(), "slot taken");
    assert!(t.map((0, 5), 3).is_err(), "expert already resident");
    assert!(t.map((3, 0), 3).is_err(), "layer out of range");
    assert!(t.map((0, 8), 3).is_err(), "expert out of range");
    assert!(t.map((0, 1), 4).is_err(), "slot out of range");
    assert_eq!(t.slot(0, 99), None);
    assert_eq!(t.unmap(2), Some((0, 5)));
    assert_eq!(t.unmap(2), None);
    assert_eq!(t.slot(0, 5), None);
    assert_eq!(t.resident(), 0);
    assert_eq!(t.resident_in_layer(0), 0);
}

fn profile(n_layer: usize, n_expert: usize, counts: Vec<f32>) -> Profile {
    let id = ModelId {
        fingerprint: 1,
        description: "test".into(),
    };
    Profile::new(&id, n_layer, n_expert, 10, "test", counts).unwrap()
}

#[test]
fn fill_order_hottest_first_or_uniform() {
    let layers = vec![shape(1, 1, 1), None, shape(1, 1, 1)];
    // Uniform: expert-major, skipping the layer without experts.
    let u = fill_order(&layers, 3, None);
    assert_eq!(u, vec![(0, 0), (2, 0), (0, 1), (2, 1), (0, 2), (2, 2)]);
    // Profile: global hottest first; layer 1 (no experts) never appears even if counted.
    let p = profile(3, 3, vec![1.0, 9.0, 3.0, 99.0, 99.0, 99.0, 5.0, 0.0, 9.0]);
    let o = fill_order(&layers, 3, Some(&p));
    assert_eq!(o, vec![(0, 1), (2, 2), (2, 0), (0, 2), (0, 0), (2, 1)]);
    let a = initial_assignment(&o, 4);
    assert_eq!(a, vec![(0, (0, 1)), (1, (2, 2)), (2, (2, 0)), (3, (0, 2))]);
    assert_eq!(initial_assignment(&o, 100).len(), 6);
}

#[test]
fn pointer_tables_hold_slot_addresses_and_zero_for_misses() {
    let mut inp = inputs(10_000, None);
    inp.n_expert = 4;
    let p = plan(&inp).unwrap();
    let mut t = VramTable::new(3, 4, 3);
    t.map((0, 3), 0).unwrap();
    t.map((2, 1), 2).unwrap();
    let base = 0x7f00_0000_0000u64;
    let mut pt = PtrTables::build(&t, &p, base);
    let sh2 = p.shape(2).unwrap();
    assert_eq!(pt.layer(0, Proj::Gate), &[0, 0, 0, base]);
    assert_eq!(pt.layer(0, Proj::Up), &[0, 0, 0, base + 1024]);
    assert_eq!(pt.layer(0, Proj::Down), &[0, 0, 0, base + 2048]);
    assert_eq!(
        pt.layer(2, Proj::Down),
        &[0, base + 2 * p.slot_bytes + sh2.offset(Proj::Down), 0, 0]
    );
    assert!(pt.layer(1, Proj::Gate).iter().all(|&v| v == 0));
    // Incremental updates equal a rebuild.
    t.unmap(0);
    t.map((2, 3), 0).unwrap();
    let ch_a = pt.set(&p, (0, 3), None);
    let ch_b = pt.set(&p, (2, 3), Some(0));
    assert!(ch_a.iter().all(|&(_, v)| v == 0));
    assert!(ch_b.iter().all(|&(i, v)| v != 0 && pt.ptrs[i] == v));
    assert_eq!(pt, PtrTables::build(&t, &p, base));
}

fn counts(n_layer: usize, n_expert: usize, hot: &[((u32, u32), f32)]) -> Vec<f32> {
    let mut c = vec![0f32; n_layer * n_expert];
    for &((l, e), v) in hot {
        c[l as usize * n_expert + e as usize] = v;
    }
    c
}

#[test]
fn adapt_swaps_the_hottest_misses_for_clearly_colder_residents() {
    let mut t = VramTable::new(2, 4, 3);
    t.map((0, 0), 0).unwrap();
    t.map((0, 1), 1).unwrap();
    t.map((1, 0), 2).unwrap();
    let ev: Vec<(u32, Option<Key>)> = (0..3).map(|s| (s, t.owner(s))).collect();
    let cfg = AdaptConfig {
        every: 1,
        swaps: 2,
        ratio: 1.5,
        margin: 2.0,
    };
    // Residents: (0,0)=10, (0,1)=1, (1,0)=4. Misses: (1,3)=30, (0,2)=7, (1,1)=6.9.
    let c = counts(
        2,
        4,
        &[
            ((0, 0), 10.0),
            ((0, 1), 1.0),
            ((1, 0), 4.0),
            ((1, 3), 30.0),
            ((0, 2), 8.0),
            ((1, 1), 6.9),
        ],
    );
    let s = choose(&t, &c, &ev, &[], |_| true, &cfg);
    // (1,3) replaces the coldest (0,1); (0,2)=8 vs (1,0)=4: 8 ≥ 1.5·4+2 = 8, swapped.
    assert_eq!(s.len(), 2);
    assert_eq!((s[0].into, s[0].out, s[0].slot), ((1, 3), Some((0, 1)), 1));
    assert_eq!((s[1].into, s[1].out, s[1].slot), ((0, 2), Some((1, 0)), 2));
    // Not clearly colder: 7.9 < 8.
    let c2 = counts(
        2,
        4,
        &[((0, 0), 10.0), ((0, 1), 5.0), ((1, 0), 4.0), ((1, 3), 7.9)],
    );
    assert!(choose(&t, &c2, &ev, &[], |_| true, &cfg).is_empty());
    // A pending key is not chosen again; a layer without experts is never chosen; only
    // evictable slots are victims.
    let s = choose(&t, &c, &ev, &[(1, 3)], |_| true, &cfg);
    assert_eq!(s[0].into, (0, 2));
    let s = choose(&t, &c, &ev, &[], |l| l == 0, &cfg);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].into, (0, 2));
    let s = choose(&t, &c, &ev[..1], &[], |_| true, &cfg);
    assert_eq!((s.len(), s[0].out), (1, Some((0, 0))));
    // Free slots are filled first, still with the margin.
    let mut t3 = VramTable::new(2, 4, 2);
    t3.map((0, 0), 0).unwrap();
    let ev3 = vec![(0, Some((0, 0))), (1, None)];
    let s = choose(&t3, &c, &ev3, &[], |_| true, &cfg);
    assert_eq!((s[0].slot, s[0].out, s[0].into), (1, None, (1, 3)));
    let tiny = counts(2, 4, &[((1, 3), 1.5)]);
    assert!(choose(&t3, &tiny, &ev3, &[], |_| true, &cfg).is_empty());
}

/// Hysteresis: two experts of similar heat in a one-slot cache do not trade places back and
/// forth as their counts wobble; a clearly hotter one does get in.
#[test]
fn adapt_hysteresis_prevents_thrashing() {
    let rc = RoutingCounters::new(1, 4, 0.0);
    let mut t = VramTable::new(1, 4, 1);
    t.map((0, 0), 0).unwrap();
    let cfg = AdaptConfig {
        every: 1,
        swaps: 1,
        ratio: 1.5,
        margin: 2.0,
    };
    let mut swaps = 0;
    for step in 0..200 {
        // Experts 0 and 1 alternate being routed; both equally hot overall.
        rc.observe(0, &[(step % 2) as u32]);
        let ev = vec![(0, t.owner(0))];
        for s in choose(&t, &rc.snapshot(), &ev, &[], |_| true, &cfg) {
            t.unmap(s.slot);
            t.map(s.into, s.slot).unwrap();
            swaps += 1;
        }
    }
    assert_eq!(swaps, 0);
    for _ in 0..200 {
        rc.observe(0, &[2, 2, 2]);
    }
    let ev = vec![(0, t.owner(0))];
    let s = choose(&t, &rc.snapshot(), &ev, &[], |_| true, &cfg);
    assert_eq!(s[0].into, (0, 2));
}

#[test]
fn adapt_due_every_n_steps() {
    let c = AdaptConfig {
        every: 4,
        swaps: 1,
        ..Default::default()
    };
    let due: Vec<u64> = (0..13).filter(|&s| c.due(s)).collect();
    assert_eq!(due, vec![4, 8, 12]);
    let off = AdaptConfig {
        every: 0,
        ..Default::default()
    };
    assert!(!(0..100).any(|s| off.due(s)));
}

#[test]
fn pcie_share_matches_the_fraction_over_time() {
    let mut s = PcieShare::new(0.3);
    let (mut took, mut seen) = (0, 0);
    for n in [1, 2, 3, 0, 5, 1, 1, 7, 2, 8].iter().cycle().take(1000) {
        let t = s.take(*n);
        assert!(t <= *n);
        took += t;
        seen += n;
    }
    assert!(
        (took as f64 / seen as f64 - 0.3).abs() < 1e-3,
        "{took}/{seen}"
    );
    let mut z = PcieShare::new(0.0);
    assert_eq!((0..50).map(|_| z.take(8)).sum::<usize>(), 0);
    let mut all = PcieShare::new(1.0);
    assert_eq!(all.take(5), 5);
    assert_eq!(PcieShare::new(f64::NAN).frac(), 0.0);
    assert_eq!(PcieShare::new(7.0).frac(), 1.0);
    // the staging cap: what is over it runs on the CPU and does not pile up as carry
    let mut capped = PcieShare::new(0.9).with_cap(2);
    assert_eq!(capped.take(6), 2);
    assert_eq!(capped.take(6), 2);
    assert_eq!(capped.take(1), 1, "carry of 0.9·1 + at most 1 left over");
    assert_eq!(capped.take(0), 0);
}

#[test]
fn split_sorts_pairs_into_hits_cpu_and_pcie() {
    let mut t = VramTable::new(2, 8, 4);
    t.map((1, 2), 0).unwrap();
    t.map((1, 5), 1).unwrap();
    t.map((0, 3), 2).unwrap(); // another layer: irrelevant here
                               // Two tokens × 4 slots on layer 1; 7 is missed twice, 3 and 0 once.
    let ids = [2, 7, 3, 5, 7, 2, 0, 6];
    let mut sp = LayerSplit::default();
    sp.split(&t, 1, &ids, &mut PcieShare::new(0.0));
    let s = pool_skip();
    assert_eq!(sp.cpu_ids, vec![s, 7, 3, s, 7, s, 0, 6]);
    assert_eq!(sp.gpu_ids, vec![2, s, s, 5, s, 2, s, s]);
    assert_eq!((sp.hits, sp.miss_cpu, sp.miss_pcie), (3, 5, 0));
    assert!(!sp.all_on_gpu());
    // Half the 4 distinct misses over PCIe: the one with most pairs (7) first, then id 0.
    sp.split(&t, 1, &ids, &mut PcieShare::new(0.5));
    assert_eq!(sp.pcie_experts, vec![7, 0]);
    assert_eq!(sp.cpu_ids, vec![s, s, 3, s, s, s, s, 6]);
    assert_eq!((sp.hits, sp.miss_cpu, sp.miss_pcie), (3, 2, 3));
    sp.split(&t, 1, &[2, 5], &mut PcieShare::new(0.0));
    assert!(sp.all_on_gpu());
}

fn pool_skip() -> u32 {
    crate::pool::SKIP
}

#[test]
fn counters_give_rates_and_request_deltas() {
    let c = HybridCounters::new(2);
    let s0 = c.snapshot();
    assert_eq!(s0.hit_rate(), None);
    assert_eq!(s0.pcie_share(), None);
    c.record_layer(0, 6, 2, 0);
    c.record_layer(1, 2, 1, 1);
    c.record_layer(7, 100, 100, 100); // out of range: ignored
    c.record_swaps(3, 3000);
    c.record_fill(500);
    c.record_pcie(40);
    let s1 = c.snapshot();
    assert_eq!(s1.hit_rate(), Some(8.0 / 12.0));
    assert_eq!(s1.layer_hit_rate(0), Some(0.75));
    assert_eq!(s1.layer_hit_rate(1), Some(0.5));
    assert_eq!(s1.pcie_share(), Some(0.25));
    assert_eq!((s1.swaps, s1.fill_bytes, s1.pcie_bytes), (3, 3500, 40));
    c.record_layer(1, 4, 0, 0);
    let d = c.snapshot().since(&s1);
    assert_eq!(d.hits, vec![0, 4]);
    assert_eq!(d.hit_rate(), Some(1.0));
    assert_eq!(d.pcie_share(), None);
}

/// The CPU side of a hybrid layer: the GPU's pairs (hits and PCIe misses, computed here by the
/// serial reference standing in for the GPU) plus `cpu_misses` through the pool equal the
/// full layer computed in one call.
#[test]
fn gpu_part_plus_cpu_misses_equals_the_full_layer() {
    use crate::model::compute::{Compute, SerialCompute};
    use crate::pool::tests::{cfg as pool_cfg, routing, Layer, Rng, MIXES};
    use crate::pool::{MoeInput, Pool};
    let pool = Pool::new(pool_cfg(2, true, false));
    let serial = SerialCompute::new();
    let mut rng = Rng(23);
    let layer = Layer::new(41, MIXES[2], 16, 64, 96);
    let view = layer.view();
    let mut table = VramTable::new(2, layer.e, 6);
    for (s, e) in [3u32, 5, 8, 9, 12, 15].iter().enumerate() {
        table.map((1, *e), s as u32).unwrap();
    }
    let mut sp = LayerSplit::default();
    for (frac, t, k) in [(0.0, 1, 8), (0.5, 1, 8), (0.25, 5, 4), (1.0, 3, 8)] {
        let mut share = PcieShare::new(frac);
        let x: Vec<f32> = (0..t * layer.h).map(|_| rng.f()).collect();
        let (ids, w) = routing(&mut rng, t, k, layer.e);
        sp.split(&table, 1, &ids, &mut share);
        assert_eq!(sp.hits + sp.miss_cpu + sp.miss_pcie, (t * k) as u64);
        let mut full = vec![0f32; t * layer.h];
        serial
            .moe(&view, &MoeInput::new(&x, &ids, &w, k), &mut full)
            .unwrap();
        let mut y_gpu = vec![0f32; t * layer.h];
        serial
            .moe_masked(&view, &MoeInput::new(&x, &sp.gpu_ids, &w, k), &mut y_gpu)
            .unwrap();
        let mut y_miss = vec![f32::NAN; t * layer.h];
        cpu_misses(&pool, &view, &x, &sp, &w, k, &mut y_miss).unwrap();
        let scale = full.iter().fold(0f32, |a, v| a.max(v.abs()));
        for (n, (f, (a, b))) in full.iter().zip(y_gpu.iter().zip(&y_miss)).enumerate() {
            assert!(
                (f - (a + b)).abs() <= 1e-5 * scale,
                "frac {frac} T={t} [{n}]: {f} vs {a} + {b}"
            );
        }
    }
}

/// The RAM stager writes each projection of the right expert at its slot offset (the test
/// model's slabs hold patterns naming layer, tensor and expert, so a wrong slice shows).
#[test]
fn ram_stager_writes_the_slot_record() {
    use crate::gguf::Gguf;
    use crate::tier::residency::{RamMode, Residency};
    let path = crate::tier::tests::write_model("vram-stage", 3, 4, &[1], 0);
    let g = std::sync::Arc::new(Gguf::open(&path).unwrap());
    let ram = Residency::new(g, RamMode::Mmap, None, false).unwrap();
    let mut inp = inputs(10_000, None);
    inp.n_expert = 4;
    inp.layers = shapes_of(ram.layout());
    let p = plan(&inp).unwrap();
    let mut st: RamStager<Vec<u8>> = RamStager::new(ram.clone(), &p);
    for key in [(0u32, 0u32), (2, 3), (0, 2)] {
        let mut buf = vec![0u8; p.slot_bytes as usize];
        let n = st.stage(key, &mut buf).unwrap();
        let sh = p.shape(key.0 as usize).unwrap();
        assert_eq!(n, sh.expert_bytes());
        let want = ram.expert_bytes(key.0 as usize, key.1 as usize).unwrap();
        for (pr, part) in [
            (Proj::Gate, want.gate),
            (Proj::Up, want.up),
            (Proj::Down, want.down),
        ] {
            let o = sh.offset(pr) as usize;
            assert_eq!(&buf[o..o + part.len()], part, "{key:?} {pr:?}");
        }
    }
    let mut small = vec![0u8; 16];
    assert!(st.stage((0, 0), &mut small).is_err());
    assert!(
        st.stage((1, 0), &mut vec![0u8; p.slot_bytes as usize])
            .is_err(),
        "dense layer"
    );
    assert!(st
        .stage((0, 9), &mut vec![0u8; p.slot_bytes as usize])
        .is_err());
    let _ = std::fs::remove_file(path);
}

#[test]
fn default_pcie_frac_balances_the_two_legs() {
    assert_eq!(default_pcie_frac(20.0, 20.0), 0.5);
    assert!((default_pcie_frac(25.0, 75.0) - 0.25).abs() < 1e-12);
    assert_eq!(default_pcie_frac(0.0, 20.0), 0.0);
    assert_eq!(default_pcie_frac(f64::NAN, 20.0), 0.0);
    assert_eq!(default_pcie_frac(10.0, 0.0), 1.0);
}

/// Feeds `steps` decode steps whose time per token is `cost(share)`; returns the shares used.
fn drive(t: &mut ShareTuner, steps: usize, cost: impl Fn(f64) -> u64) -> Vec<f64> {
    let mut used = Vec::new();
    for _ in 0..steps {
        let f = t.current();
        used.push(f);
        t.step(2, 2 * cost(f));
    }
    used
}

#[test]
fn share_tuner_keeps_the_faster_candidate() {
    use crate::tier::vram::share_tune::{BLOCK, HOLD, ROUNDS, WARM};
    let measure = (WARM + 2 * ROUNDS * BLOCK) as usize;
    // the link slows the step (the pool already reads RAM at its bound): 0 wins
    let mut t = ShareTuner::new(0.37);
    let used = drive(&mut t, measure, |f| if f > 0.0 { 1200 } else { 1000 });
    assert!(
        used[..WARM as usize].iter().all(|&f| f == 0.37),
        "the probe's share while warming"
    );
    let measured = &used[WARM as usize..];
    assert_eq!(
        measured.iter().filter(|&&f| f == 0.0).count(),
        measured.len() / 2
    );
    assert_eq!(t.measured(), 1);
    assert_eq!(t.current(), 0.0);
    let held = drive(&mut t, HOLD as usize, |f| if f > 0.0 { 1200 } else { 1000 });
    assert!(held.iter().all(|&f| f == 0.0), "held for HOLD steps");
    // measured again after HOLD: the link now pays (the pool leaves RAM bandwidth unused)
    let again = drive(&mut t, measure, |f| if f > 0.0 { 800 } else { 1000 });
    assert!(again.contains(&0.37) && again.contains(&0.0));
    assert_eq!(t.measured(), 2);
    assert_eq!(t.current(), 0.37);
    assert_eq!(t.probe(), 0.37);
}

#[test]
fn share_tuner_compares_time_per_token_and_keeps_the_probe_on_a_tie() {
    use crate::tier::vram::share_tune::{BLOCK, ROUNDS, WARM};
    let mut t = ShareTuner::new(0.5);
    for _ in 0..WARM {
        t.step(1, 1);
    }
    // the probe's blocks saw 4-token steps at 4000 ns (1000 per token), 0's blocks 1-token
    // steps at 1500: per token the probe's share is faster though its steps took longer
    for _ in 0..2 * ROUNDS * BLOCK {
        let (tok, ns) = if t.current() > 0.0 {
            (4, 4000)
        } else {
            (1, 1500)
        };
        t.step(tok, ns);
    }
    assert_eq!(t.current(), 0.5);
    let mut tie = ShareTuner::new(0.5);
    drive(&mut tie, (WARM + 2 * ROUNDS * BLOCK) as usize, |_| 1000);
    assert_eq!(tie.current(), 0.5);
    assert_eq!(ShareTuner::new(3.0).probe(), 1.0);
}
