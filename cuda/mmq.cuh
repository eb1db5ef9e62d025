// Tiled matrix multiplication for prefill (n_tok > 8), shared by mmq.cu (dense) and moe_mmq.cu
// (experts grouped by id): a 64-row × BN-token output tile per 128-thread block; each K step of
// 128 elements decodes the weight tile once into shared memory as f16 (bit-exact dequantized
// values rounded to f16) and loads the activations, then 4 warps run mma.sync m16n8k16 (f16 in,
// f32 accumulate). The weights are reused across the BN tokens.
//
// Activations, by weight type:
// - quantized weights: the CPU path's own int8 activations (block_q8a rows from the quantize
//   kernels, q8_0 or q8_K as the weight's ggml vec_dot type), so the products see exactly the
//   CPU's x̂ = d·q: q (|q| ≤ 127) is exact in f16, each 32-value block's mma partial sums
//   Σ ŵ·q are exact products summed in f32, and its scale d is applied in f32:
//   acc += d·Σ_block ŵ·q.
// - float weights (F32/F16/BF16): f32 rows multiplied by an exact power of two (row_scale, from
//   strata_row_scale) that brings their largest |value| into [2^14, 2^15), so f16 never
//   overflows, rounded to f16; the epilogue divides the scale out (exactly).
#pragma once
#ifdef STRATA_SIM
#include "tests/sim.h"
#else
#include <cuda_fp16.h>
#endif

#include "qdecode.cuh"

#define MMQ_BM 64
#define MMQ_BK 128
#define MMQ_THREADS 128
#define MMQ_STRIDE (MMQ_BK + 8)  // halves per shared row: 272 B, conflict-free fragment loads

// f16 storage of the shared tiles (raw bits under the CPU emulation).
#ifdef STRATA_SIM
typedef uint16_t mmq_half;
#else
typedef __half mmq_half;
#endif

// Two f32 values rounded to f16 (nearest even), packed low-first.
__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
#ifdef STRATA_SIM
    return (uint32_t)f32_to_f16(a) | (uint32_t)f32_to_f16(b) << 16;
#else
    const __half2 h = __floats2half2_rn(a, b);
    return *(const uint32_t*)&h;
#endif
}

__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
#ifdef STRATA_SIM
    const uint32_t a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
    sim_mma_16816(c, a, b, c, f16_to_f32);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
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

// One k16 step of the warp's tiles: c[mt][nt] += A(rows of warp wm, kk..kk+16)·B(tokens of
// warp wn, kk..kk+16) from the shared tiles.
template <int BN>
__device__ __forceinline__ void mmq_k16(const mmq_half* As, const mmq_half* Bs, int kk, int wm,
                                        int wn, int g, int tq,
                                        float (&c)[MmqShape<BN>::MT][MmqShape<BN>::NT][4]) {
    using S = MmqShape<BN>;
    uint32_t af[S::MT][4], bf[S::NT][2];
#pragma unroll
    for (int a = 0; a < S::MT; ++a) {
        const mmq_half* p = As + (wm * S::MT * 16 + a * 16 + g) * MMQ_STRIDE + kk + 2 * tq;
        af[a][0] = *(const uint32_t*)p;
        af[a][1] = *(const uint32_t*)(p + 8 * MMQ_STRIDE);
        af[a][2] = *(const uint32_t*)(p + 8);
        af[a][3] = *(const uint32_t*)(p + 8 * MMQ_STRIDE + 8);
    }
#pragma unroll
    for (int b = 0; b < S::NT; ++b) {
        const mmq_half* p = Bs + (wn * 32 + b * 8 + g) * MMQ_STRIDE + kk + 2 * tq;
        bf[b][0] = *(const uint32_t*)p;
        bf[b][1] = *(const uint32_t*)(p + 8);
    }
#pragma unroll
    for (int a = 0; a < S::MT; ++a)
#pragma unroll
        for (int b = 0; b < S::NT; ++b)
            mma_f16(c[a][b], af[a][0], af[a][1], af[a][2], af[a][3], bf[b][0], bf[b][1]);
}

