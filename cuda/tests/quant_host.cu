// Host-side check of the GPU decode and dot math (cuda/qdecode.cuh), run by
// tests/test_gpu_quant_host.py: the same STRATA_HD functions the kernels use, executed on the CPU.
//
//   quant_host dequant TYPE in.bin out.bin       blocks → f32 values (whole blocks)
//   quant_host dot TYPE K w.bin x.bin out.bin    rows of W [rows, K] · x f32 [n, K] → f32 [n, rows],
//                                                through q8_1 activations and the int8 item dot
//   quant_host q8_1 x.bin out.bin                f32 [n·32] → q8_1 blocks (36 B each)
//   quant_host f16 x.bin out.bin                 f32 → f16 bits (u16)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "../qdecode.cuh"

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
    std::vector<block_q8_1> xq(n * (k / 32));
    for (size_t i = 0; i < xq.size(); ++i) quantize_q8_1_ref(x + 32 * i, &xq[i]);
    std::vector<float> y(n * rows);
    const long items = k / 32;
    for (size_t t = 0; t < n; ++t)
        for (size_t r = 0; r < rows; ++r) {
            float acc = 0.0f;
            for (long i = 0; i < items; ++i) {
                QItem it;
                T::item(w.data() + r * row_bytes + (i / T::ITEMS) * T::BYTES, (int)(i % T::ITEMS), it);
                uint32_t qa[8];
                const float da = load_q8_1(&xq[t * items + i], qa);
                acc += item_dot<T>(it, qa, da);
            }
            y[t * rows + r] = acc;
        }
    write_file(out_path, y.data(), y.size() * 4);
    return 0;
}

#define TYPES(X) \
    X("Q8_0", TQ8_0) X("Q4_0", TQ4_0) X("Q5_0", TQ5_0) X("IQ4_NL", TIQ4_NL) X("Q2_K", TQ2_K) \
    X("Q3_K", TQ3_K) X("Q4_K", TQ4_K) X("Q5_K", TQ5_K) X("Q6_K", TQ6_K) X("IQ4_XS", TIQ4_XS) \
    X("IQ3_S", TIQ3_S) X("IQ3_XXS", TIQ3_XXS) X("IQ2_XS", TIQ2_XS)

int main(int argc, char** argv) {
    if (argc < 2) { fprintf(stderr, "usage: see the file header\n"); return 2; }
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
    if (mode == "q8_1" && argc == 4) {
        const std::vector<uint8_t> xb = read_file(argv[2]);
        const size_t nb = xb.size() / (32 * 4);
        std::vector<block_q8_1> out(nb);
        for (size_t i = 0; i < nb; ++i) quantize_q8_1_ref((const float*)xb.data() + 32 * i, &out[i]);
        write_file(argv[3], out.data(), out.size() * sizeof(block_q8_1));
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
