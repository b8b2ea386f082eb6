// 16-bit scales and biases (float16, bfloat16) widened to float32 for the kernels.
//
// Every 16-bit value is exactly a float32, so a layer that keeps its scales in the bits they
// came in (a GGUF's Q4_0/Q4_1 float16: 4.5-5 bits a weight read per decode step, not 6) gives
// bit for bit what it gave with float32 copies of them.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels.h"

namespace exo_kernels {
namespace {

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// IEEE binary16 to binary32: zeros, subnormals, normals, infinities and NaNs (payload kept).
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h >> 15) << 31;
  const uint32_t exponent = (h >> 10) & 0x1F;
  const uint32_t mantissa = h & 0x3FF;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float32
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1F) return from_bits(sign | 0x7F800000u | (mantissa << 13));
  return from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

void widen_portable(const uint16_t* src, ScaleType type, int64_t n, float* dst) {
  if (type == ScaleType::bf16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = from_bits(static_cast<uint32_t>(src[i]) << 16);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
  }
}

#ifdef EXO_X86
bool has_f16c() {
  static const bool ok = __builtin_cpu_supports("f16c");
  return ok;
}

__attribute__((target("avx2,f16c"))) void widen_avx2(
    const uint16_t* src, ScaleType type, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256 f = type == ScaleType::bf16
        ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        : _mm256_cvtph_ps(h);
    _mm256_storeu_ps(dst + i, f);
  }
  widen_portable(src + i, type, n - i, dst + i);
}
#endif

}  // namespace

void widen(const uint16_t* src, ScaleType type, int64_t n, float* dst) {
#ifdef EXO_X86
  if (use_avx2() && has_f16c()) {
    widen_avx2(src, type, n, dst);
    return;
  }
#endif
  widen_portable(src, type, n, dst);
}

}  // namespace exo_kernels
