//! Grouped-query attention of one query position: all the query heads that read one KV
//! head, in one pass over that head's K and V rows (`attn_gqa_avx2.rs`). Bitwise equal to
//! `attention::attend_head` for each head (sinks included) in the multi-row order (t > 1)
//! over an f16 cache, the case these kernels serve (`serves`); the other cases run
//! `attend_head` per head.
//!
//! Shapes: Nh query heads in Nkv groups of G = Nh / Nkv consecutive heads, D = head dim,
//! n = visible positions; q and out are the group's [G, D].

use super::attention::{attend_head, AttnScratch, AttnShape};
use super::attn_gqa_avx2 as k;
use super::kv::KvType;
use crate::error::Result;
use half::f16;

/// Heads served by one pass (larger groups take several passes).
pub const MAX_HEADS: usize = 8;

/// Query rows served by one pass (`attend_group_rows`): each block of V rows is widened once
/// for all of them.
pub const MAX_ROWS: usize = 4;

/// Per-task scratch of the grouped kernels, sized at load.
pub struct GroupScratch {
    qf: Vec<f32>,     // [MAX_ROWS, 8, D] the heads' queries rounded to f16, widened
    scores: Vec<f32>, // [MAX_ROWS, 8, C] scores, then probabilities (row stride C)
    acc: Vec<f32>,    // [MAX_ROWS, 8 lanes, 8, D] P·V lane accumulators
    pack: Vec<f32>,   // a block of V rows widened, as 16-dimension slabs (`group_pv`)
    out: Vec<f32>,    // [MAX_ROWS, 8, D] a pass's outputs, before they go to the rows
    n_ctx: usize,
}

impl GroupScratch {
    pub fn new(n_ctx: usize, ty: KvType, head_dim: usize) -> GroupScratch {
        let on = ty == KvType::F16;
        let z = |n: usize| vec![0f32; if on { n } else { 0 }];
        GroupScratch {
            qf: z(MAX_ROWS * MAX_HEADS * head_dim),
            scores: z(MAX_ROWS * MAX_HEADS * n_ctx),
            acc: z(MAX_ROWS * 8 * MAX_HEADS * head_dim),
            pack: z(k::pack_len(head_dim)),
            out: z(MAX_ROWS * MAX_HEADS * head_dim),
            n_ctx: if on { n_ctx } else { 0 },
        }
    }
}

/// Whether the grouped kernels serve a chunk of `t` query rows with this shape.
pub fn serves(s: &AttnShape, t: usize) -> bool {
    t > 1
        && s.ty == KvType::F16
        && s.head_dim.is_multiple_of(32)
        && s.n_head_kv > 0
        && s.n_head.is_multiple_of(s.n_head_kv)
        && k::available()
}

/// Attention of one position over keys/values [0, n) for the query heads of KV head `g`
/// (heads g·G..(g+1)·G), one of `t` query rows: `q`, `out` are those heads' [G, D]
/// (`attend_group_rows` of one row; the tests' reference for one position).
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub fn attend_group(
    s: &AttnShape,
    k_cache: &[u8],
    v_cache: &[u8],
    n: usize,
    g: usize,
    q: &[f32],
    out: &mut [f32],
    gs: &mut GroupScratch,
    hs: &mut AttnScratch,
    t: usize,
) -> Result<()> {
    attend_group_rows(s, k_cache, v_cache, &[n], g, &[q], &mut [out], gs, hs, t)
}

