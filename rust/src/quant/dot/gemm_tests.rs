//! `MultiDot`'s tests: every path bitwise the single-token kernels.

use super::super::tests::{random_act, random_row, Rng};
use super::super::{supports, vec_dot_order, vec_dot_t};
use super::*;

/// Token counts the tests hand to one call: every count up to 9 (one and more chunks of
/// the kernels' 4 or 8 tokens in registers), odd ones and `MAX_T`.
const COUNTS: [usize; 14] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 31, MAX_T];

/// Every (row, token) of the multi-token path equals the single-token kernel of the same
/// order bitwise, and the scalar kernel of that order too, for every supported type, both
/// orders, token counts 1..=MAX_T (`COUNTS`) and several row lengths.
#[test]
fn multi_equals_single_token_bitwise() {
    let mut native = 0;
    for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
        for w in GgmlType::ALL.into_iter().filter(|&w| supports(w)) {
            for order in [Order::Single, Order::Many] {
                native += usize::from(has_multi_kernel(isa, w, order));
                let mut rng = Rng::new(w.id() as u64 * 31 + 5);
                let bs = w.block_size().max(32);
                for nb in [1usize, 3, 8] {
                    let n = (nb * bs).max(w.block_size());
                    let row = random_row(w, n, &mut rng);
                    let acts: Vec<Vec<u8>> =
                        (0..MAX_T).map(|_| random_act(w, n, &mut rng)).collect();
                    let md = MultiDot::with_isa(isa, w, n, order);
                    let single = single_for(Isa::Scalar, w, order);
                    for cnt in COUNTS {
                        let refs: Vec<&[u8]> = acts[..cnt].iter().map(|a| &a[..]).collect();
                        let mut out = vec![f32::NAN; cnt];
                        md.call(&row, &refs, &mut out);
                        for (t, (o, a)) in out.iter().zip(&refs).enumerate() {
                            let want = single(n, &row, a);
                            assert_eq!(
                                o.to_bits(),
                                want.to_bits(),
                                "{} {} {order:?} n={n} cnt={cnt} t={t}",
                                isa.name(),
                                w.name()
                            );
                        }
                    }
                }
            }
        }
    }
    if Isa::Avx2.available() {
        assert!(
            native >= 7,
            "the AVX2 multi-token kernels were not exercised"
        );
    }
}

