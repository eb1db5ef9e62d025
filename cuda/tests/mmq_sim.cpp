// The prefill kernels (cuda/mmq.cu dense, cuda/moe_mmq.cu grouped experts) and the activation
// quantizers (cuda/quantize.cu) compiled for the CPU emulation (sim.h), with C entry points for
// ctypes (tests/test_gpu_mmq_sim.py). Each entry runs the kernel sequence of its Rust launcher
// (rust/src/cuda/ops/quant_mmq.rs) with the same grids and blocks: the CPU's int8 activations
// for quantized weights (q8_0 or q8_K by act_is_q8_k), the power-of-two row scales for float
// weights, then the tiles. Buffers are host arrays passed separately (the Rust side packs them
// into one scratch, GroupLayout).
//
//   g++ -std=c++20 -O1 -pthread -shared -fPIC -DSTRATA_SIM -I cuda cuda/tests/mmq_sim.cpp
#include <algorithm>
#include <cmath>
#include <cstring>

#include "sim.h"
using std::isfinite;
using std::max;
using std::min;

#include "../mmq.cu"
#include "../moe_mmq.cu"
#include "../quantize.cu"

typedef void (*MmqK)(const uint8_t*, int, int, const void*, const float*, float*, int);
typedef void (*MoeK)(const unsigned long long*, int, int, const void*, const float*, int,
                     const int*, const int4*, const int*, float*);
