//! Tier tests on small MoE-shaped GGUF files written byte by byte here; every expert slab
//! holds a pattern that names its layer, tensor and expert, so a wrong slice is caught.

use super::*;
use crate::error::Error;
use crate::gguf::Gguf;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const ROWS: u64 = 4; // n_ff_exp
const COLS: u64 = 64; // n_embd

fn pattern(layer: usize, part: usize, expert: usize, i: usize) -> u8 {
    (layer * 31 + part * 7 + expert * 3 + i * 13) as u8
}

fn dir() -> PathBuf {
    // Next to the test binary (a real disk, so page-cache eviction behaves as in production).
    let exe = std::env::current_exe().unwrap();
    let d = exe
        .parent()
        .unwrap()
        .join(format!("strata-tier-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A qwen3moe-shaped file: `n_layer` blocks with stacked F32 experts (gate/up `{COLS, ROWS,
/// E}`, down `{ROWS, COLS, E}`), except the layers in `dense`, plus `pad` bytes of metadata.
pub(crate) fn write_model(
    name: &str,
    n_layer: usize,
    n_expert: usize,
    dense: &[usize],
    pad: usize,
) -> PathBuf {
    write_model_r(name, n_layer, n_expert, dense, pad, None)
}

/// As `write_model`, with F32 routers `{COLS, E}` filled with `router` bytes when given.
fn write_model_r(
    name: &str,
    n_layer: usize,
    n_expert: usize,
    dense: &[usize],
    pad: usize,
    router: Option<u8>,
) -> PathBuf {
    fn s(b: &mut Vec<u8>, v: &str) {
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        b.extend_from_slice(v.as_bytes());
    }
    let mut tensors = Vec::new(); // (name, dims, layer, part)
    for l in 0..n_layer {
        if dense.contains(&l) {
            continue;
        }
        let e = n_expert as u64;
        if let Some(r) = router {
            tensors.push((
                format!("blk.{l}.ffn_gate_inp.weight"),
                [COLS, e, 1],
                l,
                100 + r as usize,
            ));
        }
        tensors.push((
            format!("blk.{l}.ffn_gate_exps.weight"),
            [COLS, ROWS, e],
            l,
            0,
        ));
        tensors.push((format!("blk.{l}.ffn_up_exps.weight"), [COLS, ROWS, e], l, 1));
        tensors.push((
            format!("blk.{l}.ffn_down_exps.weight"),
            [ROWS, COLS, e],
            l,
            2,
        ));
    }
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&4u64.to_le_bytes());
    s(&mut b, "general.architecture");
    b.extend_from_slice(&8u32.to_le_bytes());
    s(&mut b, "qwen3moe");
    for (k, v) in [
        ("qwen3moe.block_count", n_layer),
        ("qwen3moe.expert_count", n_expert),
    ] {
        s(&mut b, k);
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&(v as u32).to_le_bytes());
    }
    s(&mut b, "general.name");
    b.extend_from_slice(&8u32.to_le_bytes());
    s(&mut b, &"x".repeat(pad + 1));
    let slab = (ROWS * COLS * 4) as usize;
    let mut off = 0u64;
    let nbytes = |dims: &[u64; 3]| (dims.iter().product::<u64>() * 4) as usize;
    for (n, dims, _, _) in &tensors {
        s(&mut b, n);
        let nd = if dims[2] == 1 { 2u32 } else { 3 };
        b.extend_from_slice(&nd.to_le_bytes());
        for d in &dims[..nd as usize] {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&0u32.to_le_bytes()); // F32
        b.extend_from_slice(&off.to_le_bytes());
        off += nbytes(dims).next_multiple_of(32) as u64;
    }
    while b.len() % 32 != 0 {
        b.push(0);
    }
    for (_, dims, l, part) in &tensors {
        if *part >= 100 {
            b.extend(std::iter::repeat_n((*part - 100) as u8, nbytes(dims)));
        } else {
            for x in 0..n_expert {
                b.extend((0..slab).map(|i| pattern(*l, *part, x, i)));
            }
        }
        while b.len() % 32 != 0 {
            b.push(0);
        }
    }
    let p = dir().join(name);
    let mut f = std::fs::File::create(&p).unwrap();
    f.write_all(&b).unwrap();
    f.sync_all().unwrap();
    p
}

fn open(p: &Path) -> Arc<Gguf> {
    Arc::new(Gguf::open(p).unwrap())
}

fn check_bytes(res: &Residency, l: usize, e: usize) {
    let b = res.expert_bytes(l, e).unwrap();
    let slab = (ROWS * COLS * 4) as usize;
    for (part, got) in [b.gate, b.up, b.down].into_iter().enumerate() {
        assert_eq!(got.len(), slab);
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, &v)| v == pattern(l, part, e, i)),
            "layer {l} expert {e} part {part} has the wrong bytes"
        );
    }
}

