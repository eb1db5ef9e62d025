//! The routed experts of gpt-oss (llama.cpp's `build_moe_ffn` with `LLM_FFN_SWIGLU_OAI_MOE`
//! and expert biases): for a token x and its K experts e_j with weights w_j,
//! `y = Σ_j w_j · (down_e(swiglu_oai(gate_e·x + bg_e, up_e·x + bu_e)) + bd_e)`, the terms
//! added in slot order j = 0..K as ggml adds the expert views.
//!
//! The pool's fused kernel has no biases and plain SwiGLU, so these experts run as dense
//! matmuls (`Compute::matmul_segs`) over the rows that chose each expert, grouped over the
//! whole step with each segment's rows in the order its segment alone gives (a batched
//! step's entries stay bitwise their calls alone). The expert bytes are the same the pool
//! reads: the RAM tier's slabs where the `ExpertLayer` has them.
//!
//! Legend: R' = rows of the step, H = hidden, F = expert width, E = experts, K = experts
//! per row.

use super::compute::{Compute, ExpertLayer, MoeInput, QExperts, QMatrix};
use crate::error::{Error, Result};
use crate::pool::SKIP;

/// The experts' biases (ggml ne {F, E} and {H, E}).
pub struct ExpertBias {
    pub gate: Vec<f32>, // [E, F]
    pub up: Vec<f32>,   // [E, F]
    pub down: Vec<f32>, // [E, H]
}

/// Scratch of one MoE layer call, sized at load for R' rows.
#[derive(Default)]
pub struct OaiScratch {
    rows: Vec<usize>, // [≤ R'] the pairs (row·K + slot) that chose one expert, in row order
    segs: Vec<usize>, // [≤ pieces] those pairs per segment (empty segments left out)
    psegs: Vec<usize>, // [≤ pieces] the segments of one piece of those pairs
    x: Vec<f32>,      // [R', H] their inputs
    g: Vec<f32>,      // [R', F] gate projection, then the activation
    u: Vec<f32>,      // [R', F] up projection
    y: Vec<f32>,      // [R', H] down projection
    pairs: Vec<f32>,  // [R', K, H] every pair's biased expert output
}

impl OaiScratch {
    pub fn new(r: usize, h: usize, f: usize, k: usize) -> OaiScratch {
        OaiScratch {
            rows: Vec::with_capacity(r),
            segs: Vec::with_capacity(r),
            psegs: Vec::with_capacity(r),
            x: vec![0.0; r * h],
            g: vec![0.0; r * f],
            u: vec![0.0; r * f],
            y: vec![0.0; r * h],
            pairs: vec![0.0; r * k * h],
        }
    }
}

/// `g ← swiglu_oai(g, u)` element-wise, in ggml's arithmetic (`ggml_compute_forward_swiglu_oai`):
/// x = min(g, limit), y = clamp(u, −limit, limit), `x / (1 + expf(alpha·(−x))) · (y + 1)`.
pub fn swiglu_oai(g: &mut [f32], u: &[f32], alpha: f32, limit: f32) {
    for (a, &b) in g.iter_mut().zip(u) {
        let x = a.min(limit);
        let y = b.clamp(-limit, limit);
        *a = x / (1.0 + (alpha * -x).exp()) * (y + 1.0);
    }
}

/// Expert `e` of a stack as a matrix (rows, cols).
fn expert<'a>(q: &QExperts<'a>, e: usize) -> QMatrix<'a> {
    let eb = q.rows * q.ty.row_bytes(q.cols).unwrap_or(0);
    QMatrix {
        ty: q.ty,
        data: q.expert_data(e, eb),
        rows: q.rows,
        cols: q.cols,
    }
}

