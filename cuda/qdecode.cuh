// Per-type decode of one 32-element "item" of a quantized row, shared by every quantized kernel
// (mmvq, mmq, moe, getrows) and by the host check cuda/tests/quant_host.cu.
//
// Item i of a row covers elements 32i..32i+31 in dequantization order (item j of a 256-element
// super-block is its j-th group of 32), so it lines up with activation block i.
// An item is decoded into 8 words of 4 signed int8 values v (element 4w + b is byte b of v[w]),
// a scale per 16-element half d[h] and, for types with mins, m[h]:
//     y[e] = d[e/16]·v[e] − m[e/16]
// evaluated with separately rounded products (fmul_rn/fsub_rn), which is exactly the order of
// the CPU reference (rust/src/quant/dequant/, bit-exact with gguf-py): d[h] is computed the way
// the CPU computes its per-group scale (d·sc, d·(0.5 + s)·0.25, ...), and a sign-flipped grid
// value times db equals the CPU's sign-flipped db·grid.
#pragma once
#include <math.h>

#include "common.cuh"
#include "quant_tables.cuh"

struct QItem {
    uint32_t v[8];
    float d[2];
    float m[2];
};

// ---- 32-element blocks ----

// d f16 | qs i8[32]
struct TQ8_0 {
    static constexpr int QK = 32, BYTES = 34, ITEMS = 1, IS_FLOAT = 0, HAS_MIN = 0, ALIGN = 2;
    STRATA_HD static STRATA_FI void item(const uint8_t* b, int, QItem& it) {
        it.d[0] = it.d[1] = ld_f16(b);
#pragma unroll
        for (int w = 0; w < 8; ++w) it.v[w] = ld_u32_a2(b + 2 + 4 * w);
    }
};

// d f16 | qs[16]: element l low nibble of qs[l], element l+16 high nibble; y = d·(nib − 8)
struct TQ4_0 {
    static constexpr int QK = 32, BYTES = 18, ITEMS = 1, IS_FLOAT = 0, HAS_MIN = 0, ALIGN = 2;
    STRATA_HD static STRATA_FI void item(const uint8_t* b, int, QItem& it) {
        it.d[0] = it.d[1] = ld_f16(b);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const uint32_t q = ld_u32_a2(b + 2 + 4 * w);
            it.v[w] = vsub_b(q & 0x0f0f0f0fu, 0x08080808u);
            it.v[w + 4] = vsub_b((q >> 4) & 0x0f0f0f0fu, 0x08080808u);
        }
    }
};

// d f16 | qh u32 | qs[16]: bit 4 of element j is qh bit j; y = d·(q − 16)
struct TQ5_0 {
    static constexpr int QK = 32, BYTES = 22, ITEMS = 1, IS_FLOAT = 0, HAS_MIN = 0, ALIGN = 2;
    STRATA_HD static STRATA_FI void item(const uint8_t* b, int, QItem& it) {
        it.d[0] = it.d[1] = ld_f16(b);
        const uint32_t qh = ld_u32_a2(b + 2);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const uint32_t q = ld_u32_a2(b + 6 + 4 * w);
            const uint32_t lo = (q & 0x0f0f0f0fu) | spread4(qh >> (4 * w)) << 4;
            const uint32_t hi = ((q >> 4) & 0x0f0f0f0fu) | spread4(qh >> (16 + 4 * w)) << 4;
            it.v[w] = vsub_b(lo, 0x10101010u);
            it.v[w + 4] = vsub_b(hi, 0x10101010u);
        }
    }
};