/// `attend_group` for up to `MAX_ROWS` query rows of one chunk at once (row r over keys and
/// values [0, ns[r]) of the same cache, `qs[r]` and `outs[r]` its heads' [G, D]): the rows
/// share each widened block of V rows; every row's result is bitwise its own
/// `attend_group`'s (the same q·k, softmax and P·V order per row).
#[allow(clippy::too_many_arguments)]
pub fn attend_group_rows(
    s: &AttnShape,
    k_cache: &[u8],
    v_cache: &[u8],
    ns: &[usize],
    g: usize,
    qs: &[&[f32]],
    outs: &mut [&mut [f32]],
    gs: &mut GroupScratch,
    hs: &mut AttnScratch,
    t: usize,
) -> Result<()> {
    let d = s.head_dim;
    let group = s.n_head / s.n_head_kv;
    let rows = ns.len();
    assert!(
        rows <= MAX_ROWS && qs.len() == rows && outs.len() == rows,
        "attention rows"
    );
    let n_max = ns.iter().copied().max().unwrap_or(0);
    if !serves(s, t) || n_max > gs.n_ctx {
        for ((&n, q), out) in ns.iter().zip(qs).zip(outs.iter_mut()) {
            for (j, (qh, oh)) in q.chunks_exact(d).zip(out.chunks_exact_mut(d)).enumerate() {
                attend_head(s, k_cache, v_cache, n, g * group + j, qh, oh, hs, t)?;
            }
        }
        return Ok(());
    }
    let kvo = g * s.head_bytes;
    let mut h = 0;
    while h < group {
        let m = match group - h {
            r if r >= 8 => 8,
            r if r >= 4 => 4,
            r if r >= 2 => 2,
            _ => 1,
        };
        let h0 = g * group + h; // the first query head of this pass
        let sk = s.sinks.map(|sk| &sk[h0..h0 + m]);
        let pass = Pass {
            s,
            k_cache,
            v_cache,
            ns,
            kvo,
            sinks: sk,
        };
        match m {
            8 => pass.heads::<8>(qs, h, gs),
            4 => pass.heads::<4>(qs, h, gs),
            2 => pass.heads::<2>(qs, h, gs),
            _ => pass.heads::<1>(qs, h, gs),
        }
        for (r, out) in outs.iter_mut().enumerate() {
            out[h * d..(h + m) * d].copy_from_slice(&gs.out[r * m * d..(r + 1) * m * d]);
        }
        h += m;
    }
    Ok(())
}

/// `group_scores`' signature (q·k of M heads).
type ScoresFn = unsafe fn(&[u8], usize, usize, &[f32], usize, f32, &mut [f32], usize);
/// `group_pv`'s signature (P·V of M heads).
type PvFn =
    unsafe fn(&[f32], usize, &[usize], &[u8], usize, usize, &mut [f32], &mut [f32], &mut [f32]);

/// `group_scores_x2_pair`'s signature (q·k of M heads for two query rows).
type PairFn =
    unsafe fn(&[u8], usize, usize, &[f32], &[f32], usize, f32, &mut [f32], &mut [f32], usize);

/// The q·k and P·V kernels of M heads at head dim `d`, and the q·k of two rows at once where
/// there is one: the AVX-512 ones (bitwise the AVX2 ones) where the active ISA is AVX-512
/// (`STRATA_ISA` or the CPU's best), the CPU runs them and d ≤ 256; else the AVX2 ones.
fn kernels<const M: usize>(d: usize) -> (ScoresFn, PvFn, Option<PairFn>) {
    if d <= 256
        && crate::quant::dot::active_isa() == crate::quant::dot::Isa::Avx512
        && k::available_x2()
    {
        (
            k::group_scores_x2::<M>,
            k::group_pv_x2::<M>,
            Some(k::group_scores_x2_pair::<M>),
        )
    } else {
        (k::group_scores::<M>, k::group_pv::<M>, None)
    }
}

/// One pass over a KV head's rows: the cache, each query row's visible positions, the KV
/// head's byte offset in a row and the pass's heads' sinks.
struct Pass<'a> {
    s: &'a AttnShape<'a>,
    k_cache: &'a [u8],
    v_cache: &'a [u8],
    ns: &'a [usize],
    kvo: usize,
    sinks: Option<&'a [f32]>,
}

