//! Launchers of `cuda/deltanet.cu`: the Gated DeltaNet mixer's conv, per-row prep,
//! recurrence and gated norm, and the gated attention's q split and output gate.
//!
//! Legend: T = rows, t = one piece's rows, C = conv channels (2·Nk·S + Nv·S), Nk / Nv = key /
//! value heads, S = head size, Kc = conv width, Nh·D = the attention's q width.

use super::view::{bytes, grid_dim, i32_of, launch, prod, Dv, GRID_X, GRID_YZ};
use crate::cuda::{Arg, Gpu, Stream};
use crate::error::{Error, Result};

/// Conv widths the kernel keeps in registers.
pub const KC_MAX: usize = 8;
/// Head sizes the recurrence keeps in registers (S/32 values per lane and row).
pub const S_MAX: usize = 256;
/// State rows per recurrence block (`GDN_ROWS`).
const ROWS: usize = 16;

/// Where one piece's recurrent state lives: `st_tab` / `ck_tab` u64 [slots] (each slot's
/// state buffer of `sb` floats, and its checkpoint area of `cap` + 1 snapshots, 0 when it has
/// none); the layer's part at `off` floats; `sp` the piece's (pos0, slot) i32 [2]; `ck` its
/// checkpoint flag i32 [1] (nonzero: save the state after each token).
#[derive(Clone, Copy, Debug)]
pub struct StateAt {
    pub st_tab: Dv,
    pub ck_tab: Dv,
    pub sp: Dv,
    pub ck: Dv,
    pub sb: usize,
    pub off: usize,
    pub cap: usize,
}

impl StateAt {
    fn check(&self, part: usize) -> Result<()> {
        self.sp.need("gdn step params", 8)?;
        self.ck.need("gdn checkpoint flag", 4)?;
        self.st_tab.need("gdn state table", 8)?;
        self.ck_tab.need("gdn checkpoint table", 8)?;
        if self.cap == 0 || self.off + part > self.sb {
            return Err(Error::Shape(format!(
                "gdn state: {part} floats at {} outside a slot's {} (checkpoints {})",
                self.off, self.sb, self.cap
            )));
        }
        Ok(())
    }

    fn args(&self) -> [Arg; 7] {
        [
            self.st_tab.arg(),
            self.ck_tab.arg(),
            self.sp.arg(),
            self.ck.arg(),
            Arg::U64(self.sb as u64),
            Arg::U64(self.off as u64),
            Arg::I32(self.cap as i32),
        ]
    }
}

/// Causal conv + silu of one piece: x f32 [t, C] in place; w f32 [C, Kc]; the conv state
/// [Kc − 1, C] at `at`.
#[allow(clippy::too_many_arguments)]
pub fn conv(
    gpu: &Gpu,
    s: &Stream,
    x: Dv,
    w: Dv,
    at: StateAt,
    t: usize,
    c: usize,
    kc: usize,
) -> Result<()> {
    if !(2..=KC_MAX).contains(&kc) {
        return Err(Error::Model(format!(
            "ssm.conv_kernel {kc}: the GPU conv runs widths 2..={KC_MAX}"
        )));
    }
    x.need("gdn conv x", bytes(prod(&[t, c])?, 4)?)?;
    w.need("gdn conv w", bytes(prod(&[c, kc])?, 4)?)?;
    at.check((kc - 1) * c)?;
    if t == 0 {
        return Ok(());
    }
    let [st, ck_tab, sp, ck, sb, off, cap] = at.args();
    launch(
        gpu,
        s,
        "strata_gdn_conv",
        (grid_dim("channels", c.div_ceil(128), GRID_X)?, 1, 1),
        128,
        &[
            x.arg(),
            w.arg(),
            st,
            ck_tab,
            sp,
            ck,
            sb,
            off,
            cap,
            Arg::I32(i32_of("t", t)?),
            Arg::I32(i32_of("C", c)?),
            Arg::I32(kc as i32),
        ],
    )
}

