// Host-side check of the GPU decode and dot math (cuda/qdecode.cuh), run by
// tests/test_gpu_quant_host.py: the same STRATA_HD functions the kernels use, executed on the CPU.
//
//   quant_host dequant TYPE in.bin out.bin       blocks → f32 values (whole blocks)
//   quant_host dot TYPE K w.bin x.bin out.bin    rows of W [rows, K] · x f32 [n, K] → f32 [n, rows],
//                                                through the type's int8 activations (q8_0 or
//                                                q8_K, as the CPU path) and the int8 item dot
//   quant_host act KIND x.bin out.bin            f32 → activation blocks (36 B each: f32 d,
//                                                32 × int8); KIND q8_0 (n·32 values) or q8_k
//                                                (n·256 values)
//   quant_host f16 x.bin out.bin                 f32 → f16 bits (u16)
//   quant_host                                   self-check (tests/test_cuda_host.py runs it): for
//       every type, random blocks' int8 item dot equals Σ dequant·(activation values) within
//       16·u·Σ|terms|; the activation rounding bound; f16 round trips. Exit 0 when all hold.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "qdecode.cuh"

static std::vector<uint8_t> read_file(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    std::vector<uint8_t> out;
    uint8_t buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
    fclose(f);
    return out;
}

static void write_file(const char* path, const void* data, size_t n) {
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) { perror(path); exit(2); }
    fclose(f);
}

template <class T>
static int run_dequant(const std::vector<uint8_t>& in, const char* out_path) {
    if (in.size() % T::BYTES) { fprintf(stderr, "not whole blocks\n"); return 2; }
    const size_t nb = in.size() / T::BYTES;
    std::vector<float> y(nb * T::QK);
    for (size_t b = 0; b < nb; ++b)
        for (int j = 0; j < T::ITEMS; ++j) {
            QItem it;
            T::item(in.data() + b * T::BYTES, j, it);
            item_dequant<T>(it, y.data() + b * T::QK + 32 * j);
        }
    write_file(out_path, y.data(), y.size() * 4);
    return 0;
}

template <class T>
static int run_dot(long k, const std::vector<uint8_t>& w, const std::vector<uint8_t>& xb,
                   const char* out_path) {
    if (k % T::QK) { fprintf(stderr, "K not whole blocks\n"); return 2; }
    const size_t row_bytes = (size_t)(k / T::QK) * T::BYTES;
    if (w.size() % row_bytes || xb.size() % (4 * k)) { fprintf(stderr, "bad sizes\n"); return 2; }
    const size_t rows = w.size() / row_bytes, n = xb.size() / (4 * k);
    const float* x = (const float*)xb.data();
    std::vector<block_q8a> xq(n * (k / 32));
    if (act_is_q8_k<T>()) {
        for (size_t i = 0; i < xq.size(); i += 8) act_q8_k_ref(x + 32 * i, &xq[i]);
    } else {
        for (size_t i = 0; i < xq.size(); ++i) act_q8_0_ref(x + 32 * i, &xq[i]);
    }
    std::vector<float> y(n * rows);
    const long items = k / 32;
    for (size_t t = 0; t < n; ++t)
        for (size_t r = 0; r < rows; ++r) {
            float acc = 0.0f;
            for (long i = 0; i < items; ++i) {
                QItem it;
                T::item(w.data() + r * row_bytes + (i / T::ITEMS) * T::BYTES, (int)(i % T::ITEMS), it);
                uint32_t qa[8];
                const float da = load_q8a(&xq[t * items + i], qa);
                acc += item_dot<T>(it, qa, da);
            }
            y[t * rows + r] = acc;
        }
    write_file(out_path, y.data(), y.size() * 4);
    return 0;
}

