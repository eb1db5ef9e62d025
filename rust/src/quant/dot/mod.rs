//! Activation quantization and `dot(weight row, quantized activation)`.
//!
//! For each weight type the activation is quantized to the type ggml pairs it with
//! (`GgmlType::vec_dot_type`: Q8_0, Q8_1 or Q8_K; identity for float types), exactly as
//! ggml's reference quantizers round. The scalar kernels are the reference; AVX2 and
//! AVX-512 versions are chosen once at run time by CPU feature detection (or fixed with
//! [`set_active_isa`]: the settings' `isa`, `STRATA_ISA`; or per call with [`vec_dot_isa`]).
//!
//! Every kernel computes exact integer sums per block (or sub-block) and combines them with
//! the float scales in a fixed order (see `common`), so the SIMD versions, which vectorise
//! only the integer part (and the 16-lane float part of 32-element blocks), return results
//! bitwise equal to the scalar ones. docs/QUANT.md states the error bound against the float
//! dot of the dequantized operands.

// The kernels index by position as the block formats are specified (docs/FORMATS.md §2).
#![allow(clippy::needless_range_loop)]

/// The `DotFn` of an ISA's `unsafe` kernel `$f` for weight type `$t`: asserts the operand
/// lengths, then calls it. Every ISA table (`avx2::kernel`, `kernel_many`, `avx512::kernel`)
/// builds its entries with it, after its CPU check.
macro_rules! safe_dot {
    ($t:ident, $f:path) => {{
        fn wrap(n: usize, w: &[u8], a: &[u8]) -> f32 {
            $crate::quant::dot::assert_operands($crate::quant::GgmlType::$t, n, w.len(), a.len());
            // SAFETY: the tables hand this out only when the CPU runs the ISA (checked before
            // the table is built), and the slices hold exactly the row and activation of n
            // elements (asserted).
            unsafe { $f(n, w, a) }
        }
        wrap as $crate::quant::dot::DotFn
    }};
}

mod act;
mod common;
mod gemm;
pub mod pf_tune;
pub mod q4k_r16;
pub mod q6k_repack;
#[cfg(all(test, target_arch = "x86_64"))]
mod rows_bench;
mod scalar;
mod scalar_iq;
mod scalar_k;
#[cfg(test)]
pub(crate) mod tests;

#[cfg_attr(not(target_arch = "x86_64"), path = "simd_stub.rs")]
mod avx2;
#[cfg_attr(not(target_arch = "x86_64"), path = "simd_stub.rs")]
mod avx512;
#[cfg_attr(not(target_arch = "x86_64"), path = "simd_stub.rs")]
mod cpu;

use super::types::GgmlType;
use crate::error::{Error, Result};
use std::sync::OnceLock;

pub use common::{reduce8 as common_reduce8, reduce_4x8};
pub use cpu::cpu_features;
pub use gemm::{amx_available, has_multi_kernel, MultiDot, MAX_T, TILE_MAX_T};

/// `dot(n, weight row bytes, activation bytes)`; slices are exactly the row's bytes.
pub type DotFn = fn(usize, &[u8], &[u8]) -> f32;

/// `f(n, rows, act, out)`: `out[r] = dot(row r, act)` for `out.len()` rows back to back in
/// `rows`, bitwise the `DotFn` of the same ISA row by row (panics on wrong slice lengths).
pub type RowsFn = fn(usize, &[u8], &[u8], &mut [f32]);

/// An instruction set the kernels come in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL (and VNNI kernels where the CPU has VNNI).
    Avx512,
}

impl Isa {
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512];

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    pub fn from_name(s: &str) -> Option<Isa> {
        Isa::ALL
            .into_iter()
            .find(|i| i.name().eq_ignore_ascii_case(s))
    }

    /// Whether this CPU can run the kernels of this ISA.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => cpu::has_avx2(),
            Isa::Avx512 => cpu::has_avx512(),
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The best ISA this CPU runs.
pub fn best_isa() -> Isa {
    Isa::ALL
        .into_iter()
        .rev()
        .find(|i| i.available())
        .unwrap_or(Isa::Scalar)
}

