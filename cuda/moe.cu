// Routed experts, one launch per projection for all (token, slot) pairs (docs/GPU.md).
// Expert e's matrix is at ptrs[e] (device u64 table); 0 means not resident: that slot's outputs
// are zeros (gate/up) or contribute nothing (down), and the caller computes it elsewhere.
// A pointer not aligned for its type, or a negative id, is treated like 0 (never dereferenced).
//
// strata_moe_gate_up_<ty>(gate_ptrs, up_ptrs, ff, items, ids, top_k, x, act, tj0)
//   grid (⌈ff/8⌉, pairs), block 256 (one row per warp); pair p = tj0 + blockIdx.y = t·top_k + j,
//   e = ids[p]: act[p, r] = silu(Wg[e][r]·x[t])·(Wu[e][r]·x[t]).  x: block_q8a [n_tok, items]
//   (f32 for float types); act f32 [n_tok·top_k, ff]; items = h/32. The block first copies
//   x[t]'s int8 blocks (every row reads them) and each warp its gate and up rows to shared
//   memory with coalesced loads (when they fit: MOE_STAGE_ITEMS, MOE_STAGE_ROW), so the lanes'
//   scattered item reads hit shared memory.
// strata_moe_gate_<ty> writes act[p, r] = Wg[e][r]·x[t]; strata_moe_up_glu_<ty> then replaces it by
//   silu(act[p, r])·(Wu[e][r]·x[t]) — the two-launch form used when gate and up types differ.
// strata_moe_up_oai_<ty>(uptrs, ff, items, ids, top_k, x, act, tj0, gb, ub, alpha, limit): gpt-oss's
//   second launch after strata_moe_gate_<ty>: act[p, r] = swiglu_oai(act[p, r] + gb[e, r],
//   Wu[e][r]·x[t] + ub[e, r]) (biases f32 [E, ff]; vecdot.cuh swiglu_oai).
// strata_moe_down_<ty>(down_ptrs, h, items, ids, weights, top_k, a, y, t0)
//   grid (⌈h/4⌉, tokens), block 32·min(top_k, 8); t = t0 + blockIdx.y:
//   y[t, r] += Σ_j weights[t, j]·(Wd[ids[t, j]][r]·a[t·top_k + j]).  a: block_q8a [n_tok·top_k, items]
//   (f32 for float types), items = ff/32; y f32 [n_tok, h]. Warp w takes the slots j ≡ w (mod
//   warps) of the block's 4 rows, 8 lanes a row, each lane MOE_NI items at once.
// strata_moe_gate_up_act_<ty> (Q4_K and Q6_K only): gate/up staging only the activations, the
//   lanes reading the weights from global memory; strata_moe_gate_up_v0_<ty>,
//   strata_moe_down_v0_<ty> (Q4_K and Q6_K only): the earlier forms (block 128, one row per warp, activations read from global
//   memory; down: the warp's lanes over all (slot, item) pairs). Timed against the default
//   forms by bench/gpu_quant_bench.py (QuantOps::set_moe_variant).
#include "vecdot.cuh"

// Warps (rows) per block of the gate/up kernel; the most int8 activation blocks of a token it
// stages in shared memory (h ≤ 4096), and the longest gate/up row it stages per warp (Q4_K,
// IQ4_XS: h ≤ 2048; Q8_0: h ≤ 1024).
#define MOE_GU_WARPS 8
#define MOE_STAGE_ITEMS 128
#define MOE_STAGE_ROW 1152