/// The biased, clamped-SwiGLU experts of `a` (x [R', H], ids and weights [R', K]) into
/// `out` [R', H] (overwritten); `segs` are the step's segments (Σ = R'). A pair whose id is
/// `pool::SKIP` is computed elsewhere (the hybrid GPU placement's resident experts) and adds
/// nothing; a row with no other pair gets zeros.
#[allow(clippy::too_many_arguments)]
pub fn moe_oai(
    compute: &dyn Compute,
    layer: &ExpertLayer<'_>,
    bias: &ExpertBias,
    (alpha, limit): (f32, f32),
    a: &MoeInput<'_>,
    segs: &[usize],
    sc: &mut OaiScratch,
    out: &mut [f32],
) -> Result<()> {
    let (h, f, k, ne) = (layer.gate.cols, layer.gate.rows, a.k, layer.gate.n_expert);
    let t = a.x.len() / h.max(1);
    let ok = a.x.len() == t * h
        && a.ids.len() == t * k
        && a.weights.len() == t * k
        && out.len() == t * h
        && segs.iter().sum::<usize>() == t
        && (
            layer.up.rows,
            layer.up.cols,
            layer.down.rows,
            layer.down.cols,
        ) == (f, h, h, f)
        && sc.x.len() >= t * h
        && sc.pairs.len() >= t * k * h
        && bias.gate.len() == ne * f
        && bias.up.len() == ne * f
        && bias.down.len() == ne * h;
    if !ok {
        return Err(Error::Shape(format!(
            "biased experts: x {} ids {} out {} for H {h}, F {f}, K {k}, E {ne}",
            a.x.len(),
            a.ids.len(),
            out.len()
        )));
    }
    if let Some(&bad) = a.ids.iter().find(|&&id| id as usize >= ne && id != SKIP) {
        return Err(Error::Input(format!("expert id {bad} ≥ {ne} experts")));
    }
    for e in 0..ne {
        sc.rows.clear();
        sc.segs.clear();
        let mut r0 = 0;
        for &n in segs {
            let before = sc.rows.len();
            for p in r0 * k..(r0 + n) * k {
                if a.ids[p] as usize == e {
                    sc.rows.push(p);
                }
            }
            if sc.rows.len() > before {
                sc.segs.push(sc.rows.len() - before);
            }
            r0 += n;
        }
        let m = sc.rows.len();
        // Pieces of at most the scratch's rows (one piece unless a row picked `e` twice,
        // which real routing never does), each piece's segments cut from the expert's.
        let cap = (sc.x.len() / h.max(1)).max(1);
        let mut i0 = 0;
        while i0 < m {
            let i1 = (i0 + cap).min(m);
            let n = i1 - i0;
            sc.psegs.clear();
            let mut s0 = 0;
            for &c in &sc.segs {
                let (lo, hi) = (s0.max(i0), (s0 + c).min(i1));
                if hi > lo {
                    sc.psegs.push(hi - lo);
                }
                s0 += c;
            }
            for (i, &p) in sc.rows[i0..i1].iter().enumerate() {
                let r = p / k;
                sc.x[i * h..(i + 1) * h].copy_from_slice(&a.x[r * h..(r + 1) * h]);
            }
            let (x, ps) = (&sc.x[..n * h], &sc.psegs);
            compute.matmul_segs(&expert(&layer.gate, e), x, ps, &mut sc.g[..n * f])?; // [n, F]
            compute.matmul_segs(&expert(&layer.up, e), x, ps, &mut sc.u[..n * f])?; // [n, F]
            let (bg, bu) = (&bias.gate[e * f..(e + 1) * f], &bias.up[e * f..(e + 1) * f]);
            let rows = sc.g[..n * f]
                .chunks_exact_mut(f)
                .zip(sc.u[..n * f].chunks_exact_mut(f));
            for (g, u) in rows {
                let gu = g.iter_mut().zip(u.iter_mut());
                for ((gv, uv), (&b0, &b1)) in gu.zip(bg.iter().zip(bu)) {
                    *gv += b0;
                    *uv += b1;
                }
                swiglu_oai(g, u, alpha, limit);
            }
            let down = expert(&layer.down, e);
            compute.matmul_segs(&down, &sc.g[..n * f], ps, &mut sc.y[..n * h])?; // [n, H]
            let bd = &bias.down[e * h..(e + 1) * h];
            for (i, &p) in sc.rows[i0..i1].iter().enumerate() {
                let y = &sc.y[i * h..(i + 1) * h];
                for ((d, &v), &b) in sc.pairs[p * h..(p + 1) * h].iter_mut().zip(y).zip(bd) {
                    *d = v + b;
                }
            }
            i0 = i1;
        }
    }
    for (r, o) in out.chunks_exact_mut(h).enumerate() {
        let mut first = true;
        for j in 0..k {
            let (p, w) = (r * k + j, a.weights[r * k + j]);
            if a.ids[p] == SKIP {
                continue;
            }
            let y = &sc.pairs[p * h..(p + 1) * h];
            if first {
                o.iter_mut().zip(y).for_each(|(o, &v)| *o = v * w);
            } else {
                o.iter_mut().zip(y).for_each(|(o, &v)| *o += v * w);
            }
            first = false;
        }
        if first {
            o.fill(0.0);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::compute::SerialCompute;
    use crate::quant::GgmlType;

    #[test]
    fn swiglu_oai_clamps_as_ggml() {
        let (mut g, u) = ([10.0f32, -3.0, 0.5], [-20.0f32, 2.0, 9.0]);
        swiglu_oai(&mut g, &u, 1.702, 7.0);
        let s = |x: f32| x / (1.0 + (-1.702 * x).exp());
        assert_eq!(g, [s(7.0) * -6.0, s(-3.0) * 3.0, s(0.5) * 8.0]);
    }

    /// Against the formula per token, with F32 experts, over two segments.
    #[test]
    fn moe_oai_matches_the_per_token_formula() {
        let (h, f, ne, k, t) = (4usize, 3usize, 3usize, 2usize, 5usize);
        let val = |i: usize| ((i * 7919 + 13) % 101) as f32 / 50.0 - 1.0;
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (gw, uw, dw): (Vec<f32>, Vec<f32>, Vec<f32>) = (
            (0..ne * f * h).map(|i| val(i) * 3.0).collect(),
            (0..ne * f * h).map(|i| val(i + 500) * 3.0).collect(),
            (0..ne * h * f).map(|i| val(i + 900)).collect(),
        );
        let (gb, ub, db) = (bytes(&gw), bytes(&uw), bytes(&dw));
        fn q(data: &[u8], n_expert: usize, rows: usize, cols: usize) -> QExperts<'_> {
            QExperts {
                ty: GgmlType::F32,
                data,
                n_expert,
                rows,
                cols,
                slabs: None,
            }
        }
        let layer = ExpertLayer {
            gate: q(&gb, ne, f, h),
            up: q(&ub, ne, f, h),
            down: q(&db, ne, h, f),
        };
        let bias = ExpertBias {
            gate: (0..ne * f).map(|i| val(i + 40)).collect(),
            up: (0..ne * f).map(|i| val(i + 80)).collect(),
            down: (0..ne * h).map(|i| val(i + 120)).collect(),
        };
        let x: Vec<f32> = (0..t * h).map(|i| val(i + 7) * 2.0).collect();
        let ids: Vec<u32> = vec![0, 2, 1, 0, 2, 1, 0, 1, 2, 0];
        let w: Vec<f32> = (0..t * k).map(|i| 0.3 + 0.1 * i as f32).collect();
        let mut out = vec![0f32; t * h];
        let mut sc = OaiScratch::new(t, h, f, k);
        let a = MoeInput::new(&x, &ids, &w, k);
        moe_oai(
            &SerialCompute,
            &layer,
            &bias,
            (1.702, 7.0),
            &a,
            &[2, 3],
            &mut sc,
            &mut out,
        )
        .unwrap();
        for r in 0..t {
            let mut want = vec![0f64; h];
            for j in 0..k {
                let e = ids[r * k + j] as usize;
                let xr = &x[r * h..(r + 1) * h];
                let dot =
                    |m: &[f32], o: usize| -> f32 { (0..h).map(|c| m[o + c] * xr[c]).sum::<f32>() };
                let act: Vec<f32> = (0..f)
                    .map(|i| {
                        let mut g = [dot(&gw, (e * f + i) * h) + bias.gate[e * f + i]];
                        let u = dot(&uw, (e * f + i) * h) + bias.up[e * f + i];
                        swiglu_oai(&mut g, &[u], 1.702, 7.0);
                        g[0]
                    })
                    .collect();
                for c in 0..h {
                    let d: f32 = (0..f).map(|i| dw[(e * h + c) * f + i] * act[i]).sum();
                    want[c] += ((d + bias.down[e * h + c]) * w[r * k + j]) as f64;
                }
            }
            for c in 0..h {
                let got = out[r * h + c] as f64;
                assert!(
                    (got - want[c]).abs() < 1e-4 * (1.0 + want[c].abs()),
                    "row {r} col {c}"
                );
            }
        }
        assert!(moe_oai(
            &SerialCompute,
            &layer,
            &bias,
            (1.702, 7.0),
            &a,
            &[2, 2],
            &mut sc,
            &mut out
        )
        .is_err());
        // SKIP pairs add nothing: the masked call plus the other pairs' is the whole
        let all = out.clone();
        let skip_odd: Vec<u32> = (0..t * k)
            .map(|p| if p % 2 == 1 { SKIP } else { ids[p] })
            .collect();
        let skip_even: Vec<u32> = (0..t * k)
            .map(|p| if p % 2 == 0 { SKIP } else { ids[p] })
            .collect();
        let (mut a_out, mut b_out) = (vec![0f32; t * h], vec![0f32; t * h]);
        for (ids_m, o) in [(&skip_odd, &mut a_out), (&skip_even, &mut b_out)] {
            let am = MoeInput::new(&x, ids_m, &w, k);
            let r = moe_oai(
                &SerialCompute,
                &layer,
                &bias,
                (1.702, 7.0),
                &am,
                &[t],
                &mut sc,
                o,
            );
            r.unwrap();
        }
        for i in 0..t * h {
            let sum = a_out[i] + b_out[i];
            assert!((sum - all[i]).abs() <= 1e-5 * (1.0 + all[i].abs()), "{i}");
        }
        // a row that picks one expert twice (not real routing: the scratch holds R' rows,
        // the pairs run in pieces) equals that expert once with the summed weight
        let twice: Vec<u32> = (0..t * k).map(|p| (p / k % ne) as u32).collect();
        let once: Vec<u32> = (0..t).map(|r| (r % ne) as u32).collect();
        let w1: Vec<f32> = (0..t).map(|r| w[r * k] + w[r * k + 1]).collect();
        let (mut got, mut want) = (vec![0f32; t * h], vec![0f32; t * h]);
        let at = MoeInput::new(&x, &twice, &w, k);
        moe_oai(
            &SerialCompute,
            &layer,
            &bias,
            (1.702, 7.0),
            &at,
            &[2, 3],
            &mut sc,
            &mut got,
        )
        .unwrap();
        let mut sc1 = OaiScratch::new(t, h, f, 1);
        let a1 = MoeInput::new(&x, &once, &w1, 1);
        moe_oai(
            &SerialCompute,
            &layer,
            &bias,
            (1.702, 7.0),
            &a1,
            &[t],
            &mut sc1,
            &mut want,
        )
        .unwrap();
        for i in 0..t * h {
            assert!(
                (got[i] - want[i]).abs() <= 1e-5 * (1.0 + want[i].abs()),
                "{i}"
            );
        }
        let none = vec![SKIP; t * k];
        let mut z = vec![1f32; t * h];
        let am = MoeInput::new(&x, &none, &w, k);
        moe_oai(
            &SerialCompute,
            &layer,
            &bias,
            (1.702, 7.0),
            &am,
            &[t],
            &mut sc,
            &mut z,
        )
        .unwrap();
        assert!(z.iter().all(|&v| v == 0.0));
    }
}
