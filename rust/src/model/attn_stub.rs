//! Stand-in for `attn_avx2.rs` on other architectures: no kernels (attention widens rows).
#![allow(dead_code)]

pub fn available() -> bool {
    false
}

/// # Safety
/// Never called: `available()` is false.
pub unsafe fn scores(_: &[u8], _: usize, _: usize, _: &[f32], _: bool, _: f32, _: &mut [f32]) {
    unreachable!("no attention kernels on this architecture")
}

/// # Safety
/// Never called: `available()` is false.
pub unsafe fn pv_lanes(
    _: &mut [f32],
    _: &[u8],
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    _: &mut [f32],
) {
    unreachable!("no attention kernels on this architecture")
}

pub fn available_x2() -> bool {
    false
}

/// # Safety
/// Never called: `available_x2()` is false.
pub unsafe fn scores_row_x2(_: &[u8], _: usize, _: usize, _: &[f32], _: f32, _: &mut [f32]) {
    unreachable!("no attention kernels on this architecture")
}

/// # Safety
/// Never called: `available_x2()` is false.
pub unsafe fn pv_row_x2(_: &mut [f32], _: &[u8], _: usize, _: usize, _: &mut [f32]) {
    unreachable!("no attention kernels on this architecture")
}
