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
// strata_mmvq_<ty>_st(w, rows, items, x, y, n_tok)   1 token, warp per row as strata_mmvq_<ty>,
//   the block first copying x's int8 blocks and each warp its weight row to shared memory with
//   coalesced 16-byte loads (rows of a multiple of 16 bytes, at most MMVQ_STAGE_ROW; else as
//   strata_mmvq_<ty>): the lanes' item reads (36-byte activation blocks, scattered words of
//   the blocks) then hit shared memory instead of costing several L1 wavefronts each; for the
//   largest matrices (the output head).
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

// The most int8 activation blocks `_st` stages (K ≤ 4096), and the longest weight row it
// stages per warp (Q4_K K ≤ 4096, Q6_K K ≤ 2816, Q8_0 K ≤ 2048).
#define MMVQ_STAGE_ITEMS 128
#define MMVQ_STAGE_ROW 2304

template <class T>
__device__ __forceinline__ void mmvq_st_body(const uint8_t* __restrict__ w, int rows, int items,
                                             const void* x, float* __restrict__ y, int n_tok) {
    __shared__ block_q8a s_x[MMVQ_STAGE_ITEMS];
    __shared__ __align__(16) uint8_t s_w[MMVQ_WARPS][MMVQ_STAGE_ROW];
    const size_t rb = row_bytes_of<T>(items);
    // uniform over the grid: other shapes run as strata_mmvq_<ty>
    if (T::IS_FLOAT || items > MMVQ_STAGE_ITEMS || rb > MMVQ_STAGE_ROW || rb % 16 != 0 ||
        (uintptr_t)w % 16 != 0) {
        mmvq_body<T, 1>(w, rows, items, x, y, n_tok);
        return;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * MMVQ_WARPS + warp;
    {
        // the warp's row (rows past the end copy the last one), 16 bytes a lane per load, and
        // token 0's items·36 activation bytes as words: all loads issued before the stores
        const int n16 = (int)(rb / 16), nx = items * 9;
        StageCopy<uint4, (MMVQ_STAGE_ROW / 16 + 31) / 32> cw;
        StageCopy<uint32_t, (MMVQ_STAGE_ITEMS * 9 + MMVQ_WARPS * 32 - 1) / (MMVQ_WARPS * 32)> cx;
        cw.load((const uint4*)(w + (size_t)min(row, rows - 1) * rb), n16, lane, 32);
        cx.load((const uint32_t*)x, nx, threadIdx.x, MMVQ_WARPS * 32);
        cw.store((uint4*)s_w[warp], n16, lane, 32);
        cx.store((uint32_t*)s_x, nx, threadIdx.x, MMVQ_WARPS * 32);
    }
    __syncthreads();
    if (row >= rows) return;
    float acc[1] = {0.0f};
    row_dot<T, 1>(s_w[warp], items, s_x, 0, 1, acc, lane);
    const float v = warp_sum(acc[0]);
    if (lane == 0) y[row] = v;
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
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32)                               \
        strata_mmvq_##name##_st(const uint8_t* w, int rows, int items, const void* x, float* y, \
                                int n_tok) {                                                    \
        mmvq_st_body<T>(w, rows, items, x, y, n_tok);                                           \
    }

STRATA_FOR_TYPES(MMVQ_KERNELS)
