// The matrix-vector kernels (cuda/mmvq.cu) compiled for the CPU emulation (sim.h) with a C
// entry point for ctypes (tests/test_gpu_quant_sim.py): every variant of every type, launched
// with the grid and block of rust/src/cuda/ops/quant.rs `matmul`; pointers are host arrays.
//
//   g++ -std=c++20 -O1 -pthread -shared -fPIC -DSTRATA_SIM -I cuda cuda/tests/quant_sim.cpp
#include <algorithm>
#include <cstring>

#include "sim.h"
using std::min;

#include "../mmvq.cu"

typedef void (*MmvqK)(const uint8_t*, int, int, const void*, float*, int);
struct MmvqEntry {
  const char* name;
  MmvqK one, n8, r1;
};
#define MMVQ_ENTRY(name, T) \
  {#name, strata_mmvq_##name, strata_mmvq_##name##_n8, strata_mmvq_##name##_r1},
static const MmvqEntry mmvq_table[] = {STRATA_FOR_TYPES(MMVQ_ENTRY)};

extern "C" {

// variant 0: warp per row (grid ⌈rows/4⌉), 1: `_n8` (grid.z ⌈n_tok/8⌉), 2: `_r1` (grid rows).
// Returns 0, or -1 for an unknown type name.
int sim_mmvq(const char* ty, int variant, const uint8_t* w, int rows, int items, const void* x,
             float* y, int n_tok) {
  for (const MmvqEntry& e : mmvq_table) {
    if (std::strcmp(e.name, ty) != 0) continue;
    unsigned gx = (unsigned)((rows + MMVQ_WARPS - 1) / MMVQ_WARPS);
    if (variant == 0)
      sim_launch(e.one, dim3(gx), dim3(MMVQ_WARPS * 32), w, rows, items, x, y, n_tok);
    else if (variant == 1)
      sim_launch(e.n8, dim3(gx, 1, (unsigned)((n_tok + 7) / 8)), dim3(MMVQ_WARPS * 32), w, rows,
                 items, x, y, n_tok);
    else
      sim_launch(e.r1, dim3((unsigned)rows), dim3(MMVQ_WARPS * 32), w, rows, items, x, y, n_tok);
    return 0;
  }
  return -1;
}
}
