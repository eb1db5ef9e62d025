// What a hybrid decode layer's GPU part loses to latency rather than to its kernels (issue 23):
// three measurements on a chain of small dependent kernels, the shape of a one-token layer's
// attention and router (each kernel a few µs of work on a handful of blocks).
//
//   A. a graph of N dependent kernels replayed back to back: µs per kernel boundary with plain
//      stream order vs programmatic dependent launch (PDL: each kernel's blocks are launched
//      while its predecessor finishes and wait at `griddepcontrol.wait`);
//   B. the host hand-off round trip as the hybrid step does it today: the host launches the
//      add and the next layer's graph, records an event and waits for it (cuEventSynchronize);
//   C. the same chain queued ahead behind a stream wait on a host-written flag
//      (cuStreamWaitValue32), the host releasing it with one store and waiting for the
//      chain's event: the launch calls leave the round trip.
//
// Results (H100, 2026-12-06): docs/BENCHMARKS.md, "launch and hand-off latency of the layer's
// GPU part": ~2.7 µs per kernel on the chain, PDL −0.3 µs; C saves ~1 µs of B's ~5 µs round
// trip, so an engine gate built on C bought nothing and was not kept.
//
// Build and run on the device (nvcc there):
//   nvcc -O3 -arch=sm_90 -lcuda -o /tmp/gcl bench/gpu_chain_latency.cu && /tmp/gcl [N] [reps]
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                    \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,                \
              cudaGetErrorString(e_));                                          \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)
#define CU(x)                                                                  \
  do {                                                                         \
    CUresult r = (x);                                                          \
    if (r != CUDA_SUCCESS) {                                                   \
      const char* s = nullptr;                                                 \
      cuGetErrorString(r, &s);                                                 \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s ? s : "?"); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

constexpr int H = 2048;  // one token's hidden row, f32

// One dependent step: every block reads the whole row (as a norm or a one-token matmul's
// activation does), then writes its slice of the next row. `work` extra passes stand for the
// kernel's own time. PDL: wait for the predecessor's writes first (a no-op without PDL).
__global__ void step(const float* __restrict__ in, float* __restrict__ out, int work) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  __shared__ float red[32];
  float s = 0.0f;
  for (int w = 0; w <= work; w++)
    for (int i = threadIdx.x; i < H; i += blockDim.x) s += in[i] * (1.0f + 1e-7f * w);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    s = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  }
  const int per = H / gridDim.x;
  for (int i = threadIdx.x; i < per; i += blockDim.x) {
    int j = blockIdx.x * per + i;
    out[j] = in[j] * 0.999f + 1e-9f * __shfl_sync(0xffffffffu, s, 0);
  }
}

static void launch(cudaStream_t s, const float* in, float* out, int blocks, int work,
                   bool pdl) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(256);
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = pdl ? at : nullptr;
  cfg.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, step, in, out, work));
}

// N kernels ping-ponging between a and b.
static void chain(cudaStream_t s, float* a, float* b, int n, int blocks, int work, bool pdl) {
  for (int k = 0; k < n; k++) launch(s, k % 2 ? b : a, k % 2 ? a : b, blocks, work, pdl);
}