// Four entries of a 16-byte table (its four little-endian words t0..t3) for the 4 nibbles
// (bits 0..3 of each byte) of n: two byte-permutes for entries 0..7 and 8..15, then a per-byte
// choice by bit 3.
STRATA_HD STRATA_FI uint32_t kv16_lookup4(uint32_t n, uint32_t t0, uint32_t t1, uint32_t t2,
                                          uint32_t t3) {
    n &= 0x0f0f0f0fu;
    const uint32_t sel = (n & 7u) | (n >> 4 & 0x70u) | (n >> 8 & 0x700u) | (n >> 12 & 0x7000u);
    const uint32_t lo = byte_perm(t0, t1, sel), hi = byte_perm(t2, t3, sel);
    const uint32_t m = ((n >> 3) & 0x01010101u) * 0xffu;
    return (lo & ~m) | (hi & m);
}

// Four kvalues_iq4nl entries for the 4 nibbles of n.
STRATA_HD STRATA_FI uint32_t iq4nl_lookup4(uint32_t n) {
    return kv16_lookup4(n, STRATA_KVALUES_IQ4NL_W0, STRATA_KVALUES_IQ4NL_W1,
                        STRATA_KVALUES_IQ4NL_W2, STRATA_KVALUES_IQ4NL_W3);
}

// d f16 | qs[16]: as Q4_0 with y = d·kvalues_iq4nl[nib]
struct TIQ4_NL {
    static constexpr int QK = 32, BYTES = 18, ITEMS = 1, IS_FLOAT = 0, HAS_MIN = 0, ALIGN = 2;
    STRATA_HD static STRATA_FI void item(const uint8_t* b, int, QItem& it) {
        it.d[0] = it.d[1] = ld_f16(b);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const uint32_t q = ld_u32_a2(b + 2 + 4 * w);
            it.v[w] = iq4nl_lookup4(q);
            it.v[w + 4] = iq4nl_lookup4(q >> 4);
        }
    }
};

