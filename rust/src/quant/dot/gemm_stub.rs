//! Stand-in for `gemm_avx2.rs` and `gemm_avx512.rs` on other architectures: no multi-token kernels (the tiles
//! loop over the single-token ones).

use super::super::Order;

pub type MultiFn = unsafe fn(usize, &[u8], &[&[u8]], &mut [f32]);

pub fn kernel(_w: crate::quant::GgmlType, _order: Order) -> Option<MultiFn> {
    None
}

pub fn kernel_with(_w: crate::quant::GgmlType, _order: Order, _vnni: bool) -> Option<MultiFn> {
    None
}

pub type RowsFn = unsafe fn(usize, &[u8], usize, &[&[u8]], &mut [f32]);

pub fn rows_kernel(_w: crate::quant::GgmlType, _order: Order) -> Option<RowsFn> {
    None
}

pub fn rows_kernel_t(_w: crate::quant::GgmlType, _order: Order) -> Option<(RowsFn, usize)> {
    None
}

pub fn rows_kernel_with(_w: crate::quant::GgmlType, _order: Order, _vnni: bool) -> Option<RowsFn> {
    None
}
