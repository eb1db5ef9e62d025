//! The Gated DeltaNet mixer of the hybrid families (`qwen3next`, `qwen35moe`): the recurrent
//! layers that stand in for attention in three layers of four (llama.cpp's
//! src/models/qwen3next.cpp, qwen35moe.cpp, delta-net-base.cpp and ggml's CPU ops
//! `ssm_conv` / `gated_delta_net`).
//!
//! Per token and layer:
//! 1. projections of the normed input h [H]: qkv = attn_qkv·h [C] (C = 2·Nk·S + Nv·S),
//!    z = attn_gate·h [Nv·S], β and α [Nv] (`ssm_ba` fused per key head as [β r, α r], or
//!    `ssm_beta` / `ssm_alpha`);
//! 2. a causal depthwise conv1d of width Kc over qkv (the slot's last Kc − 1 inputs are its
//!    conv state), then silu;
//! 3. q, k [Nk, S] L2-normed per head, v [Nv, S]; β = σ(β), g = softplus(α + dt_bias) · A
//!    (A = −exp(A_log), as the converter writes `ssm_a`);
//! 4. per value head h (reading key head `HeadOrder::k_head`): with the state M [S(v), S(k)]
//!    M ← exp(g)·M; δ = (v − M·k)·β; M ← M + δ ⊗ k; o = (M·q) / √S;
//! 5. o RMSNorm'd per head (`ssm_norm` [S]) times silu(z), then `ssm_out` [H, Nv·S].
//!
//! Prefill runs the recurrence token by token, as decode does (ggml's fused CPU op runs it
//! the same way): a prompt's state is bitwise the state of its tokens decoded one at a time.
//! Where `Recurrent::set_chunked` asks, long prefill pieces run the chunked form instead
//! (`deltanet_chunk`: the same sums in another order, within float rounding). The recurrence of
//! the pieces that save no checkpoints runs split by key head on the compute's threads
//! (`deltanet_par`); windows run it here, saving the state after each token.
//!
//! Legend: R' = rows of the step, H = hidden, Nk / Nv = key / value heads, S = head size
//! (`ssm.state_size`, keys and values alike), C = conv channels, Kc = `ssm.conv_kernel`,
//! Lr = recurrent layers.

use super::attention::f32_bytes;
use super::batch::Piece;
use super::checkpoints::Checkpoints;
use super::compute::Compute;
use super::deltanet_chunk::ChunkTasks;
use super::weights::{floats, matrix, Weights};
use crate::error::{Error, Result};
use crate::gguf::{Gguf, TensorInfo};
use crate::quant::dot::vec_dot;
use crate::quant::vexp::silu_mul;
use crate::quant::GgmlType;

/// Which key head a value head reads when Nv > Nk (the V-head order the converter writes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadOrder {
    /// Value head h reads key head h / (Nv/Nk) (qwen3next: HF's grouped order).
    Grouped,
    /// Value head h reads key head h mod Nk (qwen35moe: the converter reorders V heads).
    Tiled,
}

impl HeadOrder {
    #[inline]
    pub fn k_head(self, h: usize, nk: usize, nv: usize) -> usize {
        match self {
            HeadOrder::Grouped => h / (nv / nk),
            HeadOrder::Tiled => h % nk,
        }
    }
}

/// How β and α are projected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BetaAlpha {
    /// `ssm_ba` (2·Nv, H): per key head g, rows [β of its r value heads, α of them]
    /// (r = Nv/Nk) (qwen3next).
    Fused,
    /// `ssm_beta` and `ssm_alpha` (Nv, H) each (qwen35moe).
    Split,
}

/// A hybrid family's options (`arch::Graph::hybrid`): its recurrent layers' layout; its
/// attention layers gate their output with σ of a second half of each q head
/// (`attn_q` is (2·Nh·D, H): per head [q D, gate D]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hybrid {
    pub heads: HeadOrder,
    pub ba: BetaAlpha,
}

