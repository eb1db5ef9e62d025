// Shared definitions of the quantized kernels (docs/GPU.md): ggml block layouts, the int8
// activation block, exact f16 widening, byte-wise (SWAR) helpers, dp4a, warp reductions.
//
// Everything marked STRATA_HD compiles for the device (nvcc) and for the host (nvcc or a plain
// C++ compiler): cuda/tests/quant_host.cu runs the same decode and dot code on the CPU and
// compares it with strata's CPU dequantization.
#pragma once
#include <stdint.h>
#include <string.h>

#ifndef STRATA_HD
#ifdef __CUDACC__
#define STRATA_HD __host__ __device__
#else
#define STRATA_HD
#endif
#endif

#ifdef __CUDACC__
#define STRATA_FI __forceinline__
#else
#define STRATA_FI inline
#endif

// ---- ggml block layouts (docs/FORMATS.md §2; all fields little-endian, f16 kept as raw bits) ----
// GGUF blocks are not 4-byte aligned in general (Q8_0 is 34 bytes): kernels read them through
// the ld_* helpers below, never through these structs' multi-byte fields directly, except
// where a type's block size and the launcher's pointer check prove the alignment.
struct block_q8_0 { uint16_t d; int8_t qs[32]; };                                    // 34 B
struct block_q4_0 { uint16_t d; uint8_t qs[16]; };                                   // 18 B
struct block_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };                    // 22 B
struct block_iq4_nl { uint16_t d; uint8_t qs[16]; };                                 // 18 B
struct block_q2_k { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; };         // 84 B
struct block_q3_k { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };  // 110
struct block_q4_k { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };        // 144 B
struct block_q5_k { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };  // 176
struct block_q6_k { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };  // 210 B
struct block_iq4_xs { uint16_t d, scales_h; uint8_t scales_l[4]; uint8_t qs[128]; };  // 136 B
struct block_iq3_s { uint16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t signs[32]; uint8_t scales[4]; };  // 110
struct block_iq3_xxs { uint16_t d; uint8_t qs[96]; };                                // 98 B
struct block_iq2_xs { uint16_t d; uint16_t qs[32]; uint8_t scales[8]; };             // 74 B

// The activation block the int8 dots read: 32 values d·q with an f32 scale d. The quantize
// kernels fill it exactly as the CPU path quantizes activations for the weight type (q8_0 or
// q8_K, act_q8_0_ref / act_q8_k_ref in qdecode.cuh), so the int8 dots see the CPU's integers.
// 36 bytes, 4-byte aligned (the quantize kernels write arrays of it into 4-aligned scratch).
struct block_q8a { float d; int8_t qs[32]; };

#ifdef __cplusplus
static_assert(sizeof(block_q8_0) == 34, "q8_0");
static_assert(sizeof(block_q4_0) == 18, "q4_0");
static_assert(sizeof(block_q5_0) == 22, "q5_0");
static_assert(sizeof(block_q2_k) == 84, "q2_k");
static_assert(sizeof(block_q3_k) == 110, "q3_k");
static_assert(sizeof(block_q4_k) == 144, "q4_k");
static_assert(sizeof(block_q5_k) == 176, "q5_k");
static_assert(sizeof(block_q6_k) == 210, "q6_k");
static_assert(sizeof(block_iq4_xs) == 136, "iq4_xs");
static_assert(sizeof(block_iq3_s) == 110, "iq3_s");
static_assert(sizeof(block_iq3_xxs) == 98, "iq3_xxs");
static_assert(sizeof(block_iq2_xs) == 74, "iq2_xs");
static_assert(sizeof(block_q8a) == 36, "q8a");
#endif

// ---- float helpers ----
STRATA_HD STRATA_FI float bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

STRATA_HD STRATA_FI uint32_t f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

// IEEE binary16 bits widened to f32 exactly as rust/src/quant/dequant/mod.rs f16_to_f32 does
// (numpy's astype): subnormals normalised, NaN sign and payload kept.
STRATA_HD STRATA_FI float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) return bits_f32(sign | f32_bits((float)man * bits_f32(0x33800000u)));
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

// f32 → f16 bits, round to nearest even (finite inputs; overflow gives ±inf, NaN stays NaN).
STRATA_HD STRATA_FI uint16_t f32_to_f16(float f) {
    const uint32_t x = f32_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // rounds to ≥ 65520: inf
    if (ax < 0x38800000u) {                                    // below 2^-14: subnormal f16
        // value / 2^-24, rounded to nearest even: exact because the product is exact in f32.
        const float scaled = bits_f32(ax) * 16777216.0f;       // · 2^24
        uint32_t m = (uint32_t)scaled;
        const float rem = scaled - (float)m;
        if (rem > 0.5f || (rem == 0.5f && (m & 1u))) m++;
        return (uint16_t)(sign | m);
    }
    uint32_t m = ax + 0xfffu + ((ax >> 13) & 1u);  // round mantissa to 10 bits, ties to even
    m -= 0x38000000u;                              // rebias exponent 127 → 15
    return (uint16_t)(sign | (m >> 13));
}

// Products and differences that must not be contracted into an FMA (the CPU reference rounds
// each step): dequantization uses these so getrows is bit-exact with the CPU.
STRATA_HD STRATA_FI float fmul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
STRATA_HD STRATA_FI float fsub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

// ---- loads from GGUF blocks ----
STRATA_HD STRATA_FI uint32_t ld_u8(const uint8_t* p) { return p[0]; }

