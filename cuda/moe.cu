// Routed experts, one launch per projection for all (token, slot) pairs (GPU_SPEC.md §4).
// Expert e's matrix is at ptrs[e] (device u64 table); 0 means not resident: that slot's outputs
// are zeros (gate/up) or contribute nothing (down), and the caller computes it elsewhere.
// A pointer not aligned for its type, or a negative id, is treated like 0 (never dereferenced).
//
// strata_moe_gate_up_<ty>(gate_ptrs, up_ptrs, ff, items, ids, top_k, x, act, tj0)
//   grid (⌈ff/4⌉, pairs), block 128; pair p = tj0 + blockIdx.y = t·top_k + j, e = ids[p]:
//   act[p, r] = silu(Wg[e][r]·x[t])·(Wu[e][r]·x[t]).  x: block_q8a [n_tok, items] (f32 for float types);
//   act f32 [n_tok·top_k, ff]; items = h/32.
// strata_moe_gate_<ty> writes act[p, r] = Wg[e][r]·x[t]; strata_moe_up_glu_<ty> then replaces it by
//   silu(act[p, r])·(Wu[e][r]·x[t]) — the two-launch form used when gate and up types differ.
// strata_moe_down_<ty>(down_ptrs, h, items, ids, weights, top_k, a, y, t0)
//   grid (⌈h/4⌉, tokens), block 128; t = t0 + blockIdx.y:
//   y[t, r] += Σ_j weights[t, j]·(Wd[ids[t, j]][r]·a[t·top_k + j]).  a: block_q8a [n_tok·top_k, items]
//   (f32 for float types), items = ff/32; y f32 [n_tok, h].
#include "vecdot.cuh"

// MODE 0: fused gate+up+SwiGLU (TG == TU); 1: gate only; 2: up times silu(act) in place.
template <class TG, class TU, int MODE>
__device__ __forceinline__ void moe_gate_up_body(const unsigned long long* gptrs,
                                                 const unsigned long long* uptrs, int ff, int items,
                                                 const int* ids, int top_k, const void* x,
                                                 float* act, int tj0) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * MMVQ_WARPS + warp;
    if (row >= ff) return;
    const long p = (long)tj0 + blockIdx.y;
    const long t = p / top_k;
    const int e = ids[p];
    float* out = act + p * ff + row;
    const uint8_t* wg = MODE == 2 ? nullptr : expert_ptr<TG>(gptrs, e);
    const uint8_t* wu = MODE == 1 ? nullptr : expert_ptr<TU>(uptrs, e);
    const bool ok = (MODE == 2 || wg != nullptr) && (MODE == 1 || wu != nullptr);
    if (!ok) {
        if (lane == 0) *out = 0.0f;
        return;
    }
    float g[1] = {0.0f}, u[1] = {0.0f};
    if constexpr (MODE == 0 && !TG::IS_FLOAT) {
        // Fused: one pass over the items decodes the gate and the up row and reads each int8
        // activation block once (twice the independent loads in flight per lane).
        const uint8_t* rg = wg + (size_t)row * row_bytes_of<TG>(items);
        const uint8_t* ru = wu + (size_t)row * row_bytes_of<TU>(items);
        const block_q8a* xq = (const block_q8a*)act_at<TG>(x, t, items);
#pragma unroll 2
        for (int i = lane; i < items; i += 32) {
            QItem ig, iu;
            TG::item(rg + (size_t)(i / TG::ITEMS) * TG::BYTES, i % TG::ITEMS, ig);
            TU::item(ru + (size_t)(i / TU::ITEMS) * TU::BYTES, i % TU::ITEMS, iu);
            uint32_t qa[8];
            const float da = load_q8a(xq + i, qa);
            g[0] += item_dot<TG>(ig, qa, da);
            u[0] += item_dot<TU>(iu, qa, da);
        }
    } else {
        if (MODE != 2)
            row_dot<TG, 1>(wg + (size_t)row * row_bytes_of<TG>(items), items,
                           act_at<TG>(x, t, items), 0, 1, g, lane);
        if (MODE != 1)
            row_dot<TU, 1>(wu + (size_t)row * row_bytes_of<TU>(items), items,
                           act_at<TU>(x, t, items), 0, 1, u, lane);
    }
    const float gs = warp_sum(g[0]), us = warp_sum(u[0]);
    if (lane == 0) {
        if (MODE == 0) *out = silu_mul(gs, us);
        else if (MODE == 1) *out = gs;
        else *out = silu_mul(*out, us);
    }
}

