// RMSNorm over rows (norm.cuh's norm_row), the residual add fused with it, and the attention
// norm that also quantizes its rows for the matmuls that read them.
//
// Launch: grid (rows), block NORM_THREADS; `n` is the row width (any n ≥ 1).
#include "norm.cuh"
#include "actq.cuh"

// x f32 [rows, n], w f32 [n], out f32 [rows, n] (may alias x).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    strata_norm_rms(const float* x, const float* w, float* out, int n, float eps) {
  const size_t off = (size_t)blockIdx.x * n;
  norm_row(x + off, nullptr, nullptr, w, out + off, nullptr, n, eps);
}

// The residual add fused with the next norm: x += y, then out = RMSNorm(x) · w.
// x f32 [rows, n] (updated in place), y f32 [rows, n], w f32 [n], out f32 [rows, n];
// out2 f32 [rows, n] or null: the same rows again (a hybrid layer's FFN input for the host).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    strata_norm_add_rms(float* x, const float* y, const float* w, float* out, float* out2,
                        int n, float eps) {
  const size_t off = (size_t)blockIdx.x * n;
  norm_row(x + off, y + off, x + off, w, out + off, out2 != nullptr ? out2 + off : nullptr, n,
           eps);
}

// The attention norm fused with the quantization of its matmuls' activations (decode): x
// (+= y, written back, when y is given) → out = RMSNorm(x) · w as strata_norm_rms /
// strata_norm_add_rms compute it, then out's row → qout as strata_quantize_q8_0 / _q8_k would
// quantize it (`kind` ACT_Q8_0 / ACT_Q8_K, actq.cuh): one launch for the two.
// x f32 [rows, n], y f32 [rows, n] or null, w f32 [n], out f32 [rows, n],
// qout block_q8a [rows, n / 32]. Launch: grid (rows), block NORM_THREADS.
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    strata_norm_rms_act(float* x, const float* y, const float* w, float* out, block_q8a* qout,
                        int n, float eps, int kind) {
  const size_t off = (size_t)blockIdx.x * n;
  norm_row(x + off, y != nullptr ? y + off : nullptr, x + off, w, out + off, nullptr, n, eps);
  __syncthreads();  // the row's outputs, written by every thread, visible to the warps
  act_quantize_block(out + off, qout + (size_t)blockIdx.x * (n / 32), n, kind);
}