// 2-byte aligned p (every block size is even and the launchers check base pointers).
STRATA_HD STRATA_FI uint32_t ld_u16(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return *(const uint16_t*)p;
#else
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
#endif
}

// A little-endian u32 at a 2-byte aligned address, as two 16-bit loads.
STRATA_HD STRATA_FI uint32_t ld_u32_a2(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    const uint16_t* q = (const uint16_t*)p;
    return (uint32_t)q[0] | (uint32_t)q[1] << 16;
#else
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
#endif
}

// A little-endian u32 at a 4-byte aligned address.
STRATA_HD STRATA_FI uint32_t ld_u32_a4(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return *(const uint32_t*)p;
#else
    return ld_u32_a2(p);
#endif
}

// 32 bytes at a 4-byte aligned address as 8 little-endian words: two 16-byte loads on the
// device when the address is 16-byte aligned (fewer L1 transactions), else 8 word loads.
STRATA_HD STRATA_FI void ld_32b_a4(const uint8_t* p, uint32_t (&w)[8]) {
#ifdef __CUDA_ARCH__
    if (((uintptr_t)p & 15u) == 0) {
        const uint4 a = *(const uint4*)p, b = *(const uint4*)(p + 16);
        w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
        w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
        return;
    }
#endif
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = ld_u32_a4(p + 4 * i);
}

// 32 bytes at a 2-byte aligned address as 8 little-endian words: on the device nine aligned word
// loads from p rounded down to 4 and a funnel shift (half the load instructions of 16-bit loads;
// the words read lie in the 4-byte words that hold p .. p + 31, so in the same allocation). The
// CPU emulation (STRATA_SIM) runs this device form too; plain host code reads bytes.
STRATA_HD STRATA_FI void ld_32b_a2(const uint8_t* p, uint32_t (&w)[8]) {
#if defined(__CUDA_ARCH__) || defined(STRATA_SIM)
    const uint32_t* a = (const uint32_t*)((uintptr_t)p & ~(uintptr_t)3);
    const uint32_t sh = ((uint32_t)(uintptr_t)p & 2u) * 8u;
    uint32_t v[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) v[i] = a[i];
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = __funnelshift_r(v[i], v[i + 1], sh);
#else
    for (int i = 0; i < 8; ++i) w[i] = ld_u32_a2(p + 4 * i);
#endif
}

// 16 bytes at a 4-byte aligned address as 4 words (one 16-byte load on the device when aligned).
STRATA_HD STRATA_FI void ld_16b_a4(const uint8_t* p, uint32_t (&w)[4]) {
#if defined(__CUDA_ARCH__) || defined(STRATA_SIM)
    if (((uintptr_t)p & 15u) == 0) {
        const uint4 a = *(const uint4*)p;
        w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
        return;
    }
#endif
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = ld_u32_a4(p + 4 * i);
}

STRATA_HD STRATA_FI float ld_f16(const uint8_t* p) { return f16_to_f32((uint16_t)ld_u16(p)); }

// ---- byte-wise (SWAR) helpers on 4 packed int8 ----
// x − c per byte, for bytes of x in 0..127 and of c in 0..127: the signed int8 results.
STRATA_HD STRATA_FI uint32_t vsub_b(uint32_t x, uint32_t c) {
    return ((x | 0x80808080u) - c) ^ 0x80808080u;
}

// The byte mask (0xff per set bit) of the low 4 bits of s: bit k → byte k.
STRATA_HD STRATA_FI uint32_t sign_mask4(uint32_t s) {
    const uint32_t t = (s & 1u) | (s & 2u) << 7 | (s & 4u) << 14 | (s & 8u) << 21;
    return t * 0xffu;
}

// Negate the bytes of g (each 1..127) where mask m has 0xff.
STRATA_HD STRATA_FI uint32_t apply_signs(uint32_t g, uint32_t m) {
    return (g ^ m) + (m & 0x01010101u);
}

// Bits 0..3 of n spread to bit 0 of bytes 0..3.
STRATA_HD STRATA_FI uint32_t spread4(uint32_t n) {
    return (n & 1u) | (n & 2u) << 7 | (n & 4u) << 14 | (n & 8u) << 21;
}

// Σ_k a.byte[k]·b.byte[k] + c, bytes as signed int8.
STRATA_HD STRATA_FI int dp4a(uint32_t a, uint32_t b, int c) {
#ifdef __CUDA_ARCH__
    return __dp4a((int)a, (int)b, c);
#else
    for (int k = 0; k < 4; ++k) c += (int)(int8_t)(a >> (8 * k)) * (int)(int8_t)(b >> (8 * k));
    return c;
#endif
}

// Byte permute: byte k of the result is byte (sel nibble k & 7) of the 8-byte value {hi:lo}.
// (Selectors here never set bit 3, the sign-replicate mode of the hardware instruction.)
STRATA_HD STRATA_FI uint32_t byte_perm(uint32_t lo, uint32_t hi, uint32_t sel) {
#ifdef __CUDA_ARCH__
    return __byte_perm(lo, hi, sel);
#else
    const uint64_t v = (uint64_t)hi << 32 | lo;
    uint32_t r = 0;
    for (int k = 0; k < 4; ++k) r |= (uint32_t)((v >> (8 * ((sel >> (4 * k)) & 7))) & 0xff) << (8 * k);
    return r;
#endif
}

// ---- warp helpers ----
#if defined(__CUDACC__) || defined(STRATA_SIM)
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ int warp_sum_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
#endif