// g += Wg_row·x, u += Wu_row·x over this lane's items (lane, lane + 32, ...): NI items a pass,
// indices past the row clamped to its last item (loads stay in bounds) and dropped.
template <class T, int NI>
__device__ __forceinline__ void gate_up_dots(const uint8_t* __restrict__ rg,
                                             const uint8_t* __restrict__ ru, int items,
                                             const block_q8a* xa, int lane, float& g, float& u) {
    for (int i0 = lane; i0 < items; i0 += 32 * NI) {
        QItem ig[NI], iu[NI];
        uint32_t qa[NI][8];
        float da[NI];
#pragma unroll
        for (int k = 0; k < NI; ++k) {
            const int i = min(i0 + 32 * k, items - 1);
            T::item(rg + (size_t)(i / T::ITEMS) * T::BYTES, i % T::ITEMS, ig[k]);
            T::item(ru + (size_t)(i / T::ITEMS) * T::BYTES, i % T::ITEMS, iu[k]);
            da[k] = load_q8a(xa + i, qa[k]);
        }
#pragma unroll
        for (int k = 0; k < NI; ++k) {
            if (i0 + 32 * k < items) {
                g += item_dot<T>(ig[k], qa[k], da[k]);
                u += item_dot<T>(iu[k], qa[k], da[k]);
            }
        }
    }
}

// MODE 0: fused gate+up+SwiGLU (TG == TU); 1: gate only; 2: up times silu(act) in place;
// 3: up with gpt-oss's biases and clamped SwiGLU on act in place (`oai`).
// NI: items per lane whose loads are issued together (fused mode). ROWS (fused mode): each warp
// also copies its gate and up rows to shared memory with coalesced 16-byte loads (rows of a
// multiple of 16 bytes, at most MOE_STAGE_ROW, 16-byte aligned), and the lanes decode their
// items from there.
template <class TG, class TU, int MODE, int NI, bool ROWS>
__device__ __forceinline__ void moe_gate_up_body(const unsigned long long* gptrs,
                                                 const unsigned long long* uptrs, int ff, int items,
                                                 const int* ids, int top_k, const void* x,
                                                 float* act, int tj0, OaiGlu oai = {}) {
    constexpr bool STAGE = MODE == 0 && !TG::IS_FLOAT;
    constexpr bool SROWS = STAGE && ROWS;
    __shared__ block_q8a s_x[STAGE ? MOE_STAGE_ITEMS : 1];
    __shared__ __align__(16) uint8_t s_rows[SROWS ? MOE_GU_WARPS : 1][SROWS ? 2 * MOE_STAGE_ROW : 16];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + warp;
    const long p = (long)tj0 + blockIdx.y;
    const long t = p / top_k;
    // the expert's rows first: their address loads overlap the staging copy
    const int e = ids[p];
    const uint8_t* wg = MODE >= 2 ? nullptr : expert_ptr<TG>(gptrs, e);
    const uint8_t* wu = MODE == 1 ? nullptr : expert_ptr<TU>(uptrs, e);
    const bool ok = (MODE >= 2 || wg != nullptr) && (MODE == 1 || wu != nullptr);
    const bool staged = STAGE && items <= MOE_STAGE_ITEMS;
    const size_t rbg = row_bytes_of<TG>(items);
    // uniform over the block (one expert)
    const bool rows_staged = SROWS && staged && ok && rbg % 16 == 0 && rbg <= MOE_STAGE_ROW &&
                             (uintptr_t)wg % 16 == 0 && (uintptr_t)wu % 16 == 0;
    if (staged) {
        // the warp's gate and up rows (rows past ff copy the last one) as 16-byte words and the
        // token's items·36 activation bytes as words: all loads issued before the stores
        const int n16 = rows_staged ? (int)(rbg / 16) : 0, nx = items * 9;
        constexpr int THREADS = MOE_GU_WARPS * 32;
        StageCopy<uint4, SROWS ? (MOE_STAGE_ROW / 16 + 31) / 32 : 1> cg, cu;
        StageCopy<uint32_t, (MOE_STAGE_ITEMS * 9 + THREADS - 1) / THREADS> cx;
        const size_t r = (size_t)min(row, ff - 1);
        if (rows_staged) {
            cg.load((const uint4*)(wg + r * rbg), n16, lane, 32);
            cu.load((const uint4*)(wu + r * rbg), n16, lane, 32);
        }
        cx.load((const uint32_t*)act_at<TG>(x, t, items), nx, threadIdx.x, THREADS);
        if (rows_staged) {
            cg.store((uint4*)s_rows[warp], n16, lane, 32);
            cu.store((uint4*)s_rows[warp] + n16, n16, lane, 32);
        }
        cx.store((uint32_t*)s_x, nx, threadIdx.x, THREADS);
        __syncthreads();
    }
    if (row >= ff) return;
    float* out = act + p * ff + row;
    if (!ok) {
        if (lane == 0) *out = 0.0f;
        return;
    }
    float g[1] = {0.0f}, u[1] = {0.0f};
    if constexpr (STAGE) {
        // Fused: one pass over the items decodes the gate and the up row and reads each int8
        // activation block once (twice the independent loads in flight per lane).
        const uint8_t* rg = wg + (size_t)row * rbg;
        const uint8_t* ru = wu + (size_t)row * rbg;
        if (rows_staged)
            gate_up_dots<TG, NI>(s_rows[warp], s_rows[warp] + rbg, items, s_x, lane, g[0], u[0]);
        else if (staged) gate_up_dots<TG, NI>(rg, ru, items, s_x, lane, g[0], u[0]);
        else gate_up_dots<TG, NI>(rg, ru, items, (const block_q8a*)act_at<TG>(x, t, items), lane,
                                  g[0], u[0]);
    } else {
        if (MODE < 2)
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
        else if (MODE == 2) *out = silu_mul(*out, us);
        else {
            const size_t b = (size_t)e * ff + row;
            *out = swiglu_oai(*out + oai.gb[b], us + oai.ub[b], oai.alpha, oai.limit);
        }
    }
}