/// The guard of an ISA test: such tests are `#[ignore]`d in `cargo test` and run by
/// tests/test_isa.py (`-- --ignored`), which reports each as skipped, with the reason, where
/// the CPU lacks its ISA; run without the ISA, the test fails instead of passing unchecked.
#[cfg(test)]
pub(crate) fn require_isa(isa: Isa, test: &str) {
    assert!(
        isa.available(),
        "{test} needs {} and this CPU lacks it: tests/test_isa.py runs it only where it can",
        isa.name()
    );
}

static ACTIVE: OnceLock<Isa> = OnceLock::new();

/// Sets the one-token kernels' software prefetch distance in bytes (0: off) and returns the
/// previous one; a benchmark knob (results are bitwise the same at any distance).
pub fn set_prefetch_distance(bytes: usize) -> usize {
    avx2::pf::knob::DIST.set(bytes)
}

/// Sets the output head kernel's software prefetch distance in bytes (0: off) and returns
/// the previous one; a benchmark knob like `set_prefetch_distance`.
/// Setting it pins it: the head's own tuning (`pf_tune`) stops.
pub fn set_head_prefetch_distance(bytes: usize) -> usize {
    pf_tune::HEAD_TUNER.pin();
    avx2::pf::knob::HEAD.set(bytes)
}

/// (the output head kernel's prefetch distance now, whether it is settled: chosen by its
/// tuning on this CPU, or pinned by `set_head_prefetch_distance`).
pub fn head_prefetch_state() -> (usize, bool) {
    pf_tune::HEAD_TUNER.state()
}

/// Fix the ISA `vec_dot` uses before its first use (the engine's settings call this); an
/// error when the CPU cannot run `isa` or another ISA is already in use.
pub fn set_active_isa(isa: Isa) -> Result<()> {
    if !isa.available() {
        return Err(Error::Config(format!("this CPU cannot run {}", isa.name())));
    }
    let got = *ACTIVE.get_or_init(|| isa);
    if got != isa {
        return Err(Error::Config(format!(
            "the dot kernels already use {}; the ISA is chosen once per process",
            got.name()
        )));
    }
    Ok(())
}

/// The ISA `vec_dot` uses: as set by `set_active_isa` (the settings object's `isa`, through
/// `Model.open`), else `STRATA_ISA` (the variable the settings read, so that a process whose
/// first dot runs before any model opens agrees with its settings), capped at what this CPU
/// runs, else the best this CPU runs. Chosen once per process.
pub fn active_isa() -> Isa {
    *ACTIVE.get_or_init(|| env_isa(std::env::var("STRATA_ISA").ok().as_deref()))
}

/// The ISA a `STRATA_ISA` value asks for, capped at the best this CPU runs; the best for no
/// value, `auto` or a name that is no ISA (the settings reject those with a typed error).
fn env_isa(v: Option<&str>) -> Isa {
    let best = best_isa();
    match v.and_then(Isa::from_name) {
        Some(i) if i.index() <= best.index() => i,
        _ => best,
    }
}

const N_TYPES: usize = 43;

fn scalar_kernel(w: GgmlType) -> Option<DotFn> {
    use GgmlType::*;
    Some(match w {
        F32 => scalar::f32_dot,
        F16 => scalar::f16_dot,
        BF16 => scalar::bf16_dot,
        Q4_0 => scalar::q4_0,
        Q4_1 => scalar::q4_1,
        Q5_0 => scalar::q5_0,
        Q5_1 => scalar::q5_1,
        Q8_0 => scalar::q8_0,
        IQ4NL => scalar::iq4_nl,
        MXFP4 => scalar::mxfp4,
        Q2_0 => scalar::q2_0,
        Q2K => scalar_k::q2_k,
        Q3K => scalar_k::q3_k,
        Q4K => scalar_k::q4_k,
        Q5K => scalar_k::q5_k,
        Q6K => scalar_k::q6_k,
        TQ1_0 => scalar_k::tq1_0,
        TQ2_0 => scalar_k::tq2_0,
        IQ2XXS => scalar_iq::iq2_xxs,
        IQ2XS => scalar_iq::iq2_xs,
        IQ2S => scalar_iq::iq2_s,
        IQ3XXS => scalar_iq::iq3_xxs,
        IQ3S => scalar_iq::iq3_s,
        IQ1S => scalar_iq::iq1_s,
        IQ1M => scalar_iq::iq1_m,
        IQ4XS => scalar_iq::iq4_xs,
        _ => return None,
    })
}

