// Small f32 kernels: residual add, bias rows, argmax per row, copy.
#include "model.cuh"

// x[i] += y[i] for i < n. Launch: grid (ceil(n / 256)), block 256.
extern "C" __global__ void strata_ew_add_f32(float* x, const float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}

// x[i] += b[i % cols] for i < n: a bias row added to every row of x f32 [n / cols, cols].
// Launch: grid (ceil(n / 256)), block 256.
extern "C" __global__ void strata_ew_add_rows_f32(float* x, const float* b, int n, int cols) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += b[i % cols];
}

// dst[i] = src[i] for i < n. Launch: grid (ceil(n / 256)), block 256.
extern "C" __global__ void strata_ew_copy_f32(float* dst, const float* src, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}

// Three 4-byte-word copies in one launch: dst_j[i] = src_j[i] for i < n_j, j = 0, 1, 2 (the
// hybrid step's routing ids, weights and FFN input to mapped host memory: one kernel instead
// of three copies). Launch: grid (ceil((n0 + n1 + n2) / 256)), block 256.
extern "C" __global__ void strata_ew_copy3_u32(unsigned* d0, const unsigned* s0, int n0,
                                               unsigned* d1, const unsigned* s1, int n1,
                                               unsigned* d2, const unsigned* s2, int n2) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n0) {
    d0[i] = s0[i];
  } else if ((i -= n0) < n1) {
    d1[i] = s1[i];
  } else if ((i -= n1) < n2) {
    d2[i] = s2[i];
  }
}

// out[r] = the first index of the largest value of row r of x f32 [rows, n].
// Launch: grid (rows), block 256.
extern "C" __global__ void __launch_bounds__(256)
    strata_ew_argmax_f32(const float* x, int* out, int n) {
  __shared__ float sv[8];
  __shared__ int si[8];
  const float* row = x + (size_t)blockIdx.x * n;
  float bv = -__builtin_huge_valf();
  int bi = n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    if (row[i] > bv || bi == n) {  // the thread's first element, then strictly larger ones
      bv = row[i];
      bi = i;
    }
  }
  sm_warp_argmax(bv, bi);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) {
      if (sv[w] > bv || (sv[w] == bv && si[w] < bi)) {
        bv = sv[w];
        bi = si[w];
      }
    }
    out[blockIdx.x] = bi < n ? bi : 0;
  }
}
