// Host check of the model kernels' shared math (cuda/model.cuh, host paths of the
// __host__ __device__ functions): f16 <-> f32 conversion over every f16 bit pattern and at
// every rounding midpoint, ggml's round-half-even, the RMSNorm scale. References are written
// independently here (ldexp, nextafter, nearbyint). Exit 0 = pass. Run by
// tests/test_cuda_host.py (nvcc) — the model kernels themselves run under the CPU emulation
// in tests/test_gpu_model_sim.py.
#include <cfenv>
#include <cmath>
#include <cstdio>

#include "model.cuh"

static int fails = 0;
#define CHECK(c, ...)                  \
  do {                                 \
    if (!(c) && fails++ < 20) {        \
      std::printf("FAIL: " __VA_ARGS__); \
      std::printf("\n");               \
    }                                  \
  } while (0)

static float ref_h2f(unsigned h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  float v;
  if (e == 0) v = std::ldexp((float)m, -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = std::ldexp(1.0f + m / 1024.0f, e - 15);
  return s ? -v : v;
}

int main() {
  // every pattern widens exactly; every finite value rounds back to itself
  for (unsigned h = 0; h < 65536; h++) {
    float f = sm_h2f((uint16_t)h), r = ref_h2f(h);
    if (std::isnan(r)) {
      CHECK(std::isnan(f), "h2f(%04x) = %g, want NaN", h, f);
      CHECK((sm_f2h(f) & 0x7c00) == 0x7c00 && (sm_f2h(f) & 0x3ff), "f2h(NaN %04x)", h);
      continue;
    }
    CHECK(f == r && std::signbit(f) == std::signbit(r), "h2f(%04x) = %a, want %a", h, f, r);
    CHECK(sm_f2h(f) == h, "f2h(h2f(%04x)) = %04x", h, sm_f2h(f));
  }
  // midpoints between neighbours (positive finite) round to the even one; just off them to
  // the nearer one
  for (unsigned h = 0; h < 0x7bff; h++) {
    double a = ref_h2f(h), b = ref_h2f(h + 1), mid = (a + b) / 2;
    float fm = (float)mid;  // exact: f16 neighbours' midpoints fit in f32
    unsigned even = (h & 1) ? h + 1 : h;
    CHECK(sm_f2h(fm) == even, "f2h(mid %04x..) = %04x, want %04x", h, sm_f2h(fm), even);
    CHECK(sm_f2h(std::nextafter(fm, 0.0f)) == h, "below mid %04x", h);
    CHECK(sm_f2h(std::nextafter(fm, INFINITY)) == h + 1, "above mid %04x", h);
    CHECK(sm_f2h(-fm) == (even | 0x8000), "f2h(-mid %04x..)", h);
  }
  CHECK(sm_f2h(65520.0f) == 0x7c00 && sm_f2h(65519.99f) == 0x7bff, "overflow edge");
  CHECK(sm_f2h(1e-9f) == 0 && sm_f2h(-1e-9f) == 0x8000, "underflow to signed zero");
  CHECK(sm_round_h(0.1f) == ref_h2f(0x2e66), "round_h(0.1)");
  // ggml's nearest_int: round half to even
  std::fesetround(FE_TONEAREST);
  for (int i = -1016; i <= 1016; i++) {
    float v = i / 8.0f;
    CHECK(sm_rint(v) == (int)std::nearbyint(v), "rint(%g) = %d", v, sm_rint(v));
  }
  CHECK(sm_rint(2.5f) == 2 && sm_rint(-2.5f) == -2 && sm_rint(3.5f) == 4, "ties to even");
  CHECK(sm_q8_0_inv(0.0f) == 0.0f && sm_q8_0_inv(127.0f) == 1.0f, "q8_0 inverse scale");
  // the RMSNorm scale from an f64 sum of squares
  float sc = sm_rms_scale(48.0, 3, 1e-6f);
  CHECK(sc == 1.0f / std::sqrt(16.0f + 1e-6f), "rms scale %a", sc);
  CHECK(sm_head_bytes<SM_KV_F16>(128) == 256 && sm_head_bytes<SM_KV_Q8_0>(128) == 136, "head");
  uint8_t blk[34] = {0x00, 0x3c};  // d = 1.0
  blk[2 + 5] = (uint8_t)(int8_t)-7;
  CHECK(sm_kv_get<SM_KV_Q8_0>(blk, 5) == -7.0f && sm_kv_get<SM_KV_Q8_0>(blk, 6) == 0.0f, "q8_0 get");
  if (fails) {
    std::printf("%d failure(s)\n", fails);
    return 1;
  }
  std::printf("model_host: ok\n");
  return 0;
}
