// Shared helpers of the model kernels (norm, rope, attention, router, elementwise).
//
// Everything here is `__host__ __device__` where it can be, so the math is checked on the
// CPU too. Built with STRATA_SIM (g++, cuda/tests/sim.h), the kernels themselves run on the
// CPU under a small emulation of blocks, barriers, warp shuffles and mma.sync: the
// emulation tests in tests/test_gpu_model_sim.py run them against numpy without a GPU.
#pragma once

#ifdef STRATA_SIM
#include "tests/sim.h"
#else
#include <cuda_fp16.h>
#include <stdint.h>
#endif

#define SM_HD __host__ __device__ __forceinline__
#define SM_D __device__ __forceinline__

// ---- f16 <-> f32 (IEEE binary16, round to nearest even), on raw bits -------------------

SM_HD float sm_h2f(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  uint32_t s = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ffu, bits;
  if (e == 0) {
    if (m == 0) {
      bits = s;
    } else {  // subnormal: normalize
      e = 127 - 15 + 1;
      while (!(m & 0x400u)) {
        m <<= 1;
        e--;
      }
      bits = s | (e << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (e == 31) {
    bits = s | 0x7f800000u | (m << 13);
  } else {
    bits = s | ((e + 127 - 15) << 23) | (m << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
#endif
}

SM_HD uint16_t sm_f2h(float f) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(f));
#else
  uint32_t x;
  __builtin_memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // rounds to inf
  if (ax < 0x38800000u) {  // subnormal or zero in f16
    if (ax < 0x33000000u) return (uint16_t)sign;  // < half of the smallest subnormal
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // value = m·2^(e-150) = (m >> shift) units of 2^-24
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t m = ax + 0xc8000000u;  // rebias exponent by -112 (<< 23)
  uint32_t q = m >> 13, rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1))) q++;
  return (uint16_t)(sign | q);
#endif
}

// f16 rounding of an f32 value, returned as f32 (what the CPU path does to q before q·k).
SM_HD float sm_round_h(float f) { return sm_h2f(sm_f2h(f)); }

// Round half to even to an integer, as ggml's x86 quantizers (and rintf) do.
SM_HD int sm_rint(float v) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(v);
#else
  float t = v + 12582912.0f;  // 1.5·2^23: ggml's nearest_int, exact for |v| < 2^22
  uint32_t b;
  __builtin_memcpy(&b, &t, 4);
  return (int)(b & 0x007fffffu) - 0x00400000;
#endif
}

// ---- RMSNorm scale: 1 / sqrt(mean(x²) + eps), mean from an f64 sum of f32 squares -------
SM_HD float sm_rms_scale(double sum_sq, int n, float eps) {
  float mean = (float)(sum_sq / (double)n);
  return 1.0f / sqrtf(mean + eps);
}

// ---- q8_0 (34 bytes per 32 values: f16 d, int8 qs[32]) ---------------------------------
// d = amax/127 (stored f16), q = round-half-even(x · 127/amax): ggml's x86 quantize_row_q8_0.
SM_HD float sm_q8_0_inv(float amax) { return amax != 0.0f ? 127.0f / amax : 0.0f; }

// ---- warp reductions (full warp, all 32 lanes active) ----------------------------------
SM_D float sm_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
SM_D double sm_warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// The warp's largest (v, i) pair, ties to the lower i, in every lane.
SM_D void sm_warp_argmax(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, v, o);
    int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) {
      v = ov;
      i = oi;
    }
  }
}

SM_D float sm_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum of one double per thread over the whole block (blockDim.x a multiple of 32, ≤ 1024);
// every thread gets the total. `red` is shared scratch of 32 doubles.
SM_D double sm_block_sum_d(double v, double* red) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = sm_warp_sum_d(v);
  __syncthreads();  // `red` may still be read by a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  double t = 0.0;
  for (int i = 0; i < nw; i++) t += red[i];  // same order in every thread
  return t;
}

// ---- KV cache rows ----------------------------------------------------------------------
// Cache layout (K and V alike): [slot][layer][Nkv][n_ctx] rows of one head (D values) in the
// cache type; a head row is D·2 bytes (f16) or D/32·34 bytes (q8_0).
enum SmKv { SM_KV_F16 = 0, SM_KV_Q8_0 = 1 };

template <int KV>
SM_HD int sm_head_bytes(int d) {
  return KV == SM_KV_F16 ? 2 * d : d / 32 * 34;
}

// One value of a head row.
template <int KV>
SM_HD float sm_kv_get(const uint8_t* row, int i) {
  if (KV == SM_KV_F16) {
    return sm_h2f(((const uint16_t*)row)[i]);
  } else {
    const uint8_t* b = row + (i >> 5) * 34;
    float d = sm_h2f((uint16_t)(b[0] | (b[1] << 8)));
    return d * (float)(int8_t)b[2 + (i & 31)];
  }
}

// ---- tensor cores: D = A·B + C, m16n8k16, f16 inputs, f32 accumulators -------------------
// Fragments (g = lane/4, c = lane%4; pairs of f16 packed low-first in a u32):
//   a[0] = A[g][2c..2c+1], a[1] = A[g+8][2c..], a[2] = A[g][2c+8..], a[3] = A[g+8][2c+8..]
//   b[0] = B[2c..2c+1][g],  b[1] = B[2c+8..2c+9][g]          (B is K×N, k pairs packed)
//   d[0..1] = D[g][2c..2c+1], d[2..3] = D[g+8][2c..2c+1]
SM_D void sm_mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef STRATA_SIM
  sim_mma_16816(d, a, b, d, sm_h2f);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

SM_HD uint32_t sm_pack_h2(float lo, float hi) {
  return (uint32_t)sm_f2h(lo) | ((uint32_t)sm_f2h(hi) << 16);
}