static cudaGraphExec_t capture(cudaStream_t s, float* a, float* b, int n, int blocks, int work,
                               bool pdl) {
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  chain(s, a, b, n, blocks, work, pdl);
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0ULL));
  CK(cudaGraphDestroy(g));
  return ge;
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 10;
  const int reps = argc > 2 ? atoi(argv[2]) : 2000;
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *a, *b;
  CK(cudaMalloc(&a, 4 * H));
  CK(cudaMalloc(&b, 4 * H));
  std::vector<float> init(H);
  for (int i = 0; i < H; i++) init[i] = 1.0f + (i % 97) * 0.01f;
  CK(cudaMemcpy(a, init.data(), 4 * H, cudaMemcpyHostToDevice));
  cudaEvent_t e0, e1, ev;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));

  printf("chain of %d dependent kernels (256 threads each), %d repetitions\n", n, reps);
  printf("%-58s %10s\n", "A. graph replay, µs per chain (per kernel)", "");
  for (int blocks : {4, 32}) {
    for (int work : {0, 8}) {
      for (bool pdl : {false, true}) {
        cudaGraphExec_t g = capture(s, a, b, n, blocks, work, pdl);
        for (int i = 0; i < 50; i++) CK(cudaGraphLaunch(g, s));
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < reps; i++) CK(cudaGraphLaunch(g, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        double us = 1e3 * ms / reps;
        printf("  blocks %2d, work %d, %-4s %34.2f (%5.2f)\n", blocks, work, pdl ? "PDL" : "plain",
               us, us / n);
        CK(cudaGraphExecDestroy(g));
      }
    }
  }

  // B and C: one host round trip per "layer": the GPU's chain must start after the host's
  // hand-off (its CPU work done) and the host waits for the chain's end.
  int* flag_h;  // host-written release counter, mapped
  CK(cudaHostAlloc(&flag_h, 64, cudaHostAllocMapped));
  *(volatile int*)flag_h = 0;
  CUdeviceptr flag_d;
  CU(cuMemHostGetDevicePointer(&flag_d, flag_h, 0));
  using clk = std::chrono::steady_clock;
  auto us_since = [](clk::time_point t) {
    return std::chrono::duration<double, std::micro>(clk::now() - t).count();
  };
  printf("%-58s %10s\n", "B/C. host hand-off round trip, µs (median)", "");
  for (bool pdl : {false, true}) {
    cudaGraphExec_t g = capture(s, a, b, n, 4, 0, pdl);
    for (int i = 0; i < 50; i++) CK(cudaGraphLaunch(g, s));
    CK(cudaStreamSynchronize(s));
    // B: launch the graph after the hand-off, record, wait
    std::vector<double> rt;
    for (int i = 0; i < reps; i++) {
      auto t = clk::now();
      CK(cudaGraphLaunch(g, s));
      CK(cudaEventRecord(ev, s));
      CK(cudaEventSynchronize(ev));
      rt.push_back(us_since(t));
    }
    printf("  B launch + event sync, %-5s %31.2f\n", pdl ? "PDL" : "plain", median(rt));
    // C: the chain queued behind a wait on the flag before the hand-off
    rt.clear();
    int seq = *(volatile int*)flag_h;
    CU(cuStreamWaitValue32((CUstream)s, flag_d, seq + 1, CU_STREAM_WAIT_VALUE_GEQ));
    CK(cudaGraphLaunch(g, s));
    CK(cudaEventRecord(ev, s));
    for (int i = 0; i < reps; i++) {
      auto t = clk::now();
      __atomic_store_n(flag_h, seq + 1, __ATOMIC_RELEASE);  // the hand-off
      CK(cudaEventSynchronize(ev));
      rt.push_back(us_since(t));
      seq++;
      // the next round queued ahead (the hybrid step would do this before its CPU work)
      CU(cuStreamWaitValue32((CUstream)s, flag_d, seq + 1, CU_STREAM_WAIT_VALUE_GEQ));
      CK(cudaGraphLaunch(g, s));
      CK(cudaEventRecord(ev, s));
    }
    __atomic_store_n(flag_h, seq + 1, __ATOMIC_RELEASE);
    CK(cudaStreamSynchronize(s));
    printf("  C queued behind a flag, %-5s %30.2f\n", pdl ? "PDL" : "plain", median(rt));
    CK(cudaGraphExecDestroy(g));
  }
  // the empty round trip: a wait on the flag and the event alone
  {
    std::vector<double> rt;
    int seq = *(volatile int*)flag_h;
    CU(cuStreamWaitValue32((CUstream)s, flag_d, seq + 1, CU_STREAM_WAIT_VALUE_GEQ));
    CK(cudaEventRecord(ev, s));
    for (int i = 0; i < reps; i++) {
      auto t = clk::now();
      __atomic_store_n(flag_h, seq + 1, __ATOMIC_RELEASE);
      CK(cudaEventSynchronize(ev));
      rt.push_back(us_since(t));
      seq++;
      CU(cuStreamWaitValue32((CUstream)s, flag_d, seq + 1, CU_STREAM_WAIT_VALUE_GEQ));
      CK(cudaEventRecord(ev, s));
    }
    __atomic_store_n(flag_h, seq + 1, __ATOMIC_RELEASE);
    CK(cudaStreamSynchronize(s));
    printf("  flag release to event seen, no kernels %19.2f\n", median(rt));
  }
  CK(cudaGetLastError());
  return 0;
}