/// The recurrent layers' hyper-parameters (`{arch}.ssm.*`) and which layers are recurrent.
#[derive(Clone, Debug, PartialEq)]
pub struct SsmParams {
    /// Kc: conv kernel width.
    pub d_conv: usize,
    /// S: key and value head size.
    pub d_state: usize,
    /// Nk: key heads (`ssm.group_count`).
    pub n_k: usize,
    /// Nv: value heads (`ssm.time_step_rank`).
    pub n_v: usize,
    /// [n_layer]: whether layer l is a DeltaNet layer (else gated full attention).
    pub recurrent: Vec<bool>,
}

impl SsmParams {
    /// C: the conv channels (q, k and v).
    pub fn conv_dim(&self) -> usize {
        2 * self.n_k * self.d_state + self.n_v * self.d_state
    }

    /// Nv·S: the width of v, z and the mixer's output.
    pub fn v_dim(&self) -> usize {
        self.n_v * self.d_state
    }

    /// Floats of one slot's state in one recurrent layer: the conv state [Kc − 1, C] and the
    /// delta-rule state [Nv, S, S].
    pub fn state_floats(&self) -> (usize, usize) {
        (
            (self.d_conv - 1) * self.conv_dim(),
            self.n_v * self.d_state * self.d_state,
        )
    }

    pub fn check(&self) -> Result<()> {
        let (s, nk, nv) = (self.d_state, self.n_k, self.n_v);
        if self.d_conv < 2 || s == 0 || nk == 0 || nv == 0 || !nv.is_multiple_of(nk) {
            return Err(Error::Model(format!(
                "ssm.conv_kernel {} must be ≥ 2, ssm.state_size {s} > 0, and ssm.time_step_rank \
                 {nv} a positive multiple of ssm.group_count {nk}",
                self.d_conv
            )));
        }
        Ok(())
    }
}

/// A DeltaNet layer's weights (shapes in numpy order).
pub struct DeltaNetWeights {
    /// Its index among the recurrent layers (its state's place).
    pub index: usize,
    pub qkv: TensorInfo,  // (C, H) attn_qkv
    pub gate: TensorInfo, // (Nv·S, H) attn_gate: z
    /// (2·Nv, H) `ssm_ba`, or [(Nv, H) `ssm_beta`, (Nv, H) `ssm_alpha`].
    pub ba: Vec<TensorInfo>,
    pub conv: Vec<f32>,    // [C, Kc] ssm_conv1d
    pub dt_bias: Vec<f32>, // [Nv] ssm_dt.bias
    pub a: Vec<f32>,       // [Nv] ssm_a = −exp(A_log)
    pub norm: Vec<f32>,    // [S] ssm_norm
    pub out: TensorInfo,   // (H, Nv·S) ssm_out
}

impl DeltaNetWeights {
    pub fn load(
        g: &Gguf,
        l: usize,
        index: usize,
        h: usize,
        sp: &SsmParams,
        ba: BetaAlpha,
    ) -> Result<DeltaNetWeights> {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        let (c, vd, nv) = (sp.conv_dim(), sp.v_dim(), sp.n_v);
        Ok(DeltaNetWeights {
            index,
            qkv: matrix(g, &n("attn_qkv"), c, h)?,
            gate: matrix(g, &n("attn_gate"), vd, h)?,
            ba: match ba {
                BetaAlpha::Fused => vec![matrix(g, &n("ssm_ba"), 2 * nv, h)?],
                BetaAlpha::Split => vec![
                    matrix(g, &n("ssm_beta"), nv, h)?,
                    matrix(g, &n("ssm_alpha"), nv, h)?,
                ],
            },
            conv: floats(g, &n("ssm_conv1d"), &[sp.d_conv, c])?,
            dt_bias: floats(g, &format!("blk.{l}.ssm_dt.bias"), &[nv])?,
            a: floats(g, &format!("blk.{l}.ssm_a"), &[nv])?,
            norm: floats(g, &n("ssm_norm"), &[sp.d_state])?,
            out: matrix(g, &n("ssm_out"), h, vd)?,
        })
    }
}

