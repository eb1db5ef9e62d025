// The smoke kernel's math as a __host__ __device__ function, so that the host check
// (cuda/tests/smoke_host.cu, no GPU needed) runs the very code the kernel runs.
#ifndef STRATA_SMOKE_CUH
#define STRATA_SMOKE_CUH

// a * x + b in f32, rounded after the product and after the sum (no fused multiply-add), so
// that it equals numpy's float32 a * x + b exactly.
__host__ __device__ inline float strata_axpb(float a, float x, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(__fmul_rn(a, x), b);
#else
    volatile float p = a * x;
    return p + b;
#endif
}

#endif  // STRATA_SMOKE_CUH
