// The Gated DeltaNet kernels (cuda/deltanet.cu) compiled for the CPU emulation (sim.h) with C
// entry points for ctypes (tests/test_gpu_gdn_sim.py). Each entry launches its kernel with the
// grid and block its Rust launcher uses (rust/src/cuda/ops/deltanet.rs); pointers are host
// arrays, the state tables hold host addresses.
//
//   g++ -std=c++20 -O1 -pthread -shared -fPIC -DSTRATA_SIM -I cuda cuda/tests/gdn_sim.cpp
#include "../deltanet.cu"

extern "C" {

void sim_gdn_conv(float* x, const float* w, const unsigned long long* st_tab,
                  const unsigned long long* ck_tab, const int* sp, const int* ck,
                  unsigned long long sb, unsigned long long off, int cap, int t, int c, int kc) {
  sim_launch(strata_gdn_conv, dim3((c + 127) / 128), dim3(128), x, w, st_tab, ck_tab, sp, ck, sb,
             off, cap, t, c, kc);
}

void sim_gdn_prep(float* qkv, const float* b, const float* a, const float* dt_bias,
                  const float* a_log, float* gates, int t, int c, int nk, int nv, int s, int fused,
                  float eps) {
  sim_launch(strata_gdn_prep, dim3(2 * nk + 1, t), dim3(32), qkv, b, a, dt_bias, a_log, gates, c,
             nk, nv, s, fused, eps);
}

void sim_gdn_recur(const float* qkv, const float* gates, float* core,
                   const unsigned long long* st_tab, const unsigned long long* ck_tab,
                   const int* sp, const int* ck, unsigned long long sb, unsigned long long off,
                   int cap, int t, int c, int nk, int nv, int s, int grouped) {
  sim_launch(strata_gdn_recur, dim3(nv, (s + GDN_ROWS - 1) / GDN_ROWS), dim3(32 * GDN_WARPS), qkv,
             gates, core, st_tab, ck_tab, sp, ck, sb, off, cap, t, c, nk, nv, s, grouped);
}

void sim_gdn_gated_norm(float* o, const float* z, const float* w, int t, int nv, int s,
                        float eps) {
  sim_launch(strata_gdn_gated_norm, dim3(nv, t), dim3(32), o, z, w, nv, s, eps);
}

void sim_gdn_split_q(const float* qg, float* q, float* gate, int n, int d) {
  sim_launch(strata_gdn_split_q, dim3((n + 255) / 256), dim3(256), qg, q, gate, n, d);
}

void sim_gdn_sigmoid_mul(float* att, const float* gate, int n) {
  sim_launch(strata_gdn_sigmoid_mul, dim3((n + 255) / 256), dim3(256), att, gate, n);
}
}
