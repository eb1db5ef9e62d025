// Tiled matrix multiplication for prefill (n_tok > 8), shared by mmq.cu (dense) and moe_mmq.cu
// (experts grouped by id): a 64-row × BN-token output tile per 128-thread block; each K step of
// 128 elements decodes the weight tile once into shared memory as f16 (bit-exact dequantized
// values rounded to f16) and converts the activations f32 → f16, then 4 warps run
// mma.sync m16n8k16 (f16 in, f32 accumulate). The weights are reused across the BN tokens.
// Activation rows are multiplied by an exact power of two (row_scale, from strata_row_scale)
// that brings their largest |value| into [2^14, 2^15), so f16 never overflows; the epilogue
// divides it out (exactly).
#pragma once
#include <cuda_fp16.h>

#include "qdecode.cuh"

#define MMQ_BM 64
#define MMQ_BK 128
#define MMQ_THREADS 128
#define MMQ_STRIDE (MMQ_BK + 8)  // halves per shared row: 272 B, conflict-free fragment loads

__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *(const uint32_t*)&h;
}

__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Warp tiling of the 64 × BN block tile: BN = 64 → 2 × 2 warps of 32 × 32; BN = 32 → 4 × 1 warps
// of 16 × 32. MT m16 tiles and 4 n8 tiles per warp.
template <int BN>
struct MmqShape {
    static constexpr int WN = BN / 32;          // warps along N
    static constexpr int WM = 4 / WN;           // warps along M
    static constexpr int MT = MMQ_BM / WM / 16;  // m16 tiles per warp
    static constexpr int NT = 4;                // n8 tiles per warp (32 tokens)
};

// The power of two s with amax·s in [2^14, 2^15) (1 for 0 or non-finite amax).
__device__ __forceinline__ float pow2_scale(float amax) {
    if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
    int e;
    frexpf(amax, &e);  // amax = m·2^e, m in [0.5, 1)
    return ldexpf(1.0f, min(max(15 - e, -120), 120));
}

// One 64 × BN output tile: acc[mt][nt][4] in the m16n8 C-fragment layout of each warp.
// w: the weight matrix (rows × 32·items, GGUF rows); rows row0.. are this tile's.
// Token n < n_valid of the tile reads f32 activations at x + xrow(n)·x_stride (16-aligned).
template <class T, int BN, class XRow>
__device__ __forceinline__ void mmq_tile(const uint8_t* __restrict__ w, int rows, int items, int row0,
                                         const float* __restrict__ x, long x_stride,
                                         const float* __restrict__ row_scale, int n_valid, XRow xrow,
                                         float (&acc)[MmqShape<BN>::MT][MmqShape<BN>::NT][4]) {
    using S = MmqShape<BN>;
    __shared__ __align__(16) __half As[MMQ_BM * MMQ_STRIDE];
    __shared__ __align__(16) __half Bs[BN * MMQ_STRIDE];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / S::WN, wn = warp % S::WN;
    const int g = lane >> 2, tq = lane & 3;
    const size_t rb = row_bytes_of<T>(items);
#pragma unroll
    for (int a = 0; a < S::MT; ++a)
#pragma unroll
        for (int b = 0; b < S::NT; ++b)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.0f;

    const int ksteps = (items + 3) / 4;
    for (int ks = 0; ks < ksteps; ++ks) {
        // Weights: 64 rows × 4 items, two items per thread.
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int idx = tid + MMQ_THREADS * q;
            const int r = idx >> 2, it = idx & 3;
            const int gi = ks * 4 + it;
            float v[32];
            if (row0 + r < rows && gi < items) {
                item_values<T>(w + (size_t)(row0 + r) * rb, gi, v);
            } else {
#pragma unroll
                for (int e = 0; e < 32; ++e) v[e] = 0.0f;
            }
            uint4* dst = (uint4*)(As + r * MMQ_STRIDE + it * 32);
#pragma unroll
            for (int e = 0; e < 4; ++e)
                dst[e] = make_uint4(pack_half2(v[8 * e], v[8 * e + 1]), pack_half2(v[8 * e + 2], v[8 * e + 3]),
                                    pack_half2(v[8 * e + 4], v[8 * e + 5]), pack_half2(v[8 * e + 6], v[8 * e + 7]));
        }
        // Activations: BN tokens × 128 values as float4 → 4 halves.
#pragma unroll
        for (int q = 0; q < BN / 4; ++q) {
            const int idx = tid + MMQ_THREADS * q;
            const int n = idx >> 5, c4 = idx & 31;
            const int k = ks * MMQ_BK + 4 * c4;
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (n < n_valid && k < 32 * items) {
                const long xr = xrow(n);
                const float sc = row_scale[xr];
                a = *(const float4*)(x + xr * x_stride + k);
                a = make_float4(a.x * sc, a.y * sc, a.z * sc, a.w * sc);
            }
            uint2* dst = (uint2*)(Bs + n * MMQ_STRIDE + 4 * c4);
            *dst = make_uint2(pack_half2(a.x, a.y), pack_half2(a.z, a.w));
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MMQ_BK; kk += 16) {
            uint32_t af[S::MT][4], bf[S::NT][2];
#pragma unroll
            for (int a = 0; a < S::MT; ++a) {
                const __half* p = As + (wm * S::MT * 16 + a * 16 + g) * MMQ_STRIDE + kk + 2 * tq;
                af[a][0] = *(const uint32_t*)p;
                af[a][1] = *(const uint32_t*)(p + 8 * MMQ_STRIDE);
                af[a][2] = *(const uint32_t*)(p + 8);
                af[a][3] = *(const uint32_t*)(p + 8 * MMQ_STRIDE + 8);
            }
#pragma unroll
            for (int b = 0; b < S::NT; ++b) {
                const __half* p = Bs + (wn * 32 + b * 8 + g) * MMQ_STRIDE + kk + 2 * tq;
                bf[b][0] = *(const uint32_t*)p;
                bf[b][1] = *(const uint32_t*)(p + 8);
            }
#pragma unroll
            for (int a = 0; a < S::MT; ++a)
#pragma unroll
                for (int b = 0; b < S::NT; ++b)
                    mma_f16(acc[a][b], af[a][0], af[a][1], af[a][2], af[a][3], bf[b][0], bf[b][1]);
        }
        __syncthreads();
    }
}

// Calls out(row, n, value) for each element of the tile held by this thread (row relative to
// the tile's row0, n the tile's token index); the caller bounds-checks.
template <int BN, class Out>
__device__ __forceinline__ void mmq_epilogue(const float (&acc)[MmqShape<BN>::MT][MmqShape<BN>::NT][4],
                                             Out out) {
    using S = MmqShape<BN>;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp / S::WN, wn = warp % S::WN;
    const int g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int a = 0; a < S::MT; ++a)
#pragma unroll
        for (int b = 0; b < S::NT; ++b)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int r = wm * S::MT * 16 + a * 16 + g + 8 * (c >> 1);
                const int n = wn * 32 + b * 8 + 2 * tq + (c & 1);
                out(r, n, acc[a][b][c]);
            }
}