fn table(isa: Isa) -> &'static [Option<DotFn>; N_TYPES] {
    static TABLES: [OnceLock<[Option<DotFn>; N_TYPES]>; 3] =
        [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    TABLES[isa.index()].get_or_init(|| {
        let mut t = [None; N_TYPES];
        for w in GgmlType::ALL {
            let mut k = scalar_kernel(w);
            if k.is_some() && isa != Isa::Scalar && Isa::Avx2.available() {
                k = avx2::kernel(w).or(k);
            }
            if k.is_some() && isa == Isa::Avx512 && Isa::Avx512.available() {
                k = avx512::kernel(w).or(k);
            }
            t[w.id() as usize] = k;
        }
        t
    })
}

/// The kernel `isa` uses for weight type `w` (falling back to the next lower ISA where
/// that type has no kernel of its own); None when the type has no dot kernel or the CPU
/// cannot run `isa`.
pub fn kernel_for(isa: Isa, w: GgmlType) -> Option<DotFn> {
    if !isa.available() {
        return None;
    }
    table(isa)[w.id() as usize]
}

/// Whether the kernel `isa` would use for `w` is a SIMD kernel of that ISA itself.
pub fn has_native_kernel(isa: Isa, w: GgmlType) -> bool {
    match isa {
        Isa::Scalar => scalar_kernel(w).is_some(),
        Isa::Avx2 => isa.available() && avx2::kernel(w).is_some(),
        Isa::Avx512 => isa.available() && avx512::kernel(w).is_some(),
    }
}

/// Bytes of the quantized activation for a weight type `w` and a row of `n` elements.
pub fn act_bytes(w: GgmlType, n: usize) -> Option<usize> {
    w.vec_dot_type().row_bytes(n)
}

/// Quantize the activation row `x` into the format `act` (a `vec_dot_type`).
pub fn quantize_act(act: GgmlType, x: &[f32], out: &mut [u8]) -> Result<()> {
    let need = act.row_bytes(x.len()).ok_or_else(|| {
        Error::Quant(format!(
            "{} elements is not whole {} blocks",
            x.len(),
            act.name()
        ))
    })?;
    if out.len() != need {
        return Err(Error::Quant(format!(
            "activation buffer is {} bytes, expected {need}",
            out.len()
        )));
    }
    match act {
        GgmlType::F32 => act::f32_row(x, out),
        GgmlType::F16 => act::f16_row(x, out),
        GgmlType::BF16 => act::bf16_row(x, out),
        GgmlType::Q8_0 => act::q8_0(x, out),
        GgmlType::Q8_1 => act::q8_1(x, out),
        GgmlType::Q8K => act::q8_k(x, out),
        other => {
            return Err(Error::Quant(format!(
                "{} is not an activation type",
                other.name()
            )))
        }
    }
    Ok(())
}

/// Whether `w` has a dot kernel.
pub fn supports(w: GgmlType) -> bool {
    scalar_kernel(w).is_some()
}

/// Panic unless `w_len` and `a_len` are exactly the bytes of a row of `n` elements of `w`
/// and of its activation. Every SIMD kernel wrapper asserts this before its unchecked
/// reads, so a `DotFn` is safe to call with any slices.
#[inline(always)]
fn assert_operands(w: GgmlType, n: usize, w_len: usize, a_len: usize) {
    assert!(
        w.row_bytes(n) == Some(w_len) && act_bytes(w, n) == Some(a_len),
        "dot {}: n = {n}, row {w_len} bytes, activation {a_len} bytes",
        w.name()
    );
}

/// Check the operands of a dot and return the kernel; panics on a misuse (unsupported
/// type, `n` not whole blocks, wrong slice lengths): callers check `supports` and size
/// their buffers when the model loads.
#[inline]
fn checked(isa: Isa, w: GgmlType, n: usize, w_len: usize, a_len: usize) -> DotFn {
    let k = kernel_for(isa, w)
        .unwrap_or_else(|| panic!("no {} dot kernel for {}", isa.name(), w.name()));
    assert_operands(w, n, w_len, a_len);
    k
}

