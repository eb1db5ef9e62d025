// One warp's share of the activation quantization (act_q8_0_ref / act_q8_k_ref in
// qdecode.cuh, computed by a warp's lanes): the bodies of cuda/quantize.cu's kernels, also run
// as the tail of the kernels that produce a matmul's input (the attention norm in norm.cu,
// the decode attention's output in attention.cu), so that a fused producer writes the very
// int8 blocks the separate quantize kernel would, with one launch fewer on the chain.
#pragma once
#include "qdecode.cuh"

// The activation kinds of a fused tail (the Rust side passes them: rust/src/cuda/ops/act.rs).
#define ACT_NONE (-1)
#define ACT_Q8_0 0  // blocks of 32 values (Q8_0, Q4_0, Q5_0, IQ4_NL weights)
#define ACT_Q8_K 1  // super-blocks of 256 values (K-quants and the 256-value IQ types)

// Block b of x f32 [32·…] → out[b] by one warp (lane = its lane).
__device__ __forceinline__ void act_q8_0_warp(const float* x, block_q8a* out, long b, int lane) {
    const float v = x[b * 32 + lane];
    const float amax = warp_max(fabsf(v));
    out[b].qs[lane] = (int8_t)act_rint(fmul_rn(v, act_q8_0_inv(amax)));
    if (lane == 0) out[b].d = act_q8_0_scale(amax);
}

// Super-block sb of x f32 [256·…] → out[8·sb .. 8·sb + 8] by one warp.
__device__ __forceinline__ void act_q8_k_warp(const float* x, block_q8a* out, long sb, int lane) {
    // element 32j + lane of the super-block in v[j]
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = x[sb * 256 + 32 * j + lane];
    // the first element of largest magnitude: (|v|, index) reduced with ties to the lower index
    float amax = 0.0f, max = 0.0f;
    int at = 256;
#pragma unroll
    for (int j = 0; j < 8; ++j)
        if (fabsf(v[j]) > amax) {
            amax = fabsf(v[j]);
            max = v[j];
            at = 32 * j + lane;
        }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float oa = __shfl_xor_sync(0xffffffffu, amax, o);
        const float om = __shfl_xor_sync(0xffffffffu, max, o);
        const int oi = __shfl_xor_sync(0xffffffffu, at, o);
        if (oa > amax || (oa == amax && oi < at)) {
            amax = oa;
            max = om;
            at = oi;
        }
    }
    const float iscale = amax != 0.0f ? -127.0f / max : 0.0f;
    const float d = amax != 0.0f ? 1.0f / iscale : 0.0f;
    block_q8a* o = out + sb * 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int q = act_rint(fmul_rn(iscale, v[j]));
        o[j].qs[lane] = (int8_t)(q < 127 ? q : 127);
    }
    if (lane < 8) o[lane].d = d;
}

// Block b of x by the 8 lanes 8c .. 8c + 7 of a warp (c = this lane's octet), 4 values each:
// act_q8_0_warp's block (the largest magnitude over the 32, then each value alone), four
// blocks per warp at once. Every lane of the warp calls it (the shuffles stay within an
// octet); an octet with `live` false writes nothing.
__device__ __forceinline__ void act_q8_0_oct(const float* x, block_q8a* out, long b, int lane,
                                             bool live) {
    const int q = lane & 7;  // values 4q .. 4q + 3 of the block
    const float4 v = *(const float4*)(x + b * 32 + 4 * q);
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float id = act_q8_0_inv(amax);
    const uint32_t w = (uint32_t)(act_rint(fmul_rn(v.x, id)) & 0xff) |
                       (uint32_t)(act_rint(fmul_rn(v.y, id)) & 0xff) << 8 |
                       (uint32_t)(act_rint(fmul_rn(v.z, id)) & 0xff) << 16 |
                       (uint32_t)(act_rint(fmul_rn(v.w, id)) & 0xff) << 24;
    if (!live) return;
    memcpy(out[b].qs + 4 * q, &w, 4);
    if (q == 0) out[b].d = act_q8_0_scale(amax);
}

// The n values at x (n a multiple of the kind's item; x 16-byte aligned) → out (n / 32 blocks)
// by the block's threads: q8_0 blocks by 8 lanes each, q8_K super-blocks by a warp each.
// Every thread of the block calls it (after a barrier that makes x visible); ACT_NONE does
// nothing.
__device__ __forceinline__ void act_quantize_block(const float* x, block_q8a* out, int n,
                                                   int kind) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (kind == ACT_Q8_0) {
        // a warp's 4 blocks at once (past the last block, an octet reads the warp's first)
        for (int b0 = 4 * warp; b0 < n / 32; b0 += 4 * nw) {
            const int b = b0 + (lane >> 3);
            const bool live = b < n / 32;
            act_q8_0_oct(x, out, live ? b : b0, lane, live);
        }
    } else if (kind == ACT_Q8_K) {
        for (int sb = warp; sb < n / 256; sb += nw) act_q8_k_warp(x, out, sb, lane);
    }
}
