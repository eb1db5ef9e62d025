// The pipeline's smoke kernel: proves that nvcc built a fatbin, the driver loaded it and a
// launch with by-value arguments works. Launcher: rust/src/cuda/ops/smoke.rs.
#include "common.cuh"
#include "smoke.cuh"

// y[i] = a * x[i] + b for i < n. x, y: f32 [n]. One thread per element, any grid.
extern "C" __global__ void strata_smoke_axpb(const float* __restrict__ x, float* __restrict__ y,
                                             float a, float b, uint32_t n) {
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        y[i] = strata_axpb(a, x[i], b);
    }
}
