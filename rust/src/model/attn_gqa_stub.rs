//! Stand-in for `attn_gqa_avx2.rs` on other architectures: no kernels (`attn_gqa` runs the
//! per-head path).
#![allow(dead_code)]

pub fn available() -> bool {
    false
}

/// # Safety
/// Never called: `available()` is false.
#[allow(clippy::too_many_arguments)]
pub unsafe fn group_scores<const M: usize>(
    _: &[u8],
    _: usize,
    _: usize,
    _: &[f32],
    _: usize,
    _: f32,
    _: &mut [f32],
    _: usize,
) {
    unreachable!("no attention kernels on this architecture")
}

pub fn available_x2() -> bool {
    false
}

/// # Safety
/// Never called: `available_x2()` is false.
#[allow(clippy::too_many_arguments)]
pub unsafe fn group_scores_x2_pair<const M: usize>(
    _: &[u8],
    _: usize,
    _: usize,
    _: &[f32],
    _: &[f32],
    _: usize,
    _: f32,
    _: &mut [f32],
    _: &mut [f32],
    _: usize,
) {
    unreachable!("no attention kernels on this architecture")
}

// Never called either: `available_x2()` is false.
pub use group_pv as group_pv_x2;
pub use group_scores as group_scores_x2;

/// # Safety
/// Never called: `available()` is false.
pub unsafe fn softmax_f16p(_: &mut [f32], _: Option<f32>) {
    unreachable!("no attention kernels on this architecture")
}

/// # Safety
/// Never called: `available()` is false.
#[cfg(test)]
pub unsafe fn expf_lanes(_: &[f32; 8]) -> [f32; 8] {
    unreachable!("no attention kernels on this architecture")
}

/// # Safety
/// Never called: `available()` is false.
#[allow(clippy::too_many_arguments)]
pub unsafe fn group_pv<const M: usize>(
    _: &[f32],
    _: usize,
    _: &[usize],
    _: &[u8],
    _: usize,
    _: usize,
    _: &mut [f32],
    _: &mut [f32],
    _: &mut [f32],
) {
    unreachable!("no attention kernels on this architecture")
}

pub fn pack_len(_: usize) -> usize {
    0
}
