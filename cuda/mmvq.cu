// Decode matrix-vector products: y[t, r] = Σ_k W[r, k]·x[t, k] for up to 8 tokens per block
// (grid.z walks further groups of 8, the fallback for prefill shapes without mmq).
// One warp per weight row; each lane decodes 32-element items into registers and dots them
// with the int8 activations (dp4a) or, for float weights, with the f32 activations.
//
// strata_mmvq_<ty>(w, rows, items, x, y, n_tok)      1 token  (grid (⌈rows/4⌉, 1, 1))
// strata_mmvq_<ty>_n8(w, rows, items, x, y, n_tok)   ≤ 8 tokens per grid.z (grid (⌈rows/4⌉, 1, ⌈n/8⌉))
// strata_mmvq_<ty>_r1(w, rows, items, x, y, n_tok)   1 token, one row per block, its items split
//   over the 4 warps (grid (rows, 1, 1)): for matrices of few rows (K/V projections, router),
//   which the warp-per-row kernel would spread over too few blocks to fill the GPU.
//   w: [rows, 32·items] in the type's GGUF layout; x: int8 blocks (block_q8a) [n_tok, items] or f32 [n_tok, 32·items];
//   y: f32 [n_tok, rows]. Block: 128 threads.
#include "vecdot.cuh"

template <class T, int NT>
__device__ __forceinline__ void mmvq_body(const uint8_t* __restrict__ w, int rows, int items,
                                          const void* x, float* __restrict__ y, int n_tok) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * MMVQ_WARPS + warp;
    if (row >= rows) return;
    const int t0 = blockIdx.z * NT;
    const int nt = min(NT, n_tok - t0);
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
    row_dot<T, NT>(w + (size_t)row * row_bytes_of<T>(items), items, act_at<T>(x, t0, items),
                   act_stride<T>(items), nt, acc, lane);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const float v = warp_sum(acc[t]);
        if (lane == 0 && t < nt) y[(size_t)(t0 + t) * rows + row] = v;
    }
}

template <class T>
__device__ __forceinline__ void mmvq_r1_body(const uint8_t* __restrict__ w, int rows, int items,
                                             const void* x, float* __restrict__ y) {
    __shared__ float part[MMVQ_WARPS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x;
    if (row >= rows) return;  // the whole block
    float acc[1] = {0.0f};
    row_dot<T, 1>(w + (size_t)row * row_bytes_of<T>(items), items, act_at<T>(x, 0, items),
                  act_stride<T>(items), 1, acc, threadIdx.x, MMVQ_WARPS * 32);
    const float v = warp_sum(acc[0]);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = part[0];
#pragma unroll
        for (int i = 1; i < MMVQ_WARPS; ++i) s += part[i];
        y[row] = s;
    }
}

#define MMVQ_KERNELS(name, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32)                               \
        strata_mmvq_##name(const uint8_t* w, int rows, int items, const void* x, float* y,     \
                           int n_tok) {                                                         \
        mmvq_body<T, 1>(w, rows, items, x, y, n_tok);                                           \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32)                               \
        strata_mmvq_##name##_n8(const uint8_t* w, int rows, int items, const void* x, float* y, \
                                int n_tok) {                                                    \
        mmvq_body<T, 8>(w, rows, items, x, y, n_tok);                                           \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32)                               \
        strata_mmvq_##name##_r1(const uint8_t* w, int rows, int items, const void* x, float* y, \
                                int n_tok) {                                                    \
        mmvq_r1_body<T>(w, rows, items, x, y);                                                  \
    }

STRATA_FOR_TYPES(MMVQ_KERNELS)
