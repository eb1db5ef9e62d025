//! Stand-in for the x86 SIMD modules on other architectures: no kernels, no features.
#![allow(dead_code)]

use super::{DotFn, RowsFn};
use crate::quant::GgmlType;

pub fn kernel(_w: GgmlType) -> Option<DotFn> {
    None
}

pub fn kernel_with(_w: GgmlType, _vnni: bool) -> Option<DotFn> {
    None
}

pub fn has_avx2() -> bool {
    false
}

pub fn has_avx512() -> bool {
    false
}

pub fn has_vnni() -> bool {
    false
}

pub fn cpu_features() -> Vec<&'static str> {
    Vec::new()
}

pub fn kernel_many(_w: GgmlType) -> Option<DotFn> {
    None
}

pub fn rows_kernel(_w: GgmlType) -> Option<RowsFn> {
    None
}
