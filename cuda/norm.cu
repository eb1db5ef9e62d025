// RMSNorm over rows: out = x / sqrt(mean(x²) + eps) · w, the mean from an f64 sum of f32
// squares (as the CPU path and ggml's CPU backend compute it); with the residual add in front,
// and (the attention norm) with its matmuls' activation quantization behind.
//
// Launch: grid (rows), block NORM_THREADS; `n` is the row width (any n ≥ 1). Rows of a
// multiple of 4 values up to NORM_REG_MAX, with 16-byte aligned pointers, stay in registers
// as float4 between the sum and the scaling; others take the strided loop.
#include "model.cuh"
#include "actq.cuh"

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

// One row: x (+ y, written back to xw when y is given) → out (and → o2, when given: a
// second copy of the row, e.g. in mapped host memory).
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
          ((float4*)xw)[i] = a;
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
      xw[i] = v;
    }
    s += (double)(v * v);
  }
  float scale = sm_rms_scale(norm_block_sum(s, red), n, eps);
  // each thread reads back only the elements it wrote
  for (int i = tid; i < n; i += nt) {
    const float o = (xr[i] * scale) * w[i];
    orow[i] = o;
    if (o2 != nullptr) o2[i] = o;
  }
}

// x f32 [rows, n], w f32 [n], out f32 [rows, n] (may alias x).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    strata_norm_rms(const float* x, const float* w, float* out, int n, float eps) {
  const size_t off = (size_t)blockIdx.x * n;
  norm_row(x + off, nullptr, nullptr, w, out + off, nullptr, n, eps);
}

// The residual add fused with the next norm: x += y, then out = RMSNorm(x) · w.
// x f32 [rows, n] (updated in place), y f32 [rows, n], w f32 [n], out f32 [rows, n];
// out2 f32 [rows, n] or null: the same rows again (a hybrid layer's FFN input for the host).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    strata_norm_add_rms(float* x, const float* y, const float* w, float* out, float* out2,
                        int n, float eps) {
  const size_t off = (size_t)blockIdx.x * n;
  norm_row(x + off, y + off, x + off, w, out + off, out2 != nullptr ? out2 + off : nullptr, n,
           eps);
}

// The attention norm fused with the quantization of its matmuls' activations (decode): x
// (+= y, written back, when y is given) → out = RMSNorm(x) · w as strata_norm_rms /
// strata_norm_add_rms compute it, then out's row → qout as strata_quantize_q8_0 / _q8_k would
// quantize it (`kind` ACT_Q8_0 / ACT_Q8_K, actq.cuh): one launch for the two. Rows up to
// NORM_REG_MAX values are quantized from a copy in shared memory (no read back through L2).
// x f32 [rows, n], y f32 [rows, n] or null, w f32 [n], out f32 [rows, n],
// qout block_q8a [rows, n / 32]. Launch: grid (rows), block NORM_THREADS.
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    strata_norm_rms_act(float* x, const float* y, const float* w, float* out, block_q8a* qout,
                        int n, float eps, int kind) {
  __shared__ __align__(16) float hs[NORM_REG_MAX];
  const size_t off = (size_t)blockIdx.x * n;
  const bool staged = n <= NORM_REG_MAX;
  float* xr = x + off;
  norm_row(xr, y != nullptr ? y + off : nullptr, xr, w, out + off, staged ? hs : nullptr, n,
           eps);
  __syncthreads();  // the row's outputs, written by every thread, visible to the warps
  act_quantize_block(staged ? hs : out + off, qout + (size_t)blockIdx.x * (n / 32), n, kind);
}
