// Device building blocks of the matrix-vector kernels (mmvq.cu, moe.cu): one warp computes the
// dot of one weight row with up to NT activation rows.
#pragma once
#include "qdecode.cuh"

// Warps per thread block of the matrix-vector kernels (one weight row per warp).
#define MMVQ_WARPS 4

// acc[t] += Σ_k row[k]·x_t[k] over this lane's items (lane, lane + step, ...; step 32 when a
// warp has the row, more when several warps share it), for t < nt ≤ NT.
// Quantized rows: x is int8 activation blocks (block_q8a), token t at xq + t·x_stride (x_stride = items);
// float rows: x is f32, token t at xf + t·x_stride (x_stride = 32·items), 16-byte aligned.
template <class T, int NT>
__device__ __forceinline__ void row_dot(const uint8_t* __restrict__ row, int items, const void* x,
                                        long x_stride, int nt, float (&acc)[NT], int lane,
                                        int step = 32) {
#pragma unroll 2
    for (int i = lane; i < items; i += step) {
        if constexpr (T::IS_FLOAT) {
            float v[32];
            T::fitem(row + (size_t)i * T::BYTES, v);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (t < nt) {
                    const float4* xp = (const float4*)((const float*)x + t * x_stride + 32l * i);
                    float s = 0.0f;
#pragma unroll
                    for (int q = 0; q < 8; ++q) {
                        const float4 a = xp[q];
                        s += v[4 * q] * a.x + v[4 * q + 1] * a.y + v[4 * q + 2] * a.z + v[4 * q + 3] * a.w;
                    }
                    acc[t] += s;
                }
            }
        } else {
            QItem it;
            T::item(row + (size_t)(i / T::ITEMS) * T::BYTES, i % T::ITEMS, it);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (t < nt) {
                    uint32_t qa[8];
                    const float da = load_q8a((const block_q8a*)x + t * x_stride + i, qa);
                    acc[t] += item_dot<T>(it, qa, da);
                }
            }
        }
    }
}

// Σ over item i of a row times the matching 32 activations of one token (xt: that token's
// activation blocks, or its f32 values for float rows).
template <class T>
__device__ __forceinline__ float one_item_dot(const uint8_t* __restrict__ row, int i, const void* xt) {
    if constexpr (T::IS_FLOAT) {
        float v[32];
        T::fitem(row + (size_t)i * T::BYTES, v);
        const float4* xp = (const float4*)((const float*)xt + 32l * i);
        float s = 0.0f;
#pragma unroll
        for (int q = 0; q < 8; ++q) {
            const float4 a = xp[q];
            s += v[4 * q] * a.x + v[4 * q + 1] * a.y + v[4 * q + 2] * a.z + v[4 * q + 3] * a.w;
        }
        return s;
    } else {
        QItem it;
        T::item(row + (size_t)(i / T::ITEMS) * T::BYTES, i % T::ITEMS, it);
        uint32_t qa[8];
        const float da = load_q8a((const block_q8a*)xt + i, qa);
        return item_dot<T>(it, qa, da);
    }
}

// Activations of token t: int8 activation blocks for quantized rows, f32 for float rows.
template <class T>
__device__ __forceinline__ const void* act_at(const void* x, long t, int items) {
    if constexpr (T::IS_FLOAT) return (const float*)x + t * 32l * items;
    else return (const block_q8a*)x + t * (long)items;
}

template <class T>
__device__ __forceinline__ long act_stride(int items) {
    return T::IS_FLOAT ? 32l * items : (long)items;
}

// A copy global → shared of the elements first, first + step, ... (< n, at most N of them) of
// one thread, in two phases: load() keeps them in registers, store() writes them, so that the
// loads of several copies are in flight together before any store waits on them.
template <class W, int N>
struct StageCopy {
    W v[N];
    __device__ __forceinline__ void load(const W* __restrict__ src, int n, int first, int step) {
#pragma unroll
        for (int b = 0; b < N; ++b) {
            const int i = first + b * step;
            if (i < n) v[b] = src[i];
        }
    }
    __device__ __forceinline__ void store(W* dst, int n, int first, int step) const {
#pragma unroll
        for (int b = 0; b < N; ++b) {
            const int i = first + b * step;
            if (i < n) dst[i] = v[b];
        }
    }
};

// Expert e's matrix from a pointer table, or null when e < 0, the pointer is 0 or misaligned.
template <class T>
__device__ __forceinline__ const uint8_t* expert_ptr(const unsigned long long* ptrs, int e) {
    if (e < 0) return nullptr;
    const unsigned long long p = ptrs[e];
    if (p == 0 || p % T::ALIGN != 0) return nullptr;
    return (const uint8_t*)p;
}

__device__ __forceinline__ float silu_mul(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

// gpt-oss's clamped SwiGLU (ggml_swiglu_oai): x = min(g, limit), y = clamp(u, ±limit),
// x·σ(alpha·x)·(y + 1), in ggml's arithmetic x / (1 + e^(−alpha·x))·(y + 1).
__device__ __forceinline__ float swiglu_oai(float g, float u, float alpha, float limit) {
    const float x = fminf(g, limit), y = fminf(fmaxf(u, -limit), limit);
    return x / (1.0f + expf(alpha * -x)) * (y + 1.0f);
}

// The biased, clamped SwiGLU of gpt-oss's experts: the gate and up biases (f32 [E, ff] each)
// and the activation's constants.
struct OaiGlu {
    const float* gb;
    const float* ub;
    float alpha;
    float limit;
};

// y[row] = W[row]·x for one token, one row per block (grid (rows)), the row's items split over
// the MMVQ_WARPS warps, their partial sums added in warp order by thread 0
// (strata_mmvq_<ty>_r1, and the fused router of router.cu, which must sum as it does).
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
