// The model kernels compiled for the CPU emulation (sim.h) with C entry points for ctypes
// (tests/test_gpu_model_sim.py). Each entry launches its kernel with the grid and block its
// Rust launcher uses (rust/src/cuda/ops/*.rs); pointers are host arrays.
//
//   g++ -std=c++20 -O1 -pthread -shared -fPIC -DSTRATA_SIM -I cuda cuda/tests/model_sim.cpp
#include "../norm.cu"
#include "../quantize.cu"
#include "../rope.cu"
#include "../attention.cu"
#include "../router.cu"
#include "../elementwise.cu"

extern "C" {

void sim_norm_rms(const float* x, const float* w, float* out, int rows, int n, float eps) {
  sim_launch(strata_norm_rms, dim3(rows), dim3(NORM_THREADS), x, w, out, n, eps);
}

// x (+= y when y is given) → out = RMSNorm(x)·w and its rows quantized into qout
// (strata_norm_rms_act, act ACT_Q8_0 / ACT_Q8_K).
void sim_norm_rms_act(float* x, const float* y, const float* w, float* out, block_q8a* qout,
                      int rows, int n, float eps, int act) {
  sim_launch(strata_norm_rms_act, dim3(rows), dim3(NORM_THREADS), x, y, w, out, qout, n, eps,
             act);
}

// n_rows rows of n values quantized by the separate kernels (quantize.cu), as
// QuantOps::quantize_act launches them: the reference of the fused tails.
void sim_quantize_act(const float* x, block_q8a* out, int n_rows, int n, int act) {
  long items = (long)n_rows * (n / (act == ACT_Q8_K ? 256 : 32));
  if (act == ACT_Q8_K)
    sim_launch(strata_quantize_q8_k, dim3((unsigned)((items + 7) / 8)), dim3(256), x, out, items);
  else
    sim_launch(strata_quantize_q8_0, dim3((unsigned)((items + 7) / 8)), dim3(256), x, out, items);
}

void sim_norm_add_rms(float* x, const float* y, const float* w, float* out, int rows, int n,
                      float eps) {
  sim_launch(strata_norm_add_rms, dim3(rows), dim3(NORM_THREADS), x, y, w, out, (float*)nullptr,
             n, eps);
}

// The same with the second copy of the output rows (`out2`).
void sim_norm_add_rms_copy(float* x, const float* y, const float* w, float* out, float* out2,
                           int rows, int n, float eps) {
  sim_launch(strata_norm_add_rms, dim3(rows), dim3(NORM_THREADS), x, y, w, out, out2, n, eps);
}

void sim_rope_neox(float* x, const float* c, const float* s, const int* sp, int n_tok,
                   int n_head, int d, int n_rot, int n_pos) {
  sim_launch(strata_rope_neox, dim3(n_head, n_tok), dim3(32), x, c, s, sp, n_head, d, n_rot,
             n_pos);
}

// `norm`, `bias`: whether qn/kn and qb/kb/vb are passed to the kernel (else null).
void sim_rope_qkv(int kv, float* q, const float* k, const float* v, const float* qn,
                  const float* kn, const float* qb, const float* kb, const float* vb,
                  const float* c, const float* s, const int* sp, uint8_t* kc, uint8_t* vc,
                  unsigned long long slot_stride, int n_tok, int n_head, int n_head_kv, int d,
                  int n_rot, int n_ctx, float eps, int norm, int bias, int neox) {
  auto k_ = kv == 0 ? strata_rope_qkv_f16 : strata_rope_qkv_q8_0;
  const float* no = nullptr;
  sim_launch(k_, dim3(n_head + 2 * n_head_kv, n_tok), dim3(32), q, k, v, norm ? qn : no,
             norm ? kn : no, bias ? qb : no, bias ? kb : no, bias ? vb : no, c, s, sp, kc, vc,
             slot_stride, n_head, n_head_kv, d, n_rot, neox, n_ctx, eps);
}

typedef void (*DecodeK)(const float*, const uint8_t*, const uint8_t*, unsigned long long,
                        const int*, float*, float*, float*, int, int, int, int, float,
                        const float*, int, block_q8a*, int, int);
typedef void (*PrefillK)(const float*, const uint8_t*, const uint8_t*, unsigned long long,
                         const int*, float*, int, int, int, int, float, const float*, int);

// With sinks f32 [n_head] (null: none), a window (0: none) and the output's quantization
// into qout (act: ACT_Q8_0 / ACT_Q8_K, or ACT_NONE).
// hs: each KV head's query heads over hs blocks (the kernel sees n_head_kv·hs "KV heads").
void sim_attn_decode_act(int kv, int d, const float* q, const uint8_t* kc, const uint8_t* vc,
                         unsigned long long slot_stride, const int* sp, float* part_o,
                         float* part_ml, float* out, int n_tok, int n_head, int n_head_kv,
                         int n_ctx, int n_split, float scale, const float* sinks, int window,
                         block_q8a* qout, int act, int hs) {
  int g = n_head / (n_head_kv * hs);  // query heads per block
  DecodeK k;
  if (d == 256)  // G ≤ 8 only (the host refuses more)
    k = kv == 0 ? strata_attn_decode_f16_d256_g8 : strata_attn_decode_q8_0_d256_g8;
  else if (kv == 0)
    k = d == 64 ? (g <= 8 ? strata_attn_decode_f16_d64_g8 : strata_attn_decode_f16_d64_g16)
                : (g <= 8 ? strata_attn_decode_f16_d128_g8 : strata_attn_decode_f16_d128_g16);
  else
    k = d == 64 ? (g <= 8 ? strata_attn_decode_q8_0_d64_g8 : strata_attn_decode_q8_0_d64_g16)
                : (g <= 8 ? strata_attn_decode_q8_0_d128_g8 : strata_attn_decode_q8_0_d128_g16);
  sim_launch(k, dim3(n_split, n_head_kv * hs, n_tok), dim3(ATT_THREADS), q, kc, vc, slot_stride,
             sp, part_o, part_ml, out, n_head, n_head_kv * hs, n_ctx, n_split, scale, sinks,
             window, qout, act, hs);
}

// With sinks f32 [n_head] (null: none) and a window (0: none).
void sim_attn_decode_sw(int kv, int d, const float* q, const uint8_t* kc, const uint8_t* vc,
                        unsigned long long slot_stride, const int* sp, float* part_o,
                        float* part_ml, float* out, int n_tok, int n_head, int n_head_kv,
                        int n_ctx, int n_split, float scale, const float* sinks, int window) {
  sim_attn_decode_act(kv, d, q, kc, vc, slot_stride, sp, part_o, part_ml, out, n_tok, n_head,
                      n_head_kv, n_ctx, n_split, scale, sinks, window, nullptr, ACT_NONE, 1);
}

void sim_attn_decode(int kv, int d, const float* q, const uint8_t* kc, const uint8_t* vc,
                     unsigned long long slot_stride, const int* sp, float* part_o,
                     float* part_ml, float* out, int n_tok, int n_head, int n_head_kv,
                     int n_ctx, int n_split, float scale) {
  sim_attn_decode_sw(kv, d, q, kc, vc, slot_stride, sp, part_o, part_ml, out, n_tok, n_head,
                     n_head_kv, n_ctx, n_split, scale, nullptr, 0);
}

void sim_attn_prefill_sw(int kv, int d, const float* q, const uint8_t* kc, const uint8_t* vc,
                         unsigned long long slot_stride, const int* sp, float* out, int n_tok,
                         int n_head, int n_head_kv, int n_ctx, float scale, const float* sinks,
                         int window) {
  PrefillK k;
  if (kv == 0)
    k = d == 64 ? strata_attn_prefill_f16_d64
                : (d == 128 ? strata_attn_prefill_f16_d128 : strata_attn_prefill_f16_d256);
  else
    k = d == 64 ? strata_attn_prefill_q8_0_d64
                : (d == 128 ? strata_attn_prefill_q8_0_d128 : strata_attn_prefill_q8_0_d256);
  int g = n_head / n_head_kv;
  unsigned halves = d > 128 ? d / 128 : 1;  // output dims per block: 128 at most
  sim_launch(k, dim3((n_tok * g + PF_ROWS - 1) / PF_ROWS, n_head_kv, halves), dim3(ATT_THREADS), q, kc,
             vc, slot_stride, sp, out, n_tok, n_head, n_head_kv, n_ctx, scale, sinks, window);
}

void sim_attn_prefill(int kv, int d, const float* q, const uint8_t* kc, const uint8_t* vc,
                      unsigned long long slot_stride, const int* sp, float* out, int n_tok,
                      int n_head, int n_head_kv, int n_ctx, float scale) {
  sim_attn_prefill_sw(kv, d, q, kc, vc, slot_stride, sp, out, n_tok, n_head, n_head_kv, n_ctx,
                      scale, nullptr, 0);
}

void sim_router_topk(const float* logits, int* ids, float* w, int n_tok, int n_expert, int k,
                     int norm) {
  sim_launch(strata_router_topk, dim3(n_tok), dim3(32), logits, ids, w, (int*)nullptr,
             (float*)nullptr, n_expert, k, norm);
}

void sim_router_f32_topk(const float* w_r, const float* x, float* logits, int* ids, float* w,
                         int* ids2, float* w2, int n_expert, int h, int k, int norm, int* done) {
  sim_launch(strata_router_f32_topk, dim3(n_expert), dim3(MMVQ_WARPS * 32),
             (const uint8_t*)w_r, h / 32, x, logits, ids, w, ids2, w2, n_expert, k, norm, done);
}

void sim_router_topk_copy(const float* logits, int* ids, float* w, int* ids2, float* w2,
                          int n_tok, int n_expert, int k, int norm) {
  sim_launch(strata_router_topk, dim3(n_tok), dim3(32), logits, ids, w, ids2, w2, n_expert, k,
             norm);
}

void sim_router_topk_softmax(const float* logits, int* ids, float* w, int n_tok, int n_expert,
                             int k) {
  sim_launch(strata_router_topk_softmax, dim3(n_tok), dim3(32), logits, ids, w, n_expert, k);
}

void sim_add_rows(float* x, const float* b, int rows, int cols) {
  int n = rows * cols;
  sim_launch(strata_ew_add_rows_f32, dim3((n + 255) / 256), dim3(256), x, b, n, cols);
}

void sim_router_biased_topk(const float* logits, const float* bias, int* ids, float* w,
                            int n_tok, int n_expert, int k, int gate, int norm, float scale) {
  sim_launch(strata_router_biased_topk, dim3(n_tok), dim3(32), logits, bias, ids, w, n_expert,
             k, gate, norm, scale);
}

void sim_ffn_gate(const float* g, float* w, int n, int mode) {
  sim_launch(strata_ffn_gate, dim3((n + 255) / 256), dim3(256), g, w, n, mode);
}

void sim_argmax(const float* x, int* out, int rows, int n) {
  sim_launch(strata_ew_argmax_f32, dim3(rows), dim3(256), x, out, n);
}

void sim_add(float* x, const float* y, int n) {
  sim_launch(strata_ew_add_f32, dim3((n + 255) / 256), dim3(256), x, y, n);
}

uint16_t sim_f2h(float f) { return sm_f2h(f); }
float sim_h2f(uint16_t h) { return sm_h2f(h); }
}
