// The MoE router of one token per block: p = softmax(logits) over the E experts (max
// subtracted, f32 exponentials, f64 sum, then p·(1/sum) as the CPU path computes it), the
// top k by p (ties: the lower expert id first, as rust/src/model/forward.rs `route`), and
// their weights p[id], renormalized to sum to 1 (summed in f32 in pick order) when `norm`.
//
// logits f32 [T, E], ids i32 [T, k] (by descending p), w f32 [T, k]. E ≤ 1024, k ≤ 64.
// Launch: grid (T), block 32.
#include "model.cuh"
#include "vecdot.cuh"

#define ROUTER_MAX_E 1024

// expf as the CPU path's libm computes it (glibc's expf: a double evaluation rounded once,
// within 0.502 ulp), not CUDA's expf (within 2 ulp): σ of the router logits then ties and
// orders the experts as the CPU path does.
SM_HD float sm_expf(float x) { return (float)exp((double)x); }
#define ROUTER_MAX_K 64

// The k largest entries of score [n] in turn by the block's one warp (ties: the lower id
// first; each taken entry set to -inf): ids_row[j] = its id, pick[j] = val[id] (val may be
// score itself: read before the entry is taken). score and pick in shared memory.
SM_D void router_pick_k(float* score, const float* val, int n, int k, int* ids_row,
                        float* pick) {
  const int lane = threadIdx.x;
  for (int j = 0; j < k; j++) {
    float bv = -__builtin_huge_valf();
    int bi = n;
    for (int i = lane; i < n; i += 32) {
      if (score[i] > bv) {  // ascending i: the first maximum of this lane
        bv = score[i];
        bi = i;
      }
    }
    sm_warp_argmax(bv, bi);
    if (lane == 0) {
      if (bi >= n) bi = j;  // all remaining are -inf/NaN: never out of range
      ids_row[j] = bi;
      pick[j] = val[bi];
      score[bi] = -__builtin_huge_valf();
    }
    __syncthreads();
  }
}

// The k largest of the values v[j] = score of entry lane + 32·j (NJ per lane, -inf past n)
// held in the warp's registers, in turn (ties: the lower id first, as `router_pick_k`):
// ids_row[j] = its id, pick[j] = v at the id (both written and read by lane 0 only). Each
// lane keeps its own best; after a round only the winner's lane looks again: no shared
// scan, no block barrier per pick.
template <int NJ>
SM_D void router_pick_regs(float (&v)[NJ], int n, int k, int* ids_row, float* pick) {
  const int lane = threadIdx.x;
  float bv;
  int bj;
  auto own_best = [&]() {
    bv = -__builtin_huge_valf();
    bj = NJ;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      if (v[j] > bv) {  // ascending j: the first maximum of this lane
        bv = v[j];
        bj = j;
      }
    }
  };
  own_best();
  for (int j = 0; j < k; j++) {
    float wv = bv;
    int wi = bj < NJ ? lane + 32 * bj : n;
    sm_warp_argmax(wv, wi);
    if (wi >= n) wi = j;  // all remaining are -inf/NaN: never out of range
    const int r = wi >> 5;
    float mine = 0.0f;
#pragma unroll
    for (int q = 0; q < NJ; q++)
      if (q == r) mine = v[q];
    const float pv = __shfl_sync(0xffffffffu, mine, wi & 31);
    if (lane == 0) {
      ids_row[j] = wi;
      pick[j] = pv;
    }
    if (lane == (wi & 31)) {
#pragma unroll
      for (int q = 0; q < NJ; q++)
        if (q == r) v[q] = -__builtin_huge_valf();
      own_best();
    }
  }
}

// p = softmax(logits row) in registers (lane + 32·j, NJ per lane), then the top k; ids2_row
// / w2_row (or null): the same ids and weights again.
template <int NJ>
SM_D void router_topk_row(const float* x, int* ids_row, float* w_row, int* ids2_row,
                          float* w2_row, int n_expert, int k, int norm, float* pick) {
  const int lane = threadIdx.x;
  float p[NJ];
  float mx = -__builtin_huge_valf();
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    const int i = lane + 32 * j;
    // (L2 reads: the fused router's last block reads logits other blocks wrote)
    p[j] = i < n_expert ? __ldcg(x + i) : -__builtin_huge_valf();
    mx = fmaxf(mx, p[j]);
  }
  mx = sm_warp_max(mx);
  double s = 0.0;
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    if (lane + 32 * j < n_expert) {
      float e = expf(p[j] - mx);
      p[j] = e;
      s += (double)e;
    }
  }
  float inv = (float)(1.0 / sm_warp_sum_d(s));