// Slots of one token handled together by a block (their pointers and weights in shared memory).
#define MOE_DOWN_SLOTS 32

// One warp per output row; its lanes walk the flattened (slot, item) pairs of the token, so the
// loads of all slots are independent and the lanes stay busy when a row has few items (ff = 768
// gives 24 items per slot).
template <class T>
__device__ __forceinline__ void moe_down_body(const unsigned long long* ptrs, int h, int items,
                                              const int* ids, const float* weights, int top_k,
                                              const void* a, float* y, int t0) {
    __shared__ const uint8_t* s_w[MOE_DOWN_SLOTS];
    __shared__ float s_wt[MOE_DOWN_SLOTS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * MMVQ_WARPS + warp;
    const bool active = row < h;
    const long t = (long)t0 + blockIdx.y;
    const size_t rb = row_bytes_of<T>(items);
    float acc = 0.0f;
    for (int j0 = 0; j0 < top_k; j0 += MOE_DOWN_SLOTS) {
        const int ns = min(MOE_DOWN_SLOTS, top_k - j0);
        __syncthreads();
        if (threadIdx.x < ns) {
            const long p = t * top_k + j0 + threadIdx.x;
            s_w[threadIdx.x] = expert_ptr<T>(ptrs, ids[p]);
            s_wt[threadIdx.x] = weights[p];
        }
        __syncthreads();
        if (!active) continue;
        const int total = ns * items;
        for (int q = lane; q < total; q += 32) {
            const int j = q / items, i = q - j * items;
            const uint8_t* w = s_w[j];
            if (w == nullptr) continue;
            const long p = t * top_k + j0 + j;
            acc += s_wt[j] * one_item_dot<T>(w + (size_t)row * rb, i, act_at<T>(a, p, items));
        }
    }
    if (!active) return;
    acc = warp_sum(acc);
    if (lane == 0) y[t * h + row] += acc;
}

#define MOE_KERNELS(name, T)                                                                      \
    extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) strata_moe_gate_up_##name(      \
        const unsigned long long* gptrs, const unsigned long long* uptrs, int ff, int items,      \
        const int* ids, int top_k, const void* x, float* act, int tj0) {                          \
        moe_gate_up_body<T, T, 0>(gptrs, uptrs, ff, items, ids, top_k, x, act, tj0);             \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) strata_moe_gate_##name(         \
        const unsigned long long* gptrs, int ff, int items, const int* ids, int top_k,            \
        const void* x, float* act, int tj0) {                                                     \
        moe_gate_up_body<T, T, 1>(gptrs, gptrs, ff, items, ids, top_k, x, act, tj0);             \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) strata_moe_up_glu_##name(       \
        const unsigned long long* uptrs, int ff, int items, const int* ids, int top_k,            \
        const void* x, float* act, int tj0) {                                                     \
        moe_gate_up_body<T, T, 2>(uptrs, uptrs, ff, items, ids, top_k, x, act, tj0);             \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) strata_moe_down_##name(         \
        const unsigned long long* ptrs, int h, int items, const int* ids, const float* weights,   \
        int top_k, const void* a, float* y, int t0) {                                             \
        moe_down_body<T>(ptrs, h, items, ids, weights, top_k, a, y, t0);                          \
    }

STRATA_FOR_TYPES(MOE_KERNELS)
