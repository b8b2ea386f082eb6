// What qmatmul.cpp shares with the other sources of the extension.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define EXO_X86 1
#endif

namespace exo_kernels {

// How a layer's scales and biases are stored: float32, or the 16 bits they came in (a GGUF's
// float16, an MLX model's bfloat16), which a decode step then reads instead of 32.
enum class ScaleType : int { f32 = 0, f16 = 1, bf16 = 2 };

// One call of the quantized matmul: what every path (portable, AVX2, AVX-512) reads.
struct Problem {
  const float* x;         // [M, K]
  const uint32_t* w;      // [N, K * bits / 32]
  // [N, G] float32. For 16-bit scales (`scale_type`) `rows` points these at float32 copies of
  // the rows it hands a kernel (exact widening), so every kernel reads float32 alike.
  const float* scales;    // [N, G]
  const float* biases;    // [N, G]
  ScaleType scale_type = ScaleType::f32;
  const uint16_t* scales16 = nullptr;  // [N, G] when scale_type is f16 or bf16
  const uint16_t* biases16 = nullptr;
  // Q4_0's layout: every bias is -8 x its scale, so none is stored (biases16 null; 16-bit
  // scales only). Kernels that widen take -8 x the widened scale (exact: the same float32 as a
  // stored float16 -8 x scale); the VNNI kernel's bias term, sum_g (bias + 8 scale) xsum_g, is
  // 0 and skipped. A 4-bit group-32 layer then reads 4.5 bits a weight instead of 5.
  bool implicit_bias = false;
  float* out;             // [M, N]
  const float* xsum;      // [M, G]
  const float* xp;        // [M, K]: x permuted to the 4-bit kernel's lane order (AVX2, 4 bits)
  const float* xst;       // [M / 4][G][4]: xsum of each block of 4 rows, transposed (AVX-512)
  // int8 activations (`int8`): x ~= dx[m, b] * qx[m, 32 b + i] per block b of 32 values; for
  // 4 bits each block holds its even elements, then its odd ones (the weights' nibble order).
  const int8_t* qx;       // [M, K]
  const float* dx;        // [M, K / 32]
  const float* dxt;       // [K / 32, M4]: dx transposed, M rounded up to 4 (4-row kernel)
  // The VNNI kernel's (`compute_vnni`): per row and unit of 64, -8 * the sum of each of its
  // two blocks' int8 values (the centring); qx then in that kernel's order.
  const int32_t* qc = nullptr;  // [M, K / 64, 2]
  int64_t m4;
  int64_t M, N, K, G;
  int group_size, bits;
  bool dequantize = false;  // write W itself (float32 [N, K]) to `out` instead of x @ W.T
  bool int8 = false;        // integer dot products against qx/dx instead of float ones
};

// out[M, N] = x[M, K] @ dequantize(w, scales, biases).T, x row-contiguous float32: the exact
// computation of the quantized_matmul primitive (same paths, same thread pool), run here.
// `scales` and `biases` are float32, or 16-bit words of `scale_type`.
void matmul_rows(
    const float* x, int64_t M, int64_t K, const uint32_t* w, const void* scales,
    const void* biases, ScaleType scale_type, int64_t N, int group_size, int bits, bool int8,
    float* out);

// n 16-bit floats of `type` (f16 or bf16) widened to float32 (exact; F16C where present).
void widen(const uint16_t* src, ScaleType type, int64_t n, float* dst);

// Whether to take the AVX2+FMA paths: the CPU has them and tests did not force the portable one.
bool use_avx2();

// out = silu(gate) * up over n floats, vectorised (swiglu.cpp): a prompt's MLP activation and
// fused_linear's SwiGLU prologue.
void swiglu(const float* gate, const float* up, float* out, int64_t n);

// The AVX-512 paths of float activations (qmatmul_avx512.cpp).
bool avx512_available();  // the CPU has AVX512F and tests forced neither AVX2 nor portable
bool avx512_takes(const Problem& p);  // this call takes them: float x, 8 bits or 4 with K % 64 == 0
void force_avx2(bool on);  // tests: the AVX2 paths even where AVX-512 is present
// One call on them: x put in their lane order (and its sums transposed), then `run(p)`, which
// hands rows of W to the threads, each calling rows_avx512 on its rows [n0, n1).
void compute_avx512(Problem p, void (*run)(const Problem&));
void rows_avx512(const Problem& p, int64_t n0, int64_t n1);

// The int8-activation path of 4-bit layers on AVX-512 VNNI (qmatmul_vnni.cpp).
bool vnni_available();  // the CPU has AVX512F/BW/VL + VNNI and tests forced no narrower path
bool vnni_takes(const Problem& p);  // int8 activations, 4 bits, K % 64 == 0
void force_no_vnni(bool on);  // tests: the AVX2 int8 kernels even where VNNI is present
// One call on it (p.qx / p.dx: x quantized by the int8 path): x reordered, then `run(p)`.
void compute_vnni(Problem p, void (*run)(const Problem&));
void rows_vnni(const Problem& p, int64_t n0, int64_t n1);

#ifdef EXO_X86
// bias[i][r] = sum_g biases[(n0 + i) * G + g] * xst[4 g + r] for the weight rows [n0, n1) (at
// most 8) and a block of 4 rows of x (xst: their sums per group, transposed to [G][4]). Each lane
// adds in g order, a multiply then an add: the one-row kernels' bias term, bit for bit. The 8
// chains run side by side (one at a time, a batch's bias terms waited on the add latency: ~7 %
// of an 8-row decode step).
inline void bias_terms(
    const float* biases, int64_t G, int64_t n0, int64_t n1, const float* xst, float (*bias)[4]) {
  const float* rows[8];
  for (int i = 0; i < 8; ++i) rows[i] = biases + (n0 + i < n1 ? n0 + i : n1 - 1) * G;
  __m128 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const __m128 x = _mm_load_ps(xst + 4 * g);
    for (int i = 0; i < 8; ++i) acc[i] = _mm_add_ps(acc[i], _mm_mul_ps(_mm_set1_ps(rows[i][g]), x));
  }
  for (int64_t i = 0; i < n1 - n0; ++i) _mm_store_ps(bias[i], acc[i]);
}