/// `Σ_i w[i]·a[i]` over `n` elements; `w_row` holds the weight row in its own type and
/// `act` the activation quantized with `quantize_act(w.vec_dot_type(), ..)` (whose values
/// are all in [-127, 127]). Panics on a misuse (see `checked`).
#[inline]
pub fn vec_dot(w: GgmlType, n: usize, w_row: &[u8], act: &[u8]) -> f32 {
    checked(active_isa(), w, n, w_row.len(), act.len())(n, w_row, act)
}

/// `vec_dot` with a given ISA; an error when the CPU cannot run it or the type has no
/// kernel.
pub fn vec_dot_isa(isa: Isa, w: GgmlType, n: usize, w_row: &[u8], act: &[u8]) -> Result<f32> {
    if !isa.available() {
        return Err(Error::Quant(format!("this CPU cannot run {}", isa.name())));
    }
    if !supports(w) {
        return Err(Error::Quant(format!("no dot kernel for {}", w.name())));
    }
    if w.row_bytes(n) != Some(w_row.len()) || act_bytes(w, n) != Some(act.len()) {
        return Err(Error::Quant(format!(
            "dot {}: n = {n} with a {}-byte row and a {}-byte activation",
            w.name(),
            w_row.len(),
            act.len()
        )));
    }
    Ok(checked(isa, w, n, w_row.len(), act.len())(n, w_row, act))
}

/// Which of ggml's float orders a dot follows: `Single` is `vec_dot`'s; `Many` is ggml's
/// multi-row order where it differs (`kernel_many`: llamafile's tinyBLAS for F32, the tiled
/// matmul for Q6_K / IQ3_S, the repacked gemm for Q4_K); other types have one order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Single,
    Many,
}

/// How many leading activation rows of a dense matmul with `t` rows ggml computes in its
/// multi-row order (the rest in `vec_dot`'s). ggml (AVX2 build, llamafile on) runs
/// `ggml_vec_dot_*` for one row; for several rows of F32 weights tinyBLAS, for ≥ 8 rows of
/// Q6_K / IQ3_S its tiled matmul; Q4_K weights (llama.cpp repacks them to `q4_K_8x8` when the
/// row count is a multiple of 8) take the repacked gemm for the first ⌊t/4⌋·4 rows and the
/// gemv (`vec_dot`) for the rest. Q8_0's tinyBLAS order is its vec_dot order.
pub fn many_rows(w: GgmlType, t: usize) -> usize {
    match w {
        GgmlType::F32 if t > 1 => t,
        GgmlType::Q6K | GgmlType::IQ3S if t >= 8 => t,
        GgmlType::Q4K => t - t % 4,
        _ => 0,
    }
}

/// The order of activation row `tok` of a dense matmul with `t` rows.
#[inline]
pub fn order_t(w: GgmlType, t: usize, tok: usize) -> Order {
    if tok < many_rows(w, t) {
        Order::Many
    } else {
        Order::Single
    }
}

/// The order of ggml's CPU `mul_mat_id` (routed experts) for an expert that `rows`
/// activation rows (token-slots) are routed to: its tiled order for ≥ 8 rows of Q6_K /
/// IQ3_S, else `vec_dot` (llamafile is not used for `mul_mat_id`, so F32 stays `vec_dot`;
/// repacked Q4_K experts run the gemv, i.e. `vec_dot`, row by row).
#[inline]
pub fn order_id(w: GgmlType, rows: usize) -> Order {
    match w {
        GgmlType::F32 | GgmlType::Q4K => Order::Single,
        _ => order_t(w, rows, 0),
    }
}

/// `vec_dot` in a given order (`Many` falls back to `vec_dot` for types with one order).
#[inline]
pub fn vec_dot_order(w: GgmlType, n: usize, w_row: &[u8], act: &[u8], order: Order) -> f32 {
    if order == Order::Many {
        if let Some(k) = kernel_many(active_isa(), w) {
            assert_operands(w, n, w_row.len(), act.len());
            return k(n, w_row, act);
        }
    }
    vec_dot(w, n, w_row, act)
}

