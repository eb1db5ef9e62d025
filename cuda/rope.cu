// RoPE NEOX (pairs (i, i + n_rot/2) for i < n_rot/2; the fused step also NORM), with the cos/sin table computed once
// on the host by the CPU path's `Rope::table` (linear and YaRN scaling and the YaRN
// magnitude folded in), so the angles are those of the CPU bit for bit.
//
// Tables: cos, sin f32 [n_ctx, n_rot/2]. The step parameters `sp` (device i32 [2]) hold
// pos0 (the first position of this call's tokens) and the KV slot, so a captured decode
// graph reads them from memory. D = head dim (a multiple of 32, ≤ 256).
#include "model.cuh"

// x f32 [T, n_head, D] rotated in place; token t sits at position pos0 + t (< n_pos, the
// table's rows; tokens past it are left alone: the host refuses them first).
// Launch: grid (n_head, T), block 32.
extern "C" __global__ void __launch_bounds__(32)
    strata_rope_neox(float* x, const float* cos_t, const float* sin_t, const int* sp,
                     int n_head, int d, int n_rot, int n_pos) {
  int half = n_rot / 2, pos = sp[0] + blockIdx.y;
  if (pos >= n_pos) return;
  float* h = x + ((size_t)blockIdx.y * n_head + blockIdx.x) * d;
  const float* c = cos_t + (size_t)pos * half;
  const float* s = sin_t + (size_t)pos * half;
  for (int i = threadIdx.x; i < half; i += 32) {
    float x0 = h[i], x1 = h[i + half];
    h[i] = x0 * c[i] - x1 * s[i];
    h[i + half] = x0 * s[i] + x1 * c[i];
  }
}

// Stores one head row of D values (in shared memory `v`) to the cache row `dst` (2-byte
// aligned: cache rows and q8_0 blocks have even sizes); called by all 32 lanes of the warp.
//
// The q8_0 scale is stored as one 16-bit word. Storing its two bytes separately
// (`blk[0] = dh & 0xff`) is miscompiled by ptxas 13.0 for sm_90: the low byte of the
// register that `cvt.rn.f16.f32` produced became `F2I.U8.F16.TRUNC`, the half VALUE
// truncated to an integer (0 for any scale below 1), not its low 8 bits — every stored scale
// lost its low mantissa bits on the GPU while the CPU emulation was right.
template <int KV>
__device__ void store_head(const float* v, uint8_t* dst, int d) {
  int lane = threadIdx.x;
  if (KV == SM_KV_F16) {
    uint16_t* o = (uint16_t*)dst;
    for (int i = lane; i < d; i += 32) o[i] = sm_f2h(v[i]);
  } else {
    for (int b = 0; b < d / 32; b++) {  // one q8_0 block per pass: lane = element
      float x = v[b * 32 + lane];
      float amax = sm_warp_max(fabsf(x));
      float id = sm_q8_0_inv(amax);
      uint8_t* blk = dst + b * 34;
      if (lane == 0) *(uint16_t*)blk = sm_f2h(amax / 127.0f);  // f16 d, little-endian
      blk[2 + lane] = (uint8_t)(int8_t)sm_rint(x * id);
    }
  }
}

