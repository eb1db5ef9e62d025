//! Multi-token dots: one weight row against several tokens' quantized activations, each weight
//! block decoded once for all of them (prefill's weight reuse). Every result is bitwise the
//! single-token dot of the same row, activation and float order (`Order`: `vec_dot`'s, or the
//! multi-row order of `kernel_many`): the SIMD kernels (`gemm_avx2.rs`, `gemm_avx512.rs`)
//! repeat the single-token kernel's integer lanes and float combine per token, and types
//! without a multi-token kernel loop over the single-token one.

use super::{active_isa, kernel_for, kernel_many, DotFn, Isa, Order};
use crate::quant::GgmlType;

#[cfg(target_arch = "x86_64")]
#[path = "gemm_amx.rs"]
mod gemm_amx;
#[cfg_attr(target_arch = "x86_64", path = "gemm_avx2.rs")]
#[cfg_attr(not(target_arch = "x86_64"), path = "gemm_stub.rs")]
mod gemm_avx2;
#[cfg_attr(target_arch = "x86_64", path = "gemm_avx512.rs")]
#[cfg_attr(not(target_arch = "x86_64"), path = "gemm_stub.rs")]
mod gemm_avx512;
#[cfg(target_arch = "x86_64")]
#[path = "gemm_vnni.rs"]
mod gemm_vnni;
#[cfg(all(test, target_arch = "x86_64"))]
pub(super) use gemm_avx2::q4_k_rows_il;
#[cfg(target_arch = "x86_64")]
pub(super) use gemm_avx512::iq3s512::{
    iq3_s_dot as iq3_s_avx512, iq3_s_dot_vbmi as iq3_s_avx512_vbmi,
    iq3_s_rows_perm as iq3_s_rows_avx512,
};

/// Whether the AMX-INT8 tile kernels run here (`gemm_amx.rs`: Q4_K, both orders; IQ3_S and
/// Q6_K, `Order::Many`).
pub fn amx_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        gemm_amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Fewest tokens for which `rows_call` takes the AMX tiles (below it a tile's unused token
/// columns cost more than the multi-token kernel).
const AMX_MIN_T: usize = 12;

/// Fewest tokens for which `rows_call` takes the VNNI register tiles (`gemm_vnni.rs`): IQ3_S
/// from 8 (its multi-token kernels redo the grid decode, signs and scales per token), the K
/// types from 12 (below it the 16-token registers' empty lanes cost more than the AVX-512
/// kernels: Q4_K at 8 tokens 0.77× of them, at 16 1.2–1.6×; `bench/bench_gemm_isa.py`, Zen 4).
const VNNI_MIN_T: [usize; 2] = [12, 8];

/// The rows × tokens tile scheme `rows_call` may take: each row's weights decoded and each
/// token's activations laid out once per call.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tiles {
    None,
    /// AMX-INT8 tiles (`gemm_amx.rs`): Q4_K in both orders, IQ3_S and Q6_K in `Order::Many`
    /// (Q6_K takes the VNNI registers where both run: `for_type`).
    Amx,
    /// AVX-512 VNNI registers (`gemm_vnni.rs`), where AMX is absent: the same types and
    /// orders.
    Vnni,
}

impl Tiles {
    /// The scheme for `w` in `order` on this CPU, the AVX-512 dispatch active: AMX where the
    /// CPU has it, except Q6_K, whose five tile products per chunk (the signed 8-bit scale
    /// split in four, and the −32 term) ran below one `vpdpbusd` per four weights on the GPU
    /// host's Xeon at every token count measured (1 thread, 16/32/64 tokens: 93.5 / 120.6 /
    /// 208.6 GOP/s against 57.2 / 89.0 / 162.1; 16 threads 300.9 against 221.9;
    /// `bench/bench_gemm_isa.py`, 12-04); IQ3_S and Q4_K stay on AMX (ahead at 64 tokens,
    /// mixed below).
    fn for_type(w: GgmlType, order: Order) -> Tiles {
        if !tiles_have(w, order == Order::Many) {
            Tiles::None
        } else if w != GgmlType::Q6K && amx_available() {
            Tiles::Amx
        } else if vnni_tiles_available() {
            Tiles::Vnni
        } else {
            Tiles::None
        }
    }

    /// Fewest tokens the scheme takes for `w`.
    fn min_t(self, w: GgmlType) -> usize {
        match self {
            Tiles::None => usize::MAX,
            Tiles::Amx => AMX_MIN_T,
            Tiles::Vnni => VNNI_MIN_T[usize::from(w == GgmlType::IQ3S)],
        }
    }
}