/// `rows_plain` (the rows × tokens kernels: Q4_K `Single` in row pairs and quads under
/// AVX-512, VNNI and AVX-512BW variants) equals the single-token kernel bitwise for every
/// (row, token), over row counts that leave every remainder of the pairs and quads and
/// token counts 1..=9 and wider ones up to `MAX_T` (past a kernel's most: `call` per row;
/// AVX2's Q4_K interleaved kernel from `IL_MIN_T`), every supported type and both orders,
/// with each ISA's dispatch and each AVX-512 variant the CPU runs.
#[test]
fn rows_plain_equals_single_token_bitwise() {
    let mut kernels = 0;
    for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
        for w in GgmlType::ALL.into_iter().filter(|&w| supports(w)) {
            for order in [Order::Single, Order::Many] {
                let mut rng = Rng::new(w.id() as u64 * 17 + 3);
                let n = 512; // two blocks of 256 (or 16 of 32)
                let variants = [false, true]
                    .into_iter()
                    .filter(|_| isa == Isa::Avx512)
                    .filter_map(|vnni| MultiDot::avx512_variant(w, n, order, vnni));
                let dots: Vec<MultiDot> = std::iter::once(MultiDot::with_isa(isa, w, n, order))
                    .chain(variants)
                    .collect();
                kernels += dots.iter().filter(|md| md.rows.is_some()).count();
                let rb = w.row_bytes(n).unwrap();
                let nr = 11;
                let rows: Vec<u8> = (0..nr).flat_map(|_| random_row(w, n, &mut rng)).collect();
                let acts: Vec<Vec<u8>> = (0..MAX_T).map(|_| random_act(w, n, &mut rng)).collect();
                let single = single_for(Isa::Scalar, w, order);
                for md in &dots {
                    for r in [1usize, 2, 3, 4, 5, 7, 11] {
                        for nt in (1..=9).chain([16, 17, 33, MAX_T]) {
                            let refs: Vec<&[u8]> = acts[..nt].iter().map(|a| &a[..]).collect();
                            let mut out = vec![f32::NAN; r * nt];
                            md.rows_plain(&rows[..r * rb], r, &refs, &mut out);
                            for (i, o) in out.iter().enumerate() {
                                let want = single(
                                    n,
                                    &rows[(i / nt) * rb..(i / nt + 1) * rb],
                                    refs[i % nt],
                                );
                                assert_eq!(
                                    o.to_bits(),
                                    want.to_bits(),
                                    "{} {} {order:?} rows={r} tokens={nt} at {i}",
                                    isa.name(),
                                    w.name()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    if Isa::Avx512.available() {
        // the dispatch's kernel and the AVX-512BW variant at least (VNNI too where it runs)
        assert!(
            kernels >= 2,
            "the AVX-512 rows × tokens kernels were not exercised"
        );
    } else if Isa::Avx2.available() {
        assert!(
            kernels >= 1,
            "the AVX2 rows × tokens kernel was not exercised"
        );
    }
}

/// IQ3_S (whose kernel decodes a block once for all the call's tokens): every token count
/// 1..=MAX_T and one above it, both orders, against the active ISA's single-token kernels (`vec_dot_order`:
/// AVX2 `iq3_s` / `iq3_s_tiled`), with activations at the Q8_K extremes (±127) beside
/// random ones, and tokens given in a shuffled order of distinct buffers.
#[test]
fn iq3s_every_count_equals_single_token() {
    let w = GgmlType::IQ3S;
    let mut rng = Rng::new(0x1935);
    for nb in [1usize, 2, 3, 8] {
        let n = 256 * nb;
        let row = random_row(w, n, &mut rng);
        let mut acts: Vec<Vec<u8>> = (0..MAX_T + 9).map(|_| random_act(w, n, &mut rng)).collect();
        // two tokens at the extremes: all +127 / all −127 (Q8_K never holds −128)
        let x: Vec<f32> = (0..n)
            .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
            .collect();
        super::super::quantize_act(GgmlType::Q8K, &x, &mut acts[3]).unwrap();
        let y: Vec<f32> = x.iter().map(|v| -v).collect();
        super::super::quantize_act(GgmlType::Q8K, &y, &mut acts[10]).unwrap();
        acts.rotate_left(nb);
        for order in [Order::Single, Order::Many] {
            let md = MultiDot::new(w, n, order);
            for cnt in (1..=MAX_T).chain([MAX_T + 9]) {
                let refs: Vec<&[u8]> = acts[..cnt].iter().map(|a| &a[..]).collect();
                let mut out = vec![f32::NAN; cnt];
                md.call(&row, &refs, &mut out);
                for (t, (o, a)) in out.iter().zip(&refs).enumerate() {
                    let want = vec_dot_order(w, n, &row, a, order);
                    assert_eq!(
                        o.to_bits(),
                        want.to_bits(),
                        "{order:?} n={n} cnt={cnt} t={t}"
                    );
                }
            }
        }
    }
}

/// The handle of the active ISA agrees with `vec_dot_t` (the order ggml takes for each
/// activation row of a dense matmul of t rows) on the types of the test models.
#[test]
fn handle_follows_vec_dot_t() {
    for w in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::IQ3S, GgmlType::Q5K] {
        let mut rng = Rng::new(9 + w.id() as u64);
        let n = 512;
        let row = random_row(w, n, &mut rng);
        for t in [1usize, 3, 5, 8, 13] {
            let acts: Vec<Vec<u8>> = (0..t).map(|_| random_act(w, n, &mut rng)).collect();
            for (tok, a) in acts.iter().enumerate() {
                let order = super::super::order_t(w, t, tok);
                let mut out = [0f32; 1];
                MultiDot::new(w, n, order).call(&row, &[a], &mut out);
                let want = vec_dot_t(w, n, &row, a, t, tok);
                assert_eq!(out[0].to_bits(), want.to_bits(), "{} t={t}", w.name());
                let again = vec_dot_order(w, n, &row, a, order);
                assert_eq!(again.to_bits(), want.to_bits());
            }
        }
    }
}

/// The AVX-512 multi-token kernels (Q4_K, Q6_K, IQ3_S both orders; Q8_0), both variants (VNNI
/// where the CPU has it, and AVX-512BW), against the scalar single-token kernel of the same
/// order and the AVX2 multi-token path, bitwise: token counts 1..=MAX_T and above, several
/// row lengths, activations at the extremes (±127) beside random ones.
#[test]
#[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx512"]
fn avx512_multi_equals_scalar_bitwise() {
    crate::quant::dot::require_isa(Isa::Avx512, "avx512_multi_equals_scalar_bitwise");
    let mut checked = 0;
    for w in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q8_0, GgmlType::IQ3S] {
        let mut rng = Rng::new(0x512 + w.id() as u64);
        for nb in [1usize, 2, 3, 8] {
            let n = nb * 256;
            let row = random_row(w, n, &mut rng);
            let mut acts: Vec<Vec<u8>> =
                (0..MAX_T + 5).map(|_| random_act(w, n, &mut rng)).collect();
            let x: Vec<f32> = (0..n)
                .map(|i| if i % 5 == 0 { -1.0 } else { 1.0 })
                .collect();
            let y: Vec<f32> = x.iter().map(|v| -v).collect();
            let at = w.vec_dot_type();
            super::super::quantize_act(at, &x, &mut acts[2]).unwrap();
            super::super::quantize_act(at, &y, &mut acts[9]).unwrap();
            for order in [Order::Single, Order::Many] {
                let scalar = single_for(Isa::Scalar, w, order);
                let avx2 = MultiDot::with_isa(Isa::Avx2, w, n, order);
                for vnni in [false, true] {
                    if vnni && !super::super::cpu::has_vnni() {
                        continue;
                    }
                    let md = MultiDot::avx512_variant(w, n, order, vnni)
                        .expect("an AVX-512 multi-token kernel");
                    checked += 1;
                    for cnt in (1..=MAX_T).chain([MAX_T + 5]) {
                        let refs: Vec<&[u8]> = acts[..cnt].iter().map(|a| &a[..]).collect();
                        let (mut got, mut two) = (vec![f32::NAN; cnt], vec![f32::NAN; cnt]);
                        for (o, a) in got.chunks_mut(MAX_T).zip(refs.chunks(MAX_T)) {
                            md.call(&row, a, o);
                        }
                        for (o, a) in two.chunks_mut(MAX_T).zip(refs.chunks(MAX_T)) {
                            avx2.call(&row, a, o);
                        }
                        for (t, a) in refs.iter().enumerate() {
                            let want = scalar(n, &row, a);
                            assert_eq!(
                                (got[t].to_bits(), two[t].to_bits()),
                                (want.to_bits(), want.to_bits()),
                                "{} {order:?} vnni={vnni} n={n} cnt={cnt} t={t}",
                                w.name()
                            );
                        }
                    }
                }
            }
        }
    }
    println!("avx512: {checked} multi-token kernel variants equal scalar");
    assert!(checked >= 4 * 2 * 4);
}

/// The AMX tile path (`rows_call` on Q4_K in both orders, IQ3_S and Q6_K in `Many`) against
/// the scalar single-token kernel of the order, bitwise (`tiles_equal_scalar`).
#[test]
#[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks amx"]
fn amx_rows_equal_scalar_bitwise() {
    assert!(
        amx_available(),
        "amx_rows_equal_scalar_bitwise needs AMX-INT8: tests/test_isa.py runs it only where it can"
    );
    let cases = [
        (GgmlType::Q4K, Order::Single),
        (GgmlType::Q4K, Order::Many),
        (GgmlType::IQ3S, Order::Many),
        (GgmlType::Q6K, Order::Many),
    ];
    let checked = tiles_equal_scalar(&cases, Tiles::Amx);
    println!("amx: {checked} (row, token) dots equal scalar");
}

/// The VNNI register tiles (`rows_call` where the CPU has no AMX: the AMX test's types and
/// orders) against
/// the scalar single-token kernel, bitwise (`tiles_equal_scalar`); the permuted and the
/// gathered grid lookups both where the CPU has VBMI.
#[test]
#[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks vnni"]
fn vnni_rows_equal_scalar_bitwise() {
    assert!(
        vnni_tiles_available(),
        "vnni_rows_equal_scalar_bitwise needs AVX-512 VNNI: tests/test_isa.py runs it only where it can"
    );
    let cases = [
        (GgmlType::Q4K, Order::Single),
        (GgmlType::Q4K, Order::Many),
        (GgmlType::IQ3S, Order::Many),
        (GgmlType::Q6K, Order::Many),
    ];
    let checked = tiles_equal_scalar(&cases, Tiles::Vnni);
    println!("vnni: {checked} (row, token) dots equal scalar");
}

/// The gathered IQ3_S lookups, which the VNNI tiles take on CPUs without VBMI, give the bits
/// of the VBMI permutes.
#[test]
#[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks vnni_vbmi"]
fn vnni_gather_equals_vbmi_bitwise() {
    assert!(
        vnni_tiles_available() && super::super::cpu::has_vbmi(),
        "vnni_gather_equals_vbmi_bitwise needs AVX-512 VNNI and VBMI: tests/test_isa.py runs it only where it can"
    );
    let w = GgmlType::IQ3S;
    let mut rng = Rng::new(0x5eed);
    for (n, nr, nt) in [(256usize, 9usize, 8usize), (768, 17, 33), (2048, 40, 64)] {
        let rows: Vec<u8> = (0..nr).flat_map(|_| random_row(w, n, &mut rng)).collect();
        let acts: Vec<Vec<u8>> = (0..nt).map(|_| random_act(w, n, &mut rng)).collect();
        let refs: Vec<&[u8]> = acts.iter().map(|a| &a[..]).collect();
        let (mut p, mut g) = (vec![f32::NAN; nr * nt], vec![f32::NAN; nr * nt]);
        // SAFETY: VNNI and VBMI (asserted above); whole blocks, `out` nr × nt.
        unsafe {
            gemm_vnni::rows(w, true, n, &rows, nr, &refs, &mut p, false);
            gemm_vnni::rows_iq3s_gather((n, &rows, nr, &refs, &mut g, false));
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&p), bits(&g), "n={n} nr={nr} nt={nt}");
    }
}

/// `rows_call` through `tiles` against the scalar single-token kernel of the order, bitwise:
/// row counts around the tiles' row tiles, token counts around the 16-token tile (from the
/// scheme's fewest), several row lengths, activations at the extremes (±127) beside random
/// ones, and weights whose scales and mins take every 6-bit extreme; then `rows_call_keep`'s
/// reuse of the activations' layout. The (row, token) dots checked.
fn tiles_equal_scalar(cases: &[(GgmlType, Order)], tiles: Tiles) -> usize {
    let mut checked = 0;
    for (&(w, order), nb) in cases.iter().flat_map(|c| [1usize, 3, 8].map(|nb| (c, nb))) {
        let scalar = single_for(Isa::Scalar, w, order);
        let n = nb * 256;
        let mut rng = Rng::new(0xA4 + nb as u64);
        let nr_max = 40;
        let mut rows: Vec<u8> = (0..nr_max)
            .flat_map(|_| random_row(w, n, &mut rng))
            .collect();
        // row 1: every scale (and min) at its largest, row 2: all zero weights
        // (Q6_K: every scale −128, the most negative, as 0x80 bytes; the d of every block
        // stays random)
        let (bb, sc, fill) = match w {
            GgmlType::Q4K => (144, 4..16, 0xFF),
            GgmlType::IQ3S => (110, 106..110, 0xFF),
            _ => (210, 192..208, 0x80),
        };
        let rbb = w.row_bytes(n).unwrap();
        for b in 0..nb {
            rows[rbb + bb * b + sc.start..rbb + bb * b + sc.end].fill(fill);
            let zeros = if w == GgmlType::Q6K { 0..192 } else { 2..bb };
            rows[2 * rbb + bb * b + zeros.start..2 * rbb + bb * b + zeros.end].fill(0);
        }
        let mut acts: Vec<Vec<u8>> = (0..64).map(|_| random_act(w, n, &mut rng)).collect();
        let x: Vec<f32> = (0..n)
            .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
            .collect();
        let y: Vec<f32> = x.iter().map(|v| -v).collect();
        super::super::quantize_act(GgmlType::Q8K, &x, &mut acts[1]).unwrap();
        super::super::quantize_act(GgmlType::Q8K, &y, &mut acts[17]).unwrap();
        let mut md = MultiDot::with_isa(Isa::Avx512, w, n, order);
        // the engine takes tiles here (AMX or VNNI: `Tiles::for_type`); the scheme under test
        assert_ne!(md.tiles, Tiles::None, "{} {order:?}", w.name());
        md.tiles = tiles;
        let rb = w.row_bytes(n).unwrap();
        let min_t = tiles.min_t(w);
        for nr in [1usize, 5, 8, 9, 16, 17, 40] {
            for nt in [min_t, min_t + 1, 13, 15, 16, 17, 31, 32, 40, 64] {
                assert!(md.uses_tiles(nt), "{} {order:?}", w.name());
                let refs: Vec<&[u8]> = acts[..nt].iter().map(|a| &a[..]).collect();
                let mut out = vec![f32::NAN; nr * nt];
                md.rows_call(&rows[..nr * rb], nr, &refs, &mut out);
                for r in 0..nr {
                    for (t, a) in refs.iter().enumerate() {
                        let want = scalar(n, &rows[r * rb..(r + 1) * rb], a);
                        assert_eq!(
                            out[r * nt + t].to_bits(),
                            want.to_bits(),
                            "{} {order:?} n={n} nr={nr} nt={nt} r={r} t={t}: {} vs {want}",
                            w.name(),
                            out[r * nt + t]
                        );
                        checked += 1;
                    }
                }
                // `rows_call_keep`: the same activations reuse their layout; other ones
                // (reversed: other first and last addresses) are laid out again although
                // the caller says "same"
                let mut again = vec![f32::NAN; nr * nt];
                md.rows_call_keep(&rows[..nr * rb], nr, &refs, &mut again, true);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&again), bits(&out), "{} kept layout", w.name());
                let rev: Vec<&[u8]> = refs.iter().rev().copied().collect();
                md.rows_call_keep(&rows[..nr * rb], nr, &rev, &mut again, true);
                for r in 0..nr {
                    for t in 0..nt {
                        let want = out[r * nt + (nt - 1 - t)];
                        assert_eq!(again[r * nt + t].to_bits(), want.to_bits());
                    }
                }
            }
        }
    }
    checked
}

/// Thread CPU time of a Q4_K (`Order::Single`) or IQ3_S (`Many`) run of rows × tokens: the AMX tiles
/// (`rows_call`) against the multi-token kernel per row (`call`), best of 7 interleaved:
/// `cargo test --no-default-features --release amx_rows_throughput -- --ignored --nocapture`.
#[test]
#[ignore = "benchmark"]
fn amx_rows_throughput() {
    if !amx_available() {
        println!("no AMX here");
        return;
    }
    for (w, order, n, nr) in [
        (GgmlType::Q4K, Order::Single, 2048usize, 64usize),
        (GgmlType::Q4K, Order::Single, 768, 64),
        (GgmlType::IQ3S, Order::Many, 2048, 64),
        (GgmlType::Q6K, Order::Many, 768, 64),
    ] {
        let mut rng = Rng::new(7 + n as u64);
        let rb = w.row_bytes(n).unwrap();
        let rows: Vec<u8> = (0..nr).flat_map(|_| random_row(w, n, &mut rng)).collect();
        let acts: Vec<Vec<u8>> = (0..MAX_T).map(|_| random_act(w, n, &mut rng)).collect();
        let md = MultiDot::with_isa(Isa::Avx512, w, n, order);
        for nt in [4usize, 8, 16, 32] {
            let refs: Vec<&[u8]> = acts[..nt].iter().map(|a| &a[..]).collect();
            let mut out = vec![0f32; nr * nt];
            let reps = (20_000_000 / (nr * n * nt)).max(1);
            let mut best = [u64::MAX; 2];
            for _ in 0..7 {
                for (k, b) in best.iter_mut().enumerate() {
                    let t0 = super::super::tests::thread_cpu_ns();
                    for _ in 0..reps {
                        if k == 0 {
                            md.rows_call(&rows, nr, &refs, &mut out);
                        } else {
                            for (r, o) in out.chunks_exact_mut(nt).enumerate() {
                                md.call(&rows[r * rb..(r + 1) * rb], &refs, o);
                            }
                        }
                    }
                    *b = (*b).min(super::super::tests::thread_cpu_ns() - t0);
                }
            }
            let per = |k: usize| best[k] as f64 / (reps * nr * nt * n / 256) as f64;
            println!(
                "{} {order:?} n={n} rows={nr} tokens={nt}: AMX {:.2} ns, multi-token {:.2} ns per (row, token, block): {:.2}x",
                w.name(),
                per(0),
                per(1),
                per(1) / per(0)
            );
        }
    }
}

#[test]
#[should_panic]
fn multi_rejects_a_short_activation() {
    let w = GgmlType::Q4K;
    let mut rng = Rng::new(1);
    let row = random_row(w, 256, &mut rng);
    let a = random_act(w, 256, &mut rng);
    let mut out = [0f32; 2];
    MultiDot::new(w, 256, Order::Single).call(&row, &[&a, &a[..100]], &mut out);
}

/// Decode-batch dots (1-8 tokens) of a Q4_K / Q6_K matrix far larger than the caches, one
/// thread: the multi-token kernel per row (`call`) against `rows_plain` (the rows × tokens
/// kernel where the type has one) and the grouped one-token kernel once per token
/// (`vec_dot_rows`, runs of 64 rows), best of 5 interleaved passes, GB/s of weights read:
/// `cargo test --no-default-features --release small_t_throughput -- --ignored --nocapture`.
#[test]
#[ignore = "benchmark"]
fn small_t_throughput() {
    for (w, n, nr) in [
        (GgmlType::Q4K, 2048usize, 8192usize),
        (GgmlType::Q6K, 2048, 4096),
    ] {
        let mut rng = Rng::new(11);
        let rb = w.row_bytes(n).unwrap();
        let rows: Vec<u8> = (0..nr).flat_map(|_| random_row(w, n, &mut rng)).collect();
        let acts: Vec<Vec<u8>> = (0..8).map(|_| random_act(w, n, &mut rng)).collect();
        let md = MultiDot::new(w, n, Order::Single);
        for nt in [1usize, 2, 3, 4, 8] {
            let refs: Vec<&[u8]> = acts[..nt].iter().map(|a| &a[..]).collect();
            let mut out = vec![0f32; nr * nt];
            let mut best = [f64::MAX; 3];
            for _ in 0..5 {
                for (k, b) in best.iter_mut().enumerate() {
                    let t0 = std::time::Instant::now();
                    if k == 0 {
                        for (r, o) in out.chunks_exact_mut(nt).enumerate() {
                            md.call(&rows[r * rb..(r + 1) * rb], &refs, o);
                        }
                    } else if k == 2 {
                        // the grouped one-token kernel once per token, runs of 64 rows
                        for (r0, o) in out.chunks_mut(64 * nt).enumerate() {
                            let k = o.len() / nt;
                            let run = &rows[r0 * 64 * rb..(r0 * 64 + k) * rb];
                            for (t, a) in refs.iter().enumerate() {
                                super::super::vec_dot_rows(
                                    w,
                                    n,
                                    run,
                                    a,
                                    &mut o[t * k..(t + 1) * k],
                                );
                            }
                        }
                    } else {
                        for (r0, o) in out.chunks_mut(64 * nt).enumerate() {
                            let k = o.len() / nt;
                            md.rows_plain(&rows[r0 * 64 * rb..(r0 * 64 + k) * rb], k, &refs, o);
                        }
                    }
                    *b = b.min(t0.elapsed().as_secs_f64());
                }
            }
            let gbs = |s: f64| rows.len() as f64 / s / 1e9;
            println!(
                "{} n={n} tokens={nt}: call per row {:.2} ms ({:.1} GB/s), rows_plain {:.2} ms ({:.1} GB/s), one-token rows per token {:.2} ms ({:.1} GB/s)",
                w.name(), best[0] * 1e3, gbs(best[0]), best[1] * 1e3, gbs(best[1]), best[2] * 1e3, gbs(best[2])
            );
        }
    }
}
