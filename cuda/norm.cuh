// One row's RMSNorm by a block: out = x / sqrt(mean(x²) + eps) · w, the mean from an f64 sum
// of f32 squares (as the CPU path and ggml's CPU backend compute it); the row kernels of
// norm.cu and the fused router of router.cu (which must sum as they do: the same
// NORM_THREADS threads, the same order).
//
// Rows of a multiple of 4 values up to NORM_REG_MAX, with 16-byte aligned pointers, stay in
// registers as float4 between the sum and the scaling; others take the strided loop.
#pragma once
#include "model.cuh"

#define NORM_THREADS 512
#define NORM_VEC 4                                      // float4s a thread keeps
#define NORM_REG_MAX (4 * NORM_VEC * NORM_THREADS)      // 8192 values

// Sum of one double per thread over the block; every thread gets the total (one warp
// reduces the warps' sums). `red` is shared scratch of 33 doubles.
SM_D double norm_block_sum(double v, double* red) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = sm_warp_sum_d(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double t = lane < nw ? red[lane] : 0.0;
    t = sm_warp_sum_d(t);
    if (lane == 0) red[32] = t;
  }
  __syncthreads();
  return red[32];
}

SM_D bool norm_aligned(const void* p) { return ((unsigned long long)p & 15) == 0; }

// One row: x (+ y when y is given, written back to xw when xw is given) → out (and → o2,
// when given: a second copy of the row, e.g. in mapped host memory).
SM_D void norm_row(const float* xr, const float* yr, float* xw, const float* w, float* orow,
                   float* o2, int n, float eps) {
  __shared__ double red[33];
  const int tid = threadIdx.x, nt = blockDim.x;
  if ((n & 3) == 0 && n <= 4 * NORM_VEC * nt && norm_aligned(xr) && norm_aligned(w) &&
      norm_aligned(orow) && (yr == nullptr || norm_aligned(yr)) &&
      (o2 == nullptr || norm_aligned(o2))) {
    const int n4 = n >> 2;
    float4 v[NORM_VEC];
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < NORM_VEC; k++) {
      int i = tid + k * nt;
      if (i < n4) {
        float4 a = ((const float4*)xr)[i];
        if (yr != nullptr) {
          float4 b = ((const float4*)yr)[i];
          a.x += b.x;
          a.y += b.y;
          a.z += b.z;
          a.w += b.w;
          if (xw != nullptr) ((float4*)xw)[i] = a;
        }
        v[k] = a;
        s += (double)(a.x * a.x);
        s += (double)(a.y * a.y);
        s += (double)(a.z * a.z);
        s += (double)(a.w * a.w);
      }
    }
    float scale = sm_rms_scale(norm_block_sum(s, red), n, eps);
#pragma unroll
    for (int k = 0; k < NORM_VEC; k++) {
      int i = tid + k * nt;
      if (i < n4) {
        float4 ww = ((const float4*)w)[i], a = v[k], o;
        o.x = (a.x * scale) * ww.x;
        o.y = (a.y * scale) * ww.y;
        o.z = (a.z * scale) * ww.z;
        o.w = (a.w * scale) * ww.w;
        ((float4*)orow)[i] = o;
        if (o2 != nullptr) ((float4*)o2)[i] = o;
      }
    }
    return;
  }
  double s = 0.0;
  for (int i = tid; i < n; i += nt) {
    float v = xr[i];
    if (yr != nullptr) {
      v += yr[i];
      if (xw != nullptr) xw[i] = v;
    }
    s += (double)(v * v);
  }
  float scale = sm_rms_scale(norm_block_sum(s, red), n, eps);
  // each thread reads back only the elements it wrote (or adds them again: the same sums)
  for (int i = tid; i < n; i += nt) {
    const float v = xw != nullptr ? xw[i] : (yr != nullptr ? xr[i] + yr[i] : xr[i]);
    const float o = (v * scale) * w[i];
    orow[i] = o;
    if (o2 != nullptr) o2[i] = o;
  }
}