/// The DeltaNet shape of a layer: S, Nk, Nv.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub s: usize,
    pub nk: usize,
    pub nv: usize,
}

impl Heads {
    /// C: the conv channels.
    pub fn c(&self) -> usize {
        (2 * self.nk + self.nv) * self.s
    }

    fn check(&self) -> Result<()> {
        let Heads { s, nk, nv } = *self;
        if s == 0 || s > S_MAX || nk == 0 || nv == 0 || !nv.is_multiple_of(nk) {
            return Err(Error::Model(format!(
                "DeltaNet heads: S {s} must be in 1..={S_MAX}, Nv {nv} a positive multiple of \
                 Nk {nk} (the GPU recurrence)"
            )));
        }
        Ok(())
    }
}

/// β / α of the rows: `Fused(ba)` f32 [T, 2·Nv] (`ssm_ba`), or `Split(b, a)` f32 [T, Nv] each.
#[derive(Clone, Copy, Debug)]
pub enum Gates {
    Fused(Dv),
    Split(Dv, Dv),
}

/// q and k heads of qkv f32 [T, C] L2-normed in place; gates f32 [T, Nv, 2] = (β, decay)
/// from `ba`, `dt_bias` and `a` f32 [Nv].
#[allow(clippy::too_many_arguments)]
pub fn prep(
    gpu: &Gpu,
    s: &Stream,
    qkv: Dv,
    ba: Gates,
    dt_bias: Dv,
    a: Dv,
    gates: Dv,
    t: usize,
    h: Heads,
    eps: f32,
) -> Result<()> {
    h.check()?;
    let c = h.c();
    qkv.need("gdn qkv", bytes(prod(&[t, c])?, 4)?)?;
    let (b, al, fused) = match ba {
        Gates::Fused(ba) => {
            ba.need("gdn ba", bytes(prod(&[t, 2, h.nv])?, 4)?)?;
            (ba, ba, 1)
        }
        Gates::Split(b, a) => {
            b.need("gdn beta", bytes(prod(&[t, h.nv])?, 4)?)?;
            a.need("gdn alpha", bytes(prod(&[t, h.nv])?, 4)?)?;
            (b, a, 0)
        }
    };
    dt_bias.need("gdn dt bias", bytes(h.nv, 4)?)?;
    a.need("gdn A", bytes(h.nv, 4)?)?;
    gates.need("gdn gates", bytes(prod(&[t, h.nv, 2])?, 4)?)?;
    if t == 0 {
        return Ok(());
    }
    launch(
        gpu,
        s,
        "strata_gdn_prep",
        (
            grid_dim("heads", 2 * h.nk + 1, GRID_X)?,
            grid_dim("rows", t, GRID_YZ)?,
            1,
        ),
        32,
        &[
            qkv.arg(),
            b.arg(),
            al.arg(),
            dt_bias.arg(),
            a.arg(),
            gates.arg(),
            Arg::I32(i32_of("C", c)?),
            Arg::I32(i32_of("Nk", h.nk)?),
            Arg::I32(i32_of("Nv", h.nv)?),
            Arg::I32(i32_of("S", h.s)?),
            Arg::I32(fused),
            Arg::F32(eps),
        ],
    )
}