fn profile_for(g: &Gguf, counts: Vec<f32>) -> Profile {
    let layout = ExpertLayout::from_gguf(g).unwrap();
    let id = model_id(g, &layout);
    Profile::new(&id, layout.n_layer(), layout.n_expert, 10, "test", counts).unwrap()
}

// ---- counters -----------------------------------------------------------------------------

#[test]
fn counters_count_and_rank() {
    let c = RoutingCounters::new(2, 4, 0.0);
    c.observe(0, &[1, 3, 3, 3, 2, 1]);
    c.observe(1, &[0]);
    c.observe(1, &[9]); // out of range: ignored
    c.observe(7, &[0]); // layer out of range: ignored
    assert_eq!(c.count(0, 3), 3.0);
    assert_eq!(c.count(0, 1), 2.0);
    assert_eq!(c.count(1, 0), 1.0);
    assert_eq!(c.hits(0), 6);
    assert_eq!(c.top_k(0, 3), vec![(3, 3.0), (1, 2.0), (2, 1.0)]);
    assert_eq!(c.top_k(0, 10).len(), 4);
    assert_eq!(c.snapshot(), vec![0.0, 2.0, 1.0, 3.0, 1.0, 0.0, 0.0, 0.0]);
    for _ in 0..1000 {
        c.end_step();
    }
    assert_eq!(c.count(0, 3), 3.0, "half-life 0 means no decay");
    c.reset();
    assert_eq!(c.snapshot(), vec![0.0; 8]);
}

#[test]
fn counters_decay_by_half_life() {
    let hl = counters::DECAY_PERIOD as f64 * 2.0;
    let c = RoutingCounters::new(1, 2, hl);
    c.observe(0, &[0; 400]);
    for _ in 0..counters::DECAY_PERIOD * 2 {
        c.end_step();
    }
    // Two decay passes of 0.5^(1/2) each: one half-life.
    let got = c.count(0, 0);
    assert!((got - 200.0).abs() < 1.0, "{got}");
    for _ in 0..counters::DECAY_PERIOD * 2 {
        c.end_step();
    }
    let got = c.count(0, 0);
    assert!((got - 100.0).abs() < 1.0, "{got}");
    assert_eq!(c.hits(0), 400, "hits are not decayed");
}

// ---- profiles and fingerprints ----------------------------------------------------------

#[test]
fn profile_round_trip() {
    let p = write_model("rt.gguf", 3, 8, &[], 0);
    let g = open(&p);
    let counts: Vec<f32> = (0..24).map(|i| (i * 7 % 11) as f32 + 0.25).collect();
    let prof = profile_for(&g, counts.clone());
    let out = dir().join("rt.prof");
    prof.save(&out).unwrap();
    let back = Profile::load(&out).unwrap();
    assert_eq!(back, prof);
    assert_eq!(back.counts, counts);
    // The order is hottest first, ties in file order.
    let order = back.order();
    for w in order.windows(2) {
        let (a, b) = (
            back.count(w[0].0 as _, w[0].1 as _),
            back.count(w[1].0 as _, w[1].1 as _),
        );
        assert!(a > b || (a == b && w[0] < w[1]));
    }
}

#[test]
fn profile_refuses_bad_files() {
    let p = write_model("bad.gguf", 2, 4, &[], 0);
    let prof = profile_for(&open(&p), vec![1.0; 8]);
    let good = prof.to_bytes();
    let path = Path::new("x.prof");
    for n in 0..good.len() {
        assert!(
            matches!(
                Profile::from_bytes(path, &good[..n]),
                Err(Error::Profile(_))
            ),
            "truncation to {n} bytes accepted"
        );
    }
    for i in 8..good.len() {
        let mut b = good.clone();
        b[i] ^= 0x40;
        assert!(
            Profile::from_bytes(path, &b).is_err(),
            "flipped byte {i} accepted"
        );
    }
    let mut b = good.clone();
    b[0] = b'X';
    let e = Profile::from_bytes(path, &b).unwrap_err().to_string();
    assert!(e.contains("not a Strata profile"), "{e}");
    let layout = ExpertLayout::from_gguf(&open(&p)).unwrap();
    let id = model_id(&open(&p), &layout);
    assert!(Profile::new(&id, 2, 4, 1, "", vec![f32::NAN; 8]).is_err());
    assert!(Profile::new(&id, 2, 4, 1, "", vec![-1.0; 8]).is_err());
    assert!(Profile::new(&id, 2, 4, 1, "", vec![1.0; 7]).is_err());
}

