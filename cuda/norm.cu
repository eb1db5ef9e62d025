// RMSNorm over rows: out = x / sqrt(mean(x²) + eps) · w, the mean from an f64 sum of f32
// squares (as the CPU path and ggml's CPU backend compute it).
//
// Launch: grid (rows), block NORM_THREADS; `n` is the row width (any n ≥ 1).
#include "model.cuh"

#define NORM_THREADS 256

// x f32 [rows, n], w f32 [n], out f32 [rows, n] (may alias x).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    strata_norm_rms(const float* x, const float* w, float* out, int n, float eps) {
  __shared__ double red[32];
  const float* xr = x + (size_t)blockIdx.x * n;
  float* orow = out + (size_t)blockIdx.x * n;
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = xr[i];
    s += (double)(v * v);
  }
  float scale = sm_rms_scale(sm_block_sum_d(s, red), n, eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) orow[i] = (xr[i] * scale) * w[i];
}

// The residual add fused with the next norm: x += y, then out = RMSNorm(x) · w.
// x f32 [rows, n] (updated in place), y f32 [rows, n], w f32 [n], out f32 [rows, n].
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    strata_norm_add_rms(float* x, const float* y, const float* w, float* out, int n,
                        float eps) {
  __shared__ double red[32];
  float* xr = x + (size_t)blockIdx.x * n;
  const float* yr = y + (size_t)blockIdx.x * n;
  float* orow = out + (size_t)blockIdx.x * n;
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = xr[i] + yr[i];
    xr[i] = v;
    s += (double)(v * v);
  }
  float scale = sm_rms_scale(sm_block_sum_d(s, red), n, eps);
  // each thread reads back only the elements it wrote
  for (int i = threadIdx.x; i < n; i += blockDim.x) orow[i] = (xr[i] * scale) * w[i];
}