// ---- self-check ----
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd() {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rnd_normal() {
    float s = 0.0f;
    for (int i = 0; i < 12; ++i) s += (float)(rnd() & 0xffff) / 65536.0f;
    return s - 6.0f;
}

// Random block bytes with finite f16 scales (2^-12..2^2, random sign) at the given offsets
// (MXFP4: its E8M0 scale 2^-18..2^11).
template <class T>
static void random_block(uint8_t* b, const int* f16_at, int n_f16) {
    for (int i = 0; i < T::BYTES; ++i) b[i] = (uint8_t)rnd();
    for (int f = 0; f < n_f16; ++f) {
        const float mag = ldexpf(1.0f + (float)(rnd() & 1023) / 1024.0f, (int)(rnd() % 15) - 12);
        const uint16_t h = f32_to_f16((rnd() & 1) ? -mag : mag);
        b[f16_at[f]] = (uint8_t)(h & 0xff);
        b[f16_at[f] + 1] = (uint8_t)(h >> 8);
    }
    if (T::QK == 32 && T::BYTES == 17) b[0] = (uint8_t)(110 + rnd() % 30);  // MXFP4's E8M0 scale
}

template <class T>
static int self_check_type(const char* name, std::initializer_list<int> f16_fields) {
    const std::vector<int> at(f16_fields);
    std::vector<uint8_t> b(T::BYTES);
    int bad = 0;
    for (int rep = 0; rep < 200; ++rep) {
        random_block<T>(b.data(), at.data(), (int)at.size());
        for (int j = 0; j < T::ITEMS; ++j) {
            QItem it;
            T::item(b.data(), j, it);
            float y[32], x[256];
            item_dequant<T>(it, y);
            const int nx = act_is_q8_k<T>() ? 256 : 32;  // the item's 32 values come first
            for (int e = 0; e < nx; ++e) x[e] = rnd_normal() * ((rnd() & 63) == 0 ? 20.0f : 1.0f);
            block_q8a ab[8];
            if (act_is_q8_k<T>()) act_q8_k_ref(x, ab);
            else act_q8_0_ref(x, ab);
            const block_q8a& a = ab[0];
            uint32_t qa[8];
            const float da = load_q8a(&a, qa);
            const float got = item_dot<T>(it, qa, da);
            double want = 0.0, mag = 0.0, amax = 0.0;
            for (int e = 0; e < nx; ++e) amax = fmax(amax, fabs((double)x[e]));
            for (int e = 0; e < 32; ++e) {
                const double xh = (double)da * a.qs[e];
                want += (double)y[e] * xh;
                const double term = fabs((double)it.d[e / 16] * (int8_t)(it.v[e / 4] >> (8 * (e % 4)))) +
                                    (T::HAS_MIN ? fabs((double)it.m[e / 16]) : 0.0);
                mag += term * fabs(xh);
                if (fabs(x[e] - xh) > fabs(da) / 2.0 + amax * ldexp(1.0, -10)) ++bad;
            }
            if (fabs((double)got - want) > 16.0 * ldexp(1.0, -24) * mag + 1e-30) {
                if (bad < 5) fprintf(stderr, "%s: item dot %.9g vs %.9g\n", name, got, want);
                ++bad;
            }
        }
    }
    printf("%s: %s\n", name, bad ? "FAILED" : "ok");
    return bad;
}

static int self_check() {
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000u; ++h)
        if ((h & 0x7c00u) != 0x7c00u && f32_to_f16(f16_to_f32((uint16_t)h)) != h) ++bad;
    printf("f16 round trip: %s\n", bad ? "FAILED" : "ok");
    bad += self_check_type<TQ8_0>("Q8_0", {0});
    bad += self_check_type<TQ4_0>("Q4_0", {0});
    bad += self_check_type<TQ5_0>("Q5_0", {0});
    bad += self_check_type<TIQ4_NL>("IQ4_NL", {0});
    bad += self_check_type<TMXFP4>("MXFP4", {});
    bad += self_check_type<TQ2_K>("Q2_K", {80, 82});
    bad += self_check_type<TQ3_K>("Q3_K", {108});
    bad += self_check_type<TQ4_K>("Q4_K", {0, 2});
    bad += self_check_type<TQ5_K>("Q5_K", {0, 2});
    bad += self_check_type<TQ6_K>("Q6_K", {208});
    bad += self_check_type<TIQ4_XS>("IQ4_XS", {0});
    bad += self_check_type<TIQ3_S>("IQ3_S", {0});
    bad += self_check_type<TIQ3_XXS>("IQ3_XXS", {0});
    bad += self_check_type<TIQ2_XS>("IQ2_XS", {0});
    return bad ? 1 : 0;
}

#define TYPES(X) \
    X("Q8_0", TQ8_0) X("Q4_0", TQ4_0) X("Q5_0", TQ5_0) X("IQ4_NL", TIQ4_NL) X("MXFP4", TMXFP4) \
    X("Q2_K", TQ2_K) \
    X("Q3_K", TQ3_K) X("Q4_K", TQ4_K) X("Q5_K", TQ5_K) X("Q6_K", TQ6_K) X("IQ4_XS", TIQ4_XS) \
    X("IQ3_S", TIQ3_S) X("IQ3_XXS", TIQ3_XXS) X("IQ2_XS", TIQ2_XS)

int main(int argc, char** argv) {
    if (argc < 2) return self_check();
    const std::string mode = argv[1];
    if (mode == "dequant" && argc == 5) {
        const std::string ty = argv[2];
        const std::vector<uint8_t> in = read_file(argv[3]);
#define X(name, T) if (ty == name) return run_dequant<T>(in, argv[4]);
        TYPES(X)
#undef X
        fprintf(stderr, "unknown type %s\n", argv[2]);
        return 2;
    }
    if (mode == "dot" && argc == 7) {
        const std::string ty = argv[2];
        const long k = atol(argv[3]);
        const std::vector<uint8_t> w = read_file(argv[4]), x = read_file(argv[5]);
#define X(name, T) if (ty == name) return run_dot<T>(k, w, x, argv[6]);
        TYPES(X)
#undef X
        fprintf(stderr, "unknown type %s\n", argv[2]);
        return 2;
    }
    if (mode == "act" && argc == 5) {
        const std::string kind = argv[2];
        const std::vector<uint8_t> xb = read_file(argv[3]);
        const float* x = (const float*)xb.data();
        const size_t nb = xb.size() / (32 * 4);
        std::vector<block_q8a> out(nb);
        if (kind == "q8_0") {
            for (size_t i = 0; i < nb; ++i) act_q8_0_ref(x + 32 * i, &out[i]);
        } else if (kind == "q8_k" && nb % 8 == 0) {
            for (size_t i = 0; i < nb; i += 8) act_q8_k_ref(x + 32 * i, &out[i]);
        } else {
            fprintf(stderr, "unknown kind %s (or not whole 256-value blocks)\n", argv[2]);
            return 2;
        }
        write_file(argv[4], out.data(), out.size() * sizeof(block_q8a));
        return 0;
    }
    if (mode == "f16" && argc == 4) {
        const std::vector<uint8_t> xb = read_file(argv[2]);
        std::vector<uint16_t> out(xb.size() / 4);
        for (size_t i = 0; i < out.size(); ++i) out[i] = f32_to_f16(((const float*)xb.data())[i]);
        write_file(argv[3], out.data(), out.size() * 2);
        return 0;
    }
    fprintf(stderr, "bad arguments\n");
    return 2;
}
