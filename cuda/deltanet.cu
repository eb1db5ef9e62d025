// The Gated DeltaNet mixer of the hybrid families (qwen3next, qwen35moe) and the output gate
// of their full-attention layers, as the CPU path computes them (rust/src/model/deltanet.rs).
//
// A recurrent layer over the step's T rows, after the projections (the quant matmuls):
//   qkv f32 [T, C] (C = 2·Nk·S + Nv·S: q [Nk, S], k [Nk, S], v [Nv, S]), z f32 [T, Nv·S],
//   β and α pre-activations (fused `ssm_ba` rows or split `ssm_beta` / `ssm_alpha`);
// 1. strata_gdn_conv (per piece): causal depthwise conv1d of width Kc over qkv with the
//    slot's conv state [Kc − 1, C], then silu, in place;
// 2. strata_gdn_prep (all rows): q and k heads L2-normed in place; per value head
//    β = σ(b), decay = exp(softplus(a + dt_bias)·A) into gates f32 [T, Nv, 2];
// 3. strata_gdn_recur (per piece): per value head h (reading key head kh) and token, with
//    M [S(v), S(k)] its state: M ← decay·M; δ = (v − M·k)·β; M ← M + δ ⊗ k;
//    o = (M·q)/√S into core f32 [T, Nv·S];
// 4. strata_gdn_gated_norm (all rows): RMSNorm of each head of core times w [S] times
//    silu(z), in place.
//
// Recurrent state, per slot (one device buffer each, its address in `st_tab` u64 [slots]):
// [Lr, Kc − 1, C] conv states, then [Lr, Nv, S, S] delta-rule states (f32), `sb` floats in
// all; a layer's part starts `off` floats in. A checkpoint is a copy of that whole buffer:
// `ck_tab` u64 [slots] holds each slot's checkpoint area ([cap + 1, sb]; 0: none yet) and a
// piece whose flag `ck[0]` is set (a speculative window) writes the state after its token at
// position p to snapshot p mod cap (both kernels write their layer's part of it).
// `sp` (device i32 [2]) is the piece's (pos0, slot), read at run time (graph replay).
#include "model.cuh"

#define GDN_KC_MAX 8       // conv widths up to this (Qwen's: 4)
#define GDN_EPL 8          // state values per lane of one row (S ≤ 256)
#define GDN_WARPS 4        // warps per recurrence block
#define GDN_RPW 4          // state rows per warp
#define GDN_ROWS (GDN_WARPS * GDN_RPW)

SM_D float gdn_silu(float x) { return x / (1.0f + expf(-x)); }
SM_D float gdn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
// ggml's softplus: x above 20, else ln(1 + eˣ)
SM_D float gdn_softplus(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }

// The slot's state (its snapshot area when `snap` ≥ 0) plus `off` floats.
SM_D float* gdn_state(const unsigned long long* tab, int slot, unsigned long long sb, long snap,
                      unsigned long long off) {
  float* base = (float*)tab[slot];
  if (base == nullptr) return nullptr;
  return base + (snap < 0 ? 0 : (unsigned long long)snap * sb) + off;
}

// Conv of one piece of t rows: x f32 [t, C] in place; w f32 [C, Kc]; the conv state of this
// layer at `off` floats into the slot's state.
// Launch: grid (ceil(C / 128)), block 128 (a thread per channel, looping over the tokens).
extern "C" __global__ void __launch_bounds__(128)
    strata_gdn_conv(float* x, const float* w, const unsigned long long* st_tab,
                    const unsigned long long* ck_tab, const int* sp, const int* ck,
                    unsigned long long sb, unsigned long long off, int cap, int t, int c,
                    int kc) {
  int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  int pos0 = sp[0], slot = sp[1];
  float* st = gdn_state(st_tab, slot, sb, -1, off);
  float win[GDN_KC_MAX];
  float wc[GDN_KC_MAX];
  for (int k = 0; k < kc; k++) wc[k] = w[(size_t)ch * kc + k];
  for (int k = 0; k < kc - 1; k++) win[k] = st[(size_t)k * c + ch];
  bool save = ck[0] != 0 && ck_tab[slot] != 0ull;
  for (int i = 0; i < t; i++) {
    float xv = x[(size_t)i * c + ch];
    float sum = 0.0f;
    for (int k = 0; k < kc - 1; k++) sum = fmaf(win[k], wc[k], sum);
    sum = fmaf(xv, wc[kc - 1], sum);
    for (int k = 0; k < kc - 2; k++) win[k] = win[k + 1];
    win[kc - 2] = xv;
    x[(size_t)i * c + ch] = gdn_silu(sum);
    if (save) {
      float* sn = gdn_state(ck_tab, slot, sb, (long)((pos0 + i + 1) % cap), off);
      for (int k = 0; k < kc - 1; k++) sn[(size_t)k * c + ch] = win[k];
    }
  }
  for (int k = 0; k < kc - 1; k++) st[(size_t)k * c + ch] = win[k];
}