// Slots of one token whose pointers and weights a block holds in shared memory at a time.
#define MOE_DOWN_SLOTS 32
// Output rows per block of the down kernel, the most warps it runs (slots j ≡ warp mod warps),
// and items per lane whose loads are issued together (ff = 768: 24 items, 8 lanes a row: 3).
#define MOE_DOWN_ROWS 4
#define MOE_DOWN_WARPS 8
#define MOE_DOWN_NI 3

// A warp holds the block's 4 rows for its slots: lane = 8·r + sub takes row r's items sub,
// sub + 8, ...; the lanes of a row are summed by shuffles, then the warps' sums in a fixed order.
template <class T>
__device__ __forceinline__ void moe_down_body(const unsigned long long* ptrs, int h, int items,
                                              const int* ids, const float* weights, int top_k,
                                              const void* a, float* y, int t0) {
    constexpr int LPR = 32 / MOE_DOWN_ROWS;  // lanes per row
    __shared__ const uint8_t* s_w[MOE_DOWN_SLOTS];
    __shared__ float s_wt[MOE_DOWN_SLOTS];
    __shared__ float part[MOE_DOWN_WARPS][MOE_DOWN_ROWS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nw = blockDim.x >> 5;
    const int r = lane / LPR, sub = lane % LPR;
    const int row = blockIdx.x * MOE_DOWN_ROWS + r;
    const int rowc = min(row, h - 1);  // rows past h compute row h − 1 and drop it
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
        for (int j = warp; j < ns; j += nw) {
            const uint8_t* w = s_w[j];
            if (w == nullptr) continue;  // the whole warp
            const uint8_t* wr = w + (size_t)rowc * rb;
            const void* xt = act_at<T>(a, t * top_k + j0 + j, items);
            float sj = 0.0f;
            for (int i0 = sub; i0 < items; i0 += LPR * MOE_DOWN_NI) {
                float d[MOE_DOWN_NI];
#pragma unroll
                for (int k = 0; k < MOE_DOWN_NI; ++k)
                    d[k] = one_item_dot<T>(wr, min(i0 + LPR * k, items - 1), xt);
#pragma unroll
                for (int k = 0; k < MOE_DOWN_NI; ++k)
                    if (i0 + LPR * k < items) sj += d[k];
            }
            acc += s_wt[j] * sj;
        }
    }
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (sub == 0) part[warp][r] = acc;
    __syncthreads();
    if (threadIdx.x < MOE_DOWN_ROWS) {
        const int orow = blockIdx.x * MOE_DOWN_ROWS + threadIdx.x;
        if (orow < h) {
            float s = part[0][threadIdx.x];
            for (int w = 1; w < nw; ++w) s += part[w][threadIdx.x];
            y[t * h + orow] += s;
        }
    }
}

