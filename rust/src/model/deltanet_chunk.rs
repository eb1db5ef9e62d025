//! The chunked form of the Gated DeltaNet recurrence (`deltanet`), for prefill: a value
//! head's tokens in chunks of up to `CHUNK`, each chunk's delta rule solved with matrix
//! products instead of one state pass per token (the WY / UT form of the delta rule that
//! llama.cpp's `build_delta_net_chunking` and the HF / fla chunked gated delta rule use). The
//! same sums in another order: within float rounding of the recurrence, not bitwise.
//!
//! With the state M [S(v), S(k)] before a chunk of n tokens, g_i the log decays, G_i their
//! running sum within the chunk (G_i − G_j ≤ 0 for j ≤ i, so every exponential is ≤ 1), β_i
//! and the normed q_i, k_i [S(k)], v_i [S(v)], the recurrence's δ_i (its `dj` over the rows)
//! are u_i = β_i·(v_i − e^{G_i}·M·k_i − Σ_{j<i} e^{G_i−G_j}·(k_i·k_j)·u_j), a forward
//! substitution over the chunk's rows; then
//!   o_i = (e^{G_i}·M·q_i + Σ_{j≤i} e^{G_i−G_j}·(q_i·k_j)·u_j) / √S,
//!   M ← e^{G_{n−1}}·M + Σ_j e^{G_{n−1}−G_j}·u_j ⊗ k_j.
//! M·k and M·q of the whole chunk, k·kᵀ, q·kᵀ, the output's P·U and the state's Uᵀ·K are
//! matrix products (`gemm`); the substitution is n²/2 row updates.
//!
//! Legend: n = tokens of the chunk (≤ C = `CHUNK`), S = head size (keys and values alike).

use std::sync::Mutex;

/// Tokens per chunk (llama.cpp's and fla's 64).
pub const CHUNK: usize = 64;

/// Scratches of the chunked pieces' tasks (each task its own; units dealt round robin).
pub const CHUNK_TASKS: usize = 16;

/// The chunked form's setting and its tasks' scratch (`Recurrent::chunk`): pieces of at
/// least `min_tokens` tokens that save no checkpoints run chunked; the others, the one-token
/// decode and the windows run the recurrence. Memory: `CHUNK_TASKS` scratches of
/// 9·C·S + S² + C² + 2·C floats (S = 128: 0.38 MB each, 6 MB in all), allocated when turned on.
pub struct ChunkTasks {
    pub min_tokens: usize,
    pub scratch: Vec<Mutex<ChunkScratch>>,
}

impl ChunkTasks {
    /// For head size `s`; `min_tokens` ≥ 2.
    pub fn new(min_tokens: usize, s: usize) -> ChunkTasks {
        ChunkTasks {
            min_tokens,
            scratch: (0..CHUNK_TASKS)
                .map(|_| Mutex::new(ChunkScratch::new(s)))
                .collect(),
        }
    }
}

/// One task's scratch for chunks of up to `CHUNK` tokens of head size S, sized at set-up.
pub struct ChunkScratch {
    s: usize,
    pub q: Vec<f32>,    // [C, S] the chunk's normed q (gathered)
    pub k: Vec<f32>,    // [C, S] normed k
    pub v: Vec<f32>,    // [C, S] v
    pub beta: Vec<f32>, // [C] σ(β)
    pub g: Vec<f32>,    // [C] log decays, then their running sum G
    pub o: Vec<f32>,    // [C, S] the output before the gated norm
    kt: Vec<f32>,       // [S, C] kᵀ
    mt: Vec<f32>,       // [S(k), S(v)] Mᵀ
    km: Vec<f32>,       // [C, S(v)] (M·k_i)ᵀ rows
    qm: Vec<f32>,       // [C, S(v)] (M·q_i)ᵀ rows
    u: Vec<f32>,        // [C, S(v)] the δ rows
    ut: Vec<f32>,       // [S(v), C] decayed δ rows, transposed
    cc: Vec<f32>,       // [C, C] k·kᵀ, then the masked, decayed q·kᵀ
}