impl Pass<'_> {
    /// M heads of one KV head for each query row (heads h..h + M of the group: [M, D] at
    /// `qs[r][h·D..]`):
    /// q·k, softmax (with the heads' [M] sinks where given) of each row, then P·V of all the
    /// rows in one pass over the V rows, into `gs.out` [R, M, D].
    fn heads<const M: usize>(&self, qs: &[&[f32]], h: usize, gs: &mut GroupScratch) {
        let d = self.s.head_dim;
        let stride = gs.n_ctx;
        let rows = self.ns.len();
        let scale = 1.0 / (d as f32).sqrt();
        let (qk, pv, pair) = kernels::<M>(d);
        // each row's [M, D] queries rounded to f16 (the key type's dot type), widened
        for (r, q) in qs.iter().enumerate() {
            let qf = &mut gs.qf[r * M * d..(r + 1) * M * d];
            for (o, &x) in qf.iter_mut().zip(&q[h * d..(h + M) * d]) {
                *o = f16::from_f32(x).to_f32();
            }
        }
        let (qf, scores) = (&gs.qf, &mut gs.scores);
        let (kc, rb, kvo) = (self.k_cache, self.s.row_bytes, self.kvo);
        let mut r = 0;
        while r < rows {
            // two rows share each widened pair of K rows up to their common even length;
            // the rest of each row (and a row without a partner) runs alone from there
            let (two, done) = match pair {
                Some(f) if r + 1 < rows => {
                    let shared = self.ns[r].min(self.ns[r + 1]) & !1;
                    let (sa, sb) =
                        scores[r * M * stride..(r + 2) * M * stride].split_at_mut(M * stride);
                    let (qa, qb) = (
                        &qf[r * M * d..(r + 1) * M * d],
                        &qf[(r + 1) * M * d..(r + 2) * M * d],
                    );
                    // SAFETY: `kernels` checked the CPU features; the kernel bound-checks its rows.
                    unsafe { f(kc, rb, kvo, qa, qb, shared, scale, sa, sb, stride) };
                    (2, shared)
                }
                _ => (1, 0),
            };
            for rr in r..r + two {
                let n = self.ns[rr];
                let q1 = &qf[rr * M * d..(rr + 1) * M * d];
                let row = &mut scores[rr * M * stride..(rr + 1) * M * stride];
                // SAFETY: `serves` (and `kernels`) checked the CPU features; the kernels
                // bound-check their rows.
                unsafe {
                    if n > done {
                        qk(
                            &kc[done * rb..],
                            rb,
                            kvo,
                            q1,
                            n - done,
                            scale,
                            &mut row[done..],
                            stride,
                        );
                    }
                    for (j, hrow) in row.chunks_exact_mut(stride).enumerate() {
                        k::softmax_f16p(&mut hrow[..n], self.sinks.map(|sk| sk[j]));
                    }
                }
            }
            r += two;
        }
        let (acc, pack) = (&mut gs.acc, &mut gs.pack);
        let (p, out) = (&gs.scores[..rows * M * stride], &mut gs.out[..rows * M * d]);
        // SAFETY: as above.
        unsafe {
            pv(
                p,
                stride,
                self.ns,
                self.v_cache,
                self.s.row_bytes,
                self.kvo,
                acc,
                pack,
                out,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kv::KvCache;
    use crate::quant::dot::Isa;
    use crate::quant::vexp::{expf_lane, softmax};

    fn cache(nkv: usize, d: usize, n: usize) -> KvCache {
        let val = |i: usize| ((i * 7919 + 13) % 1013) as f32 / 253.0 - 2.0;
        let mut kv = KvCache::new(KvType::F16, 1, n.max(1), nkv, d, 1).unwrap();
        for p in 0..n {
            let k: Vec<f32> = (0..nkv * d).map(|i| val(i + 31 * p)).collect();
            let v: Vec<f32> = (0..nkv * d).map(|i| val(i * 3 + 17 * p + 5)).collect();
            kv.write(0, 0, p, &k, &v).unwrap();
        }
        kv
    }

    /// Every head of every group equals `attend_head` (the per-head path, itself checked
    /// element by element against ggml's orders in `attention::tests`) bit for bit: groups of
    /// 8, 6 (a pass of 4 and one of 2) and 3, positions short of one 8-lane step, not a
    /// multiple of 8, and spanning several P·V blocks (256 positions).
    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx2"]
    fn group_equals_attend_head_bitwise() {
        // (without AVX2 `serves` is false and the per-head path runs: nothing to compare)
        crate::quant::dot::require_isa(Isa::Avx2, "group_equals_attend_head_bitwise");
        assert!(k::available());
        let d = 64;
        let sinks: Vec<f32> = (0..16).map(|i| i as f32 * 0.7 - 4.0).collect();
        for (nh, nkv, sink) in [
            (16usize, 2usize, false),
            (12, 2, false),
            (3, 1, false),
            (16, 2, true),
            (3, 1, true),
        ] {
            let group = nh / nkv;
            let kv = cache(nkv, d, 530);
            let shape = AttnShape::of(&kv, nh, nkv, d).with(sink.then_some(&sinks[..nh]), None);
            assert!(serves(&shape, 2));
            let q: Vec<f32> = (0..nh * d)
                .map(|i| ((i * 104_729) % 2003) as f32 / 700.0 - 1.4)
                .collect();
            let mut gs = GroupScratch::new(530, KvType::F16, d);
            let mut hs = AttnScratch::new(530, KvType::F16, d);
            for n in [1usize, 5, 8, 61, 64, 65, 150, 256, 257, 530] {
                let (kc, vc) = kv.layer(0, 0, n);
                for g in 0..nkv {
                    let r = g * group * d..(g + 1) * group * d;
                    let mut got = vec![f32::NAN; group * d];
                    attend_group(
                        &shape,
                        kc,
                        vc,
                        n,
                        g,
                        &q[r.clone()],
                        &mut got,
                        &mut gs,
                        &mut hs,
                        4,
                    )
                    .unwrap();
                    for j in 0..group {
                        let h = g * group + j;
                        let mut want = vec![0f32; d];
                        let qh = &q[h * d..(h + 1) * d];
                        attend_head(&shape, kc, vc, n, h, qh, &mut want, &mut hs, 4).unwrap();
                        let b = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            b(&got[j * d..(j + 1) * d]),
                            b(&want),
                            "{nh}/{nkv} n={n} h={h}"
                        );
                    }
                }
            }
        }
    }

    /// The AVX-512 q·k (two positions per register) and P·V (16 dimensions per register)
    /// equal the AVX2 kernels bit for bit: heads per KV head 8, 4, 2, 1, head dims 64, 128,
    /// 256, position counts odd and even, over one and two P·V blocks.
    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx512"]
    fn x2_kernels_equal_avx2_bitwise() {
        crate::quant::dot::require_isa(Isa::Avx512, "x2_kernels_equal_avx2_bitwise");
        assert!(k::available_x2());
        fn check<const M: usize>(d: usize) {
            let nkv = 2;
            let kv = cache(nkv, d, 300);
            let q: Vec<f32> = (0..M * d)
                .map(|i| f16::from_f32(((i * 104_729) % 2003) as f32 / 700.0 - 1.4).to_f32())
                .collect();
            let row_bytes = AttnShape::of(&kv, M * nkv, nkv, d).row_bytes;
            let kvo = d * 2; // the second KV head
            let stride = 301;
            for n in [1usize, 2, 3, 8, 63, 64, 255, 300] {
                let (kc, _) = kv.layer(0, 0, n);
                let (mut a, mut b) = (vec![f32::NAN; M * stride], vec![f32::NAN; M * stride]);
                // SAFETY: AVX2 and AVX-512 checked above; the kernels bound-check their rows.
                unsafe {
                    k::group_scores::<M>(kc, row_bytes, kvo, &q, n, 0.09, &mut a, stride);
                    k::group_scores_x2::<M>(kc, row_bytes, kvo, &q, n, 0.09, &mut b, stride);
                }
                for h in 0..M {
                    for j in 0..n {
                        let (x, y) = (a[h * stride + j], b[h * stride + j]);
                        assert_eq!(x.to_bits(), y.to_bits(), "M={M} d={d} n={n} h={h} j={j}");
                    }
                }
                // two query rows sharing the K rows (even n): each row's scores bitwise
                if n % 2 == 0 {
                    let qb: Vec<f32> = q.iter().map(|x| f16::from_f32(-0.5 * x).to_f32()).collect();
                    let (mut pa, mut pb) = (vec![f32::NAN; M * stride], vec![f32::NAN; M * stride]);
                    let mut want_b = vec![f32::NAN; M * stride];
                    // SAFETY: as above.
                    unsafe {
                        k::group_scores_x2_pair::<M>(
                            kc, row_bytes, kvo, &q, &qb, n, 0.09, &mut pa, &mut pb, stride,
                        );
                        k::group_scores_x2::<M>(
                            kc,
                            row_bytes,
                            kvo,
                            &qb,
                            n,
                            0.09,
                            &mut want_b,
                            stride,
                        );
                    }
                    for h in 0..M {
                        for j in 0..n {
                            let i = h * stride + j;
                            assert_eq!(pa[i].to_bits(), b[i].to_bits(), "pair a M={M} n={n}");
                            assert_eq!(pb[i].to_bits(), want_b[i].to_bits(), "pair b M={M} n={n}");
                        }
                    }
                }
                // P·V over the same rows, probabilities as the softmax leaves them (f16)
                let pr: Vec<f32> = (0..M * stride)
                    .map(|i| f16::from_f32(((i * 7901) % 997) as f32 / 997.0).to_f32())
                    .collect();
                let (_, vc) = kv.layer(0, 0, n);
                let mut acc = vec![0f32; 8 * M * d];
                let mut pack = vec![0f32; k::pack_len(d)];
                let mut outs = [vec![f32::NAN; M * d], vec![f32::NAN; M * d]];
                for (kern, o) in [k::group_pv::<M> as PvFn, k::group_pv_x2::<M>]
                    .into_iter()
                    .zip(&mut outs)
                {
                    // SAFETY: as above.
                    unsafe {
                        kern(
                            &pr,
                            stride,
                            &[n],
                            vc,
                            row_bytes,
                            kvo,
                            &mut acc,
                            &mut pack,
                            o,
                        )
                    };
                }
                let [oa, ob] = &outs;
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(oa), bits(ob), "P·V M={M} d={d} n={n}");
                // three query rows in one pass (the rows path of a prefill chunk): each row
                // bitwise its own one-row pass, for both kernels
                if n >= 3 {
                    let ns = [n, n - 1, n - 2];
                    let pr3: Vec<f32> = (0..3 * M * stride)
                        .map(|i| f16::from_f32(((i * 7901 + 13) % 997) as f32 / 997.0).to_f32())
                        .collect();
                    let kernels: [PvFn; 2] = [k::group_pv::<M>, k::group_pv_x2::<M>];
                    for kern in kernels {
                        let mut acc3 = vec![0f32; 3 * 8 * M * d];
                        let mut o3 = vec![f32::NAN; 3 * M * d];
                        // SAFETY: as above.
                        unsafe {
                            kern(
                                &pr3, stride, &ns, vc, row_bytes, kvo, &mut acc3, &mut pack,
                                &mut o3,
                            )
                        };
                        for (r, &nr) in ns.iter().enumerate() {
                            let mut o1 = vec![f32::NAN; M * d];
                            let p1 = &pr3[r * M * stride..(r + 1) * M * stride];
                            // SAFETY: as above.
                            unsafe {
                                kern(
                                    p1,
                                    stride,
                                    &[nr],
                                    vc,
                                    row_bytes,
                                    kvo,
                                    &mut acc,
                                    &mut pack,
                                    &mut o1,
                                )
                            };
                            assert_eq!(
                                bits(&o3[r * M * d..(r + 1) * M * d]),
                                bits(&o1),
                                "P·V rows M={M} d={d} n={n} r={r}"
                            );
                        }
                    }
                }
            }
        }
        for d in [64, 128, 256] {
            check::<8>(d);
            check::<4>(d);
            check::<2>(d);
            check::<1>(d);
        }
    }

    /// The 8-lane exp equals `expf_lane` over its whole range (fast path, the subnormal and
    /// overflow branches, −∞), and the softmax equals `vexp::softmax` with padding, with the
    /// probabilities then rounded to f16.
    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks avx2"]
    fn softmax_equals_vexp_bitwise() {
        crate::quant::dot::require_isa(Isa::Avx2, "softmax_equals_vexp_bitwise");
        assert!(k::available());
        let mut xs: Vec<f32> = (0..4000).map(|i| -110.0 + i as f32 * 0.0517).collect();
        xs.extend([
            -87.5,
            -88.7,
            -100.0,
            -103.9,
            -104.0,
            -150.0,
            -200.0,
            f32::NEG_INFINITY,
        ]);
        xs.extend([0.0, -0.0, 1e-30, 88.0, 88.8, 89.0, 130.0]);
        for (ci, c) in xs.chunks(8).enumerate() {
            let mut lanes = [0f32; 8];
            lanes[..c.len()].copy_from_slice(c);
            // SAFETY: the CPU runs the kernels (checked above).
            let got = unsafe { k::expf_lanes(&lanes) };
            for (l, &x) in lanes.iter().enumerate() {
                assert_eq!(got[l].to_bits(), expf_lane(x).to_bits(), "chunk {ci} x={x}");
            }
        }
        for n in [1usize, 3, 8, 13, 64, 301] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 613) as f32 / 19.0 - 16.0)
                .collect();
            let mut want = x.clone();
            softmax(&mut want, true);
            let want: Vec<u32> = want
                .iter()
                .map(|v| f16::from_f32(*v).to_f32().to_bits())
                .collect();
            let mut got = x.clone();
            // SAFETY: the CPU runs the kernels (checked above).
            unsafe { k::softmax_f16p(&mut got, None) };
            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "n={n}");
            for sink in [-20.0f32, 0.3, 25.0] {
                let mut want = x.clone();
                crate::quant::vexp::softmax_sink(&mut want, sink);
                let want: Vec<u32> = want
                    .iter()
                    .map(|v| f16::from_f32(*v).to_f32().to_bits())
                    .collect();
                let mut got = x.clone();
                // SAFETY: the CPU runs the kernels (checked above).
                unsafe { k::softmax_f16p(&mut got, Some(sink)) };
                let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "n={n} sink={sink}");
            }
        }
    }
}
