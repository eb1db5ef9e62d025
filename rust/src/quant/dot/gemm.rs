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
#[cfg(all(test, target_arch = "x86_64"))]
pub(super) use gemm_avx2::q4_k_rows_il;
#[cfg(target_arch = "x86_64")]
pub(super) use gemm_avx512::iq3s512::{
    iq3_s_dot as iq3_s_avx512, iq3_s_dot_vbmi as iq3_s_avx512_vbmi,
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

/// Most tokens a tile hands to one `MultiDot::call` (`MultiDot::group` says how many suit
/// the kernel).
pub const MAX_T: usize = 64;

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
    /// `rows_call` may take the AMX tiles (Q4_K; IQ3_S and Q6_K in `Order::Many`; AVX-512
    /// active, AMX here).
    amx: bool,
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
        md.amx = false; // the variant itself, not the tiles
        md.rows = gemm_avx512::rows_kernel_with(w, order, vnni).map(|k| (k, ROWS_MAX_T));
        Some(md)
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
            amx: isa == Isa::Avx512
                && (w == GgmlType::Q4K
                    || (matches!(w, GgmlType::IQ3S | GgmlType::Q6K) && order == Order::Many))
                && amx_available(),
            order,
        }
    }

    /// How many tokens (at most `MAX_T`) a call should get. The IQ3_S kernel decodes each
    /// block once per call for all its tokens (its decode costs several tokens' work), so
    /// it takes `MAX_T`; a rows × tokens kernel its most (AVX2's interleaved Q4_K kernel
    /// shares its transpose of four rows over all of them), at most `WIDE_T`; the others
    /// `NARROW_T`.
    #[inline]
    pub fn group(&self) -> usize {
        if self.amx || (self.multi.is_some() && self.w == GgmlType::IQ3S) {
            MAX_T
        } else {
            self.rows
                .map_or(NARROW_T, |(_, t)| t.clamp(NARROW_T, WIDE_T))
        }
    }

    /// Whether `rows_call` takes the AMX tiles for `nt` tokens.
    #[inline]
    pub fn uses_amx(&self, nt: usize) -> bool {
        self.amx && nt >= AMX_MIN_T
    }

    /// `out[r·nt + t] = dot(row r, acts[t])` for the `nr` consecutive rows of `rows` and the
    /// `nt = acts.len()` tokens, bitwise `call`'s (the AMX tiles where `uses_amx`, else `call`
    /// per row). Panics on wrong slice lengths.
    pub fn rows_call(&self, rows: &[u8], nr: usize, acts: &[&[u8]], out: &mut [f32]) {
        self.rows_call_keep(rows, nr, acts, out, false)
    }

    /// `rows_call`, where `same_acts` promises that `acts` hold the same bytes (at the same
    /// addresses) as at this thread's previous `rows_call` of any handle: the AMX tiles then
    /// reuse the activations' tile layout instead of building it again (a tile's runs of
    /// rows over one token group, and Up after Gate on the same activations).
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
        if self.uses_amx(nt) {
            // SAFETY: `amx` holds only where `gemm_amx::available()`; the lengths are asserted.
            unsafe {
                gemm_amx::rows(
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
mod tests {
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
                    let acts: Vec<Vec<u8>> =
                        (0..MAX_T).map(|_| random_act(w, n, &mut rng)).collect();
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
            let mut acts: Vec<Vec<u8>> =
                (0..MAX_T + 9).map(|_| random_act(w, n, &mut rng)).collect();
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

    /// The AMX tile path (`rows_call` on Q4_K in both orders, IQ3_S and Q6_K in `Many`) against the scalar
    /// single-token kernel of the order, bitwise: row counts around the 16-row tile, token counts around the
    /// 16-token tile (from `AMX_MIN_T`), several row lengths, activations at the extremes (±127)
    /// beside random ones, and weights whose scales and mins take every 6-bit extreme.
    #[test]
    #[ignore = "ISA test: tests/test_isa.py runs it, skipped where the CPU lacks amx"]
    fn amx_rows_equal_scalar_bitwise() {
        assert!(
            amx_available(),
            "amx_rows_equal_scalar_bitwise needs AMX-INT8: tests/test_isa.py runs it only where it can"
        );
        let mut checked = 0;
        let cases = [
            (GgmlType::Q4K, Order::Single),
            (GgmlType::Q4K, Order::Many),
            (GgmlType::IQ3S, Order::Many),
            (GgmlType::Q6K, Order::Many),
        ];
        for ((w, order), nb) in cases
            .into_iter()
            .flat_map(|c| [1usize, 3, 8].map(|nb| (c, nb)))
        {
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
            let md = MultiDot::with_isa(Isa::Avx512, w, n, order);
            let rb = w.row_bytes(n).unwrap();
            for nr in [1usize, 5, 16, 17, 40] {
                for nt in [AMX_MIN_T, 13, 15, 16, 17, 31, 32, 40, 64] {
                    assert!(md.uses_amx(nt), "{} {order:?}", w.name());
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
                    // `rows_call_keep`: the same activations reuse their tile layout; other
                    // ones (reversed: other first and last addresses) are laid out again
                    // although the caller says "same"
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
        println!("amx: {checked} (row, token) dots equal scalar");
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
    /// kernel where the type has one), best of 5 interleaved passes, GB/s of weights read:
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
                let mut best = [f64::MAX; 2];
                for _ in 0..5 {
                    for (k, b) in best.iter_mut().enumerate() {
                        let t0 = std::time::Instant::now();
                        if k == 0 {
                            for (r, o) in out.chunks_exact_mut(nt).enumerate() {
                                md.call(&rows[r * rb..(r + 1) * rb], &refs, o);
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
                    "{} n={n} tokens={nt}: call per row {:.2} ms ({:.1} GB/s), rows_plain {:.2} ms ({:.1} GB/s)",
                    w.name(), best[0] * 1e3, gbs(best[0]), best[1] * 1e3, gbs(best[1])
                );
            }
        }
    }
}