// The per-row work between the conv and the recurrence, over every row: the q and k heads
// of qkv f32 [T, C] L2-normed in place (as llama.cpp's: x·(1/√(mean(x²) + eps/S))·(1/√S),
// the sum in f64); gates f32 [T, Nv, 2] = (β, decay) per value head.
// β / α of row r, value head h: `fused` (ssm_ba rows [Nk][β r', α r'], r' = Nv/Nk):
// b[r·2Nv + (h/r')·2r' + h mod r'] and that + r'; else b[r·Nv + h] and a[r·Nv + h].
// Launch: grid (2·Nk + 1, T), block 32: a warp per head; the last one the gates.
extern "C" __global__ void __launch_bounds__(32)
    strata_gdn_prep(float* qkv, const float* b, const float* a, const float* dt_bias,
                    const float* a_log, float* gates, int c, int nk, int nv, int s, int fused,
                    float eps) {
  int lane = threadIdx.x, hi = blockIdx.x, r = blockIdx.y;
  if (hi == 2 * nk) {
    int rr = nv / nk;
    for (int h = lane; h < nv; h += 32) {
      float bv, av;
      if (fused) {
        size_t at = (size_t)r * 2 * nv + (size_t)(h / rr) * 2 * rr + h % rr;
        bv = b[at];
        av = b[at + rr];
      } else {
        bv = b[(size_t)r * nv + h];
        av = a[(size_t)r * nv + h];
      }
      float g = gdn_softplus(av + dt_bias[h]) * a_log[h];
      gates[((size_t)r * nv + h) * 2] = gdn_sigmoid(bv);
      gates[((size_t)r * nv + h) * 2 + 1] = expf(g);
    }
    return;
  }
  float* x = qkv + (size_t)r * c + (size_t)hi * s;
  double sum = 0.0;
  for (int i = lane; i < s; i += 32) sum += (double)(x[i] * x[i]);
  sum = sm_warp_sum_d(sum);
  float n = (float)s;
  float mean = (float)(sum / (double)s);
  float scale = 1.0f / sqrtf(mean + eps / n);
  float post = 1.0f / sqrtf(n);
  for (int i = lane; i < s; i += 32) x[i] = (x[i] * scale) * post;
}

// The delta rule over one piece of t rows (rows r0.. of qkv and gates, already offset by the
// host): core f32 [t, Nv·S] the output before the gated norm. `grouped`: value head h reads
// key head h / (Nv/Nk), else h mod Nk. The layer's delta-rule state at `off` floats.
// Launch: grid (Nv, ceil(S / GDN_ROWS)), block 32·GDN_WARPS: each warp keeps GDN_RPW rows of
// its head's state in registers (S/32 values per lane and row) over the piece's tokens.
extern "C" __global__ void __launch_bounds__(32 * GDN_WARPS)
    strata_gdn_recur(const float* qkv, const float* gates, float* core,
                     const unsigned long long* st_tab, const unsigned long long* ck_tab,
                     const int* sp, const int* ck, unsigned long long sb,
                     unsigned long long off, int cap, int t, int c, int nk, int nv, int s,
                     int grouped) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int hv = blockIdx.x;
  int kh = grouped ? hv / (nv / nk) : hv % nk;
  int j0 = (blockIdx.y * GDN_WARPS + warp) * GDN_RPW;
  int pos0 = sp[0], slot = sp[1];
  size_t head = (size_t)hv * s * s;
  float* st = gdn_state(st_tab, slot, sb, -1, off) + head;
  bool save = ck[0] != 0 && ck_tab[slot] != 0ull;
  float m[GDN_RPW][GDN_EPL];