#[test]
fn fingerprint_refuses_other_models() {
    let a = write_model("fa.gguf", 3, 8, &[], 0);
    let a2 = write_model("fa2.gguf", 3, 8, &[], 0); // a byte-identical copy
    let b = write_model("fb.gguf", 3, 8, &[], 40); // same shapes, other offsets and size
    let c = write_model("fc.gguf", 3, 4, &[], 0); // fewer experts
                                                  // Same layout, other router weights (a fine-tune): another fingerprint.
    let (r1, r2) = (
        write_model_r("fr1.gguf", 3, 8, &[], 0, Some(1)),
        write_model_r("fr2.gguf", 3, 8, &[], 0, Some(2)),
    );
    let fp = |p: &Path| {
        let g = open(p);
        model_id(&g, &ExpertLayout::from_gguf(&g).unwrap()).fingerprint
    };
    assert_ne!(fp(&r1), fp(&r2));
    assert_eq!(fp(&r1), fp(&r1));
    let (ga, gb, gc) = (open(&a), open(&b), open(&c));
    let prof = profile_for(&ga, vec![1.0; 24]);
    let la = ExpertLayout::from_gguf(&ga).unwrap();
    let id_a2 = model_id(&open(&a2), &ExpertLayout::from_gguf(&open(&a2)).unwrap());
    assert_eq!(id_a2.fingerprint, prof.fingerprint);
    prof.check(Path::new("p"), &id_a2, &la).unwrap();
    for g in [gb, gc] {
        let l = ExpertLayout::from_gguf(&g).unwrap();
        let id = model_id(&g, &l);
        assert_ne!(id.fingerprint, prof.fingerprint);
        match prof.check(Path::new("p.prof"), &id, &l) {
            Err(Error::ProfileMismatch(m)) => {
                assert!(m.contains("made for another model"), "{m}");
                assert!(m.contains("strata-fill profile"), "{m}");
            }
            other => panic!("expected a mismatch, got {other:?}"),
        }
        let r = Residency::new(g.clone(), RamMode::Mmap, Some(&prof), false);
        assert!(matches!(r, Err(Error::ProfileMismatch(_))));
    }
}

// ---- layout and residency ---------------------------------------------------------------

#[test]
fn layout_and_mapped_bytes() {
    let p = write_model("lay.gguf", 4, 8, &[2], 0);
    let g = open(&p);
    let res = Residency::new(g.clone(), RamMode::Mmap, None, false).unwrap();
    let lay = res.layout();
    assert_eq!((lay.n_layer(), lay.n_expert), (4, 8));
    assert!(lay.layer(2).is_none());
    assert_eq!(lay.expert_bytes(0), 3 * 1024);
    assert_eq!(lay.total_bytes(), 3 * 8 * 3 * 1024);
    for l in [0, 1, 3] {
        for e in 0..8 {
            assert_eq!(res.place(l, e), Some(Place::Mapped));
            check_bytes(&res, l, e);
        }
    }
    assert!(res.expert_bytes(2, 0).is_none(), "dense layer");
    assert!(res.expert_bytes(0, 8).is_none(), "expert out of range");
    assert!(res.expert_bytes(9, 0).is_none(), "layer out of range");
    assert_eq!(res.arena_bytes(), 0);
    let u = res.uses();
    assert_eq!(u.mapped_hits, 24);
    assert_eq!(u.mapped_bytes, 24 * 3 * 1024);
    assert_eq!(u.resident_hits, 0);
}