/// Every slot's recurrent state, and the mixer's scratch for R rows.
pub struct Recurrent {
    pub sp: SsmParams,
    pub opts: Hybrid,
    conv: Vec<Vec<f32>>, // [slots][Lr, Kc − 1, C]
    ssm: Vec<Vec<f32>>,  // [slots][Lr, Nv, S(v), S(k)]
    qkv: Vec<f32>,       // [R, C] projected, then conv'd and silu'd in place
    z: Vec<f32>,         // [R, Nv·S]
    ba: Vec<f32>,        // [R, 2·Nv] (fused) or [R, Nv] β then [R, Nv] α
    core: Vec<f32>,      // [R, Nv·S] the recurrence's output, then normed and gated
    /// The gated attention layers' q projection [R, Nh·2D] and output gate [R, Nh·D].
    pub qg: Vec<f32>,
    pub gate: Vec<f32>,
    /// Checkpoints of the slots' states (speculative windows' positions).
    pub ck: Checkpoints,
    /// [pieces] whether the step's piece is a window (checkpointed), set by the step.
    pub windows: Vec<bool>,
    /// The chunked form for long prefill pieces (`set_chunked`); None: the recurrence only.
    pub chunk: Option<ChunkTasks>,
}

impl Recurrent {
    pub fn new(
        sp: SsmParams,
        opts: Hybrid,
        n_slots: usize,
        rows: usize,
        q_dim: usize,
    ) -> Recurrent {
        let lr = sp.recurrent.iter().filter(|&&r| r).count();
        let (cs, ss) = sp.state_floats();
        let z = |n: usize| vec![0f32; n];
        Recurrent {
            ck: Checkpoints::new(n_slots, lr * cs, lr * ss),
            windows: Vec::with_capacity(n_slots),
            conv: (0..n_slots).map(|_| z(lr * cs)).collect(),
            ssm: (0..n_slots).map(|_| z(lr * ss)).collect(),
            qkv: z(rows * sp.conv_dim()),
            z: z(rows * sp.v_dim()),
            ba: z(rows * 2 * sp.n_v),
            core: z(rows * sp.v_dim()),
            qg: z(rows * 2 * q_dim),
            gate: z(rows * q_dim),
            chunk: None,
            sp,
            opts,
        }
    }

    /// Runs pieces of at least `min_tokens` tokens that save no checkpoints in the chunked
    /// form (`deltanet_chunk`: within float rounding of the recurrence, not bitwise); 0: the
    /// recurrence for every piece. Values 1 and 2 both mean 2 (one token is decode).
    pub fn set_chunked(&mut self, min_tokens: usize) {
        self.chunk = match min_tokens {
            0 => None,
            n => Some(ChunkTasks::new(n.max(2), self.sp.d_state)),
        };
    }

    /// Empties a slot's state (a sequence starting over).
    pub fn reset(&mut self, slot: usize) {
        self.conv[slot].fill(0.0);
        self.ssm[slot].fill(0.0);
        self.ck.drop_after(slot, 0);
    }

    /// Marks the slot's current state as its state at `pos` (`Checkpoints::mark`).
    pub fn mark(&mut self, slot: usize, pos: usize) {
        self.ck.mark(slot, pos, &self.conv[slot], &self.ssm[slot]);
    }

    /// Restores the slot's state at `pos` from a checkpoint; false without one.
    pub fn restore(&mut self, slot: usize, pos: usize) -> bool {
        self.ck
            .restore(slot, pos, &mut self.conv[slot], &mut self.ssm[slot])
    }

    /// Bytes of one slot's state (every recurrent layer's conv and delta-rule state, f32).
    pub fn slot_bytes(&self) -> usize {
        4 * (self.conv[0].len() + self.ssm[0].len())
    }

