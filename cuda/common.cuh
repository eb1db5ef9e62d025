// Shared device code for every kernel file: ggml block structs, q8_1, warp reductions.
// (GPU_SPEC.md §3. Starts empty; the quantized-matrix work fills it.)
#ifndef STRATA_COMMON_CUH
#define STRATA_COMMON_CUH

#include <stdint.h>

#endif  // STRATA_COMMON_CUH
