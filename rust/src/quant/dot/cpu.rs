//! x86-64 CPU feature detection for the kernel tables (cached by std).

/// AVX2 with FMA and F16C (every AVX2 CPU the kernels target has all three).
pub fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// AVX-512 F, BW and VL (Skylake-SP, Ice Lake, Sapphire Rapids, Zen 4 and later).
pub fn has_avx512() -> bool {
    has_avx2()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
}

/// AVX-512 VNNI (`vpdpbusd`).
pub fn has_vnni() -> bool {
    has_avx512() && is_x86_feature_detected!("avx512vnni")
}

/// AVX-512 VBMI (`vpermi2b`: the IQ3_S grid permuted out of registers).
pub fn has_vbmi() -> bool {
    has_avx512() && is_x86_feature_detected!("avx512vbmi")
}

/// AVX-512 VBMI and BITALG (`vpshufbitqmb`: the IQ3_S rows kernel's bit reorders; Ice Lake,
/// Sapphire Rapids, Zen 4 and later).
pub fn has_vbmi_bitalg() -> bool {
    has_vbmi() && is_x86_feature_detected!("avx512bitalg")
}

/// The SIMD features relevant to the kernels that this CPU has.
pub fn cpu_features() -> Vec<&'static str> {
    let mut v = Vec::new();
    macro_rules! probe {
        ($($f:tt),*) => {$(
            if is_x86_feature_detected!($f) {
                v.push($f);
            }
        )*};
    }
    probe!(
        "sse4.2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "bmi2",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512vnni",
        "avx512vbmi",
        "avx512bitalg",
        "avx512bf16",
        "avxvnni"
    );
    // (tiles usable: CPU, OS state and the process's permission, as the kernels need)
    if super::gemm::amx_available() {
        v.push("amx-int8");
    }
    v
}
