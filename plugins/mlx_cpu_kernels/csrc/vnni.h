// What the VNNI int8 kernels (qmatmul_vnni.cpp: 4-bit layers; qmatmul_vnni8.cpp: 8-bit ones)
// share: loading 16-bit scales, the bias term and the outputs' stores, prefetching.
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels.h"

#ifdef EXO_X86
#define EXO_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace exo_kernels::vnni {

// Weight rows prefetched ahead by the kernels (a decode step's rows are too short for the
// hardware prefetcher to run ahead), into L2, not L1: a core has few L1 miss buffers, and
// prefetches held there starved the loads. One row, 1 thread, 1B shapes streamed from memory:
// 8.4-12 GB/s a CPU-second with L1 prefetches, 12-15.5 into L2 (as llama.cpp's ~13.5 a core).
constexpr int64_t kAhead = 8;

// x's share of L2: rows of x are taken in tiles of at most this many bytes (codes, starts and
// dx), each tile against every weight row, so a long prompt's rows are read from L2, not L3.
constexpr int64_t kTileBytes = 512 * 1024;

// A unit: 64 weights (two blocks of 32).
constexpr int64_t kUnit = 64;

// Up to 16 scales or biases from s (the rest of the vector 0), widened to float32 (exact).
template <class T>
EXO_VNNI inline __m512 load16(const T* s, int64_t count) {
  const __mmask16 mask = count >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_maskz_loadu_ps(mask, s);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, s);
    if constexpr (std::is_same_v<T, F16>)
      return _mm512_cvtph_ps(h);
    else
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

EXO_VNNI inline float hsum512(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return hsum(_mm256_add_ps(lo, hi));
}

// Two 32-bit words (a unit's two starts or two dx) in the low lanes of a vector.
template <class V>
EXO_VNNI inline __m512i two_words(const V* at) {
  return _mm512_castsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at)));
}

// Bytes [offset, offset + bytes) of the weight row kAhead rows after row n (packed at `row`),
// into L2, where there is one.
inline void prefetch_ahead(
    const Problem& p, const uint8_t* row, int64_t n, int64_t offset, int64_t bytes) {
  if (n + kAhead >= p.N) return;
  const char* at = reinterpret_cast<const char*>(row + kAhead * (p.K * p.bits / 8) + offset);
  for (int64_t line = 0; line < bytes; line += 64) _mm_prefetch(at + line, _MM_HINT_T1);
}

// Outputs [m0, m0 + R) x [n, n + W): each lane total plus the bias term
// sum_g (bias + c scale) xsum_g (c = 2^(bits - 1), the centring), 16 groups a vector.
template <int W, int R, class T>
EXO_VNNI __attribute__((always_inline)) inline void store_outputs(
    const Problem& p, int64_t n, int64_t m0, const T* const (&sr)[W], const T* const (&br)[W],
    const __m512 (&total)[W][R]) {
  const __m512 c = _mm512_set1_ps(static_cast<float>(1 << (p.bits - 1)));
  __m512 bias[W][R];
  for (int j = 0; j < W; ++j)
    for (int r = 0; r < R; ++r) bias[j][r] = _mm512_setzero_ps();
  // Q4_0 (`implicit_bias`): bias + 8 scale is 0 in every group: neither read nor summed.
  for (int64_t g = 0; g < (p.implicit_bias ? 0 : p.G); g += 16) {
    const int64_t count = std::min<int64_t>(16, p.G - g);
    __m512 xs[R];
    for (int r = 0; r < R; ++r) xs[r] = load16(p.xsum + (m0 + r) * p.G + g, count);
    for (int j = 0; j < W; ++j) {
      const __m512 b =
          _mm512_add_ps(load16(br[j] + g, count), _mm512_mul_ps(c, load16(sr[j] + g, count)));
      for (int r = 0; r < R; ++r) bias[j][r] = _mm512_fmadd_ps(b, xs[r], bias[j][r]);
    }
  }
  for (int j = 0; j < W; ++j)
    for (int r = 0; r < R; ++r)
      p.out[(m0 + r) * p.N + n + j] = hsum512(_mm512_add_ps(total[j][r], bias[j][r]));
}

// Per thread (each MLX stream calls from its own), reused across calls.
template <class V>
V* scratch(std::vector<V>& store, int64_t count) {
  if (static_cast<int64_t>(store.size()) < count) store.resize(count);
  return store.data();
}

// f(gs, T{}) with the layer's group size (32, 64 or 128: std::integral_constant) and how its
// scales are stored (float, F16, BF16) as types: the kernels are compiled for each.
template <class F>
void by_layout(const Problem& p, F&& f) {
  const auto with = [&](auto scale) {
    switch (p.group_size) {
      case 32: f(std::integral_constant<int, 32>{}, scale); break;
      case 64: f(std::integral_constant<int, 64>{}, scale); break;
      default: f(std::integral_constant<int, 128>{}, scale); break;
    }
  };
  if (p.scale_type == ScaleType::f16)
    with(F16{});
  else if (p.scale_type == ScaleType::bf16)
    with(BF16{});
  else
    with(float{});
}

// The 8-bit layers' kernel (qmatmul_vnni8.cpp): x as the int8 path left it (p.qx, p.dx); per
// unit its two blocks' starts, -128 x the sum of their values, computed here; then `run(p)`.
void compute8(Problem p, void (*run)(const Problem&));
void rows8(const Problem& p, int64_t n0, int64_t n1);

}  // namespace exo_kernels::vnni
#endif
