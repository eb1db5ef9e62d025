// Routed experts for prefill: (token, slot) pairs grouped by expert on the device, then one
// tiled tensor-core launch per projection (mmq.cuh) over all experts' token tiles.
//
// strata_moe_group(ids, pairs, bn, order, tiles, n_tiles, max_tiles)   grid 1, block 1024:
//   counting sort of the pairs by ids[p] (ids < 0 or ≥ MOE_MAX_E: an "absent" bucket);
//   order i32 [pairs] = pair indices grouped by expert; tiles int4 [max_tiles] = (expert or −1,
//   start in order, count ≤ bn, 0); n_tiles i32 [1].
// strata_moe_mmq_{gate,up,down}_<ty>(ptrs, rows, items, x, xs, x_div, order, tiles, n_tiles, out)
//   grid (⌈rows/64⌉, any), block 128; each block walks tiles blockIdx.y, +gridDim.y, ...
//   Pair p reads activation row p / x_div of x: quantized types block_q8a [.., items] (the CPU's
//   activations for the type, strata_quantize_*; xs unused), float types f32 [.., 32·items] with
//   its scale xs[p / x_div] (strata_row_scale, mmq.cu); out f32 [pairs, rows]:
//   gate: out = W·x; up: out = silu(out)·(W·x); down: out = W·x. A 0 / misaligned pointer or an
//   absent id writes zeros.
// strata_moe_mmq_up_oai_<ty>(..., out, gb, ub, alpha, limit): gpt-oss's up after the gate:
//   out = swiglu_oai(out + gb[e, r], W·x + ub[e, r]) (biases f32 [E, rows]).
// strata_moe_reduce(out, weights, top_k, h, y, n_tok)   y[t, r] += Σ_j weights[t, j]·out[t·top_k + j, r]
// strata_moe_bias(ptrs, align, ids, weights, bias, top_k, h, y, n_tok)   gpt-oss's down bias:
//   y[t, r] += Σ_j weights[t, j]·bias[ids[t, j], r] over the slots whose expert's down pointer is
//   present (non-zero, `align`-aligned; the others are computed elsewhere); bias f32 [E, h].
#include "mmq.cuh"
#include "vecdot.cuh"

#define MOE_MAX_E 4096
#define MOE_BN 32

extern "C" __global__ void __launch_bounds__(1024)
    strata_moe_group(const int* __restrict__ ids, int pairs, int bn, int* __restrict__ order,
                     int4* __restrict__ tiles, int* __restrict__ n_tiles, int max_tiles) {
    __shared__ int cnt[MOE_MAX_E + 1];
    __shared__ int off[MOE_MAX_E + 1];
    __shared__ int s_max;
    const int tid = threadIdx.x;
    if (tid == 0) s_max = -1;
    for (int i = tid; i <= MOE_MAX_E; i += blockDim.x) cnt[i] = 0;
    __syncthreads();
    int m = -1;
    for (int p = tid; p < pairs; p += blockDim.x) {
        const int e = ids[p];
        if (e >= 0 && e < MOE_MAX_E) m = max(m, e);
    }
    atomicMax(&s_max, m);
    __syncthreads();
    const int absent = s_max + 1;
    for (int p = tid; p < pairs; p += blockDim.x) {
        const int e = ids[p];
        atomicAdd(&cnt[(e >= 0 && e < MOE_MAX_E) ? e : absent], 1);
    }
    __syncthreads();
    if (tid == 0) {
        int o = 0, nt = 0;
        for (int b = 0; b <= absent; ++b) {
            off[b] = o;
            const int c = cnt[b];
            for (int s = 0; s < c; s += bn)
                if (nt < max_tiles) tiles[nt++] = make_int4(b == absent ? -1 : b, o + s, min(bn, c - s), 0);
            o += c;
            cnt[b] = 0;
        }
        *n_tiles = nt;
    }
    __syncthreads();
    for (int p = tid; p < pairs; p += blockDim.x) {
        const int e = ids[p];
        const int b = (e >= 0 && e < MOE_MAX_E) ? e : absent;
        order[off[b] + atomicAdd(&cnt[b], 1)] = p;
    }
}