#[test]
fn resident_mode_copies_everything() {
    let p = write_model("res.gguf", 3, 8, &[1], 0);
    let res = Residency::new(open(&p), RamMode::Resident, None, true).unwrap();
    assert_eq!(res.plan().len(), 16);
    let f = fill::start(
        &res,
        FillOptions {
            threads: 3,
            ..Default::default()
        },
    )
    .unwrap();
    let pr = f.wait();
    assert!(pr.finished && !pr.cancelled);
    assert_eq!(pr.done_experts, 16);
    assert_eq!(pr.done_bytes, 16 * 3 * 1024);
    assert_eq!(res.resident(), (16, 16 * 3 * 1024));
    for l in [0, 2] {
        for e in 0..8 {
            assert!(matches!(res.place(l, e), Some(Place::Resident(_))));
            check_bytes(&res, l, e);
        }
    }
    assert_eq!(res.uses().resident_hits, 16);
    // Either locked or a warning that says how to raise the limit.
    assert!(res.locked() || res.warnings().iter().any(|w| w.contains("ulimit -l")));
    // Resident slabs are in the arena, not the map.
    let b = res.expert_bytes(0, 0).unwrap();
    let map = &res.gguf().shards[0].map;
    let in_map = |s: &[u8]| {
        let p = s.as_ptr() as usize;
        p >= map.as_ptr() as usize && p < map.as_ptr() as usize + map.len()
    };
    assert!(!in_map(b.gate) && !in_map(b.down));
    assert_eq!(b.gate.as_ptr() as usize % 64, 0);
    assert_eq!(b.down.as_ptr() as usize % 64, 0);
}

#[test]
fn budget_keeps_the_hottest() {
    let p = write_model("bud.gguf", 3, 8, &[], 0);
    let g = open(&p);
    // Counts: layer 1 expert 5 hottest, then descending by a fixed scramble.
    let counts: Vec<f32> = (0..24).map(|i| ((i * 5 + 3) % 24) as f32).collect();
    let prof = profile_for(&g, counts.clone());
    let rec = 3 * 1024u64; // every slab is a multiple of 64 bytes: no padding
    let budget = 5 * rec + rec / 2; // room for 5 experts, not 6
    let res = Residency::new(g.clone(), RamMode::Budget(budget), Some(&prof), false).unwrap();
    assert_eq!(res.arena_bytes(), 5 * rec);
    let mut want: Vec<usize> = (0..24).collect();
    want.sort_by(|&a, &b| counts[b].total_cmp(&counts[a]).then(a.cmp(&b)));
    want.truncate(5);
    fill::start(&res, FillOptions::default()).unwrap().wait();
    let table = res.table();
    let got: Vec<usize> = (0..24).filter(|&i| table[i] == 1).collect();
    want.sort();
    assert_eq!(got, want);
    for i in 0..24 {
        check_bytes(&res, i / 8, i % 8);
    }
    // Without a profile: the same share of every layer, with a warning.
    let res = Residency::new(g, RamMode::Budget(6 * rec), None, false).unwrap();
    fill::start(&res, FillOptions::default()).unwrap().wait();
    let t = res.table();
    let per_layer: Vec<usize> = (0..3)
        .map(|l| t[l * 8..l * 8 + 8].iter().filter(|&&x| x == 1).count())
        .collect();
    assert_eq!(per_layer, vec![2, 2, 2]);
    assert!(res.warnings()[0].contains("without a profile"));
}

#[test]
fn ram_mode_parse() {
    assert_eq!(RamMode::parse("mmap", 0.0).unwrap(), RamMode::Mmap);
    assert_eq!(
        RamMode::parse("budget", 1.5).unwrap(),
        RamMode::Budget(3 << 29)
    );
    assert!(matches!(
        RamMode::parse("budget", 0.0),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        RamMode::parse("budget", f64::NAN),
        Err(Error::Config(_))
    ));
    assert!(matches!(RamMode::parse("ssd", 1.0), Err(Error::Config(_))));
}

#[test]
fn cancelled_fill_leaves_a_consistent_table() {
    let p = write_model("can.gguf", 4, 16, &[], 0);
    let res = Residency::new(open(&p), RamMode::Resident, None, false).unwrap();
    let total = res.plan().len();
    // 3 KiB per expert at 60 KiB/s: about 20 experts a second, so the cancel lands mid-way.
    let opts = FillOptions {
        threads: 2,
        max_bytes_per_s: 60 * 1024,
        ..Default::default()
    };
    let f = fill::start(&res, opts).unwrap();
    assert!(fill::start(&res, opts).is_err(), "one fill at a time");
    // Readers race the fill: every read must see the map or a complete copy.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (res, stop) = (res.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for i in 0..64 {
                    check_bytes(&res, i / 16, i % 16);
                }
                n += 1;
            }
            n
        })
    };
    while f.progress().done_experts < 3 {
        std::thread::sleep(Duration::from_millis(2));
    }
    f.cancel();
    let pr = f.wait();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    assert!(pr.cancelled && pr.finished);
    assert!(pr.done_experts >= 3 && pr.done_experts < total, "{pr:?}");
    let (n, bytes) = res.resident();
    assert_eq!(n, pr.done_experts, "resident = completed copies");
    assert_eq!(bytes, pr.done_bytes);
    for i in 0..64 {
        check_bytes(&res, i / 16, i % 16);
    }
    // A second fill completes the rest.
    let pr2 = fill::start(
        &res,
        FillOptions {
            threads: 2,
            ..Default::default()
        },
    )
    .unwrap()
    .wait();
    assert_eq!(pr2.done_experts, total - n);
    assert_eq!(res.resident().0, total);
    for i in 0..64 {
        check_bytes(&res, i / 16, i % 16);
    }
}