/// The dot ggml's CPU matmul computes for activation row `tok` of `t` (`order_t`).
/// `vec_dot_t(.., 1, 0)` is `vec_dot`.
#[inline]
pub fn vec_dot_t(w: GgmlType, n: usize, w_row: &[u8], act: &[u8], t: usize, tok: usize) -> f32 {
    vec_dot_order(w, n, w_row, act, order_t(w, t, tok))
}

/// The dot ggml's CPU `mul_mat_id` computes for one output of an expert that `rows`
/// activation rows are routed to (`order_id`).
#[inline]
pub fn vec_dot_id(w: GgmlType, n: usize, w_row: &[u8], act: &[u8], rows: usize) -> f32 {
    vec_dot_order(w, n, w_row, act, order_id(w, rows))
}

/// The multi-row kernel of `isa` for `w` where its order differs from `kernel_for`'s
/// (AVX-512 runs the AVX2 one).
pub fn kernel_many(isa: Isa, w: GgmlType) -> Option<DotFn> {
    let simd = match isa {
        Isa::Avx2 | Isa::Avx512 if Isa::Avx2.available() => avx2::kernel_many(w),
        _ => None,
    };
    simd.or(match w {
        GgmlType::F32 => Some(scalar::f32_dot_many as DotFn),
        GgmlType::Q6K => Some(scalar_k::q6_k_tiled as DotFn),
        GgmlType::IQ3S => Some(scalar_k::iq3_s_tiled as DotFn),
        GgmlType::Q4K => Some(scalar_k::q4_k_gemm as DotFn),
        _ => None,
    })
}

/// The grouped one-token kernel of `isa` for `w` where it has one (several rows per call
/// against one activation, bitwise `kernel_for(isa, w)` per row): AVX2 Q4_K and Q6_K, under
/// AVX-512 too, and AVX-512 IQ3_S. Every kernel of every ISA is bitwise the scalar one, so the AVX2 grouped
/// kernel stands in for the AVX-512 per-row one: its interleaved rows and prefetch read RAM
/// faster than one zmm row at a time (Q4_K decode 49.0 against 37.5 tok/s, `BENCHMARKS.md`).
pub fn rows_kernel_for(isa: Isa, w: GgmlType) -> Option<RowsFn> {
    match isa {
        Isa::Avx512 if isa.available() => avx512::rows_kernel(w).or_else(|| avx2::rows_kernel(w)),
        Isa::Avx2 if isa.available() => avx2::rows_kernel(w),
        _ => None,
    }
}

/// The slice contract of a grouped one-token kernel (`RowsFn`): `n` whole blocks of `w`,
/// `rows` holding `nr` rows, `act` one activation of `n` elements; panics otherwise.
pub(crate) fn assert_rows_args(w: GgmlType, n: usize, rows: &[u8], act: &[u8], nr: usize) {
    let rb = w.row_bytes(n).unwrap_or(0);
    assert!(
        rb > 0 && rows.len() == rb * nr && act_bytes(w, n) == Some(act.len()),
        "rows dot {}: n = {n}, {} row bytes for {nr} rows, activation {} bytes",
        w.name(),
        rows.len(),
        act.len()
    );
}

/// Dots of consecutive rows (`rows` = `out.len()` rows of `n` elements, back to back) with
/// one activation: `out[r] = vec_dot(w, n, row r, act)` bitwise (the one-token decode
/// matvec; grouped kernels where the type has them). The kernel is looked up once.
pub fn vec_dot_rows(w: GgmlType, n: usize, rows: &[u8], act: &[u8], out: &mut [f32]) {
    let rb = w.row_bytes(n).expect("n is whole blocks");
    assert_eq!(rows.len(), rb * out.len(), "rows hold out.len() rows");
    let isa = active_isa();
    let k = checked(isa, w, n, rb, act.len());
    if let Some(g) = rows_kernel_for(isa, w) {
        return g(n, rows, act, out);
    }
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb)) {
        *o = k(n, row, act);
    }
}