/// Whether the tile schemes have a kernel for `w` in `order` (`many`): AMX and VNNI have the
/// same ones (Q4_K in both orders, IQ3_S and Q6_K in `Order::Many`).
fn tiles_have(w: GgmlType, many: bool) -> bool {
    matches!(
        (w, many),
        (GgmlType::IQ3S, true) | (GgmlType::Q4K, _) | (GgmlType::Q6K, true)
    )
}

/// Whether the VNNI register tiles run here (AVX-512 VNNI).
fn vnni_tiles_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        gemm_vnni::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Most tokens a tile hands to one `MultiDot::call` (`MultiDot::group` says how many suit
/// the kernel), except where the rows × tokens tiles take the call (`TILE_MAX_T`).
pub const MAX_T: usize = 64;

/// Most tokens one `rows_call` through the tiles (AMX or VNNI registers) takes: every row
/// block's weights are decoded once per call, so a dense projection of a 512-token chunk
/// decodes its rows twice at 256 and eight times at 64 (the decode was about a third of the
/// IQ3_S tile's time at 32 tokens).
pub const TILE_MAX_T: usize = 256;

/// Most tokens the AVX-512 rows × tokens kernels take (`MultiDot::rows_plain`; AVX2's
/// Q4_K kernel takes up to `MAX_T`).
pub const ROWS_MAX_T: usize = 4;

/// Tokens per call for the kernels that decode a block per 4 tokens: a group's activations
/// stay in L1 while the rows of a tile's row block run over them.
const NARROW_T: usize = 8;

/// Most tokens per call for a rows × tokens kernel that takes more than `NARROW_T`: AVX2's
/// interleaved Q4_K kernel (pp512 on the qwen35moe bench file, 2 threads, Zen 3: 8 tokens
/// 182–257 tok/s, 16: 214–227, 32: 240–286, 64: 242–294 over interleaved runs).
const WIDE_T: usize = 32;

/// Whether `isa` has a multi-token kernel of its own for `w` in `order` (else the
/// single-token kernel loops).
pub fn has_multi_kernel(isa: Isa, w: GgmlType, order: Order) -> bool {
    multi_for(isa, w, order).is_some()
}

/// The multi-token kernel of `w` in `order` for `isa`: AVX-512's own (`gemm_avx512::kernel`:
/// Q4_K, Q6_K and IQ3_S; Q4_K and Q6_K passed `avx512_multi_equals_scalar_bitwise` / tests/test_gemm_isa.py on
/// the GPU host's Xeon, 2026-12-02), else the AVX2 one.
fn multi_for(isa: Isa, w: GgmlType, order: Order) -> Option<gemm_avx2::MultiFn> {
    if isa == Isa::Avx512 && isa.available() {
        if let Some(k) = gemm_avx512::kernel(w, order) {
            return Some(k);
        }
    }
    // The AVX2 kernels serve AVX-512 too where it has none of its own: their results are the
    // single-token ones bit for bit whatever the ISA, and the block decode is shared.
    if isa != Isa::Scalar && isa.available() && Isa::Avx2.available() {
        gemm_avx2::kernel(w, order)
    } else {
        None
    }
}

/// The single-token kernel of `order` (`kernel_many` where the type has one, else
/// `kernel_for`).
fn single_for(isa: Isa, w: GgmlType, order: Order) -> DotFn {
    let many = match order {
        Order::Many => kernel_many(isa, w),
        Order::Single => None,
    };
    many.or_else(|| kernel_for(isa, w))
        .unwrap_or_else(|| panic!("no {} dot kernel for {}", isa.name(), w.name()))
}

/// The multi-token dot for one weight type, row length and order, looked up once (a tile's
/// loop calls it per row): `call` checks only slice lengths.
#[derive(Clone, Copy)]
pub struct MultiDot {
    w: GgmlType,
    n: usize,
    row_len: usize,
    act_len: usize,
    single: DotFn,
    multi: Option<gemm_avx2::MultiFn>,
    /// Rows × tokens at once (`gemm_avx512::rows_kernel`, else `gemm_avx2::rows_kernel_t`),
    /// if any, and the most tokens it takes.
    rows: Option<(gemm_avx512::RowsFn, usize)>,
    /// The tiles `rows_call` may take (AVX-512 active: `Tiles::for_type`).
    tiles: Tiles,
    order: Order,
}

impl MultiDot {
    /// With the active ISA. Panics as `vec_dot` does for a type without a kernel or `n` not
    /// whole blocks.
    pub fn new(w: GgmlType, n: usize, order: Order) -> MultiDot {
        MultiDot::with_isa(active_isa(), w, n, order)
    }

    /// With a given ISA (which the CPU must run).
    pub fn with_isa(isa: Isa, w: GgmlType, n: usize, order: Order) -> MultiDot {
        MultiDot::with_kernel(isa, w, n, order, multi_for(isa, w, order))
    }

    /// With the AVX-512 multi-token kernel of `w` (and rows × tokens kernel, where the type
    /// has one), its VNNI variant or (`vnni` false) the AVX-512BW one (never the AMX tiles);
    /// None when the CPU cannot run it or the type has none (tests and benchmarks compare the
    /// variants).
    pub fn avx512_variant(w: GgmlType, n: usize, order: Order, vnni: bool) -> Option<MultiDot> {
        let k = gemm_avx512::kernel_with(w, order, vnni)?;
        let mut md = MultiDot::with_kernel(Isa::Avx512, w, n, order, Some(k));
        md.tiles = Tiles::None; // the variant itself, not the tiles
        md.rows = gemm_avx512::rows_kernel_with(w, order, vnni).map(|k| (k, ROWS_MAX_T));
        Some(md)
    }

    /// This handle with its rows × tokens scheme set by name — "amx", "vnni" or "none" —
    /// where the CPU runs it and it has the type and order (benchmarks compare the schemes
    /// on CPUs with both); else why not.
    pub fn with_tile_scheme(mut self, name: &str) -> Result<MultiDot, String> {
        let have = tiles_have(self.w, self.order == Order::Many);
        self.tiles = match name {
            "none" => Tiles::None,
            "amx" if have && amx_available() => Tiles::Amx,
            "vnni" if have && vnni_tiles_available() => Tiles::Vnni,
            "amx" | "vnni" => {
                return Err(format!(
                    "no {name} tiles for {} ({:?}) on this CPU",
                    self.w.name(),
                    self.order
                ))
            }
            _ => return Err(format!("unknown tile scheme {name:?}: amx, vnni or none")),
        };
        Ok(self)
    }

    fn with_kernel(
        isa: Isa,
        w: GgmlType,
        n: usize,
        order: Order,
        multi: Option<gemm_avx2::MultiFn>,
    ) -> MultiDot {
        assert!(isa.available(), "this CPU cannot run {}", isa.name());
        let row_len = w.row_bytes(n).expect("n is whole blocks");
        let act_len = super::act_bytes(w, n).expect("n is whole blocks");
        // the rows kernel is AVX-512's where it has one and runs where its multi-token
        // kernel would, else AVX2's on an AVX2 dispatch (bitwise the same results: every rows
        // kernel is `call`'s; AVX-512's multi-token kernels are not traded for AVX2's
        // interleaved one unmeasured)
        let rows = (isa == Isa::Avx512 && multi.is_some())
            .then(|| gemm_avx512::rows_kernel(w, order))
            .flatten()
            .map(|k| (k, ROWS_MAX_T))
            .or_else(|| {
                (isa == Isa::Avx2 && multi.is_some())
                    .then(|| gemm_avx2::rows_kernel_t(w, order))
                    .flatten()
            });
        MultiDot {
            w,
            n,
            row_len,
            act_len,
            single: single_for(isa, w, order),
            multi,
            rows,
            tiles: if isa == Isa::Avx512 {
                Tiles::for_type(w, order)
            } else {
                Tiles::None
            },
            order,
        }
    }

    /// How many tokens a call should get: `TILE_MAX_T` where the tiles take the type and
    /// order; else at most `MAX_T`. The IQ3_S kernel decodes each
    /// block once per call for all its tokens (its decode costs several tokens' work), so
    /// it takes `MAX_T`; a rows × tokens kernel its most (AVX2's interleaved Q4_K kernel
    /// shares its transpose of four rows over all of them), at most `WIDE_T`; the others
    /// `NARROW_T`.
    #[inline]
    pub fn group(&self) -> usize {
        if self.tiles != Tiles::None {
            TILE_MAX_T
        } else if self.multi.is_some() && self.w == GgmlType::IQ3S {
            MAX_T
        } else {
            self.rows
                .map_or(NARROW_T, |(_, t)| t.clamp(NARROW_T, WIDE_T))
        }
    }

    /// Whether `rows_call` takes tiles (AMX or VNNI registers) for `nt` tokens.
    #[inline]
    pub fn uses_tiles(&self, nt: usize) -> bool {
        nt >= self.tiles.min_t(self.w)
    }

    /// `out[r·nt + t] = dot(row r, acts[t])` for the `nr` consecutive rows of `rows` and the
    /// `nt = acts.len()` tokens, bitwise `call`'s (the tiles, AMX or VNNI registers, where
    /// `uses_tiles`, else `rows_plain`). Panics on wrong slice lengths.
    pub fn rows_call(&self, rows: &[u8], nr: usize, acts: &[&[u8]], out: &mut [f32]) {
        self.rows_call_keep(rows, nr, acts, out, false)
    }

    /// `rows_call`, where `same_acts` promises that the bytes at the addresses of `acts` did
    /// not change since this thread's last `rows_call` with `same_acts` false: the tiles then
    /// reuse the activations' layout of the last call whose activations had these addresses
    /// (blocks, token count, first and last address), instead of building it again (a
    /// tile's runs of rows over one token group, and Up after Gate on the same activations).
    pub fn rows_call_keep(
        &self,
        rows: &[u8],
        nr: usize,
        acts: &[&[u8]],
        out: &mut [f32],
        same_acts: bool,
    ) {
        let nt = self.check_rows(rows, nr, acts, out);
        #[cfg(target_arch = "x86_64")]
        if self.uses_tiles(nt) {
            let tiles = match self.tiles {
                Tiles::Vnni => gemm_vnni::rows,
                Tiles::Amx => gemm_amx::rows,
                Tiles::None => unreachable!("no tiles take {nt} tokens"),
            };
            // SAFETY: `Tiles::Vnni` / `Tiles::Amx` only where `gemm_vnni::available()` /
            // `gemm_amx::available()` and the scheme has the type and order
            // (`Tiles::for_type`, `with_tile_scheme`); the lengths are asserted.
            unsafe {
                tiles(
                    self.w,
                    self.order == Order::Many,
                    self.n,
                    rows,
                    nr,
                    acts,
                    out,
                    same_acts,
                )
            };
            return;
        }
        self.rows_plain(rows, nr, acts, out);
    }

    /// Panics unless `rows` holds `nr` rows, `out` `nr` × tokens and every activation a row's
    /// worth; the token count.
    fn check_rows(&self, rows: &[u8], nr: usize, acts: &[&[u8]], out: &[f32]) -> usize {
        let nt = acts.len();
        assert!(
            rows.len() == nr * self.row_len
                && out.len() == nr * nt
                && acts.iter().all(|a| a.len() == self.act_len),
            "rows dot {}: n = {}, {} bytes for {nr} rows, {nt} activations",
            self.w.name(),
            self.n,
            rows.len()
        );
        nt
    }

    /// `rows_call` without the AMX tiles: for as many tokens as it takes the rows × tokens
    /// kernel where the type has one (rows decoded in pairs or quads, their integer sums
    /// reduced together), else `call` per row. Bitwise `call`'s. Panics on wrong slice lengths.
    pub fn rows_plain(&self, rows: &[u8], nr: usize, acts: &[&[u8]], out: &mut [f32]) {
        let nt = self.check_rows(rows, nr, acts, out);
        match self.rows {
            // SAFETY: `rows_kernel` gave a kernel only on a CPU that runs it; the lengths are
            // asserted (n whole blocks: `new`).
            Some((k, max_t)) if nt > 1 && nt <= max_t => unsafe { k(self.n, rows, nr, acts, out) },
            _ => {
                for (r, o) in out.chunks_exact_mut(nt.max(1)).take(nr).enumerate() {
                    let row = &rows[r * self.row_len..(r + 1) * self.row_len];
                    for (a, oo) in acts.chunks(MAX_T).zip(o.chunks_mut(MAX_T)) {
                        self.call(row, a, oo);
                    }
                }
            }
        }
    }

    /// `out[t] = dot(w_row, acts[t])` in the handle's order, for every `t < acts.len()`,
    /// bitwise the single-token kernel's (`vec_dot_order`). Panics on wrong slice lengths.
    #[inline]
    pub fn call(&self, w_row: &[u8], acts: &[&[u8]], out: &mut [f32]) {
        assert!(
            w_row.len() == self.row_len
                && out.len() == acts.len()
                && acts.iter().all(|a| a.len() == self.act_len),
            "multi dot {}: n = {}, row {} bytes, {} activations",
            self.w.name(),
            self.n,
            w_row.len(),
            acts.len()
        );
        match self.multi {
            // SAFETY: `multi_for` / `avx512_variant` gave a kernel only on a CPU that runs its
            // ISA (AVX2, AVX-512, VNNI as the kernel needs); every slice holds
            // exactly the row and activation of n elements (asserted).
            Some(k) if acts.len() > 1 => unsafe { k(self.n, w_row, acts, out) },
            _ => {
                // (each `DotFn` checks its operands itself)
                for (o, a) in out.iter_mut().zip(acts) {
                    *o = (self.single)(self.n, w_row, a);
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "gemm_tests.rs"]
mod tests;