    /// The mixer of one DeltaNet layer over the step's rows: `h` [R', H] the normed input,
    /// `pieces` the step's pieces (each continues its slot's state), `out` [R', H].
    #[allow(clippy::too_many_arguments)]
    pub fn mix(
        &mut self,
        compute: &dyn Compute,
        w: &Weights,
        dw: &DeltaNetWeights,
        eps: f32,
        h: &[f32],
        segs: &[usize],
        pieces: &[Piece],
        out: &mut [f32],
    ) -> Result<()> {
        let sp = &self.sp;
        let (c, vd, nv) = (sp.conv_dim(), sp.v_dim(), sp.n_v);
        let t: usize = segs.iter().sum();
        let (qkv, z, ba, core) = (
            &mut self.qkv[..t * c],
            &mut self.z[..t * vd],
            &mut self.ba[..t * 2 * nv],
            &mut self.core[..t * vd],
        );
        compute.matmul_segs(&w.mat(&dw.qkv), h, segs, qkv)?; // [R', C]
        compute.matmul_segs(&w.mat(&dw.gate), h, segs, z)?; // [R', Nv·S]
        match &dw.ba[..] {
            [fused] => compute.matmul_segs(&w.mat(fused), h, segs, ba)?, // [R', 2·Nv]
            [beta, alpha] => {
                let (b, a) = ba.split_at_mut(t * nv);
                compute.matmul_segs(&w.mat(beta), h, segs, b)?; // [R', Nv]
                compute.matmul_segs(&w.mat(alpha), h, segs, a)?; // [R', Nv]
            }
            _ => unreachable!("one fused or two split β/α projections"),
        }
        // The pieces that save no checkpoints run split by key head on the compute's tasks
        // (each piece its own slot); the windows' token-by-token checkpoints run here.
        let par = super::deltanet_par::Heads {
            sp,
            opts: self.opts,
            dw,
            eps,
            t,
            chunk: self.chunk.as_ref(),
        };
        par.run(
            compute,
            (qkv, z, ba, core),
            (&mut self.conv, &mut self.ssm),
            pieces,
            &self.windows,
        )?;
        let st = States {
            conv: &mut self.conv,
            ssm: &mut self.ssm,
            ck: &mut self.ck,
            windows: &self.windows,
        };
        let io = Rows { qkv, z, ba, core };
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has FMA (checked above).
            unsafe { recur_fma(sp, self.opts, dw, eps, io, st, pieces, t) };
            return compute.matmul_segs(&w.mat(&dw.out), &self.core[..t * vd], segs, out);
        }
        recur(sp, self.opts, dw, eps, io, st, pieces, t);
        let core = &self.core[..t * vd];
        compute.matmul_segs(&w.mat(&dw.out), core, segs, out) // [R', H]
    }
}

/// The step's projected rows (`Recurrent`'s scratch, R' rows each).
struct Rows<'a> {
    qkv: &'a mut [f32],
    z: &'a [f32],
    ba: &'a [f32],
    core: &'a mut [f32],
}

/// Every slot's states and their checkpoints (`windows`: which pieces save theirs).
struct States<'a> {
    conv: &'a mut [Vec<f32>],
    ssm: &'a mut [Vec<f32>],
    ck: &'a mut Checkpoints,
    windows: &'a [bool],
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn recur_fma(
    sp: &SsmParams,
    opts: Hybrid,
    dw: &DeltaNetWeights,
    eps: f32,
    io: Rows<'_>,
    st: States<'_>,
    pieces: &[Piece],
    t: usize,
) {
    recur(sp, opts, dw, eps, io, st, pieces, t)
}

/// Conv, delta rule and gated norm of every row, each piece on its slot's state, token by
/// token (`io.qkv` [R', C] is conv'd in place; the output goes to `io.core` [R', Nv·S]);
/// only the window pieces: the others ran on the compute's tasks (`deltanet_par`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn recur(
    sp: &SsmParams,
    opts: Hybrid,
    dw: &DeltaNetWeights,
    eps: f32,
    io: Rows<'_>,
    st: States<'_>,
    pieces: &[Piece],
    t: usize,
) {
    let (c, vd) = (sp.conv_dim(), sp.v_dim());
    let (cs, ss) = sp.state_floats();
    let i = dw.index;
    let Rows { qkv, z, ba, core } = io;
    for (j, p) in pieces.iter().enumerate() {
        let window = st.windows.get(j).copied().unwrap_or(false);
        let conv = &mut st.conv[p.slot][i * cs..(i + 1) * cs];
        let m = &mut st.ssm[p.slot][i * ss..(i + 1) * ss];
        if !window {
            continue; // run on the compute's tasks (`deltanet_par`)
        }
        for r in p.r0..p.r0 + p.t {
            let (b, a) = gate_rows(sp, opts.ba, ba, r, t);
            let x = &mut qkv[r * c..(r + 1) * c];
            conv_step(conv, &dw.conv, sp.d_conv, x);
            let o = &mut core[r * vd..(r + 1) * vd];
            token(sp, opts.heads, dw, eps, x, &b, &a, m, o);
            gated_norm(o, &z[r * vd..(r + 1) * vd], &dw.norm, eps);
            if window {
                let pos = p.p0 + (r - p.r0) + 1;
                st.ck.save(p.slot, pos, (i * cs, conv), (i * ss, m));
            }
        }
    }
}

