// What qmatmul.cpp shares with the other sources of the extension.
#pragma once

#include <cstdint>

namespace exo_kernels {

// out[M, N] = x[M, K] @ dequantize(w, scales, biases).T, x row-contiguous float32: the exact
// computation of the quantized_matmul primitive (same paths, same thread pool), run here.
void matmul_rows(
    const float* x, int64_t M, int64_t K, const uint32_t* w, const float* scales,
    const float* biases, int64_t N, int group_size, int bits, bool int8, float* out);

}  // namespace exo_kernels
