// f32 → int8 activation blocks (block_q8a: f32 d, 32 × int8), quantized exactly as the CPU path
// quantizes a weight type's activations (its ggml vec_dot type), so that the decode kernels'
// integer dot products are the CPU's: same quants, same scales. The math is act_q8_0_ref /
// act_q8_k_ref in qdecode.cuh (checked on the host against the CPU quantizer), computed by
// warps (actq.cuh, also the tail of the fused producers); tests/test_gpu_act_sim.py runs these
// kernels under the CPU emulation against it.
//
// strata_quantize_q8_0(x, out, n_blocks)   x f32 [32·n_blocks] → out [n_blocks]
//   (Q8_0, Q4_0, Q5_0, IQ4_NL weights); one warp per 32 values: grid ⌈n_blocks/8⌉, block 256.
// strata_quantize_q8_k(x, out, n_super)    x f32 [256·n_super] → out [8·n_super]
//   (K-quants, IQ4_XS, IQ3_S, IQ3_XXS, IQ2_XS); one warp per 256 values: grid ⌈n_super/8⌉,
//   block 256.
#include "actq.cuh"

extern "C" __global__ void __launch_bounds__(256)
    strata_quantize_q8_0(const float* __restrict__ x, block_q8a* __restrict__ out, long n_blocks) {
    const long b = (long)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (b < n_blocks) act_q8_0_warp(x, out, b, threadIdx.x & 31);
}

extern "C" __global__ void __launch_bounds__(256)
    strata_quantize_q8_k(const float* __restrict__ x, block_q8a* __restrict__ out, long n_super) {
    const long sb = (long)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (sb < n_super) act_q8_k_warp(x, out, sb, threadIdx.x & 31);
}