/// Row `r`'s β and α of the step's `ba` (`t` rows).
#[inline(always)]
pub(super) fn gate_rows<'a>(
    sp: &SsmParams,
    layout: BetaAlpha,
    ba: &'a [f32],
    r: usize,
    t: usize,
) -> (GateRow<'a>, GateRow<'a>) {
    let nv = sp.n_v;
    match layout {
        BetaAlpha::Fused => {
            let row = &ba[r * 2 * nv..(r + 1) * 2 * nv];
            let rr = nv / sp.n_k;
            // α after the group's β
            (GateRow::Fused(row, rr, 0), GateRow::Fused(row, rr, rr))
        }
        BetaAlpha::Split => (
            GateRow::Plain(&ba[r * nv..(r + 1) * nv]),
            GateRow::Plain(&ba[(t + r) * nv..(t + r + 1) * nv]),
        ),
    }
}

/// One token's β or α row, as the projection laid it out.
pub(super) enum GateRow<'a> {
    /// [Nv] in value-head order.
    Plain(&'a [f32]),
    /// [Nk, 2r]: value head h = g·r + j at g·2r + `off` + j.
    Fused(&'a [f32], usize, usize),
}

impl GateRow<'_> {
    #[inline]
    pub(super) fn at(&self, h: usize) -> f32 {
        match *self {
            GateRow::Plain(v) => v[h],
            GateRow::Fused(v, r, off) => v[(h / r) * 2 * r + off + h % r],
        }
    }
}

/// The causal conv of one token: `x` [C] (this token's projections) becomes
/// silu(Σ_k window[k]·w[c, k]) over the window [state (Kc − 1 rows), x]; the state
/// [Kc − 1, C] shifts by one row and takes x (`ggml_ssm_conv`: f32 FMAs in kernel order, as
/// its compiled C contracts them).
#[inline(always)]
fn conv_step(state: &mut [f32], w: &[f32], kc: usize, x: &mut [f32]) {
    let c = x.len();
    assert!(state.len() >= (kc - 1) * c && w.len() >= c * kc);
    for ch in 0..c {
        // SAFETY: ch < C and the state holds (Kc − 1)·C floats (asserted).
        x[ch] =
            unsafe { conv_channel(state.as_mut_ptr(), c, ch, &w[ch * kc..(ch + 1) * kc], x[ch]) };
    }
}

/// One channel of `conv_step`: `xv` is this token's input on channel `ch`, `wc` [Kc] its
/// kernel, `state` the [Kc − 1, C] window (this channel's column is read and shifted);
/// returns silu of the window's sum. Channels touch disjoint state columns, so the pool's
/// tasks run them side by side (`deltanet_par`).
/// Safety: `state` points at (Kc − 1)·`c` floats and `ch` < `c`.
#[inline(always)]
pub(super) unsafe fn conv_channel(
    state: *mut f32,
    c: usize,
    ch: usize,
    wc: &[f32],
    xv: f32,
) -> f32 {
    let kc = wc.len();
    let mut sum = 0.0f32;
    for (k, &wk) in wc[..kc - 1].iter().enumerate() {
        sum = (*state.add(k * c + ch)).mul_add(wk, sum);
    }
    sum = xv.mul_add(wc[kc - 1], sum);
    // shift this channel's window and append x
    for k in 0..kc - 2 {
        *state.add(k * c + ch) = *state.add((k + 1) * c + ch);
    }
    *state.add((kc - 2) * c + ch) = xv;
    silu(sum)
}

/// ggml's vectorised silu (`ggml_v_silu`, rows of a multiple of 8 here).
#[inline(always)]
fn silu(x: f32) -> f32 {
    silu_mul(x, 1.0)
}

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// ggml's softplus: x above 20, else ln(1 + eˣ).
#[inline(always)]
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// x / √(Σx² + eps) in place, as llama.cpp's `build_gdn_l2_norm`: RMSNorm with eps/n (sum in
/// f64), scaled by 1/√n.
#[inline(always)]
pub(super) fn l2_norm(x: &mut [f32], eps: f32) {
    let n = x.len() as f32;
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps / n).sqrt();
    let post = 1.0 / n.sqrt();
    for v in x.iter_mut() {
        *v = (*v * scale) * post;
    }
}