// ---- the earlier forms (timing baseline) ----

// (MODE as moe_gate_up_body's; only 0 is instantiated)
template <class TG, class TU, int MODE>
__device__ __forceinline__ void moe_gate_up_v0_body(const unsigned long long* gptrs,
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

// One warp per output row; its lanes walk the flattened (slot, item) pairs of the token, so the
// loads of all slots are independent and the lanes stay busy when a row has few items (ff = 768
// gives 24 items per slot).
template <class T>
__device__ __forceinline__ void moe_down_v0_body(const unsigned long long* ptrs, int h, int items,
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
    extern "C" __global__ void __launch_bounds__(MOE_GU_WARPS * 32, 6) strata_moe_gate_up_##name(   \
        const unsigned long long* gptrs, const unsigned long long* uptrs, int ff, int items,      \
        const int* ids, int top_k, const void* x, float* act, int tj0) {                          \
        moe_gate_up_body<T, T, 0, 1, true>(gptrs, uptrs, ff, items, ids, top_k, x, act, tj0);    \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_GU_WARPS * 32) strata_moe_gate_##name(         \
        const unsigned long long* gptrs, int ff, int items, const int* ids, int top_k,            \
        const void* x, float* act, int tj0) {                                                     \
        moe_gate_up_body<T, T, 1, 1, false>(gptrs, gptrs, ff, items, ids, top_k, x, act, tj0);          \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_GU_WARPS * 32) strata_moe_up_glu_##name(       \
        const unsigned long long* uptrs, int ff, int items, const int* ids, int top_k,            \
        const void* x, float* act, int tj0) {                                                     \
        moe_gate_up_body<T, T, 2, 1, false>(uptrs, uptrs, ff, items, ids, top_k, x, act, tj0);          \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_GU_WARPS * 32) strata_moe_up_oai_##name(       \
        const unsigned long long* uptrs, int ff, int items, const int* ids, int top_k,            \
        const void* x, float* act, int tj0, const float* gb, const float* ub, float alpha,        \
        float limit) {                                                                            \
        moe_gate_up_body<T, T, 3, 1, false>(uptrs, uptrs, ff, items, ids, top_k, x, act, tj0,     \
                                            OaiGlu{gb, ub, alpha, limit});                        \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_DOWN_WARPS * 32) strata_moe_down_##name(         \
        const unsigned long long* ptrs, int h, int items, const int* ids, const float* weights,   \
        int top_k, const void* a, float* y, int t0) {                                             \
        moe_down_body<T>(ptrs, h, items, ids, weights, top_k, a, y, t0);                          \
    }

STRATA_FOR_TYPES(MOE_KERNELS)

#define MOE_V0_KERNELS(name, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(MOE_GU_WARPS * 32) strata_moe_gate_up_act_##name( \
        const unsigned long long* gptrs, const unsigned long long* uptrs, int ff, int items,      \
        const int* ids, int top_k, const void* x, float* act, int tj0) {                          \
        moe_gate_up_body<T, T, 0, 1, false>(gptrs, uptrs, ff, items, ids, top_k, x, act, tj0);          \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) strata_moe_gate_up_v0_##name(   \
        const unsigned long long* gptrs, const unsigned long long* uptrs, int ff, int items,      \
        const int* ids, int top_k, const void* x, float* act, int tj0) {                          \
        moe_gate_up_v0_body<T, T, 0>(gptrs, uptrs, ff, items, ids, top_k, x, act, tj0);          \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(MMVQ_WARPS * 32) strata_moe_down_v0_##name(      \
        const unsigned long long* ptrs, int h, int items, const int* ids, const float* weights,   \
        int top_k, const void* a, float* y, int t0) {                                             \
        moe_down_v0_body<T>(ptrs, h, items, ids, weights, top_k, a, y, t0);                       \
    }

MOE_V0_KERNELS(q4_k, TQ4_K)
MOE_V0_KERNELS(q6_k, TQ6_K)
