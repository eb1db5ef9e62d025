// The matrix-vector kernels (cuda/mmvq.cu) and the routed-expert decode kernels (cuda/moe.cu)
// compiled for the CPU emulation (sim.h) with C entry points for ctypes
// (tests/test_gpu_quant_sim.py): every variant, launched with the grid and block of
// rust/src/cuda/ops/quant.rs `matmul` / moe_decode.rs; pointers are host arrays.
//
//   g++ -std=c++20 -O1 -pthread -shared -fPIC -DSTRATA_SIM -I cuda cuda/tests/quant_sim.cpp
#include <algorithm>
#include <cstring>

#include "sim.h"
using std::min;

#include "../mmvq.cu"
#include "../moe.cu"

typedef void (*MmvqK)(const uint8_t*, int, int, const void*, float*, int);
struct MmvqEntry {
  const char* name;
  MmvqK one, n8, r1, st;
};
#define MMVQ_ENTRY(name, T)                                                       \
  {#name, strata_mmvq_##name, strata_mmvq_##name##_n8, strata_mmvq_##name##_r1, \
   strata_mmvq_##name##_st},
static const MmvqEntry mmvq_table[] = {STRATA_FOR_TYPES(MMVQ_ENTRY)};

typedef void (*GateUpK)(const unsigned long long*, const unsigned long long*, int, int, const int*,
                        int, const void*, float*, int);
typedef void (*DownK)(const unsigned long long*, int, int, const int*, const float*, int,
                      const void*, float*, int);
struct MoeEntry {
  const char* name;
  GateUpK gate_up, gate_up_act, gate_up_v0;
  DownK down, down_v0;
};
#define MOE_ENTRY(name, T) {#name, strata_moe_gate_up_##name, nullptr, nullptr, strata_moe_down_##name, nullptr},
static MoeEntry moe_table[] = {STRATA_FOR_TYPES(MOE_ENTRY)};

static MoeEntry* moe_find(const char* ty) {
  static bool init = false;
  if (!init) {
    for (MoeEntry& e : moe_table) {
      if (std::strcmp(e.name, "q4_k") == 0) {
        e.gate_up_act = strata_moe_gate_up_act_q4_k;
        e.gate_up_v0 = strata_moe_gate_up_v0_q4_k;
        e.down_v0 = strata_moe_down_v0_q4_k;
      } else if (std::strcmp(e.name, "q6_k") == 0) {
        e.gate_up_act = strata_moe_gate_up_act_q6_k;
        e.gate_up_v0 = strata_moe_gate_up_v0_q6_k;
        e.down_v0 = strata_moe_down_v0_q6_k;
      }
    }
    init = true;
  }
  for (MoeEntry& e : moe_table)
    if (std::strcmp(e.name, ty) == 0) return &e;
  return nullptr;
}

// gpt-oss's gate, then up with its biases and the clamped SwiGLU (two launches).
typedef void (*GateK)(const unsigned long long*, int, int, const int*, int, const void*, float*,
                      int);
typedef void (*UpOaiK)(const unsigned long long*, int, int, const int*, int, const void*, float*,
                       int, const float*, const float*, float, float);
struct OaiEntry {
  const char* name;
  GateK gate;
  UpOaiK up;
};
#define OAI_ENTRY(name, T) {#name, strata_moe_gate_##name, strata_moe_up_oai_##name},
static const OaiEntry oai_table[] = {STRATA_FOR_TYPES(OAI_ENTRY)};

extern "C" {

// act = swiglu_oai(gate·x + gb[e], up·x + ub[e]) for the n_tok·top_k pairs, as
// rust/src/cuda/ops/quant_oai.rs launches it (block 256, 8 rows a block). Returns 0, or -1 for
// an unknown type.
int sim_moe_gate_up_oai(const char* ty, const unsigned long long* gptrs,
                        const unsigned long long* uptrs, int ff, int items, const int* ids,
                        int top_k, const void* x, float* act, int n_tok, const float* gb,
                        const float* ub, float alpha, float limit) {
  for (const OaiEntry& e : oai_table) {
    if (std::strcmp(e.name, ty) != 0) continue;
    const dim3 grid((unsigned)((ff + MOE_GU_WARPS - 1) / MOE_GU_WARPS), (unsigned)(n_tok * top_k));
    sim_launch(e.gate, grid, dim3(MOE_GU_WARPS * 32), gptrs, ff, items, ids, top_k, x, act, 0);
    sim_launch(e.up, grid, dim3(MOE_GU_WARPS * 32), uptrs, ff, items, ids, top_k, x, act, 0, gb,
               ub, alpha, limit);
    return 0;
  }
  return -1;
}

// variant 0: warp per row (grid ⌈rows/4⌉), 1: `_n8` (grid.z ⌈n_tok/8⌉), 2: `_r1` (grid rows),
// 3: `_st` (as 0, x staged in shared memory).
// Returns 0, or -1 for an unknown type name.
int sim_mmvq(const char* ty, int variant, const uint8_t* w, int rows, int items, const void* x,
             float* y, int n_tok) {
  for (const MmvqEntry& e : mmvq_table) {
    if (std::strcmp(e.name, ty) != 0) continue;
    unsigned gx = (unsigned)((rows + MMVQ_WARPS - 1) / MMVQ_WARPS);
    if (variant == 0 || variant == 3)
      sim_launch(variant == 0 ? e.one : e.st, dim3(gx), dim3(MMVQ_WARPS * 32), w, rows, items, x,
                 y, n_tok);
    else if (variant == 1)
      sim_launch(e.n8, dim3(gx, 1, (unsigned)((n_tok + 7) / 8)), dim3(MMVQ_WARPS * 32), w, rows,
                 items, x, y, n_tok);
    else
      sim_launch(e.r1, dim3((unsigned)rows), dim3(MMVQ_WARPS * 32), w, rows, items, x, y, n_tok);
    return 0;
  }
  return -1;
}

// Gate/up (+ SwiGLU) of all n_tok·top_k pairs; variant 0: the launcher's kernel (block 256, 8
// rows a block), 1: `_act`, 2: `_v0` (block 128, 4 rows). Returns 0, -1 for an unknown type,
// -2 for a variant the type lacks.
int sim_moe_gate_up(const char* ty, int variant, const unsigned long long* gptrs,
                    const unsigned long long* uptrs, int ff, int items, const int* ids, int top_k,
                    const void* x, float* act, int n_tok) {
  MoeEntry* e = moe_find(ty);
  if (!e) return -1;
  GateUpK k = variant == 0 ? e->gate_up : variant == 1 ? e->gate_up_act : e->gate_up_v0;
  if (!k) return -2;
  const int rows = variant == 2 ? MMVQ_WARPS : MOE_GU_WARPS;
  sim_launch(k, dim3((unsigned)((ff + rows - 1) / rows), (unsigned)(n_tok * top_k)),
             dim3(rows * 32), gptrs, uptrs, ff, items, ids, top_k, x, act, 0);
  return 0;
}

// y[t] += Σ_j weights[t, j]·(Wd[ids[t, j]]·a[t, j]); variant 0: the launcher's kernel (block
// 32·min(top_k, 8), 4 rows a block), 2: `_v0`. Returns as sim_moe_gate_up.
int sim_moe_down(const char* ty, int variant, const unsigned long long* ptrs, int h, int items,
                 const int* ids, const float* weights, int top_k, const void* a, float* y,
                 int n_tok) {
  MoeEntry* e = moe_find(ty);
  if (!e) return -1;
  DownK k = variant == 0 ? e->down : variant == 2 ? e->down_v0 : nullptr;
  if (!k) return -2;
  if (variant == 0)
    sim_launch(k, dim3((unsigned)((h + MOE_DOWN_ROWS - 1) / MOE_DOWN_ROWS), (unsigned)n_tok),
               dim3(32 * std::min(top_k, MOE_DOWN_WARPS)), ptrs, h, items, ids, weights, top_k,
               a, y, 0);
  else
    sim_launch(k, dim3((unsigned)((h + MMVQ_WARPS - 1) / MMVQ_WARPS), (unsigned)n_tok),
               dim3(MMVQ_WARPS * 32), ptrs, h, items, ids, weights, top_k, a, y, 0);
  return 0;
}
}