// The attention block's per-head step, fused: q, k and v heads get their biases (qb, kb,
// vb [heads·D]; null: none), q and k heads their RMSNorm (weights qn / kn [D]; null: none)
// and the rotation (`neox`: pairs (i, i + n_rot/2), else adjacent pairs (2i, 2i + 1), as
// ggml's NORM mode), q in place; the rotated k row and the v row go to the KV cache at
// position pos0 + t of the slot sp[1].
// q f32 [T, Nh, D], k and v f32 [T, Nkv, D] (k and v are left as they are).
// kc, vc: the layer's cache base of slot 0 ([Nkv][n_ctx] head rows); slot s adds
// s·slot_stride bytes.
// Launch: grid (Nh + 2·Nkv, T), block 32 (one warp per head).
template <int KV>
__device__ void rope_qkv(float* q, const float* k, const float* v, const float* qn,
                         const float* kn, const float* qb, const float* kb, const float* vb,
                         const float* cos_t, const float* sin_t, const int* sp, uint8_t* kc,
                         uint8_t* vc, unsigned long long slot_stride, int n_head, int n_head_kv,
                         int d, int n_rot, int neox, int n_ctx, float eps) {
  __shared__ float y[256];
  __shared__ float o[256];
  __shared__ double red[32];
  int lane = threadIdx.x, hi = blockIdx.x, t = blockIdx.y;
  int pos = sp[0] + t;
  if (pos >= n_ctx) return;  // refused by the host; never write out of the cache
  int kind = hi < n_head ? 0 : (hi < n_head + n_head_kv ? 1 : 2);
  int head = kind == 0 ? hi : (kind == 1 ? hi - n_head : hi - n_head - n_head_kv);
  const float* src = kind == 0 ? q + ((size_t)t * n_head + head) * d
                               : (kind == 1 ? k : v) + ((size_t)t * n_head_kv + head) * d;
  const float* bias = kind == 0 ? qb : (kind == 1 ? kb : vb);
  if (bias != nullptr) bias += (size_t)head * d;
  size_t row = (size_t)sp[1] * slot_stride + ((size_t)head * n_ctx + pos) * sm_head_bytes<KV>(d);
  if (kind == 2) {  // v: stored as is (plus its bias)
    for (int i = lane; i < d; i += 32) y[i] = bias != nullptr ? src[i] + bias[i] : src[i];
    __syncthreads();
    store_head<KV>(y, vc + row, d);
    return;
  }
  const float* w = kind == 0 ? qn : kn;
  double s = 0.0;
  for (int i = lane; i < d; i += 32) {
    float x = bias != nullptr ? src[i] + bias[i] : src[i];
    y[i] = x;
    s += (double)(x * x);
  }
  if (w != nullptr) {
    float scale = sm_rms_scale(sm_block_sum_d(s, red), d, eps);
    for (int i = lane; i < d; i += 32) y[i] = (y[i] * scale) * w[i];
  }
  __syncthreads();
  int half = n_rot / 2;
  const float* c = cos_t + (size_t)pos * half;
  const float* sn = sin_t + (size_t)pos * half;
  for (int i = lane; i < d; i += 32) {
    float r;
    if (i >= n_rot) {
      r = y[i];
    } else if (!neox) {  // adjacent pairs, in the CPU path's fused order
      int j = i >> 1;
      float x0 = y[i & ~1], x1 = y[i | 1];
      r = (i & 1) ? fmaf(x0, sn[j], x1 * c[j]) : fmaf(x0, c[j], -(x1 * sn[j]));
    } else if (i < half) {
      r = y[i] * c[i] - y[i + half] * sn[i];
    } else {
      int j = i - half;
      r = y[j] * sn[j] + y[i] * c[j];
    }
    o[i] = r;
  }
  __syncthreads();
  if (kind == 0) {
    float* dst = q + ((size_t)t * n_head + head) * d;
    for (int i = lane; i < d; i += 32) dst[i] = o[i];
  } else {
    store_head<KV>(o, kc + row, d);
  }
}

#define ROPE_QKV(NAME, KV)                                                                    \
  extern "C" __global__ void __launch_bounds__(32)                                           \
      NAME(float* q, const float* k, const float* v, const float* qn, const float* kn,       \
           const float* qb, const float* kb, const float* vb, const float* cos_t,            \
           const float* sin_t, const int* sp, uint8_t* kc, uint8_t* vc,                      \
           unsigned long long slot_stride, int n_head, int n_head_kv, int d, int n_rot,      \
           int neox, int n_ctx, float eps) {                                                 \
    rope_qkv<KV>(q, k, v, qn, kn, qb, kb, vb, cos_t, sin_t, sp, kc, vc, slot_stride, n_head, \
                 n_head_kv, d, n_rot, neox, n_ctx, eps);                                     \
  }

ROPE_QKV(strata_rope_qkv_f16, SM_KV_F16)
ROPE_QKV(strata_rope_qkv_q8_0, SM_KV_Q8_0)
