// Host check of the smoke kernel's math (cuda/smoke.cuh), run by tests/test_cuda_host.py:
// nvcc compiles this file into a host executable; no GPU is needed. It prints one line per
// failure and exits non-zero if any. Pattern for the per-block decode math of other kernels:
// include the kernel's .cuh, call its __host__ __device__ functions on known inputs, and
// compare with values computed independently here (or read from a file the test writes).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "smoke.cuh"

static int failures = 0;

static void expect_eq(float got, float want, const char* what) {
    uint32_t g, w;
    std::memcpy(&g, &got, 4);
    std::memcpy(&w, &want, 4);
    if (g != w) {
        std::printf("FAIL %s: got %.9g (0x%08x), want %.9g (0x%08x)\n", what, got, g, want, w);
        ++failures;
    }
}

int main() {
    expect_eq(strata_axpb(2.0f, 3.0f, 1.0f), 7.0f, "2*3+1");
    expect_eq(strata_axpb(-0.5f, 8.0f, 0.25f), -3.75f, "-0.5*8+0.25");
    // Two roundings, not one: (1+2^-12)^2 = 1 + 2^-11 + 2^-24; the product rounds to 1 + 2^-11
    // (ties-to-even drops 2^-24), and then 1 + 2^-11 - (1 + 2^-11) = 0. A fused multiply-add
    // would keep the 2^-24.
    const float e = 1.0f + std::ldexp(1.0f, -12);
    expect_eq(strata_axpb(e, e, -(1.0f + std::ldexp(1.0f, -11))), 0.0f, "no fma");
    // A sweep against double arithmetic rounded after each step (exact for these ranges).
    uint32_t state = 12345u;
    for (int i = 0; i < 100000; ++i) {
        state = state * 1664525u + 1013904223u;
        const float a = (float)((int)(state >> 8) - (1 << 23)) / (1 << 20);
        state = state * 1664525u + 1013904223u;
        const float x = (float)((int)(state >> 8) - (1 << 23)) / (1 << 21);
        state = state * 1664525u + 1013904223u;
        const float b = (float)((int)(state >> 8) - (1 << 23)) / (1 << 22);
        const float p = (float)((double)a * (double)x);
        const float want = (float)((double)p + (double)b);
        expect_eq(strata_axpb(a, x, b), want, "sweep");
        if (failures > 10) break;
    }
    if (failures == 0) std::printf("smoke_host: all passed\n");
    return failures == 0 ? 0 : 1;
}
