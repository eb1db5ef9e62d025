// f32 → int8 activation blocks (block_q8a: f32 d, 32 × int8), quantized exactly as the CPU path
// quantizes a weight type's activations (its ggml vec_dot type), so that the decode kernels'
// integer dot products are the CPU's: same quants, same scales. The math is act_q8_0_ref /
// act_q8_k_ref in qdecode.cuh (checked on the host against the CPU quantizer), computed here by
// warps; tests/test_gpu_act_sim.py runs these kernels under the CPU emulation against it.
//
// strata_quantize_q8_0(x, out, n_blocks)   x f32 [32·n_blocks] → out [n_blocks]
//   (Q8_0, Q4_0, Q5_0, IQ4_NL weights); one warp per 32 values: grid ⌈n_blocks/8⌉, block 256.
// strata_quantize_q8_k(x, out, n_super)    x f32 [256·n_super] → out [8·n_super]
//   (K-quants, IQ4_XS, IQ3_S, IQ3_XXS, IQ2_XS); one warp per 256 values: grid ⌈n_super/8⌉,
//   block 256.
#include "qdecode.cuh"

extern "C" __global__ void __launch_bounds__(256)
    strata_quantize_q8_0(const float* __restrict__ x, block_q8a* __restrict__ out, long n_blocks) {
    const long b = (long)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (b >= n_blocks) return;
    const float v = x[b * 32 + lane];
    const float amax = warp_max(fabsf(v));
    out[b].qs[lane] = (int8_t)act_rint(fmul_rn(v, act_q8_0_inv(amax)));
    if (lane == 0) out[b].d = act_q8_0_scale(amax);
}

extern "C" __global__ void __launch_bounds__(256)
    strata_quantize_q8_k(const float* __restrict__ x, block_q8a* __restrict__ out, long n_super) {
    const long sb = (long)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (sb >= n_super) return;
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
