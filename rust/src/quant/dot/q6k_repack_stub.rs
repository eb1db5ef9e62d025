//! Stand-in for the AVX2 repacked Q6_K kernels on other architectures (never called:
//! `cpu::has_avx2()` is false there).

pub(super) unsafe fn dot_single(_n: usize, _w: &[u8], _a: &[u8]) -> f32 {
    unreachable!("no AVX2 on this architecture")
}

pub(super) unsafe fn dot_tiled(_n: usize, _w: &[u8], _a: &[u8]) -> f32 {
    unreachable!("no AVX2 on this architecture")
}

pub(super) unsafe fn rows_single_n<const N: usize, F: FnMut(usize, [f32; N])>(
    _n: usize,
    _w: &[u8],
    _rows: std::ops::Range<usize>,
    _a: [&[u8]; N],
    _put: F,
) {
    unreachable!("no AVX2 on this architecture")
}