/// `ggml_vec_dot_f32`'s order (four 8-lane FMA accumulators, the tail in f64).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    vec_dot(GgmlType::F32, a.len(), f32_bytes(a), f32_bytes(b))
}

/// The delta rule for one token over every value head: `x` [C] the conv'd q, k, v; `st`
/// [Nv, S(v), S(k)] this layer's state; `o` [Nv·S] the output before the gated norm.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn token(
    sp: &SsmParams,
    heads: HeadOrder,
    dw: &DeltaNetWeights,
    eps: f32,
    x: &mut [f32],
    b: &GateRow<'_>,
    a: &GateRow<'_>,
    st: &mut [f32],
    o: &mut [f32],
) {
    let (s, nk, nv) = (sp.d_state, sp.n_k, sp.n_v);
    let (qk, v) = x.split_at_mut(2 * nk * s);
    for head in qk.chunks_exact_mut(s) {
        l2_norm(head, eps); // q [Nk, S] then k [Nk, S]
    }
    let (q, k) = qk.split_at(nk * s);
    for hv in 0..nv {
        let kh = heads.k_head(hv, nk, nv);
        let m = &mut st[hv * s * s..(hv + 1) * s * s];
        let (qh, kk) = (&q[kh * s..(kh + 1) * s], &k[kh * s..(kh + 1) * s]);
        let (gb, ga) = (b.at(hv), a.at(hv));
        head_step(
            dw,
            hv,
            qh,
            kk,
            &v[hv * s..(hv + 1) * s],
            gb,
            ga,
            m,
            &mut o[hv * s..(hv + 1) * s],
        );
    }
}

/// The delta rule of value head `hv` for one token: `qh`, `kk` [S] its key head's normed q
/// and k, `vh` [S] its v, `b`/`a` its β and α pre-activations, `m` [S(v), S(k)] its state,
/// `o` [S] its output before the gated norm.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn head_step(
    dw: &DeltaNetWeights,
    hv: usize,
    qh: &[f32],
    kk: &[f32],
    vh: &[f32],
    b: f32,
    a: f32,
    m: &mut [f32],
    o: &mut [f32],
) {
    let s = qh.len();
    let scale = 1.0 / (s as f32).sqrt();
    let (beta, g) = gates(dw, hv, b, a);
    let decay = g.exp();
    // Row by row in one pass over the state (each row's arithmetic is ggml's, whose
    // passes over the whole state touch every row independently).
    for (j, row) in m.chunks_exact_mut(s).enumerate() {
        for e in row.iter_mut() {
            *e *= decay; // ggml_vec_scale_f32
        }
        let dj = (vh[j] - dot(row, kk)) * beta;
        for (e, &ki) in row.iter_mut().zip(kk) {
            *e = ki.mul_add(dj, *e); // ggml_vec_mad_f32: FMAs
        }
        o[j] = dot(row, qh) * scale;
    }
}

/// Value head `hv`'s β = σ(b) and log decay g = softplus(a + dt_bias)·A from their
/// pre-activations `b`, `a`.
#[inline(always)]
pub(super) fn gates(dw: &DeltaNetWeights, hv: usize, b: f32, a: f32) -> (f32, f32) {
    (sigmoid(b), softplus(a + dw.dt_bias[hv]) * dw.a[hv])
}

/// RMSNorm of each head of `o` [Nv·S] with `w` [S], times silu(z) (`build_norm_gated`).
#[inline(always)]
fn gated_norm(o: &mut [f32], z: &[f32], w: &[f32], eps: f32) {
    let s = w.len();
    for (head, zh) in o.chunks_exact_mut(s).zip(z.chunks_exact(s)) {
        gated_norm_head(head, zh, w, eps);
    }
}