#pragma unroll
  for (int rr = 0; rr < GDN_RPW; rr++) {
    int j = j0 + rr;
#pragma unroll
    for (int e = 0; e < GDN_EPL; e++) {
      int i = lane + 32 * e;
      m[rr][e] = (j < s && i < s) ? st[(size_t)j * s + i] : 0.0f;
    }
  }
  float scale = 1.0f / sqrtf((float)s);
  for (int tok = 0; tok < t; tok++) {
    const float* row = qkv + (size_t)tok * c;
    const float* q = row + (size_t)kh * s;
    const float* k = row + (size_t)(nk + kh) * s;
    const float* v = row + (size_t)2 * nk * s + (size_t)hv * s;
    float beta = gates[((size_t)tok * nv + hv) * 2];
    float decay = gates[((size_t)tok * nv + hv) * 2 + 1];
    float qe[GDN_EPL], ke[GDN_EPL];
#pragma unroll
    for (int e = 0; e < GDN_EPL; e++) {
      int i = lane + 32 * e;
      qe[e] = i < s ? q[i] : 0.0f;
      ke[e] = i < s ? k[i] : 0.0f;
    }
    float* sn = save ? gdn_state(ck_tab, slot, sb, (long)((pos0 + tok + 1) % cap), off) + head
                     : nullptr;
#pragma unroll
    for (int rr = 0; rr < GDN_RPW; rr++) {
      int j = j0 + rr;
      float dk = 0.0f;
#pragma unroll
      for (int e = 0; e < GDN_EPL; e++) {
        m[rr][e] *= decay;
        dk = fmaf(m[rr][e], ke[e], dk);
      }
      dk = sm_warp_sum(dk);
      float vj = j < s ? v[j] : 0.0f;
      float dj = (vj - dk) * beta;
      float oq = 0.0f;
#pragma unroll
      for (int e = 0; e < GDN_EPL; e++) {
        m[rr][e] = fmaf(ke[e], dj, m[rr][e]);
        oq = fmaf(m[rr][e], qe[e], oq);
      }
      oq = sm_warp_sum(oq);
      if (j < s) {
        if (lane == 0) core[(size_t)tok * nv * s + (size_t)hv * s + j] = oq * scale;
        if (sn != nullptr) {
#pragma unroll
          for (int e = 0; e < GDN_EPL; e++) {
            int i = lane + 32 * e;
            if (i < s) sn[(size_t)j * s + i] = m[rr][e];
          }
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < GDN_RPW; rr++) {
    int j = j0 + rr;
#pragma unroll
    for (int e = 0; e < GDN_EPL; e++) {
      int i = lane + 32 * e;
      if (j < s && i < s) st[(size_t)j * s + i] = m[rr][e];
    }
  }
}

// o f32 [T, Nv, S] in place: each head RMSNorm'd (f64 sum) times w [S] times silu(z)
// (z f32 [T, Nv·S]). Launch: grid (Nv, T), block 32.
extern "C" __global__ void __launch_bounds__(32)
    strata_gdn_gated_norm(float* o, const float* z, const float* w, int nv, int s, float eps) {
  int lane = threadIdx.x;
  size_t at = ((size_t)blockIdx.y * nv + blockIdx.x) * s;
  float* x = o + at;
  const float* zh = z + at;
  double sum = 0.0;
  for (int i = lane; i < s; i += 32) sum += (double)(x[i] * x[i]);
  sum = sm_warp_sum_d(sum);
  float scale = sm_rms_scale(sum, s, eps);
  for (int i = lane; i < s; i += 32) x[i] = ((x[i] * scale) * w[i]) * gdn_silu(zh[i]);
}

// The gated attention's q projection qg f32 [T, Nh, 2D] (per head [q D, gate D]) split into
// q f32 [T, Nh·D] and gate f32 [T, Nh·D]. Launch: grid (ceil(T·Nh·D / 256)), block 256.
extern "C" __global__ void strata_gdn_split_q(const float* qg, float* q, float* gate, int n,
                                              int d) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int hd = i / d, e = i % d;
  q[i] = qg[(size_t)hd * 2 * d + e];
  gate[i] = qg[(size_t)hd * 2 * d + d + e];
}

// att[i] *= σ(gate[i]) for i < n (the gated attention's output gate).
// Launch: grid (ceil(n / 256)), block 256.
extern "C" __global__ void strata_gdn_sigmoid_mul(float* att, const float* gate, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) att[i] *= gdn_sigmoid(gate[i]);
}
