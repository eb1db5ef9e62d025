//! Properties of the generated lookup tables (docs/FORMATS.md §2, "Lookup tables").

use super::tables::*;

fn bytes_of(v: u64, n: usize) -> Vec<u8> {
    v.to_le_bytes()[..n].to_vec()
}

fn all_bytes_in(grid: &[u64], width: usize, allowed: &[u8]) {
    for (i, &e) in grid.iter().enumerate() {
        for b in bytes_of(e, width) {
            assert!(
                allowed.contains(&b),
                "entry {i}: byte {b:#x} not in {allowed:?}"
            );
        }
    }
}

fn distinct(grid: &[u64]) {
    let mut v = grid.to_vec();
    v.sort_unstable();
    v.dedup();
    assert_eq!(v.len(), grid.len(), "grid entries must be distinct");
}

#[test]
fn ksigns_parity() {
    for (i, &s) in KSIGNS_IQ2XS.iter().enumerate() {
        assert_eq!(s & 127, i as u8);
        assert_eq!(s.count_ones() % 2, 0, "ksigns[{i}] = {s:#x} has odd parity");
    }
}

#[test]
fn iq2_grids_use_three_magnitudes() {
    for g in [&IQ2XXS_GRID[..], &IQ2XS_GRID[..], &IQ2S_GRID[..]] {
        all_bytes_in(g, 8, &[8, 25, 43]);
        distinct(g);
    }
    // ggml's first entries (all 8s, then the last byte raised to 43).
    assert_eq!(IQ2XXS_GRID[0], 0x0808_0808_0808_0808);
    assert_eq!(IQ2XXS_GRID[1], 0x0808_0808_0808_082b);
}

#[test]
fn iq3_grids() {
    let wide = |g: &[u32]| g.iter().map(|&x| x as u64).collect::<Vec<_>>();
    let x = wide(&IQ3XXS_GRID);
    all_bytes_in(&x, 4, &[4, 12, 20, 28, 36, 44, 52, 62]);
    distinct(&x);
    let s = wide(&IQ3S_GRID);
    all_bytes_in(&s, 4, &[1, 3, 5, 7, 9, 11, 13, 15]);
    distinct(&s);
    // IQ3_S has 8 values per coordinate and 512 = 8^4/8 entries; all 4-tuples are distinct.
    assert_eq!(IQ3S_GRID.len(), 512);
}

#[test]
fn iq1s_grid_is_ternary() {
    all_bytes_in(&IQ1S_GRID, 8, &[0xff, 0x00, 0x01]);
    distinct(&IQ1S_GRID);
}

#[test]
fn kvalues() {
    assert_eq!(KVALUES_IQ4NL[0], -127);
    assert_eq!(KVALUES_IQ4NL[15], 113);
    assert!(KVALUES_IQ4NL.windows(2).all(|w| w[0] < w[1]));
    // Doubled E2M1: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; sign in bit 3.
    for i in 0..8 {
        assert_eq!(KVALUES_MXFP4[i + 8], -KVALUES_MXFP4[i]);
    }
    assert_eq!(KVALUES_MXFP4[..8], [0, 1, 2, 3, 4, 6, 8, 12]);
    assert_eq!(IQ1S_DELTA, 0.125);
}