// Weight row n (if there is one) into the cache ahead of its reads: a small layer's rows are
// too short for the hardware prefetcher to run ahead of a decode step (~20 % of the step's
// matmul time on SmolLM2). Always inlined: GCC kept it an out-of-line call from the
// AVX-512 kernels (another target), 15-20 % slower on an 8-row step.
__attribute__((always_inline)) inline void prefetch_row(const Problem& p, int64_t n) {
  if (n >= p.N) return;
  const int64_t row_bytes = p.K * p.bits / 8;
  const char* row = reinterpret_cast<const char*>(p.w) + n * row_bytes;
  for (int64_t line = 0; line < row_bytes; line += 64) _mm_prefetch(row + line, _MM_HINT_T0);
}

// 16-bit scales as the kernels that read them in place see them (the one-row decode kernels:
// there the widening pass of `rows` cost ~10 % of a 4-bit group-32 step, more than the bytes it
// saved). `scale_at` is the float32 value (exact), `two_scales` two neighbours in lanes 0-1.
struct F16 {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

template <class T>
inline const T* scales_of(const Problem& p) {
  if constexpr (std::is_same_v<T, float>) return p.scales;
  else return reinterpret_cast<const T*>(p.scales16);
}
template <class T>
inline const T* biases_of(const Problem& p) {
  if constexpr (std::is_same_v<T, float>) return p.biases;
  else return reinterpret_cast<const T*>(p.biases16);
}

inline float scale_at(const float* s, int64_t i) {
  return s[i];
}
__attribute__((target("f16c"))) inline float scale_at(const F16* s, int64_t i) {
  return _cvtsh_ss(s[i].bits);
}
inline float scale_at(const BF16* s, int64_t i) {
  return _mm_cvtss_f32(_mm_castsi128_ps(_mm_cvtsi32_si128(static_cast<int>(s[i].bits) << 16)));
}

inline __m128 two_scales(const float* s) {
  return _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s)));
}
__attribute__((target("f16c"))) inline __m128 two_scales(const F16* s) {
  int32_t pair;
  std::memcpy(&pair, s, sizeof pair);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(pair));
}
__attribute__((target("sse4.1"))) inline __m128 two_scales(const BF16* s) {
  int32_t pair;
  std::memcpy(&pair, s, sizeof pair);
  return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_cvtsi32_si128(pair)), 16));
}

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
