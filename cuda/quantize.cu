// f32 → q8_1 activation blocks: one warp per 32 values (8 blocks per 256-thread block).
// d = f16(amax/127), q = clamp(rint(x/d), ±127), s = f16(d·Σq): the math of quantize_q8_1_ref in
// qdecode.cuh, which the host check compares with numpy.
//
// strata_quantize_q8_1(x, out, n_blocks)   x f32 [32·n_blocks] → out block_q8_1 [n_blocks];
//   grid ⌈n_blocks/8⌉, block 256.
#include "qdecode.cuh"

extern "C" __global__ void __launch_bounds__(256)
    strata_quantize_q8_1(const float* __restrict__ x, block_q8_1* __restrict__ out, long n_blocks) {
    const long b = (long)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (b >= n_blocks) return;
    const float v = x[b * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const uint16_t dh = f32_to_f16(amax / 127.0f);
    const float d = f16_to_f32(dh);
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    const float q = fminf(fmaxf(rintf(__fmul_rn(v, inv)), -127.0f), 127.0f);
    const int sum = warp_sum_i((int)q);
    out[b].qs[lane] = (int8_t)q;
    if (lane == 0) {
        out[b].d = dh;
        out[b].s = f32_to_f16(d * (float)sum);
    }
}