#pragma unroll
  for (int j = 0; j < NJ; j++)
    if (lane + 32 * j < n_expert) p[j] *= inv;
  router_pick_regs<NJ>(p, n_expert, k, ids_row, pick);
  if (lane == 0) {
    float sum = 0.0f;
    for (int j = 0; j < k; j++) sum += pick[j];
    for (int j = 0; j < k; j++) w_row[j] = norm ? pick[j] / sum : pick[j];
    if (ids2_row != nullptr) {
      for (int j = 0; j < k; j++) {
        ids2_row[j] = ids_row[j];
        w2_row[j] = w_row[j];
      }
    }
  }
}

// `router_topk_row` with the fewest registers per lane that hold n_expert (≤ ROUTER_MAX_E).
SM_D void router_topk_any(const float* x, int* ids_row, float* w_row, int* ids2_row,
                          float* w2_row, int n_expert, int k, int norm, float* pick) {
  if (n_expert <= 128)
    router_topk_row<4>(x, ids_row, w_row, ids2_row, w2_row, n_expert, k, norm, pick);
  else if (n_expert <= 256)
    router_topk_row<8>(x, ids_row, w_row, ids2_row, w2_row, n_expert, k, norm, pick);
  else
    router_topk_row<ROUTER_MAX_E / 32>(x, ids_row, w_row, ids2_row, w2_row, n_expert, k, norm,
                                       pick);
}

// ids2 i32 [T, k] / w2 f32 [T, k], or null: the routing again (a hybrid layer's copy for the
// host, in mapped memory: no copy kernel after this one).
extern "C" __global__ void __launch_bounds__(32)
    strata_router_topk(const float* logits, int* ids, float* w, int* ids2, float* w2,
                       int n_expert, int k, int norm) {
  __shared__ float pick[ROUTER_MAX_K];
  const int t = blockIdx.x;
  const float* x = logits + (size_t)t * n_expert;
  const size_t o = (size_t)t * k;
  int *ir = ids + o, *ir2 = ids2 != nullptr ? ids2 + o : nullptr;
  float *wr = w + o, *wr2 = ids2 != nullptr ? w2 + o : nullptr;
  router_topk_any(x, ir, wr, ir2, wr2, n_expert, k, norm, pick);
}

// One token's softmax router fused with its logits (decode): block e computes logit e =
// W[e]·x exactly as strata_mmvq_f32_r1 does (`mmvq_r1_body`), and the last block to finish
// (`done`: a zeroed counter, left at zero again) runs strata_router_topk's row on them, so
// ids, w (and the copy) are bitwise the unfused pair's, one launch fewer on the layer's chain.
// w_r f32 [E, H] (items = H / 32), x f32 [H], logits f32 [E] (written), ids i32 [k], w f32 [k].
// Launch: grid (E), block MMVQ_WARPS·32.
extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32)
    strata_router_f32_topk(const uint8_t* w_r, int items, const float* x, float* logits,
                           int* ids, float* w, int* ids2, float* w2, int n_expert, int k, int norm,
                           int* done) {
  __shared__ float pick[ROUTER_MAX_K];
  __shared__ int is_last;
  mmvq_r1_body<TF32>(w_r, n_expert, items, x, logits);
  __threadfence();  // this block's logit, before its count
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(done, 1) == n_expert - 1;
  __syncthreads();
  if (!is_last || threadIdx.x >= 32) return;
  if (threadIdx.x == 0) *done = 0;  // ready for the next launch (stream-ordered)
  router_topk_any(logits, ids, w, ids2, w2, n_expert, k, norm, pick);
}

