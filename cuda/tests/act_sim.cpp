// The activation quantize kernels (cuda/quantize.cu) compiled for the CPU emulation (sim.h),
// with C entry points for ctypes (tests/test_gpu_act_sim.py): each launches its kernel with
// the grid and block of its Rust launcher (rust/src/cuda/ops/quant.rs).
//
//   g++ -std=c++20 -O1 -pthread -shared -fPIC -DSTRATA_SIM -I cuda cuda/tests/act_sim.cpp
#include "tests/sim.h"
#include "../quantize.cu"

extern "C" {

void sim_quantize_q8_0(const float* x, block_q8a* out, long n_blocks) {
  sim_launch(strata_quantize_q8_0, dim3((unsigned)((n_blocks + 7) / 8)), dim3(256), x, out,
             n_blocks);
}

void sim_quantize_q8_k(const float* x, block_q8a* out, long n_super) {
  sim_launch(strata_quantize_q8_k, dim3((unsigned)((n_super + 7) / 8)), dim3(256), x, out,
             n_super);
}
}