// E8M0 exponent to f32, halved (ggml's e8m0_to_fp32_half): 2^(e − 128), subnormal for e < 2.
STRATA_HD STRATA_FI float e8m0_half(uint32_t e) {
    return bits_f32(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// A little-endian u32 at any address (MXFP4's 17-byte blocks have no alignment).
STRATA_HD STRATA_FI uint32_t ld_u32_a1(const uint8_t* p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// e u8 (E8M0) | qs[16]: element l low nibble of qs[l], element l+16 high nibble;
// y = e8m0_half(e)·kvalues_mxfp4[nib] (the doubled E2M1 values as int8: exact products)
struct TMXFP4 {
    static constexpr int QK = 32, BYTES = 17, ITEMS = 1, IS_FLOAT = 0, HAS_MIN = 0, ALIGN = 1;
    STRATA_HD static STRATA_FI void item(const uint8_t* b, int, QItem& it) {
        it.d[0] = it.d[1] = e8m0_half(b[0]);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const uint32_t q = ld_u32_a1(b + 1 + 4 * w);
            it.v[w] = kv16_lookup4(q, STRATA_KVALUES_MXFP4_W0, STRATA_KVALUES_MXFP4_W1,
                                   STRATA_KVALUES_MXFP4_W2, STRATA_KVALUES_MXFP4_W3);
            it.v[w + 4] = kv16_lookup4(q >> 4, STRATA_KVALUES_MXFP4_W0, STRATA_KVALUES_MXFP4_W1,
                                       STRATA_KVALUES_MXFP4_W2, STRATA_KVALUES_MXFP4_W3);
        }
    }
};

// ---- k-quants (256-element super-blocks) ----

// scales[16] | qs[64] | d | dmin. Item 4h + j, element l: q = (qs[32h + l] >> 2j) & 3,
// sc = scales[8h + 2j + l/16]; y = (d·(sc & 15))·q − dmin·(sc >> 4)
struct TQ2_K {
    static constexpr int QK = 256, BYTES = 84, ITEMS = 8, IS_FLOAT = 0, HAS_MIN = 1, ALIGN = 4;
    STRATA_HD static STRATA_FI void item(const uint8_t* b, int j, QItem& it) {
        const int h = j >> 2, s = j & 3;
        const float d = ld_f16(b + 80), dmin = ld_f16(b + 82);
        const uint32_t sc = ld_u16(b + 8 * h + 2 * s);
        it.d[0] = d * (float)(sc & 15);
        it.m[0] = dmin * (float)((sc >> 4) & 15);
        it.d[1] = d * (float)((sc >> 8) & 15);
        it.m[1] = dmin * (float)(sc >> 12);
#pragma unroll
        for (int w = 0; w < 8; ++w) it.v[w] = (ld_u32_a4(b + 16 + 32 * h + 4 * w) >> (2 * s)) & 0x03030303u;
    }
};

// The signed 6-bit scale s (0..15) of Q3_K from scales[12] at sc.
STRATA_HD STRATA_FI int q3_k_scale(const uint8_t* sc, int s) {
    const uint32_t low4 = s < 8 ? (sc[s] & 15u) : (uint32_t)(sc[s - 8] >> 4);
    const uint32_t hi2 = (sc[8 + (s & 3)] >> (2 * (s >> 2))) & 3u;
    return (int)(low4 | hi2 << 4) - 32;
}

// hmask[32] | qs[64] | scales[12] | d. Item 4h + j, element l: q = ((qs[32h + l] >> 2j) & 3)
// − (hmask[l] bit (4h + j) ? 0 : 4); y = (d·sc[8h + 2j + l/16])·q
struct TQ3_K {
    static constexpr int QK = 256, BYTES = 110, ITEMS = 8, IS_FLOAT = 0, HAS_MIN = 0, ALIGN = 2;
    STRATA_HD static STRATA_FI void item(const uint8_t* b, int j, QItem& it) {
        const int h = j >> 2, s = j & 3;
        const float d = ld_f16(b + 108);
        it.d[0] = d * (float)q3_k_scale(b + 96, 8 * h + 2 * s);
        it.d[1] = d * (float)q3_k_scale(b + 96, 8 * h + 2 * s + 1);
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const uint32_t q2 = (ld_u32_a2(b + 32 + 32 * h + 4 * w) >> (2 * s)) & 0x03030303u;
            const uint32_t hb = (ld_u32_a2(b + 4 * w) >> (4 * h + s)) & 0x01010101u;
            it.v[w] = vsub_b(q2 | hb << 2, 0x04040404u);
        }
    }
};

// get_scale_min_k4, the 6-bit (scale, min) of sub-block k, from the 16-byte header of a Q4_K /
// Q5_K block as 4 words (h[0]: d, dmin; h[1..3]: scales[12]), without branches.
STRATA_HD STRATA_FI void scale_min_k4_w(const uint32_t (&h)[4], int k, uint32_t& sc, uint32_t& m) {
    const int s = 8 * (k & 3);
    const uint32_t a = (h[1] >> s) & 255u, b = (h[2] >> s) & 255u, c = (h[3] >> s) & 255u;
    const bool lo = k < 4;
    sc = lo ? (a & 63u) : ((c & 15u) | (a >> 6) << 4);
    m = lo ? (b & 63u) : ((c >> 4) | (b >> 6) << 4);
}

// d | dmin | scales[12] | qs[128]. Item k takes nibble k%2 of qs[32(k/2) + l];
// y = (d·sc_k)·q − dmin·m_k
struct TQ4_K {
    static constexpr int QK = 256, BYTES = 144, ITEMS = 8, IS_FLOAT = 0, HAS_MIN = 1, ALIGN = 4;
    STRATA_HD static STRATA_FI void item(const uint8_t* b, int k, QItem& it) {
        uint32_t h[4], sc, m;
        ld_16b_a4(b, h);  // one load for d, dmin and the scales
        scale_min_k4_w(h, k, sc, m);
        it.d[0] = it.d[1] = f16_to_f32((uint16_t)(h[0] & 0xffffu)) * (float)sc;
        it.m[0] = it.m[1] = f16_to_f32((uint16_t)(h[0] >> 16)) * (float)m;
        uint32_t q[8];
        ld_32b_a4(b + 16 + 32 * (k >> 1), q);
        const int shift = 4 * (k & 1);
#pragma unroll
        for (int w = 0; w < 8; ++w) it.v[w] = (q[w] >> shift) & 0x0f0f0f0fu;
    }
};

// d | dmin | scales[12] | qh[32] | qs[128]. As Q4_K plus bit k of qh[l] as bit 4.
struct TQ5_K {
    static constexpr int QK = 256, BYTES = 176, ITEMS = 8, IS_FLOAT = 0, HAS_MIN = 1, ALIGN = 4;
    STRATA_HD static STRATA_FI void item(const uint8_t* b, int k, QItem& it) {
        uint32_t hd[4], sc, m;
        ld_16b_a4(b, hd);
        scale_min_k4_w(hd, k, sc, m);
        it.d[0] = it.d[1] = f16_to_f32((uint16_t)(hd[0] & 0xffffu)) * (float)sc;
        it.m[0] = it.m[1] = f16_to_f32((uint16_t)(hd[0] >> 16)) * (float)m;
        uint32_t q[8], qh[8];
        ld_32b_a4(b + 48 + 32 * (k >> 1), q);
        ld_32b_a4(b + 16, qh);
        const int shift = 4 * (k & 1);
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const uint32_t lo = (q[w] >> shift) & 0x0f0f0f0fu;
            const uint32_t hi = (qh[w] >> k) & 0x01010101u;
            it.v[w] = lo | hi << 4;
        }
    }
};

