// Why a hybrid decode layer's GPU part runs slower in the step than replayed back to back
// (issue 23): a chain of ten weight-reading kernels (each a one-token matrix-vector product's
// reads: W bytes of its own weights over 132 blocks), captured as one graph, timed by events
// on the device, in five settings:
//
//   back-to-back  the graph replayed with no host wait between replays (weights hot in L2);
//   gap           the host waits for each replay, then spins GAP µs before the next (as the
//                 step's CPU leg does): the device idles between chains, weights still in L2;
//   gap+evict     as gap, and during the gap a kernel reads EVICT MiB of other memory (the
//                 rest of a token's weights passing through L2): the chain's weights are cold;
//   gap+evict+warm  as gap+evict, then a kernel reads the chain's weights through L2
//                 (`ld.global.cg`, as strata_l2_warm does) before the gap ends;
//   gap+spin      as gap, with one block spinning on the device through the gap (is it the
//                 idle device, rather than L2, that slows the chain?).
//
// Results (H100, 2026-12-06, docs/BENCHMARKS.md "the next layer's weights read into L2"): a
// 300 µs idle gap costs nothing (20.8 against 20.5 µs a chain of 1 MiB kernels); evicted
// weights cost 0.6–1.2 µs a kernel (26.4–35.2 µs a chain), and a warm read in the gap gives
// most of it back (21.5–25.9); a block spinning through the gap on another stream made the
// chain slower (30.1–35.6), not faster.
//
// Build and run on the device:
//   nvcc -O3 -arch=sm_90 -o /tmp/gic bench/gpu_idle_chain.cu && /tmp/gic [W_KiB] [GAP_us] [EVICT_MiB]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                           \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

constexpr int KERNELS = 10;
constexpr int BLOCKS = 132;
constexpr int THREADS = 256;

// One step: every thread reads its share of `w` (16 bytes at a time) and adds the words into
// `acc`, then block 0 writes the sum into the next step's input (a dependency like a layer's).
__global__ void step(const uint4* __restrict__ w, long long n, const float* in, float* out) {
  unsigned acc = __float_as_uint(in[0]);
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    uint4 v = w[i];
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  __shared__ unsigned red[THREADS];
  red[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    unsigned s = 0;
    for (int t = 0; t < THREADS; t++) s += red[t];
    out[0] = __uint_as_float(s & 0x3fffffu);
  }
}

__global__ void warm(const uint4* __restrict__ p, long long n, unsigned* sink) {
  unsigned acc = 0;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    uint4 v = __ldcg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x5bd1e995u) sink[0] = acc;
}

__global__ void spin(volatile int* flag) {
  while (*flag == 0) {
  }
}

static void host_spin(double us) {
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() < us) {
  }
}

int main(int argc, char** argv) {
  long long wbytes = (argc > 1 ? atoll(argv[1]) : 4096) * 1024LL;
  double gap = argc > 2 ? atof(argv[2]) : 300.0;
  long long evict = (argc > 3 ? atoll(argv[3]) : 256) << 20;
  const int reps = 200;
  cudaStream_t s, side;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  char* wts;
  CK(cudaMalloc(&wts, wbytes * KERNELS));
  CK(cudaMemset(wts, 1, wbytes * KERNELS));
  char* other;
  CK(cudaMalloc(&other, evict));
  CK(cudaMemset(other, 2, evict));
  float* act;
  CK(cudaMalloc(&act, 4 * (KERNELS + 1)));
  CK(cudaMemset(act, 0, 4 * (KERNELS + 1)));
  unsigned* sink;
  CK(cudaMalloc(&sink, 4));
  int* flag;
  CK(cudaHostAlloc(&flag, 4, cudaHostAllocMapped));
  int* dflag;
  CK(cudaHostGetDevicePointer(&dflag, flag, 0));

  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int k = 0; k < KERNELS; k++)
    step<<<BLOCKS, THREADS, 0, s>>>((const uint4*)(wts + k * wbytes), wbytes / 16, act + k, act + k + 1);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));

  const char* names[] = {"back-to-back", "gap", "gap+evict", "gap+evict+warm", "gap+spin"};
  printf("W %lld KiB x %d kernels, gap %.0f us, evict %lld MiB\n", wbytes >> 10, KERNELS, gap, evict >> 20);
  for (int round = 0; round < 2; round++) {
    for (int mode = 0; mode < 5; mode++) {
      std::vector<float> us;
      for (int r = 0; r < reps; r++) {
        if (mode >= 1) {
          if (mode >= 2) warm<<<4 * BLOCKS, THREADS, 0, s>>>((const uint4*)other, evict / 16, sink);
          if (mode == 3) warm<<<4 * BLOCKS, THREADS, 0, s>>>((const uint4*)wts, wbytes * KERNELS / 16, sink);
          if (mode == 4) {
            *flag = 0;
            spin<<<1, 32, 0, side>>>(dflag);
          }
          CK(cudaStreamSynchronize(s));
          host_spin(gap);
          if (mode == 4) *flag = 1;
        }
        CK(cudaEventRecord(a, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(b, s));
        if (mode >= 1 || r == reps - 1) CK(cudaEventSynchronize(b));
        if (mode == 0 && r < reps - 1) {
          // back to back: time this replay once the next is queued
          CK(cudaEventSynchronize(b));
        }
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        us.push_back(ms * 1e3f);
        if (mode == 4) CK(cudaStreamSynchronize(side));
      }
      std::sort(us.begin(), us.end());
      printf("round %d %-16s chain median %7.2f us (p10 %7.2f, p90 %7.2f), %5.2f us per kernel\n", round,
             names[mode], us[reps / 2], us[reps / 10], us[reps * 9 / 10], us[reps / 2] / KERNELS);
    }
  }
  return 0;
}
