// What qmatmul.cpp shares with the other sources of the extension.
#pragma once

#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define EXO_X86 1
#endif

namespace exo_kernels {

// out[M, N] = x[M, K] @ dequantize(w, scales, biases).T, x row-contiguous float32: the exact
// computation of the quantized_matmul primitive (same paths, same thread pool), run here.
void matmul_rows(
    const float* x, int64_t M, int64_t K, const uint32_t* w, const float* scales,
    const float* biases, int64_t N, int group_size, int bits, bool int8, float* out);

// Whether to take the AVX2+FMA paths: the CPU has them and tests did not force the portable one.
bool use_avx2();

#ifdef EXO_X86
// The sum of a vector's 8 lanes, always in the same order.
__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}
#endif

}  // namespace exo_kernels