// ql[128] | qh[64] | scales i8[16] | d. Item 4h + k, element l: q = nibble (k/2) of
// ql[64h + 32(k%2) + l] | ((qh[32h + l] >> 2k) & 3) << 4; y = (d·scales[8h + 2k + l/16])·(q − 32)
struct TQ6_K {
    static constexpr int QK = 256, BYTES = 210, ITEMS = 8, IS_FLOAT = 0, HAS_MIN = 0, ALIGN = 2;
    STRATA_HD static STRATA_FI void item(const uint8_t* b, int j, QItem& it) {
        const int h = j >> 2, k = j & 3;
        const float d = ld_f16(b + 208);
        const uint32_t sc = ld_u16(b + 192 + 8 * h + 2 * k);
        it.d[0] = d * (float)(int8_t)(sc & 255);
        it.d[1] = d * (float)(int8_t)(sc >> 8);
        const int shift = 4 * (k >> 1);
        uint32_t ql[8], qh[8];
        ld_32b_a2(b + 64 * h + 32 * (k & 1), ql);
        ld_32b_a2(b + 128 + 32 * h, qh);
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const uint32_t lo = (ql[w] >> shift) & 0x0f0f0f0fu;
            const uint32_t hi = (qh[w] >> (2 * k)) & 0x03030303u;
            it.v[w] = vsub_b(lo | hi << 4, 0x20202020u);
        }
    }
};

// ---- i-quants ----

// d | scales_h u16 | scales_l[4] | qs[128]. Group g: ls = nibble g of scales_l | 2 bits of
// scales_h << 4, dl = d·(ls − 32); 16 bytes, low nibbles first; y = dl·kvalues_iq4nl[nib]
struct TIQ4_XS {
    static constexpr int QK = 256, BYTES = 136, ITEMS = 8, IS_FLOAT = 0, HAS_MIN = 0, ALIGN = 4;
    STRATA_HD static STRATA_FI void item(const uint8_t* b, int g, QItem& it) {
        const uint32_t lo = (b[4 + (g >> 1)] >> (4 * (g & 1))) & 15u;
        const uint32_t hi = (ld_u16(b + 2) >> (2 * g)) & 3u;
        it.d[0] = it.d[1] = ld_f16(b) * (float)((int)(lo | hi << 4) - 32);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const uint32_t q = ld_u32_a4(b + 8 + 16 * g + 4 * w);
            it.v[w] = iq4nl_lookup4(q);
            it.v[w + 4] = iq4nl_lookup4(q >> 4);
        }
    }
};