// gpt-oss's router (`Routing::SoftmaxWeight`): the top k logits (ties: the lower expert id
// first), weighted by the softmax over those k as the CPU path's (max subtracted, `sm_expf`,
// f64 sum in pick order, then e·(1/sum)). logits f32 [T, E], ids i32 [T, k], w f32 [T, k].
// Launch: grid (T), block 32.
extern "C" __global__ void __launch_bounds__(32)
    strata_router_topk_softmax(const float* logits, int* ids, float* w, int n_expert, int k) {
  __shared__ float p[ROUTER_MAX_E];
  __shared__ float pick[ROUTER_MAX_K];
  const int lane = threadIdx.x, t = blockIdx.x;
  const float* x = logits + (size_t)t * n_expert;
  for (int i = lane; i < n_expert; i += 32) p[i] = x[i];
  __syncthreads();
  router_pick_k(p, p, n_expert, k, ids + (size_t)t * k, pick);
  if (lane == 0) {
    float mx = -__builtin_huge_valf();
    for (int j = 0; j < k; j++) mx = fmaxf(mx, pick[j]);
    double s = 0.0;
    for (int j = 0; j < k; j++) {
      pick[j] = sm_expf(pick[j] - mx);
      s += (double)pick[j];
    }
    const float inv = (float)(1.0 / s);
    for (int j = 0; j < k; j++) w[(size_t)t * k + j] = pick[j] * inv;
  }
}

// A dense FFN's per-row scale from its gate logit g f32 [n] (`rust/src/gpu/ffn.rs`):
// mode 0: silu(g)/g as qwen2moe's ggml_silu then ggml_div (g = 0 gives 0.5, the limit);
// mode 1: σ(g) (ggml_sigmoid). w f32 [n]. Launch: grid (ceil(n / 256)), block 256.
extern "C" __global__ void strata_ffn_gate(const float* g, float* w, int n, int mode) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = g[i];
  float e = sm_expf(-x);
  w[i] = mode == 1 ? 1.0f / (1.0f + e) : (x == 0.0f ? 0.5f : (x / (1.0f + e)) / x);
}

// The biased router of one token per block (`Routing::SigmoidBias` / `SoftmaxBias` in
// rust/src/model/arch.rs): p = σ(logits) per expert (`sm_expf`) when gate is 0 (glm4moe),
// the softmax over the experts when 1 (ERNIE 4.5: max subtracted, f32 exponentials, f64 sum,
// then p·(1/sum), as `router_topk_row`), the top k by
// p + bias (the selection bias exp_probs_b [E]; ties: the lower expert id first), weighted by
// their unbiased p; when `norm`, divided by their sum (an f64 sum in pick order, rounded to
// f32 and clamped below at 2^-14, as ggml); then × `scale` (skipped when 1).
// logits f32 [T, E], bias f32 [E], ids i32 [T, k], w f32 [T, k]. E ≤ 1024, k ≤ 64.
// Launch: grid (T), block 32.
extern "C" __global__ void __launch_bounds__(32)
    strata_router_biased_topk(const float* logits, const float* bias, int* ids, float* w,
                              int n_expert, int k, int gate, int norm, float scale) {
  __shared__ float p[ROUTER_MAX_E];
  __shared__ float sel[ROUTER_MAX_E];
  __shared__ float pick[ROUTER_MAX_K];
  const int lane = threadIdx.x, t = blockIdx.x;
  const float* x = logits + (size_t)t * n_expert;
  if (gate == 1) {
    float mx = -__builtin_huge_valf();
    for (int i = lane; i < n_expert; i += 32) mx = fmaxf(mx, x[i]);
    mx = sm_warp_max(mx);
    double s = 0.0;
    for (int i = lane; i < n_expert; i += 32) {
      float e = expf(x[i] - mx);
      p[i] = e;
      s += (double)e;
    }
    const float inv = (float)(1.0 / sm_warp_sum_d(s));
    for (int i = lane; i < n_expert; i += 32) {
      p[i] *= inv;
      sel[i] = p[i] + bias[i];
    }
  } else {
    for (int i = lane; i < n_expert; i += 32) {
      float s = 1.0f / (1.0f + sm_expf(-x[i]));
      p[i] = s;
      sel[i] = s + bias[i];
    }
  }
  __syncthreads();
  router_pick_k(sel, p, n_expert, k, ids + (size_t)t * k, pick);
  if (lane == 0) {
    float div = 1.0f;
    if (norm) {
      double sum = 0.0;
      for (int j = 0; j < k; j++) sum += (double)pick[j];
      div = fmaxf((float)sum, 6.103515625e-5f);
    }
    for (int j = 0; j < k; j++) {
      float v = norm ? pick[j] / div : pick[j];
      w[(size_t)t * k + j] = scale != 1.0f ? v * scale : v;
    }
  }
}