// One 64 × BN output tile: acc[mt][nt][4] in the m16n8 C-fragment layout of each warp.
// w: the weight matrix (rows × 32·items, GGUF rows); rows row0.. are this tile's.
// Token n < n_valid of the tile reads activation row xrow(n) of x:
//   quantized T: block_q8a [.., items] (the CPU's int8 activations for T; row_scale unused);
//   float T: f32 [.., 32·items] (16-byte aligned), times row_scale[xrow(n)] before f16.
template <class T, int BN, class XRow>
__device__ __forceinline__ void mmq_tile(const uint8_t* __restrict__ w, int rows, int items, int row0,
                                         const void* __restrict__ x,
                                         const float* __restrict__ row_scale, int n_valid, XRow xrow,
                                         float (&acc)[MmqShape<BN>::MT][MmqShape<BN>::NT][4]) {
    using S = MmqShape<BN>;
    __shared__ __align__(16) mmq_half As[MMQ_BM * MMQ_STRIDE];
    __shared__ __align__(16) mmq_half Bs[BN * MMQ_STRIDE];
    // quantized T: the scale d of (token n, 32-value block j of the K step) at Ds[4·n + j]
    __shared__ float Ds[T::IS_FLOAT ? 1 : 4 * BN];
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
        // Activations: BN tokens × 128 values, 4 per thread (c4: which 4 of the 128).
#pragma unroll
        for (int q = 0; q < BN / 4; ++q) {
            const int idx = tid + MMQ_THREADS * q;
            const int n = idx >> 5, c4 = idx & 31;
            uint2* dst = (uint2*)(Bs + n * MMQ_STRIDE + 4 * c4);
            if constexpr (T::IS_FLOAT) {
                const int k = ks * MMQ_BK + 4 * c4;
                float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (n < n_valid && k < 32 * items) {
                    const long xr = xrow(n);
                    const float sc = row_scale[xr];
                    a = *(const float4*)((const float*)x + xr * (32l * items) + k);
                    a = make_float4(a.x * sc, a.y * sc, a.z * sc, a.w * sc);
                }
                *dst = make_uint2(pack_half2(a.x, a.y), pack_half2(a.z, a.w));
            } else {
                // 4 int8 of block j (exact in f16), and the block's d once per block
                const int j = c4 >> 3, gi = ks * 4 + j;
                uint32_t qv = 0;
                float d = 0.0f;
                if (n < n_valid && gi < items) {
                    const block_q8a* blk = (const block_q8a*)x + xrow(n) * (long)items + gi;
                    qv = ld_u32_a4((const uint8_t*)blk->qs + 4 * (c4 & 7));
                    d = blk->d;
                }
                const float q0 = (float)(int8_t)qv, q1 = (float)(int8_t)(qv >> 8);
                const float q2 = (float)(int8_t)(qv >> 16), q3 = (float)(int8_t)(qv >> 24);
                *dst = make_uint2(pack_half2(q0, q1), pack_half2(q2, q3));
                if ((c4 & 7) == 0) Ds[4 * n + j] = d;
            }
        }
        __syncthreads();
        if constexpr (T::IS_FLOAT) {
#pragma unroll
            for (int kk = 0; kk < MMQ_BK; kk += 16) mmq_k16<BN>(As, Bs, kk, wm, wn, g, tq, acc);
        } else {
            // per 32-value block j: part = Σ ŵ·q (two k16 steps), acc += d·part per token
#pragma unroll
#pragma unroll 1
            for (int j = 0; j < MMQ_BK / 32; ++j) {
                float part[S::MT][S::NT][4];
#pragma unroll
                for (int a = 0; a < S::MT; ++a)
#pragma unroll
                    for (int b = 0; b < S::NT; ++b)
#pragma unroll
                        for (int c = 0; c < 4; ++c) part[a][b][c] = 0.0f;
                mmq_k16<BN>(As, Bs, 32 * j, wm, wn, g, tq, part);
                mmq_k16<BN>(As, Bs, 32 * j + 16, wm, wn, g, tq, part);
#pragma unroll
                for (int b = 0; b < S::NT; ++b) {
                    // C fragment: elements 0, 2 are token 2·tq, elements 1, 3 token 2·tq + 1
                    const int n0 = wn * 32 + b * 8 + 2 * tq;
                    const float d0 = Ds[4 * n0 + j], d1 = Ds[4 * (n0 + 1) + j];
#pragma unroll
                    for (int a = 0; a < S::MT; ++a) {
                        acc[a][b][0] += d0 * part[a][b][0];
                        acc[a][b][1] += d1 * part[a][b][1];
                        acc[a][b][2] += d0 * part[a][b][2];
                        acc[a][b][3] += d1 * part[a][b][3];
                    }
                }
            }
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