// d | qs[64] | qh[8] | signs[32] | scales[4]. Group g: db = d·(1 + 2·nibble g of scales);
// entry k = 8g + i: index qs[k] | (qh[g] bit i) << 8 into iq3s_grid; its 4 signs are bits
// 4(i%2).. of signs[4g + i/2]
struct TIQ3_S {
    static constexpr int QK = 256, BYTES = 110, ITEMS = 8, IS_FLOAT = 0, HAS_MIN = 0, ALIGN = 2;
    STRATA_HD static STRATA_FI void item(const uint8_t* b, int g, QItem& it) {
        const uint32_t s = (b[106 + (g >> 1)] >> (4 * (g & 1))) & 15u;
        it.d[0] = it.d[1] = ld_f16(b) * (float)(1u + 2u * s);
        const uint32_t qh = b[66 + g];
        const uint32_t signs = ld_u32_a2(b + 74 + 4 * g);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const uint32_t idx = b[2 + 8 * g + i] | ((qh >> i) & 1u) << 8;
            it.v[i] = apply_signs(iq3s_grid(idx), sign_mask4(signs >> (4 * i)));
        }
    }
};

// d | qs[64] grid indices | u32[8] sign/scale words. Group g: w = word g,
// db = d·(0.5 + (w >> 28))·0.5; 8-group l: signs = ksigns[(w >> 7l) & 127], values 0..3 from
// iq3xxs_grid[qs[8g + 2l]], 4..7 from iq3xxs_grid[qs[8g + 2l + 1]]
struct TIQ3_XXS {
    static constexpr int QK = 256, BYTES = 98, ITEMS = 8, IS_FLOAT = 0, HAS_MIN = 0, ALIGN = 2;
    STRATA_HD static STRATA_FI void item(const uint8_t* b, int g, QItem& it) {
        const uint32_t w = ld_u32_a2(b + 66 + 4 * g);
        it.d[0] = it.d[1] = ld_f16(b) * (0.5f + (float)(w >> 28)) * 0.5f;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t signs = ksigns_iq2xs((w >> (7 * l)) & 127u);
            it.v[2 * l] = apply_signs(iq3xxs_grid(b[2 + 8 * g + 2 * l]), sign_mask4(signs));
            it.v[2 * l + 1] = apply_signs(iq3xxs_grid(b[3 + 8 * g + 2 * l]), sign_mask4(signs >> 4));
        }
    }
};

// d | qs u16[32] | scales[8]. Entry i: low 9 bits index iq2xs_grid (8 values), high 7 bits
// ksigns; db = d·(0.5 + nibble (i/2) of scales)·0.25. Group g = entries 4g..4g+3: entries
// 4g, 4g+1 (first 16 elements) use nibble 2g, the other two nibble 2g + 1
struct TIQ2_XS {
    static constexpr int QK = 256, BYTES = 74, ITEMS = 8, IS_FLOAT = 0, HAS_MIN = 0, ALIGN = 2;
    STRATA_HD static STRATA_FI void item(const uint8_t* b, int g, QItem& it) {
        const float d = ld_f16(b);
        const uint32_t sc = b[66 + g];
        it.d[0] = d * (0.5f + (float)(sc & 15u)) * 0.25f;
        it.d[1] = d * (0.5f + (float)(sc >> 4)) * 0.25f;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const uint32_t q = ld_u16(b + 2 + 8 * g + 2 * e);
            const uint64_t grid = iq2xs_grid(q & 511u);
            const uint32_t signs = ksigns_iq2xs(q >> 9);
            it.v[2 * e] = apply_signs((uint32_t)grid, sign_mask4(signs));
            it.v[2 * e + 1] = apply_signs((uint32_t)(grid >> 32), sign_mask4(signs >> 4));
        }
    }
};