/// The delta rule over one piece: qkv f32 [t, C] (conv'd, q/k normed), gates f32 [t, Nv, 2],
/// core f32 [t, Nv·S] out; the layer's state [Nv, S, S] at `at`. `grouped`: value head h
/// reads key head h / (Nv/Nk), else h mod Nk.
#[allow(clippy::too_many_arguments)]
pub fn recur(
    gpu: &Gpu,
    s: &Stream,
    qkv: Dv,
    gates: Dv,
    core: Dv,
    at: StateAt,
    t: usize,
    h: Heads,
    grouped: bool,
) -> Result<()> {
    h.check()?;
    let c = h.c();
    qkv.need("gdn qkv", bytes(prod(&[t, c])?, 4)?)?;
    gates.need("gdn gates", bytes(prod(&[t, h.nv, 2])?, 4)?)?;
    core.need("gdn core", bytes(prod(&[t, h.nv, h.s])?, 4)?)?;
    at.check(prod(&[h.nv, h.s, h.s])?)?;
    if t == 0 {
        return Ok(());
    }
    let [st, ck_tab, sp, ck, sb, off, cap] = at.args();
    launch(
        gpu,
        s,
        "strata_gdn_recur",
        (
            grid_dim("value heads", h.nv, GRID_X)?,
            grid_dim("row blocks", h.s.div_ceil(ROWS), GRID_YZ)?,
            1,
        ),
        128,
        &[
            qkv.arg(),
            gates.arg(),
            core.arg(),
            st,
            ck_tab,
            sp,
            ck,
            sb,
            off,
            cap,
            Arg::I32(i32_of("t", t)?),
            Arg::I32(i32_of("C", c)?),
            Arg::I32(h.nk as i32),
            Arg::I32(h.nv as i32),
            Arg::I32(h.s as i32),
            Arg::I32(grouped as i32),
        ],
    )
}

/// o f32 [T, Nv, S] in place: per head RMSNorm · w [S] · silu(z) (z f32 [T, Nv·S]).
#[allow(clippy::too_many_arguments)]
pub fn gated_norm(
    gpu: &Gpu,
    s: &Stream,
    o: Dv,
    z: Dv,
    w: Dv,
    t: usize,
    nv: usize,
    sz: usize,
    eps: f32,
) -> Result<()> {
    let n = bytes(prod(&[t, nv, sz])?, 4)?;
    o.need("gdn core", n)?;
    z.need("gdn z", n)?;
    w.need("gdn norm", bytes(sz, 4)?)?;
    if t == 0 || nv == 0 {
        return Ok(());
    }
    launch(
        gpu,
        s,
        "strata_gdn_gated_norm",
        (
            grid_dim("value heads", nv, GRID_X)?,
            grid_dim("rows", t, GRID_YZ)?,
            1,
        ),
        32,
        &[
            o.arg(),
            z.arg(),
            w.arg(),
            Arg::I32(i32_of("Nv", nv)?),
            Arg::I32(i32_of("S", sz)?),
            Arg::F32(eps),
        ],
    )
}

/// qg f32 [T, Nh, 2D] → q, gate f32 [T, Nh·D] (`n` = T·Nh·D).
pub fn split_q(gpu: &Gpu, s: &Stream, qg: Dv, q: Dv, gate: Dv, n: usize, d: usize) -> Result<()> {
    qg.need("gated q", bytes(prod(&[n, 2])?, 4)?)?;
    q.need("q", bytes(n, 4)?)?;
    gate.need("q gate", bytes(n, 4)?)?;
    if d == 0 || !n.is_multiple_of(d) {
        return Err(Error::Shape(format!(
            "gated q: {n} values are not heads of {d}"
        )));
    }
    if n == 0 {
        return Ok(());
    }
    launch(
        gpu,
        s,
        "strata_gdn_split_q",
        (grid_dim("blocks", n.div_ceil(256), GRID_X)?, 1, 1),
        256,
        &[
            qg.arg(),
            q.arg(),
            gate.arg(),
            Arg::I32(i32_of("n", n)?),
            Arg::I32(i32_of("d", d)?),
        ],
    )
}

/// att[i] *= σ(gate[i]) for i < n.
pub fn sigmoid_mul(gpu: &Gpu, s: &Stream, att: Dv, gate: Dv, n: usize) -> Result<()> {
    att.need("gated att", bytes(n, 4)?)?;
    gate.need("q gate", bytes(n, 4)?)?;
    if n == 0 {
        return Ok(());
    }
    launch(
        gpu,
        s,
        "strata_gdn_sigmoid_mul",
        (grid_dim("blocks", n.div_ceil(256), GRID_X)?, 1, 1),
        256,
        &[att.arg(), gate.arg(), Arg::I32(i32_of("n", n)?)],
    )
}
