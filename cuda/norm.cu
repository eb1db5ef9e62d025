// RMSNorm over rows: out = x / sqrt(mean(x²) + eps) · w, the mean from an f64 sum of f32
// squares (as the CPU path and ggml's CPU backend compute it).
//
// Launch: grid (rows), block NORM_THREADS; `n` is the row width (any n ≥ 1). Rows of a
// multiple of 4 values up to NORM_REG_MAX, with 16-byte aligned pointers, stay in registers
// as float4 between the sum and the scaling; others take the strided loop.
//
// The `_q8` variants also write out as q8_1 blocks (n a multiple of 32), the activation the
// next quantized matmul reads, with the math of cuda/quantize.cu (bit-identical): per 32
// values d = f16(amax/127), q = clamp(rint(v·(1/d)), ±127), s = f16(d·Σq); 36-byte blocks
// {u16 d, u16 s, i8 q[32]} at xq + 36·(row·n/32 + block).
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

// q8_1 of 32 values spread over 8 consecutive lanes (4 each, v): lane (tid % 8) writes its
// 4 quants, the group's first lane d and s. `ok` is uniform over each 8-lane group; every
// lane of the warp must call this (the shuffles take the full warp).
SM_D void norm_q8_store(const float v[4], bool ok, uint8_t* blk, int sub) {
  float amax = ok ? fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))) : 0.0f;
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const uint16_t dh = sm_f2h(amax / 127.0f);
  const float d = sm_h2f(dh);
  const float inv = d > 0.0f ? 1.0f / d : 0.0f;
  uint32_t packed = 0;
  int sum = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float q = fminf(fmaxf(rintf(__fmul_rn(v[i], inv)), -127.0f), 127.0f);
    sum += (int)q;
    packed |= (uint32_t)((int)q & 0xff) << (8 * i);
  }
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (!ok) return;
  *(uint32_t*)(blk + 4 + 4 * sub) = packed;
  if (sub == 0) *(uint32_t*)blk = (uint32_t)dh | ((uint32_t)sm_f2h(d * (float)sum) << 16);
}

// One row: x (+ y, written back to xw when y is given) → out, and its q8_1 blocks at xq
// when xq is given (n % 32 == 0).
SM_D void norm_row(const float* xr, const float* yr, float* xw, const float* w, float* orow,
                   uint8_t* xq, int n, float eps) {
  __shared__ double red[33];
  const int tid = threadIdx.x, nt = blockDim.x;
  if ((n & 3) == 0 && n <= 4 * NORM_VEC * nt && norm_aligned(xr) && norm_aligned(w) &&
      norm_aligned(orow) && (yr == nullptr || norm_aligned(yr))) {
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
        v[k] = o;
      }
    }
    if (xq != nullptr) {
#pragma unroll
      for (int k = 0; k < NORM_VEC; k++) {
        int i = tid + k * nt;  // float4 i: block i / 8, lane i % 8 of its 8
        float o4[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
        if (k * nt < n4)  // uniform over the block: all lanes of a warp take part
          norm_q8_store(o4, i < n4, xq + 36 * (size_t)(i >> 3), i & 7);
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
  for (int i = tid; i < n; i += nt) orow[i] = (xr[i] * scale) * w[i];
  if (xq == nullptr) return;
  __syncthreads();  // out is read back by other threads
  for (int i0 = 0; i0 < n; i0 += 4 * nt) {  // uniform bound; thread tid: values 4·tid ..
    int i = i0 + 4 * tid;
    bool ok = i < n;  // n % 32 == 0: whole 8-lane groups
    float o4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (ok)
      for (int j = 0; j < 4; j++) o4[j] = orow[i + j];
    norm_q8_store(o4, ok, xq + 36 * (size_t)(i >> 5), (i >> 2) & 7);
  }
}

// x f32 [rows, n], w f32 [n], out f32 [rows, n] (may alias x).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    strata_norm_rms(const float* x, const float* w, float* out, int n, float eps) {
  const size_t off = (size_t)blockIdx.x * n;
  norm_row(x + off, nullptr, nullptr, w, out + off, nullptr, n, eps);
}

// The residual add fused with the next norm: x += y, then out = RMSNorm(x) · w.
// x f32 [rows, n] (updated in place), y f32 [rows, n], w f32 [n], out f32 [rows, n].
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    strata_norm_add_rms(float* x, const float* y, const float* w, float* out, int n,
                        float eps) {
  const size_t off = (size_t)blockIdx.x * n;
  norm_row(x + off, y + off, x + off, w, out + off, nullptr, n, eps);
}

// strata_norm_rms, and out as q8_1 blocks xq [rows, n/32] (n % 32 == 0).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    strata_norm_rms_q8(const float* x, const float* w, float* out, uint8_t* xq, int n,
                       float eps) {
  const size_t off = (size_t)blockIdx.x * n;
  norm_row(x + off, nullptr, nullptr, w, out + off, xq + off / 32 * 36, n, eps);
}

// strata_norm_add_rms, and out as q8_1 blocks xq [rows, n/32] (n % 32 == 0).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    strata_norm_add_rms_q8(float* x, const float* y, const float* w, float* out, uint8_t* xq,
                           int n, float eps) {
  const size_t off = (size_t)blockIdx.x * n;
  norm_row(x + off, y + off, x + off, w, out + off, xq + off / 32 * 36, n, eps);
}