// ---- float rows (no int8 path: the kernels dot them with the f32 activations) ----
// An item is 32 consecutive elements; `fitem` widens them exactly as the CPU does.

struct TF32 {
    static constexpr int QK = 32, BYTES = 128, ITEMS = 1, IS_FLOAT = 1, HAS_MIN = 0, ALIGN = 16;
    STRATA_HD static STRATA_FI void fitem(const uint8_t* p, float* v) {
#pragma unroll
        for (int w = 0; w < 32; ++w) v[w] = bits_f32(ld_u32_a4(p + 4 * w));
    }
};

struct TF16 {
    static constexpr int QK = 32, BYTES = 64, ITEMS = 1, IS_FLOAT = 1, HAS_MIN = 0, ALIGN = 8;
    STRATA_HD static STRATA_FI void fitem(const uint8_t* p, float* v) {
#pragma unroll
        for (int w = 0; w < 16; ++w) {
            const uint32_t u = ld_u32_a4(p + 4 * w);
            v[2 * w] = f16_to_f32((uint16_t)(u & 0xffffu));
            v[2 * w + 1] = f16_to_f32((uint16_t)(u >> 16));
        }
    }
};

// The top 16 bits of an f32.
struct TBF16 {
    static constexpr int QK = 32, BYTES = 64, ITEMS = 1, IS_FLOAT = 1, HAS_MIN = 0, ALIGN = 8;
    STRATA_HD static STRATA_FI void fitem(const uint8_t* p, float* v) {
#pragma unroll
        for (int w = 0; w < 16; ++w) {
            const uint32_t u = ld_u32_a4(p + 4 * w);
            v[2 * w] = bits_f32(u << 16);
            v[2 * w + 1] = bits_f32(u & 0xffff0000u);
        }
    }
};

// ---- dequantization and the int8 dot of one item ----

// The 32 values of an item, bit-exact with the CPU reference.
template <class T>
STRATA_HD STRATA_FI void item_dequant(const QItem& it, float* y) {
#pragma unroll
    for (int w = 0; w < 8; ++w) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float q = (float)(int8_t)(it.v[w] >> (8 * k));
            float v = fmul_rn(it.d[w >> 2], q);
            if (T::HAS_MIN) v = fsub_rn(v, it.m[w >> 2]);
            y[4 * w + k] = v;
        }
    }
}

// Σ_e y[e]·a[e] for the item's values y and the activations a = da·qa[e]: exact int8 sums per
// half, combined in f32: da·(d0·Σ0 v·qa + d1·Σ1 v·qa − m0·Σ0 qa − m1·Σ1 qa).
// qa: the 8 words of the activation block; da its scale.
template <class T>
STRATA_HD STRATA_FI float item_dot(const QItem& it, const uint32_t* qa, float da) {
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        s0 = dp4a(it.v[w], qa[w], s0);
        s1 = dp4a(it.v[w + 4], qa[w + 4], s1);
    }
    float r = it.d[0] * (float)s0 + it.d[1] * (float)s1;
    if (T::HAS_MIN) {
        int a0 = 0, a1 = 0;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            a0 = dp4a(0x01010101u, qa[w], a0);
            a1 = dp4a(0x01010101u, qa[w + 4], a1);
        }
        r -= it.m[0] * (float)a0 + it.m[1] * (float)a1;
    }
    return da * r;
}

// The 8 words and the scale of an activation block (4-byte aligned).
STRATA_HD STRATA_FI float load_q8a(const block_q8a* a, uint32_t* qa) {
    const uint8_t* p = (const uint8_t*)a;
#pragma unroll
    for (int w = 0; w < 8; ++w) qa[w] = ld_u32_a4(p + 4 + 4 * w);
    return bits_f32(ld_u32_a4(p));
}

// Round half to even, as ggml's nearest_int (the CPU quantizers) and rintf do: exact for
// |v| < 2^22.
STRATA_HD STRATA_FI int act_rint(float v) {
#ifdef __CUDA_ARCH__
    return __float2int_rn(v);
#else
    return (int)(f32_bits(v + 12582912.0f) & 0x007fffffu) - 0x00400000;
#endif
}

