// Prefill matrix multiplication (n_tok > 8): y[t, r] = Σ_k W[r, k]·x[t, k] with 64 × 64 tiles on
// the tensor cores (mmq.cuh): the weight tile is decoded once per block and reused by 64 tokens.
//
// strata_row_scale(x, n_rows, k, scale)   grid ⌈n_rows/8⌉, block 256 (a warp per row):
//   scale[r] = the power of two that brings max|x[r, :]| into [2^14, 2^15) (mmq.cuh).
// strata_mmq_<ty>(w, rows, items, x, scale, y, n_tok)   grid (⌈rows/64⌉, ⌈n_tok/64⌉), block 128;
//   w [rows, 32·items] GGUF rows; y f32 [n_tok, rows]. x, by weight type (mmq.cuh):
//   quantized: block_q8a [n_tok, items] from strata_quantize_q8_0 / _q8_k for the type (the
//   CPU's activations), scale unused (may be null);
//   float: f32 [n_tok, 32·items] (16-byte aligned), scale f32 [n_tok] from strata_row_scale.
#include "mmq.cuh"

extern "C" __global__ void __launch_bounds__(256)
    strata_row_scale(const float* __restrict__ x, int n_rows, int k, float* __restrict__ scale) {
    const long r = (long)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= n_rows) return;
    float m = 0.0f;
    for (int i = lane; i < k; i += 32) m = fmaxf(m, fabsf(x[r * k + i]));
    m = warp_max(m);
    if (lane == 0) scale[r] = pow2_scale(m);
}

template <class T>
__device__ __forceinline__ void mmq_dense(const uint8_t* __restrict__ w, int rows, int items,
                                          const void* __restrict__ x, const float* __restrict__ xs,
                                          float* __restrict__ y, int n_tok) {
    constexpr int BN = 64;
    const int row0 = blockIdx.x * MMQ_BM;
    const int col0 = blockIdx.y * BN;
    const int n_valid = min(BN, n_tok - col0);
    float acc[MmqShape<BN>::MT][MmqShape<BN>::NT][4];
    mmq_tile<T, BN>(w, rows, items, row0, x, xs, n_valid,
                    [=](int n) { return col0 + n; }, acc);
    mmq_epilogue<BN>(acc, [&](int r, int n, float v) {
        if (row0 + r < rows && n < n_valid) {
            if constexpr (T::IS_FLOAT) v /= xs[col0 + n];
            y[(long)(col0 + n) * rows + row0 + r] = v;
        }
    });
}

#define MMQ_KERNEL(name, T)                                                                      \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS)                                   \
        strata_mmq_##name(const uint8_t* w, int rows, int items, const void* x,                \
                          const float* xs, float* y, int n_tok) {                               \
        mmq_dense<T>(w, rows, items, x, xs, y, n_tok);                                          \
    }

STRATA_FOR_TYPES(MMQ_KERNEL)
