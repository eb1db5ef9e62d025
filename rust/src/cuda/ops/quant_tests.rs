//! Unit tests of the launchers' pure checks and scratch sizes (no GPU needed).

use super::*;
use crate::cuda::ops::quant_kernels::TYPES;
use GgmlType::*;

#[test]
fn supported_types() {
    for ty in TYPES {
        assert!(supports(ty), "{ty:?}");
    }
    for ty in [
        Q4_1, Q5_1, Q8_1, Q8K, IQ2XXS, IQ2S, IQ1S, IQ1M, TQ1_0, NVFP4, I32,
    ] {
        assert!(!supports(ty), "{ty:?}");
    }
    // MXFP4's 17-byte blocks: any address
    assert_eq!(weight_align(MXFP4), Some(1));
    assert!(check_matmul(MXFP4, 257, 8, 64, 256, 256, 1, 256).is_ok());
}

#[test]
fn matmul_checks() {
    let ok = |ty, k| check_matmul(ty, 256, 8, k, 256, 256, 3, 256);
    assert!(ok(Q4K, 512).is_ok());
    assert!(ok(Q8_0, 96).is_ok());
    assert!(ok(F16, 64).is_ok());
    assert!(matches!(ok(Q4K, 96), Err(Error::Shape(_))));
    assert!(matches!(ok(F32, 48), Err(Error::Shape(_))));
    assert!(matches!(ok(Q4K, 0), Err(Error::Shape(_))));
    assert!(matches!(ok(Q4_1, 64), Err(Error::Quant(_))));
    assert!(matches!(
        check_matmul(Q4K, 258, 8, 256, 256, 256, 1, 256),
        Err(Error::Config(_))
    ));
    assert!(check_matmul(Q6K, 258, 8, 256, 256, 256, 1, 256).is_ok());
    assert!(matches!(
        check_matmul(Q6K, 256, 0, 256, 256, 256, 1, 256),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        check_matmul(Q6K, 256, 8, 256, 256, 256, 1, 0),
        Err(Error::Config(_))
    ));
    // Float weights read x directly and need no scratch for decode; prefill scales x.
    assert!(check_matmul(F32, 256, 8, 64, 256, 256, 1, 0).is_ok());
    assert!(matches!(
        check_matmul(F32, 256, 8, 64, 256, 256, 9, 0),
        Err(Error::Config(_))
    ));
}

#[test]
fn moe_checks() {
    let p = [(256u64, 16u64, "p"); 5];
    assert!(check_moe(&[Q4K, Q4K], 768, 2048, 8, 3, &p, 256).is_ok());
    assert!(matches!(
        check_moe(&[Q4K, Q4K], 768, 2000, 8, 3, &p, 256),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        check_moe(&[Q4K, Q4K], 768, 2048, 0, 3, &p, 256),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        check_moe(&[Q4K, IQ1S], 768, 2048, 8, 3, &p, 256),
        Err(Error::Quant(_))
    ));
    let mut bad = p;
    bad[3].0 = 0;
    assert!(matches!(
        check_moe(&[Q6K], 768, 2048, 8, 3, &bad, 256),
        Err(Error::Config(_))
    ));
}

#[test]
fn scratch_sizes() {
    assert_eq!(scratch_bytes(2048, 1), 64 * 36); // 2304, a multiple of 256
    assert!(scratch_bytes(2048, 3) >= 3 * 64 * 36);
    assert!(moe_scratch_bytes(2048, 768, 8, 5) >= 5 * 8 * 24 * 36);
    assert!(moe_scratch_bytes(2048, 768, 8, 5) >= 5 * 64 * 36);
    // Prefill: grouping tables, int8 activations and the per-slot down outputs.
    assert!(moe_scratch_bytes(2048, 768, 8, 512) >= moe_prefill_scratch_bytes(2048, 768, 8, 512));
    assert!(moe_scratch_bytes(2048, 768, 8, 512) >= 512 * 8 * (4 * 2048 + 768 / 32 * 36));
}