impl ChunkScratch {
    pub fn new(s: usize) -> ChunkScratch {
        let z = |n: usize| vec![0f32; n];
        let (c, cs) = (CHUNK, CHUNK * s);
        ChunkScratch {
            s,
            q: z(cs),
            k: z(cs),
            v: z(cs),
            beta: z(c),
            g: z(c),
            o: z(cs),
            kt: z(cs),
            mt: z(s * s),
            km: z(cs),
            qm: z(cs),
            u: z(cs),
            ut: z(cs),
            cc: z(c * c),
        }
    }

    pub fn head_size(&self) -> usize {
        self.s
    }
}

/// One chunk of `n` ≤ `CHUNK` tokens of one value head, from `sc.q`, `sc.k`, `sc.v` [n, S],
/// `sc.beta` (σ(β)) and `sc.g` (log decays) [n]: the output to `sc.o` [n, S] and the state `m`
/// [S(v), S(k)] advanced past the chunk.
pub fn chunk(m: &mut [f32], n: usize, sc: &mut ChunkScratch) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        unsafe { chunk_avx2(m, n, sc) };
        return;
    }
    chunk_body(m, n, sc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chunk_avx2(m: &mut [f32], n: usize, sc: &mut ChunkScratch) {
    chunk_body(m, n, sc)
}

#[inline(always)]
fn chunk_body(m: &mut [f32], n: usize, sc: &mut ChunkScratch) {
    let s = sc.s;
    assert!((1..=CHUNK).contains(&n) && m.len() == s * s);
    let ns = n * s;
    let ChunkScratch {
        q,
        k,
        v,
        beta,
        g,
        o,
        kt,
        mt,
        km,
        qm,
        u,
        ut,
        cc,
        ..
    } = sc;
    let (q, k, v, o) = (&q[..ns], &k[..ns], &v[..ns], &mut o[..ns]);
    let (km, qm, u) = (&mut km[..ns], &mut qm[..ns], &mut u[..ns]);
    let (kt, ut, cc) = (&mut kt[..ns], &mut ut[..ns], &mut cc[..n * n]);
    let g = &mut g[..n];
    let mut run = 0f32;
    for x in g.iter_mut() {
        run += *x;
        *x = run; // G_i
    }
    transpose(m, s, s, mt);
    gemm(n, s, s, k, mt, km, false); // [n, S(v)] row i = M·k_i
    gemm(n, s, s, q, mt, qm, false); // [n, S(v)] row i = M·q_i
    transpose(k, n, s, kt);
    gemm(n, n, s, k, kt, cc, false); // [n, n] k_i·k_j
                                     // the forward substitution: u_i from the rows before it
    for i in 0..n {
        let (done, rest) = u.split_at_mut(i * s);
        let ui = &mut rest[..s];
        let e = g[i].exp();
        for ((x, &vx), &kx) in ui.iter_mut().zip(&v[i * s..]).zip(&km[i * s..(i + 1) * s]) {
            *x = (-e).mul_add(kx, vx);
        }
        for (j, uj) in done.chunks_exact(s).enumerate() {
            let c = -((g[i] - g[j]).exp() * cc[i * n + j]);
            for (x, &y) in ui.iter_mut().zip(uj) {
                *x = c.mul_add(y, *x);
            }
        }
        let b = beta[i];
        for x in ui.iter_mut() {
            *x *= b;
        }
    }
    // the output: e^{G_i}·M·q_i plus the chunk's own part, (e^{G_i−G_j}·q_i·k_j)_{j≤i} · U
    gemm(n, n, s, q, kt, cc, false); // [n, n] q_i·k_j
    for i in 0..n {
        for j in 0..n {
            let x = &mut cc[i * n + j];
            *x = if j <= i {
                (g[i] - g[j]).exp() * *x
            } else {
                0.0
            };
        }
        let e = g[i].exp();
        for (x, &y) in o[i * s..(i + 1) * s].iter_mut().zip(&qm[i * s..]) {
            *x = e * y;
        }
    }
    gemm(n, s, n, cc, u, o, true);
    let scale = 1.0 / (s as f32).sqrt();
    for x in o.iter_mut() {
        *x *= scale;
    }
    // the state: decayed to the chunk's end, plus Σ_j e^{G_last−G_j}·u_j ⊗ k_j
    let last = g[n - 1];
    let e = last.exp();
    for x in m.iter_mut() {
        *x *= e;
    }
    for j in 0..n {
        let d = (last - g[j]).exp();
        for x in u[j * s..(j + 1) * s].iter_mut() {
            *x *= d;
        }
    }
    transpose(u, n, s, ut); // [S(v), n]
    gemm(s, s, n, ut, k, m, true);
}

/// `dst` [cols, rows] = `src` [rows, cols]ᵀ.
#[inline(always)]
fn transpose(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    for (r, row) in src[..rows * cols].chunks_exact(cols).enumerate() {
        for (c, &x) in row.iter().enumerate() {
            dst[c * rows + r] = x;
        }
    }
}

/// `c` [m, n] = (or +=, with `acc`) `a` [m, k] · `b` [k, n], all row-major: tiles of 4 rows ×
/// 16 columns held in accumulators across the k loop.
#[inline(always)]
fn gemm(m: usize, n: usize, k: usize, a: &[f32], b: &[f32], c: &mut [f32], acc: bool) {
    let (a, b, c) = (&a[..m * k], &b[..k * n], &mut c[..m * n]);
    let mut i = 0;
    while i + 4 <= m {
        let mut j = 0;
        while j + 16 <= n {
            let mut t = [[0f32; 16]; 4];
            if acc {
                for (r, tr) in t.iter_mut().enumerate() {
                    tr.copy_from_slice(&c[(i + r) * n + j..(i + r) * n + j + 16]);
                }
            }
            for p in 0..k {
                let bv: &[f32; 16] = b[p * n + j..p * n + j + 16].try_into().unwrap();
                for (r, tr) in t.iter_mut().enumerate() {
                    let av = a[(i + r) * k + p];
                    for (x, &y) in tr.iter_mut().zip(bv) {
                        *x = av.mul_add(y, *x);
                    }
                }
            }
            for (r, tr) in t.iter().enumerate() {
                c[(i + r) * n + j..(i + r) * n + j + 16].copy_from_slice(tr);
            }
            j += 16;
        }
        for r in i..i + 4 {
            gemm_row_tail(r, j, n, k, a, b, c, acc);
        }
        i += 4;
    }
    for r in i..m {
        let mut j = 0;
        while j + 16 <= n {
            let mut t = [0f32; 16];
            if acc {
                t.copy_from_slice(&c[r * n + j..r * n + j + 16]);
            }
            for p in 0..k {
                let bv: &[f32; 16] = b[p * n + j..p * n + j + 16].try_into().unwrap();
                let av = a[r * k + p];
                for (x, &y) in t.iter_mut().zip(bv) {
                    *x = av.mul_add(y, *x);
                }
            }
            c[r * n + j..r * n + j + 16].copy_from_slice(&t);
            j += 16;
        }
        gemm_row_tail(r, j, n, k, a, b, c, acc);
    }
}

/// Columns `j0..n` of row `r` of `gemm`, one at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gemm_row_tail(
    r: usize,
    j0: usize,
    n: usize,
    k: usize,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    acc: bool,
) {
    for j in j0..n {
        let mut x = if acc { c[r * n + j] } else { 0.0 };
        for p in 0..k {
            x = a[r * k + p].mul_add(b[p * n + j], x);
        }
        c[r * n + j] = x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recurrence written out per token (the state's rows as `deltanet::head_step` runs
    /// them, in f64): the chunked form's oracle.
    #[allow(clippy::too_many_arguments)]
    fn recur(
        m: &mut [f64],
        s: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        beta: &[f32],
        g: &[f32],
        o: &mut [f64],
    ) {
        for i in 0..g.len() {
            let (qi, ki, vi) = (
                &q[i * s..(i + 1) * s],
                &k[i * s..(i + 1) * s],
                &v[i * s..(i + 1) * s],
            );
            let d = (g[i] as f64).exp();
            for (a, row) in m.chunks_exact_mut(s).enumerate() {
                row.iter_mut().for_each(|x| *x *= d);
                let mk: f64 = row.iter().zip(ki).map(|(x, &y)| x * y as f64).sum();
                let dj = (vi[a] as f64 - mk) * beta[i] as f64;
                row.iter_mut()
                    .zip(ki)
                    .for_each(|(x, &y)| *x += dj * y as f64);
                o[i * s + a] =
                    row.iter().zip(qi).map(|(x, &y)| x * y as f64).sum::<f64>() / (s as f64).sqrt();
            }
        }
    }

    fn unit_rows(x: &mut [f32], s: usize) {
        for r in x.chunks_exact_mut(s) {
            let n = r.iter().map(|v| v * v).sum::<f32>().sqrt();
            r.iter_mut().for_each(|v| *v /= n);
        }
    }

    /// Chunks of every size 1..=C, and several in a row from a nonzero state, agree with the
    /// per-token recurrence (f64) within float rounding: output and state.
    #[test]
    fn chunks_equal_the_recurrence_within_rounding() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        for s in [16usize, 32, 40] {
            for lens in [
                vec![1usize],
                vec![5],
                vec![64],
                vec![64, 64, 17],
                vec![3, 64, 1],
            ] {
                let total: usize = lens.iter().sum();
                let mut sc = ChunkScratch::new(s);
                let gen = |n: usize, r: &mut dyn FnMut() -> f32| {
                    (0..n).map(|_| r()).collect::<Vec<f32>>()
                };
                let (mut q, mut k) = (gen(total * s, &mut rnd), gen(total * s, &mut rnd));
                unit_rows(&mut q, s);
                unit_rows(&mut k, s);
                let v = gen(total * s, &mut rnd);
                let beta: Vec<f32> = gen(total, &mut rnd).iter().map(|x| 0.5 + 0.5 * x).collect();
                let g: Vec<f32> = gen(total, &mut rnd)
                    .iter()
                    .map(|x| -0.3 * (1.0 + x))
                    .collect();
                let m0 = gen(s * s, &mut rnd);
                let mut want_m: Vec<f64> = m0.iter().map(|&x| x as f64).collect();
                let mut want_o = vec![0f64; total * s];
                recur(&mut want_m, s, &q, &k, &v, &beta, &g, &mut want_o);
                let mut m = m0.clone();
                let mut o = vec![0f32; total * s];
                let mut t0 = 0;
                for &n in &lens {
                    let r = t0 * s..(t0 + n) * s;
                    sc.q[..n * s].copy_from_slice(&q[r.clone()]);
                    sc.k[..n * s].copy_from_slice(&k[r.clone()]);
                    sc.v[..n * s].copy_from_slice(&v[r.clone()]);
                    sc.beta[..n].copy_from_slice(&beta[t0..t0 + n]);
                    sc.g[..n].copy_from_slice(&g[t0..t0 + n]);
                    chunk(&mut m, n, &mut sc);
                    o[r].copy_from_slice(&sc.o[..n * s]);
                    t0 += n;
                }
                let err = |got: &[f32], want: &[f64]| {
                    let scale = want.iter().fold(0f64, |a, &b| a.max(b.abs()));
                    got.iter()
                        .zip(want)
                        .fold(0f64, |a, (&x, &y)| a.max((x as f64 - y).abs()))
                        / scale
                };
                let (eo, em) = (err(&o, &want_o), err(&m, &want_m));
                assert!(
                    eo < 2e-6 && em < 2e-6,
                    "S={s} {lens:?}: output {eo:e}, state {em:e}"
                );
            }
        }
    }

    #[test]
    fn gemm_tiles_and_tails_equal_the_naive_product() {
        for (m, n, k) in [
            (4usize, 16usize, 3usize),
            (7, 37, 5),
            (1, 1, 1),
            (9, 32, 64),
        ] {
            let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5).collect();
            for acc in [false, true] {
                let mut c = vec![1f32; m * n];
                gemm(m, n, k, &a, &b, &mut c, acc);
                for i in 0..m {
                    for j in 0..n {
                        let want: f32 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum::<f32>()
                            + if acc { 1.0 } else { 0.0 };
                        assert_eq!(c[i * n + j], want, "{m}x{n}x{k} acc={acc} ({i}, {j})");
                    }
                }
            }
        }
    }
}