#[test]
fn mmap_warm_faults_the_file_in() {
    // 24 MiB: the readahead that opening the header triggers (read_ahead_kb may be 8 MiB) must
    // leave most of the file out of the page cache.
    let p = write_model("warm.gguf", 4, 2048, &[], 0);
    sys::evict_file(&p).unwrap();
    let res = Residency::new(open(&p), RamMode::Mmap, None, false).unwrap();
    let before = res.page_cache_fraction();
    assert!(before < 0.5, "eviction did not work here: {before}");
    // A limit prefaults a prefix of the order only.
    let pr = fill::start(
        &res,
        FillOptions {
            threads: 2,
            limit_bytes: 10 * 3 * 1024,
            ..Default::default()
        },
    )
    .unwrap()
    .wait();
    assert_eq!(pr.done_experts, 10);
    let pr = fill::start(&res, FillOptions::default()).unwrap().wait();
    assert_eq!(pr.done_experts, 4 * 2048);
    assert_eq!(pr.done_bytes, res.layout().total_bytes());
    assert_eq!(res.page_cache_fraction(), 1.0);
    assert_eq!(res.resident().0, 0, "mmap mode has no arena");
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn prefetch_reads_mapped_experts_only() {
    let p = write_model("pf.gguf", 2, 8, &[], 0);
    let g = open(&p);
    let counts: Vec<f32> = (0..16).map(|i| if i < 4 { 10.0 } else { 0.0 }).collect();
    let prof = profile_for(&g, counts);
    let res = Residency::new(g, RamMode::Budget(4 * 3 * 1024), Some(&prof), false).unwrap();
    fill::start(&res, FillOptions::default()).unwrap().wait();
    sys::evict_file(&p).unwrap();
    let mut pf = Prefetcher::start(res.clone(), 1, 64).unwrap();
    pf.prefetch(0, &[0, 1, 2, 3, 4, 5]); // 0..3 are resident
    pf.prefetch(1, &[7]);
    pf.drain();
    let s = pf.stats();
    assert_eq!((s.queued, s.dropped, s.done), (3, 0, 3));
    assert_eq!(s.bytes, 3 * 3 * 1024);
    for (l, e) in [(0, 4), (0, 5), (1, 7)] {
        let b = res.expert_bytes(l, e).unwrap();
        for part in [b.gate, b.up, b.down] {
            assert_eq!(sys::resident_fraction(part).unwrap(), 1.0);
        }
    }
}

#[test]
fn prefetch_counts_hits_late_and_misses_per_generation() {
    let p = write_model("pfgen.gguf", 2, 8, &[], 0);
    let g = open(&p);
    let counts: Vec<f32> = (0..16).map(|i| if i < 4 { 10.0 } else { 0.0 }).collect();
    let prof = profile_for(&g, counts);
    let res = Residency::new(g, RamMode::Budget(4 * 3 * 1024), Some(&prof), false).unwrap();
    fill::start(&res, FillOptions::default()).unwrap().wait();
    let mut pf = Prefetcher::start(res.clone(), 1, 64).unwrap();
    assert_eq!(
        pf.prefetch(0, &[4, 5, 0]),
        2,
        "resident expert 0 is not queued"
    );
    assert_eq!(pf.prefetch(0, &[5, 4]), 0, "queued once per generation");
    let t0 = std::time::Instant::now();
    while pf.stats().done < 2 {
        assert!(t0.elapsed() < Duration::from_secs(30), "prefetch stalled");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!pf.note_use(0, 4), "hit");
    assert!(pf.note_use(0, 6), "a mapped expert nobody queued is a miss");
    assert!(!pf.note_use(0, 1), "resident experts are not counted");
    let s = pf.stats();
    assert_eq!((s.hits, s.late, s.misses), (1, 0, 1));
    assert_eq!(s.bytes, 2 * 3 * 1024);
    // A new generation: last step's read-ahead no longer counts, and can be queued again.
    pf.end_step();
    assert!(pf.note_use(0, 5));
    assert_eq!(pf.prefetch(0, &[5]), 1);
    pf.drain();
    assert_eq!(pf.stats().done, 3);
}

#[test]
fn ended_generations_are_cancelled_unread() {
    // 2 × 2048 cold experts: far more than one thread reads before `end_step` follows.
    let p = write_model("pfcancel.gguf", 2, 2048, &[], 0);
    sys::evict_file(&p).unwrap();
    let res = Residency::new(open(&p), RamMode::Mmap, None, false).unwrap();
    let mut pf = Prefetcher::start(res.clone(), 1, 4096).unwrap();
    let ids: Vec<u32> = (0..2048).collect();
    assert_eq!(pf.prefetch(0, &ids) + pf.prefetch(1, &ids), 4096);
    pf.end_step();
    // A use now belongs to the new generation: not a hit, whatever was read.
    assert!(pf.note_use(0, 0));
    pf.stop();
    let s = pf.stats();
    assert_eq!(s.queued, s.done + s.cancelled, "{s:?}");
    assert!(s.cancelled > 0, "{s:?}");
    assert_eq!(s.bytes, s.done * 3 * 1024);
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn prefault_dense_reads_every_tensor_but_the_experts() {
    let p = write_model_r("dense_pf.gguf", 3, 8, &[1], 0, Some(7));
    let res = Residency::new(open(&p), RamMode::Mmap, None, false).unwrap();
    let g = res.gguf().clone();
    let dense = res.dense_ranges();
    let names: Vec<&str> = g
        .tensors()
        .iter()
        .filter(|t| dense.contains(&(t.shard, t.offset, t.nbytes)))
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(
        names,
        ["blk.0.ffn_gate_inp.weight", "blk.2.ffn_gate_inp.weight"]
    );
    sys::evict_file(&p).unwrap();
    let n = res.prefault_dense(2);
    assert_eq!(n, 2 * 8 * COLS * 4);
    for &(sh, off, len) in &dense {
        let part = &g.shards[sh].map[off..off + len];
        assert_eq!(sys::resident_fraction(part).unwrap(), 1.0);
    }
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn fully_cached_follows_the_page_cache() {
    // 2 × 512 experts of 3 KiB: spans longer than one 512-page mincore step.
    let p = write_model("cached.gguf", 2, 512, &[], 0);
    let res = Residency::new(open(&p), RamMode::Mmap, None, false).unwrap();
    let g = res.gguf().clone();
    let s = *res.layout().layer(1).unwrap();
    let all = &g.shards[0].map[s.gate.base..s.gate.base + 512 * s.gate.bytes];
    sys::populate(all);
    assert!(sys::fully_cached(all));
    assert!(sys::fully_cached(&[]));
    // SAFETY: `all` lies in the read-only map of the model file.
    unsafe { sys::drop_file_map_pages(all) }.unwrap();
    sys::evict_file(&p).unwrap();
    assert!(!sys::fully_cached(all));
    assert!(res.advise(1, 3));
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn not_a_moe_model() {
    let p = write_model("dense.gguf", 2, 4, &[0, 1], 0);
    match Residency::new(open(&p), RamMode::Mmap, None, false) {
        Err(Error::Model(m)) => assert!(m.contains("not a MoE model"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

/// Cost of `observe` per id (a measurement, not a check: run with
/// `cargo test --release --no-default-features -- --ignored observe_cost --nocapture`).
/// Thread CPU time, so a loaded machine's preemption does not count.
#[test]
#[ignore]
fn observe_cost() {
    fn cpu_ns() -> u128 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid out-parameter.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
    }
    let c = RoutingCounters::new(48, 128, 1024.0);
    let ids: Vec<u32> = (0..8u32).map(|i| (i * 37) % 128).collect();
    let steps = 200_000u64;
    let (t, cpu) = (std::time::Instant::now(), cpu_ns());
    for _ in 0..steps {
        for layer in 0..48 {
            c.observe(layer, std::hint::black_box(&ids));
        }
        c.end_step();
    }
    let n = (steps * 48 * ids.len() as u64) as f64;
    let cpu = (cpu_ns() - cpu) as f64 / n;
    let wall = t.elapsed().as_nanos() as f64 / n;
    eprintln!(
        "observe: {cpu:.2} ns CPU ({wall:.2} ns wall) per id; top-8 ids per call, \
         48 layers × 128 experts, decay on"
    );
    assert!(c.count(0, 0) > 0.0);
}