// MODE 0: gate (out = v); 1: up (out = silu(out)·v); 2: down (out = v); 3: up with gpt-oss's
// biases and clamped SwiGLU (out = swiglu_oai(out + gb, v + ub)).
template <class T, int MODE>
__device__ __forceinline__ void moe_mmq_body(const unsigned long long* ptrs, int rows, int items,
                                             const void* __restrict__ x,
                                             const float* __restrict__ xs, int x_div,
                                             const int* __restrict__ order, const int4* tiles,
                                             const int* n_tiles, float* out, OaiGlu oai = {}) {
    constexpr int BN = MOE_BN;
    __shared__ int s_pair[BN];
    const int row0 = blockIdx.x * MMQ_BM;
    const int nt = *n_tiles;
    for (int ti = blockIdx.y; ti < nt; ti += gridDim.y) {
        const int4 tl = tiles[ti];
        const int cnt = tl.z;
        __syncthreads();  // s_pair of the previous tile is no longer read
        if (threadIdx.x < BN) s_pair[threadIdx.x] = threadIdx.x < cnt ? order[tl.y + threadIdx.x] : 0;
        __syncthreads();
        const uint8_t* w = tl.x >= 0 ? expert_ptr<T>(ptrs, tl.x) : nullptr;
        if (w == nullptr) {
            for (int i = threadIdx.x; i < MMQ_BM * cnt; i += blockDim.x) {
                const int r = i % MMQ_BM, n = i / MMQ_BM;
                if (row0 + r < rows) out[(long)s_pair[n] * rows + row0 + r] = 0.0f;
            }
            continue;
        }
        float acc[MmqShape<BN>::MT][MmqShape<BN>::NT][4];
        mmq_tile<T, BN>(w, rows, items, row0, x, xs, cnt,
                        [&](int n) { return s_pair[n] / x_div; }, acc);
        mmq_epilogue<BN>(acc, [&](int r, int n, float v) {
            if (row0 + r < rows && n < cnt) {
                if constexpr (T::IS_FLOAT) v /= xs[s_pair[n] / x_div];
                float* o = out + (long)s_pair[n] * rows + row0 + r;
                if constexpr (MODE == 3) {
                    const size_t b = (size_t)tl.x * rows + row0 + r;
                    *o = swiglu_oai(*o + oai.gb[b], v + oai.ub[b], oai.alpha, oai.limit);
                } else {
                    *o = MODE == 1 ? silu_mul(*o, v) : v;
                }
            }
        });
    }
}

#define MOE_MMQ_KERNELS(name, T)                                                                  \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS) strata_moe_mmq_gate_##name(        \
        const unsigned long long* ptrs, int rows, int items, const void* x, const float* xs,      \
        int x_div, const int* order, const int4* tiles, const int* n_tiles, float* out) {         \
        moe_mmq_body<T, 0>(ptrs, rows, items, x, xs, x_div, order, tiles, n_tiles, out);          \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS) strata_moe_mmq_up_##name(          \
        const unsigned long long* ptrs, int rows, int items, const void* x, const float* xs,      \
        int x_div, const int* order, const int4* tiles, const int* n_tiles, float* out) {         \
        moe_mmq_body<T, 1>(ptrs, rows, items, x, xs, x_div, order, tiles, n_tiles, out);          \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS) strata_moe_mmq_up_oai_##name(      \
        const unsigned long long* ptrs, int rows, int items, const void* x, const float* xs,      \
        int x_div, const int* order, const int4* tiles, const int* n_tiles, float* out,           \
        const float* gb, const float* ub, float alpha, float limit) {                             \
        moe_mmq_body<T, 3>(ptrs, rows, items, x, xs, x_div, order, tiles, n_tiles, out,           \
                           OaiGlu{gb, ub, alpha, limit});                                         \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS) strata_moe_mmq_down_##name(        \
        const unsigned long long* ptrs, int rows, int items, const void* x, const float* xs,      \
        int x_div, const int* order, const int4* tiles, const int* n_tiles, float* out) {         \
        moe_mmq_body<T, 2>(ptrs, rows, items, x, xs, x_div, order, tiles, n_tiles, out);          \
    }

STRATA_FOR_TYPES(MOE_MMQ_KERNELS)

extern "C" __global__ void __launch_bounds__(256)
    strata_moe_reduce(const float* __restrict__ out, const float* __restrict__ weights, int top_k,
                      int h, float* __restrict__ y, int n_tok) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n_tok * h) return;
    const long t = i / h, r = i % h;
    float acc = 0.0f;
    for (int j = 0; j < top_k; ++j) acc += weights[t * top_k + j] * out[(t * top_k + j) * h + r];
    y[i] += acc;
}

extern "C" __global__ void __launch_bounds__(256)
    strata_moe_bias(const unsigned long long* __restrict__ ptrs, int align,
                    const int* __restrict__ ids, const float* __restrict__ weights,
                    const float* __restrict__ bias, int top_k, int h, float* __restrict__ y,
                    int n_tok) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n_tok * h) return;
    const long t = i / h, r = i % h;
    float acc = 0.0f;
    for (int j = 0; j < top_k; ++j) {
        const int e = ids[t * top_k + j];
        if (e < 0) continue;
        const unsigned long long p = ptrs[e];
        if (p == 0 || p % (unsigned long long)align != 0) continue;
        acc += weights[t * top_k + j] * bias[(long)e * h + r];
    }
    y[i] += acc;
}