// The CPU path's activations for weights whose vec_dot type is Q8_0 (rust/src/quant/dot/act.rs
// q8_0, ggml's x86 quantize_row_q8_0): per 32 values d = f16(amax/127) (kept as its f32 value),
// q = round-half-even(x·(127/amax)), no clamp (|q| ≤ 127 by construction).
STRATA_HD STRATA_FI float act_q8_0_scale(float amax) {
    return f16_to_f32(f32_to_f16(amax / 127.0f));
}
STRATA_HD STRATA_FI float act_q8_0_inv(float amax) { return amax != 0.0f ? 127.0f / amax : 0.0f; }

STRATA_HD inline void act_q8_0_ref(const float* x, block_q8a* out) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(x[i]));
    const float id = act_q8_0_inv(amax);
    for (int i = 0; i < 32; ++i) out->qs[i] = (int8_t)act_rint(fmul_rn(x[i], id));
    out->d = act_q8_0_scale(amax);
}

// The CPU path's activations for weights whose vec_dot type is Q8_K (K-quants and the
// 256-element IQ types; act.rs q8_k, ggml's quantize_row_q8_K): per 256 values, `max` is the
// first element of largest magnitude, iscale = −127/max, q = min(127, round-half-even(iscale·x)),
// d = 1/iscale (f32), the same d in each of the 8 blocks. All zero: d = 0, q = 0.
STRATA_HD inline void act_q8_k_ref(const float* x, block_q8a* out) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < 256; ++i)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    const float iscale = amax != 0.0f ? -127.0f / max : 0.0f;
    const float d = amax != 0.0f ? 1.0f / iscale : 0.0f;
    for (int b = 0; b < 8; ++b) {
        for (int i = 0; i < 32; ++i) {
            const int q = act_rint(fmul_rn(iscale, x[32 * b + i]));
            out[b].qs[i] = (int8_t)(q < 127 ? q : 127);
        }
        out[b].d = d;
    }
}

// Whether type T's activations are q8_K (256-element super-blocks) rather than q8_0.
template <class T>
STRATA_HD STRATA_FI constexpr bool act_is_q8_k() {
    return T::QK == 256;
}

// The 32 values of item i of a row (any type), bit-exact with the CPU reference.
template <class T>
STRATA_HD STRATA_FI void item_values(const uint8_t* row, long i, float* y) {
    if constexpr (T::IS_FLOAT) {
        T::fitem(row + i * T::BYTES, y);
    } else {
        QItem it;
        T::item(row + (i / T::ITEMS) * T::BYTES, (int)(i % T::ITEMS), it);
        item_dequant<T>(it, y);
    }
}

// Bytes of a row of `items` 32-element items.
template <class T>
STRATA_HD STRATA_FI size_t row_bytes_of(long items) {
    return (size_t)(items / T::ITEMS) * T::BYTES;
}

// Every type the kernels support: X(kernel suffix, decode struct). Float types use the f32
// activations directly; the others int8 activation blocks (q8_0 or q8_K, act_is_q8_k).
#define STRATA_FOR_TYPES(X)                                                                    \
    X(f32, TF32) X(f16, TF16) X(bf16, TBF16) X(q8_0, TQ8_0) X(q4_0, TQ4_0) X(q5_0, TQ5_0)      \
    X(iq4_nl, TIQ4_NL) X(mxfp4, TMXFP4) X(q2_k, TQ2_K) X(q3_k, TQ3_K) X(q4_k, TQ4_K)           \
    X(q5_k, TQ5_K) X(q6_k, TQ6_K) X(iq4_xs, TIQ4_XS) X(iq3_s, TIQ3_S) X(iq3_xxs, TIQ3_XXS)     \
    X(iq2_xs, TIQ2_XS)