/// `gated_norm` of one head: `head`, `zh`, `w` [S].
#[inline(always)]
pub(super) fn gated_norm_head(head: &mut [f32], zh: &[f32], w: &[f32], eps: f32) {
    let s = w.len();
    let sum: f64 = head.iter().map(|&v| (v * v) as f64).sum();
    let scale = 1.0 / ((sum / s as f64) as f32 + eps).sqrt();
    for ((v, &g), &zv) in head.iter_mut().zip(w).zip(zh) {
        *v = ((*v * scale) * g) * silu(zv);
    }
}

/// The gated attention's q projection `qg` [R', Nh, 2D] split into q [R', Nh·D] and the
/// output gate [R', Nh·D] (each head's first D values are q, the next D its gate).
pub fn split_q_gate(qg: &[f32], d: usize, q: &mut [f32], gate: &mut [f32]) {
    for ((pair, qh), gh) in qg
        .chunks_exact(2 * d)
        .zip(q.chunks_exact_mut(d))
        .zip(gate.chunks_exact_mut(d))
    {
        qh.copy_from_slice(&pair[..d]);
        gh.copy_from_slice(&pair[d..]);
    }
}

/// `att *= σ(gate)` element-wise (the gated attention's output gate).
pub fn apply_gate(att: &mut [f32], gate: &[f32]) {
    for (a, &g) in att.iter_mut().zip(gate) {
        *a *= sigmoid(g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_orders_map_value_heads_to_key_heads() {
        let g: Vec<usize> = (0..4).map(|h| HeadOrder::Grouped.k_head(h, 2, 4)).collect();
        let t: Vec<usize> = (0..4).map(|h| HeadOrder::Tiled.k_head(h, 2, 4)).collect();
        assert_eq!((g, t), (vec![0, 0, 1, 1], vec![0, 1, 0, 1]));
    }

    #[test]
    fn fused_beta_alpha_rows_interleave_per_key_head() {
        // Nk = 2, r = 2: [β0 β1 α0 α1 | β2 β3 α2 α3]
        let row = [0.0f32, 1.0, 10.0, 11.0, 2.0, 3.0, 12.0, 13.0];
        let (b, a) = (GateRow::Fused(&row, 2, 0), GateRow::Fused(&row, 2, 2));
        let bs: Vec<f32> = (0..4).map(|h| b.at(h)).collect();
        let al: Vec<f32> = (0..4).map(|h| a.at(h)).collect();
        assert_eq!(
            (bs, al),
            (vec![0.0, 1.0, 2.0, 3.0], vec![10.0, 11.0, 12.0, 13.0])
        );
    }

    #[test]
    fn conv_state_rolls_and_sums_the_window() {
        // C = 1, Kc = 3: y_t = silu(w0·x_{t−2} + w1·x_{t−1} + w2·x_t)
        let w = [1.0f32, 10.0, 100.0];
        let mut st = [0.0f32; 2];
        let mut ys = vec![];
        for xv in [1.0f32, 2.0, 3.0] {
            let mut x = [xv];
            conv_step(&mut st, &w, 3, &mut x);
            ys.push(x[0]);
        }
        let want = [100.0f32, 210.0, 321.0].map(silu);
        assert_eq!(ys, want);
        assert_eq!(st, [2.0, 3.0]);
    }

    #[test]
    fn gated_q_splits_per_head() {
        // Nh = 2, D = 2: per head [q q g g]
        let qg = [1.0f32, 2.0, 10.0, 20.0, 3.0, 4.0, 30.0, 40.0];
        let (mut q, mut g) = ([0f32; 4], [0f32; 4]);
        split_q_gate(&qg, 2, &mut q, &mut g);
        assert_eq!((q, g), ([1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]));
    }

    #[test]
    fn gpu_runs_the_hybrids() {
        use super::super::arch::Family;
        for (name, f) in [
            ("qwen3next", Family::Qwen3Next),
            ("qwen35moe", Family::Qwen35Moe),
        ] {
            assert_eq!(Family::from_arch(name).unwrap(), f);
            assert!(f.require_gpu().is_ok(), "{name}");
        }
    }

    #[test]
    fn l2_norm_gives_unit_length() {
        let mut x = [3.0f32, 4.0];
        l2_norm(&mut x, 0.0);
        assert!((x[0] - 0.6).abs() < 1e-6 && (x[1] - 0.8).abs() < 1e-6);
    }
}
