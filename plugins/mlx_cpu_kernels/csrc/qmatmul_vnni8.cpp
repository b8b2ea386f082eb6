// 8-bit weights x int8 activations on AVX-512 VNNI: a GGUF's Q8_0 layers (SmolLM2's output
// head). The shared parts and the 4-bit kernel's notes: vnni.h, qmatmul_vnni.cpp.

#include "vnni.h"

#ifdef EXO_X86
namespace exo_kernels::vnni {

namespace {

// 8-bit layers: 64 weights (two blocks) a `vpdpbusd`, the unsigned codes against x in the int8
// path's order (8 bits: as it is), lanes 0-7 block 0's, 8-15 block 1's; the centring (q - 128)
// in each block's first lane's start, -128 * the sum of its int8 values (p.qc: two a unit). The
// float work is per unit: such layers are few (a GGUF's Q8_0 output head, SmolLM2's), and the
// one-row calls they take are bound by reading 8 bits a weight. The AVX2 int8 kernel took 24 %
// of a SmolLM2 decode step on the head.
EXO_VNNI inline __m512i unit8_lanes() {
  return _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
}

template <int GS, class T>
EXO_VNNI inline __m512 unit8_scale(const T* sr, int64_t u) {
  if constexpr (GS == 32)
    return _mm512_permutexvar_ps(unit8_lanes(), _mm512_castps128_ps512(two_scales(sr + 2 * u)));
  else
    return _mm512_set1_ps(scale_at(sr, u * kUnit / GS));
}

template <int GS, int W, int R, class T>
EXO_VNNI inline void block8(const Problem& p, int64_t n, int64_t m0) {
  const int64_t units = p.K / kUnit;
  const uint8_t* wr[W];
  const T* sr[W];
  const T* br[W];
  for (int j = 0; j < W; ++j) {
    wr[j] = reinterpret_cast<const uint8_t*>(p.w) + (n + j) * p.K;
    sr[j] = scales_of<T>(p) + (n + j) * p.G;
    br[j] = p.implicit_bias ? nullptr : biases_of<T>(p) + (n + j) * p.G;
  }
  const __m512i lanes = unit8_lanes();
  __m512 total[W][R];
  for (int j = 0; j < W; ++j)
    for (int r = 0; r < R; ++r) total[j][r] = _mm512_setzero_ps();
  for (int64_t u = 0; u < units; ++u) {
    __m512i wv[W];
    __m512 sv[W];
    for (int j = 0; j < W; ++j) {
      prefetch_ahead(p, wr[j], n + j, kUnit * u, kUnit);
      wv[j] = _mm512_loadu_si512(wr[j] + kUnit * u);
      sv[j] = unit8_scale<GS>(sr[j], u);
    }
    for (int r = 0; r < R; ++r) {
      const int64_t m = m0 + r;
      const __m512i xv = _mm512_loadu_si512(p.qx + m * p.K + kUnit * u);
      const __m512i start =
          _mm512_maskz_permutexvar_epi32(0x0101, lanes, two_words(p.qc + (m * units + u) * 2));
      const __m512 dv = _mm512_permutexvar_ps(
          lanes, _mm512_castsi512_ps(two_words(p.dx + m * (p.K / 32) + 2 * u)));
      for (int j = 0; j < W; ++j) {
        const __m512i dot = _mm512_dpbusd_epi32(start, wv[j], xv);
        total[j][r] =
            _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), dv), sv[j], total[j][r]);
      }
    }
  }
  store_outputs(p, n, m0, sr, br, total);
}

// Rows [m0, m0 + R) of x against weight rows [n0, n1): 4 at a time, then one by one.
template <int GS, int R, class T>
EXO_VNNI inline void weight_rows8(const Problem& p, int64_t n0, int64_t n1, int64_t m0) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) block8<GS, 4, R, T>(p, n, m0);
  for (; n < n1; ++n) block8<GS, 1, R, T>(p, n, m0);
}

// 8-bit layers: weight rows in batches of 8 against every row of a tile of x, 4 x 4 at a time.
template <int GS, class T>
EXO_VNNI void rows8_gs(const Problem& p, int64_t n0, int64_t n1) {
  const int64_t x_row_bytes = p.K + p.K / kUnit * 8 + p.K / 32 * 4;
  const int64_t tile = std::max<int64_t>(4, kTileBytes / x_row_bytes / 4 * 4);
  for (int64_t t0 = 0; t0 < p.M; t0 += tile) {
    const int64_t t1 = std::min(p.M, t0 + tile);
    for (int64_t nb = n0; nb < n1; nb += 8) {
      const int64_t nb1 = std::min(n1, nb + 8);
      int64_t m = t0;
      for (; m + 4 <= t1; m += 4) weight_rows8<GS, 4, T>(p, nb, nb1, m);
      for (; m < t1; ++m) weight_rows8<GS, 1, T>(p, nb, nb1, m);
    }
  }
}

}  // namespace

void compute8(Problem p, void (*run)(const Problem&)) {
  thread_local std::vector<int32_t> starts_store;
  int32_t* starts = scratch(starts_store, p.M * p.K / 32);
  for (int64_t b = 0; b < p.M * p.K / 32; ++b) {
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) sum += p.qx[32 * b + i];
    starts[b] = -128 * sum;
  }
  p.qc = starts;
  run(p);
}

void rows8(const Problem& p, int64_t n0, int64_t n1) {
  by_layout(
      p, [&](auto gs, auto scale) { rows8_gs<decltype(gs)::value, decltype(scale)>(p, n0, n1); });
}

}  // namespace exo_kernels::vnni
#endif