struct MmqEntry {
  const char* name;
  bool is_float, q8_k;
  MmqK dense;
  MoeK gate, up, down;
};
#define MMQ_ENTRY(name, T)                                                                 \
  {#name,                    T::IS_FLOAT != 0,          act_is_q8_k<T>(),                  \
   strata_mmq_##name,        strata_moe_mmq_gate_##name, strata_moe_mmq_up_##name,         \
   strata_moe_mmq_down_##name},
static const MmqEntry mmq_table[] = {STRATA_FOR_TYPES(MMQ_ENTRY)};

// gpt-oss's up launch (the biases and the clamped SwiGLU on the gate's output).
typedef void (*MoeOaiK)(const unsigned long long*, int, int, const void*, const float*, int,
                        const int*, const int4*, const int*, float*, const float*, const float*,
                        float, float);
struct OaiUp {
  const char* name;
  MoeOaiK up;
};
#define OAI_UP(name, T) {#name, strata_moe_mmq_up_oai_##name},
static const OaiUp oai_up_table[] = {STRATA_FOR_TYPES(OAI_UP)};

static const MmqEntry* find(const char* ty) {
  for (const MmqEntry& e : mmq_table)
    if (std::strcmp(e.name, ty) == 0) return &e;
  return nullptr;
}

// QuantOps::prefill_act: x f32 [n_rows, 32·items] in the kernels' form; returns what they read.
static const void* prefill_act(const MmqEntry* e, const float* x, long n_rows, int items,
                               float* scales, block_q8a* blocks) {
  if (e->is_float) {
    sim_launch(strata_row_scale, dim3((unsigned)((n_rows + 7) / 8)), dim3(256), x, (int)n_rows,
               32 * items, scales);
    return x;
  }
  if (e->q8_k) {
    const long n = n_rows * (items / 8);
    sim_launch(strata_quantize_q8_k, dim3((unsigned)((n + 7) / 8)), dim3(256), x, blocks, n);
  } else {
    const long n = n_rows * items;
    sim_launch(strata_quantize_q8_0, dim3((unsigned)((n + 7) / 8)), dim3(256), x, blocks, n);
  }
  return blocks;
}

extern "C" {

// Block sizes of the prefill launches (checked against the Rust constants by the test).
int sim_mmq_tile_rows() { return MMQ_BM; }
int sim_moe_bn() { return MOE_BN; }

// quant_mmq::matmul_prefill: y f32 [n_tok, rows] = W·x̂. scales f32 [n_tok]; blocks
// block_q8a [n_tok, items]. Returns 0, or -1 for an unknown type name.
int sim_matmul_prefill(const char* ty, const uint8_t* w, int rows, int items, const float* x,
                       float* y, int n_tok, float* scales, uint8_t* blocks) {
  const MmqEntry* e = find(ty);
  if (e == nullptr) return -1;
  const void* xa = prefill_act(e, x, n_tok, items, scales, (block_q8a*)blocks);
  sim_launch(e->dense, dim3((unsigned)((rows + 63) / 64), (unsigned)((n_tok + 63) / 64)),
             dim3(MMQ_THREADS), w, rows, items, xa, (const float*)scales, y, n_tok);
  return 0;
}

// QuantOps::group: the pairs' grouping (order i32 [pairs], tiles int4 [max_tiles], n_tiles);
// returns grid.y of the tile launches.
static unsigned group(const int* ids, int pairs, int* order, int4* tiles, int* n_tiles) {
  const int max_tiles = (pairs + MOE_BN - 1) / MOE_BN + std::min(pairs, MOE_MAX_E + 1);
  sim_launch(strata_moe_group, dim3(1), dim3(1024), ids, pairs, MOE_BN, order, tiles, n_tiles,
             max_tiles);
  return (unsigned)std::min((pairs + MOE_BN - 1) / MOE_BN + std::min(pairs, 512), 65535);
}

// quant_mmq::moe_gate_up_prefill: act f32 [n_tok, top_k, ff] = silu(Wg·x̂_g)·(Wu·x̂_u) per
// pair (x̂ requantized only when the up type's activations differ from the gate type's).
// Work buffers: order i32 [pairs], tiles int4 [pairs/32 + pairs + 1], n_tiles i32 [1],
// scales f32 [n_tok], blocks block_q8a [n_tok, h/32].
int sim_moe_gate_up_prefill(const char* tg, const char* tu, const unsigned long long* gptrs,
                            const unsigned long long* uptrs, int ff, int h, const int* ids,
                            int top_k, const float* x, int n_tok, float* act, int* order,
                            int4* tiles, int* n_tiles, float* scales, uint8_t* blocks) {
  const MmqEntry* eg = find(tg);
  const MmqEntry* eu = find(tu);
  if (eg == nullptr || eu == nullptr) return -1;
  const int pairs = n_tok * top_k, items = h / 32;
  const unsigned gy = group(ids, pairs, order, tiles, n_tiles);
  const dim3 grid((unsigned)((ff + 63) / 64), gy);
  const void* xg = prefill_act(eg, x, n_tok, items, scales, (block_q8a*)blocks);
  sim_launch(eg->gate, grid, dim3(MMQ_THREADS), gptrs, ff, items, xg, (const float*)scales,
             top_k, (const int*)order, (const int4*)tiles, (const int*)n_tiles, act);
  const void* xu = xg;
  if (eu->is_float || eg->is_float || eu->q8_k != eg->q8_k)
    xu = prefill_act(eu, x, n_tok, items, scales, (block_q8a*)blocks);
  sim_launch(eu->up, grid, dim3(MMQ_THREADS), uptrs, ff, items, xu, (const float*)scales, top_k,
             (const int*)order, (const int4*)tiles, (const int*)n_tiles, act);
  return 0;
}

// quant_mmq::moe_gate_up_prefill with gpt-oss's `oai` arguments (one type for gate and up):
// act = swiglu_oai(Wg·x̂ + gb[e], Wu·x̂ + ub[e]). Work buffers as sim_moe_gate_up_prefill's.
int sim_moe_gate_up_oai_prefill(const char* ty, const unsigned long long* gptrs,
                                const unsigned long long* uptrs, int ff, int h, const int* ids,
                                int top_k, const float* x, int n_tok, float* act, int* order,
                                int4* tiles, int* n_tiles, float* scales, uint8_t* blocks,
                                const float* gb, const float* ub, float alpha, float limit) {
  const MmqEntry* e = find(ty);
  const OaiUp* u = nullptr;
  for (const OaiUp& o : oai_up_table)
    if (std::strcmp(o.name, ty) == 0) u = &o;
  if (e == nullptr || u == nullptr) return -1;
  const int pairs = n_tok * top_k, items = h / 32;
  const unsigned gy = group(ids, pairs, order, tiles, n_tiles);
  const dim3 grid((unsigned)((ff + 63) / 64), gy);
  const void* xa = prefill_act(e, x, n_tok, items, scales, (block_q8a*)blocks);
  sim_launch(e->gate, grid, dim3(MMQ_THREADS), gptrs, ff, items, xa, (const float*)scales, top_k,
             (const int*)order, (const int4*)tiles, (const int*)n_tiles, act);
  sim_launch(u->up, grid, dim3(MMQ_THREADS), uptrs, ff, items, xa, (const float*)scales, top_k,
             (const int*)order, (const int4*)tiles, (const int*)n_tiles, act, gb, ub, alpha,
             limit);
  return 0;
}

// gpt-oss's down bias (quant_oai::moe_down_bias): y[t] += Σ_j weights[t, j]·bias[ids[t, j]]
// over the slots whose pointer is present and `align`-aligned.
void sim_moe_bias(const unsigned long long* ptrs, int align, const int* ids, const float* weights,
                  const float* bias, int top_k, int h, float* y, int n_tok) {
  const long n = (long)n_tok * h;
  sim_launch(strata_moe_bias, dim3((unsigned)((n + 255) / 256)), dim3(256), ptrs, align, ids,
             weights, bias, top_k, h, y, n_tok);
}

// quant_mmq::moe_down_prefill: out f32 [pairs, h] = Wd[ids[p]]·âct[p], then
// y[t] += Σ_j weights[t, j]·out[t·top_k + j]. Work buffers as above, with scales f32 [pairs]
// and blocks block_q8a [pairs, ff/32].
int sim_moe_down_prefill(const char* td, const unsigned long long* dptrs, int h, int ff,
                         const int* ids, const float* weights, int top_k, const float* act,
                         int n_tok, float* y, float* out, int* order, int4* tiles, int* n_tiles,
                         float* scales, uint8_t* blocks) {
  const MmqEntry* e = find(td);
  if (e == nullptr) return -1;
  const int pairs = n_tok * top_k, items = ff / 32;
  const unsigned gy = group(ids, pairs, order, tiles, n_tiles);
  const void* xa = prefill_act(e, act, pairs, items, scales, (block_q8a*)blocks);
  sim_launch(e->down, dim3((unsigned)((h + 63) / 64), gy), dim3(MMQ_THREADS), dptrs, h, items, xa,
             (const float*)scales, 1, (const int*)order, (const int4*)tiles, (const int*)n_tiles,
             out);
  const long n = (long)n_tok * h;
  sim_launch(strata_moe_reduce, dim3((unsigned)((n + 255) / 256)), dim3(256), (const float*)out,
             weights, top_k, h, y, n_tok);
  return 0;
}
}
