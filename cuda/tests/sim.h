// A CPU emulation of the CUDA subset the model kernels use, so their indexing, barriers,
// shuffles and mma fragment layouts are checked without a GPU (g++ -DSTRATA_SIM).
//
// One block runs at a time; its threads are real threads (std::thread), `__shared__`
// variables are function statics (shared by the block's threads, which is exact while one
// block runs), __syncthreads is a std::barrier over the block, a warp shuffle exchanges
// values through a per-warp buffer between two barriers of the warp, and mma.sync m16n8k16
// gathers the warp's fragments the same way. Every lane of a warp must take part in a
// shuffle (as the kernels here guarantee with full masks).
#pragma once

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__ __restrict
#define __launch_bounds__(...)

#define __align__(n) __attribute__((aligned(n)))

struct alignas(16) uint4 {
  uint32_t x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return {x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct alignas(8) uint2 {
  uint32_t x, y;
};
inline uint2 make_uint2(uint32_t x, uint32_t y) { return {x, y}; }
struct alignas(16) int4 {
  int x, y, z, w;
};
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

struct SimBlock {
  std::unique_ptr<std::barrier<>> block;
  std::vector<std::unique_ptr<std::barrier<>>> warp;
  // per warp: 32 lanes × 8 words of exchange space
  std::vector<uint64_t> ex;
};
inline SimBlock sim_blk;

inline int sim_tid() {
  return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

inline void __syncthreads() { sim_blk.block->arrive_and_wait(); }

inline void sim_warp_sync() { sim_blk.warp[sim_tid() >> 5]->arrive_and_wait(); }

// Lane `lane` of the calling warp's exchange slot (8 words each).
inline uint64_t* sim_slot(int lane) { return &sim_blk.ex[((sim_tid() >> 5) * 32 + lane) * 8]; }

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int mask) {
  static_assert(sizeof(T) <= 8);
  int lane = sim_tid() & 31;
  std::memcpy(sim_slot(lane), &v, sizeof(T));
  sim_warp_sync();
  T r;
  std::memcpy(&r, sim_slot(lane ^ mask), sizeof(T));
  sim_warp_sync();
  return r;
}

template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
  int lane = sim_tid() & 31;
  std::memcpy(sim_slot(lane), &v, sizeof(T));
  sim_warp_sync();
  T r;
  std::memcpy(&r, sim_slot(src & 31), sizeof(T));
  sim_warp_sync();
  return r;
}

// Blocks run one at a time: fences are no-ops and a load that bypasses L1 a plain load; the
// threads of a block do run concurrently, so atomics are real (relaxed) atomics.
inline void __threadfence() {}
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline int atomicMax(int* p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v > old && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED,
                                                 __ATOMIC_RELAXED)) {
  }
  return old;
}
template <class T>
inline T __ldcg(const T* p) {
  return *p;
}

inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t shift) {
  return (uint32_t)((((uint64_t)hi << 32) | lo) >> (shift & 31));
}

inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
  return c;
}

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32: the warp's fragments are gathered and
// every lane computes its four outputs (layouts as in the PTX ISA for this shape).
inline void sim_mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                          float (*h2f)(uint16_t)) {
  int lane = sim_tid() & 31;
  uint64_t* me = sim_slot(lane);
  for (int i = 0; i < 4; i++) me[i] = a[i];
  me[4] = b[0];
  me[5] = b[1];
  sim_warp_sync();
  auto half_at = [&](uint64_t w, int hi) { return h2f((uint16_t)(hi ? (w >> 16) : w)); };
  // A[r][k], B[k][n] from the owners' registers
  auto A = [&](int r, int k) {
    int g = r & 7, tig = (k & 7) >> 1, reg = (r >> 3) + 2 * (k >> 3);
    return half_at(sim_slot(g * 4 + tig)[reg], k & 1);
  };
  auto B = [&](int k, int n) {
    int tig = (k & 7) >> 1, reg = k >> 3;
    return half_at(sim_slot(n * 4 + tig)[4 + reg], k & 1);
  };
  int g = lane >> 2, tig = lane & 3;
  float out[4];
  for (int i = 0; i < 4; i++) {
    int r = g + 8 * (i >> 1), n = tig * 2 + (i & 1);
    float acc = c[i];
    for (int k = 0; k < 16; k++) acc += A(r, k) * B(k, n);
    out[i] = acc;
  }
  sim_warp_sync();
  for (int i = 0; i < 4; i++) d[i] = out[i];
}

// Runs a kernel over the grid: blocks one after another, each with blockDim real threads.
template <class... P, class... A>
void sim_launch(void (*k)(P...), dim3 grid, dim3 block, A... args) {
  gridDim = grid;
  blockDim = block;
  int nt = (int)(block.x * block.y * block.z);
  int nw = (nt + 31) / 32;
  sim_blk.ex.assign((size_t)nw * 32 * 8, 0);
  for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
      for (unsigned bx = 0; bx < grid.x; bx++) {
        sim_blk.block = std::make_unique<std::barrier<>>(nt);
        sim_blk.warp.clear();
        for (int w = 0; w < nw; w++) sim_blk.warp.push_back(std::make_unique<std::barrier<>>(32));
        std::vector<std::thread> ts;
        for (int t = 0; t < nt; t++)
          ts.emplace_back([=]() {
            blockIdx = dim3(bx, by, bz);
            threadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
            k(args...);
          });
        for (auto& t : ts) t.join();
      }
}
