// Embedding lookup: out[i, :] = dequantized row ids[i] of W [rows, 32·items], bit-exact with the
// CPU dequantization. An id outside 0..rows gives a row of zeros (never an out-of-bounds read).
//
// strata_getrows_<ty>(w, rows, items, ids, out, n)   grid (⌈items/128⌉, n), block 128;
//   one thread per 32-element item; out f32 [n, 32·items], 16-byte aligned.
#include "qdecode.cuh"

template <class T>
__device__ __forceinline__ void getrows_body(const uint8_t* __restrict__ w, int rows, int items,
                                             const int* ids, float* __restrict__ out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= items) return;
    const long r = blockIdx.y;
    const int id = ids[r];
    float v[32];
    if (id >= 0 && id < rows) {
        item_values<T>(w + (size_t)id * row_bytes_of<T>(items), i, v);
    } else {
#pragma unroll
        for (int k = 0; k < 32; ++k) v[k] = 0.0f;
    }
    float4* o = (float4*)(out + (r * items + i) * 32);
#pragma unroll
    for (int q = 0; q < 8; ++q) o[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
}

#define GETROWS_KERNEL(name, T)                                                                  \
    extern "C" __global__ void __launch_bounds__(128) strata_getrows_##name(                    \
        const uint8_t* w, int rows, int items, const int* ids, float* out) {                    \
        getrows_body<T>(w, rows, items, ids, out);                                               \
    }

STRATA_FOR_TYPES(GETROWS_KERNEL)
