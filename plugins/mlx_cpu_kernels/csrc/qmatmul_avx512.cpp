// Quantized matmul with float32 activations on AVX-512 (AVX512F), where the CPU has it.
//
// The AVX2 kernels (qmatmul.cpp) turn weights into 8-lane vectors; these into 16-lane ones: half
// the instructions per weight, and on CPUs with 512-bit FMA units (Zen 4/5, Intel server parts)
// twice the FMA width. 8 bits: 16 bytes widened per vector, elements in order. 4 bits: 64
// elements (8 words) a step: the words in the low half of a vector, the same words shifted right
// by 4 in the high half; shifting by 0, 8, 16, 24 then gives four vectors: lane w = element
// 8w + 2t, lane 8 + w = element 8w + 2t + 1 (t = 0..3). x is permuted once per call to that order
// (`permute_x512`), so no shuffles are needed per weight.
//
// Summation: a unit is a group (4 bits with groups of 32: two groups, 64 elements). Per unit the
// vectors alternate between two accumulators (even, odd), then total = fma(a + b, scale, total);
// a unit of two groups gives each lane its own group's scale (words 0-3: the first, 4-7: the
// second). Then hsum(total) + sum_g bias[g] * xsum[g] in g order, as on AVX2. The one-row
// kernels and the many-rows one do that arithmetic op for op, so a row gives the same bits alone
// and in any batch. The AVX2 path sums in another order: a layer takes one path for every call
// (`avx512_takes` depends only on the CPU and the layer).

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>

#include "kernels.h"

namespace exo_kernels {

namespace {
std::atomic<bool> g_avx2_only{false};
}  // namespace

void force_avx2(bool on) {
  g_avx2_only = on;
}

bool avx512_available() {
#ifdef EXO_X86
  static const bool cpu = __builtin_cpu_supports("avx512f");
  return cpu && use_avx2() && !g_avx2_only.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

bool avx512_takes(const Problem& p) {
  const bool layout = p.bits == 8 || (p.bits == 4 && p.K % 64 == 0);
  return layout && !p.int8 && !p.dequantize && avx512_available();
}

#ifdef EXO_X86
#define EXO_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

namespace {

// A 64-byte aligned float buffer kept by its thread between calls (a decode step makes ~120
// calls; each thread's buffers are reused instead of allocated and freed each time).
class Scratch {
 public:
  float* get(int64_t count) {
    if (count > size_) {
      std::free(data_);
      const size_t bytes = (static_cast<size_t>(count) * sizeof(float) + 63) / 64 * 64;
      data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (data_ == nullptr) throw std::bad_alloc();
      size_ = count;
    }
    return data_;
  }
  ~Scratch() {
    std::free(data_);
  }

 private:
  float* data_ = nullptr;
  int64_t size_ = 0;
};

// x in the lane order described above (64 elements at a time).
void permute_x512(const float* x, float* xp, int64_t count) {
  for (int64_t c = 0; c < count / 64; ++c) {
    const float* src = x + 64 * c;
    float* dst = xp + 64 * c;
    for (int t = 0; t < 4; ++t)
      for (int w = 0; w < 8; ++w) {
        dst[16 * t + w] = src[8 * w + 2 * t];
        dst[16 * t + 8 + w] = src[8 * w + 2 * t + 1];
      }
  }
}

// The sum of a vector's 16 lanes, always in the same order.
EXO_AVX512 inline float hsum512(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return hsum(_mm256_add_ps(lo, hi));
}

// 8 packed words (64 elements): the words, and the words >> 4, in one vector.
EXO_AVX512 inline __m512i words64(const uint32_t* w) {
  const __m256i w8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  return _mm512_inserti64x4(_mm512_castsi256_si512(w8), _mm256_srli_epi32(w8, 4), 1);
}

// Nibble T of each lane's byte T as a float: a 16-entry table lookup (`vpermps` reads only an
// index's low 4 bits), so neither a mask nor a conversion: 2 instructions a vector instead of
// 3-4 (the one-row kernel is bound by instructions, not memory). The same floats, 0 to 15.
template <int T>
EXO_AVX512 inline __m512 nibbles(__m512i v) {
  const __m512 values =
      _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  if constexpr (T == 0)
    return _mm512_permutexvar_ps(v, values);
  else
    return _mm512_permutexvar_ps(_mm512_srli_epi32(v, 8 * T), values);
}

// 16 bytes (8-bit weights) as floats.
EXO_AVX512 inline __m512 bytes16(const uint8_t* b) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b))));
}

template <int BITS, int GS>
constexpr int64_t kUnit = BITS == 4 && GS < 64 ? 64 : GS;

// The scale of each lane in unit u of a weight row whose scales start at `sr` (float32, or
// 16-bit ones widened here: F16, BF16).
template <int BITS, int GS, class T>
EXO_AVX512 inline __m512 unit_scale(const T* sr, int64_t u) {
  if constexpr (BITS == 4 && GS == 32) {
    const __m128 two = two_scales(sr + 2 * u);
    const __m512i lanes = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
    return _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(two));
  } else {
    return _mm512_set1_ps(scale_at(sr, u));
  }
}

// ---------------------------------------------------------------- one row of x

// Rows prefetched ahead by the one-row kernel: rows of a small layer are too short (288 bytes
// at 4 bits and K = 576) for the hardware prefetcher to run ahead of a decode step's reads. On
// SmolLM2's 121 matmuls of a step (one row, Zen 5): 8.1 ms without, 6.2-6.7 with 4-32 rows.
// Into L1: this kernel is bound by its instructions (~8-9 GB/s a core on the 1B's shapes);
// the VNNI one (qmatmul_vnni.cpp) streams faster and prefetches into L2 instead.
constexpr int64_t kAhead = 8;

// n 16-bit scales (F16, BF16) as float32, 16 a vector (exact).
template <class T>
EXO_AVX512 inline void widen_row(const T* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    if constexpr (std::is_same_v<T, F16>)
      _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
    else
      _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
  for (; i < n; ++i) dst[i] = scale_at(src, i);
}

// Row m of x against W weight rows from n: the x loads are shared, the W chains interleave.
// T: how the scales are stored (float, F16, BF16). 16-bit ones are widened first, the W rows'
// at once into an L1 buffer, 16 a vector: read one at a time where used, their conversions
// cost a 4-bit group-32 step ~15 % (it is bound by instructions, not by memory, on one core).
template <int BITS, int GS, int W, class T>
EXO_AVX512 inline void row_block(const Problem& p, int64_t n, int64_t m) {
  constexpr int64_t unit = kUnit<BITS, GS>;
  const int64_t units = p.K / unit;
  const int64_t row_bytes = p.K * BITS / 8;
  const uint8_t* wr[W];
  const float* sr[W];
  const float* br[W];
  for (int j = 0; j < W; ++j) wr[j] = reinterpret_cast<const uint8_t*>(p.w) + (n + j) * row_bytes;
  if constexpr (std::is_same_v<T, float>) {
    for (int j = 0; j < W; ++j) {
      sr[j] = p.scales + (n + j) * p.G;
      br[j] = p.biases + (n + j) * p.G;
    }
  } else {
    thread_local Scratch widened;
    float* buf = widened.get(2 * W * p.G);
    const int64_t row_scales_bytes = p.G * static_cast<int64_t>(sizeof(T));
    for (int j = 0; j < W; ++j) {
      const T* s16 = scales_of<T>(p) + (n + j) * p.G;
      for (int64_t line = 0; line < row_scales_bytes; line += 64)  // the row kAhead on
        _mm_prefetch(reinterpret_cast<const char*>(s16 + kAhead * p.G) + line, _MM_HINT_T0);
      sr[j] = buf + j * p.G;
      br[j] = buf + (W + j) * p.G;
      widen_row(s16, p.G, buf + j * p.G);
      if (p.implicit_bias) {  // Q4_0: -8 x the widened scale, the float32 a stored one widens to
        for (int64_t g = 0; g < p.G; ++g) buf[(W + j) * p.G + g] = -8.0f * buf[j * p.G + g];
        continue;
      }
      const T* b16 = biases_of<T>(p) + (n + j) * p.G;
      for (int64_t line = 0; line < row_scales_bytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(b16 + kAhead * p.G) + line, _MM_HINT_T0);
      widen_row(b16, p.G, buf + (W + j) * p.G);
    }
  }
  const float* xr = p.xp + m * p.K;
  __m512 total[W];
  for (int j = 0; j < W; ++j) total[j] = _mm512_setzero_ps();
  for (int64_t u = 0; u < units; ++u) {
    __m512 a[W], b[W];
    for (int j = 0; j < W; ++j) a[j] = b[j] = _mm512_setzero_ps();
    if constexpr (BITS == 4) {
      for (int64_t first = u * unit; first < (u + 1) * unit; first += 64) {
        const __m512 x0 = _mm512_loadu_ps(xr + first);
        const __m512 x1 = _mm512_loadu_ps(xr + first + 16);
        const __m512 x2 = _mm512_loadu_ps(xr + first + 32);
        const __m512 x3 = _mm512_loadu_ps(xr + first + 48);
        for (int j = 0; j < W; ++j) {
          _mm_prefetch(reinterpret_cast<const char*>(wr[j] + kAhead * row_bytes + first / 2), _MM_HINT_T0);
          const __m512i v = words64(reinterpret_cast<const uint32_t*>(wr[j] + first / 2));
          a[j] = _mm512_fmadd_ps(nibbles<0>(v), x0, a[j]);
          b[j] = _mm512_fmadd_ps(nibbles<1>(v), x1, b[j]);
          a[j] = _mm512_fmadd_ps(nibbles<2>(v), x2, a[j]);
          b[j] = _mm512_fmadd_ps(nibbles<3>(v), x3, b[j]);
        }
      }
    } else {
      for (int64_t o = u * unit; o < (u + 1) * unit; o += 32) {
        const __m512 x0 = _mm512_loadu_ps(xr + o);
        const __m512 x1 = _mm512_loadu_ps(xr + o + 16);
        for (int j = 0; j < W; ++j) {
          _mm_prefetch(reinterpret_cast<const char*>(wr[j] + kAhead * row_bytes + o), _MM_HINT_T0);
          a[j] = _mm512_fmadd_ps(bytes16(wr[j] + o), x0, a[j]);
          b[j] = _mm512_fmadd_ps(bytes16(wr[j] + o + 16), x1, b[j]);
        }
      }
    }
    for (int j = 0; j < W; ++j) {
      if constexpr (std::is_same_v<T, float>) {
        _mm_prefetch(reinterpret_cast<const char*>(sr[j] + kAhead * p.G + u), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(br[j] + kAhead * p.G + u), _MM_HINT_T0);
      }
      const __m512 scale = unit_scale<BITS, GS>(sr[j], u);
      total[j] = _mm512_fmadd_ps(_mm512_add_ps(a[j], b[j]), scale, total[j]);
    }
  }
  const float* xs = p.xsum + m * p.G;
  float bias_term[W];
  for (int j = 0; j < W; ++j) bias_term[j] = 0.0f;
  for (int64_t g = 0; g < p.G; ++g)
    for (int j = 0; j < W; ++j) bias_term[j] += br[j][g] * xs[g];
  for (int j = 0; j < W; ++j) p.out[m * p.N + n + j] = hsum512(total[j]) + bias_term[j];
}

template <int BITS, int GS, class T>
EXO_AVX512 void one_row(const Problem& p, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) row_block<BITS, GS, 4, T>(p, n, 0);
  for (; n < n1; ++n) row_block<BITS, GS, 1, T>(p, n, 0);
}

// ---------------------------------------------------------------- many rows of x
//
// As rows_avx2_tiled: weight rows are expanded once to floats (in x's permuted order) and serve
// every row of an L2-sized tile of x, here W = 2 weight rows x R = 4 rows of x of accumulators
// (24 of the 32 vector registers), over ranges of units that fit L1 with the block.

// Weight row n as floats, in the lane order of x (permute_x512's for 4 bits).
template <int BITS>
EXO_AVX512 inline void expand_row(const Problem& p, int64_t n, float* q) {
  const uint8_t* wr = reinterpret_cast<const uint8_t*>(p.w) + n * (p.K * BITS / 8);
  for (int64_t first = 0; first < p.K; first += 64) {
    if constexpr (BITS == 4) {
      const __m512i v = words64(reinterpret_cast<const uint32_t*>(wr + first / 2));
      _mm512_store_ps(q + first, nibbles<0>(v));
      _mm512_store_ps(q + first + 16, nibbles<1>(v));
      _mm512_store_ps(q + first + 32, nibbles<2>(v));
      _mm512_store_ps(q + first + 48, nibbles<3>(v));
    } else {
      for (int64_t o = first; o < std::min(p.K, first + 64); o += 16)
        _mm512_store_ps(q + o, bytes16(wr + o));
    }
  }
}

// Outputs [m0, m0 + R) x [n, n + W), units [u0, u1): q[w] = expanded weight row n + w, x the
// block's first row (permuted), bias the outputs' bias terms ([W][4], `bias_terms`), `carry`
// the running totals between unit ranges ([W][R][16], stored and reloaded exactly).
template <int BITS, int GS, int W, int R>
EXO_AVX512 inline void tile_block(
    const Problem& p, const float* const* q, const float* x, const float* bias, int64_t n,
    int64_t m0, int64_t u0, int64_t u1, float* carry) {
  constexpr int64_t unit = kUnit<BITS, GS>;
  const int64_t units = p.K / unit;
  const float* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = x + r * p.K;
  __m512 total[W][R];
  for (int w = 0; w < W; ++w)
    for (int r = 0; r < R; ++r)
      total[w][r] = u0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(carry + 16 * (w * R + r));
  for (int64_t u = u0; u < u1; ++u) {
    __m512 a[W][R], b[W][R];
    for (int w = 0; w < W; ++w)
      for (int r = 0; r < R; ++r) a[w][r] = b[w][r] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int64_t v = 0; v < unit / 16; ++v) {  // even vectors into a, odd ones into b
      const int64_t o = u * unit + 16 * v;
      __m512 qv[W];
      for (int w = 0; w < W; ++w) qv[w] = _mm512_load_ps(q[w] + o);
      for (int r = 0; r < R; ++r) {
        const __m512 xv = _mm512_load_ps(xr[r] + o);
        for (int w = 0; w < W; ++w) {
          if (v % 2 == 0)
            a[w][r] = _mm512_fmadd_ps(qv[w], xv, a[w][r]);
          else
            b[w][r] = _mm512_fmadd_ps(qv[w], xv, b[w][r]);
        }
      }
    }
    for (int w = 0; w < W; ++w) {
      const __m512 scale = unit_scale<BITS, GS>(p.scales + (n + w) * p.G, u);
      for (int r = 0; r < R; ++r)
        total[w][r] = _mm512_fmadd_ps(_mm512_add_ps(a[w][r], b[w][r]), scale, total[w][r]);
    }
  }
  if (u1 < units) {
    for (int w = 0; w < W; ++w)
      for (int r = 0; r < R; ++r) _mm512_store_ps(carry + 16 * (w * R + r), total[w][r]);
    return;
  }
  for (int w = 0; w < W; ++w)
    for (int r = 0; r < R; ++r)
      p.out[(m0 + r) * p.N + n + w] = hsum512(total[w][r]) + bias[4 * w + r];
}

template <int BITS, int GS, int W>
EXO_AVX512 inline void tile_rows(
    int64_t rows, const Problem& p, const float* const* q, const float* x, const float* bias,
    int64_t n, int64_t m0, int64_t u0, int64_t u1, float* carry) {
  switch (rows) {
    case 4: tile_block<BITS, GS, W, 4>(p, q, x, bias, n, m0, u0, u1, carry); break;
    case 3: tile_block<BITS, GS, W, 3>(p, q, x, bias, n, m0, u0, u1, carry); break;
    case 2: tile_block<BITS, GS, W, 2>(p, q, x, bias, n, m0, u0, u1, carry); break;
    default: tile_block<BITS, GS, W, 1>(p, q, x, bias, n, m0, u0, u1, carry); break;
  }
}

// x's share of L2 in the many-rows kernel: L2 is 1-2 MB a core on AVX-512 CPUs, and the
// expanded batch takes up to 8 x K floats beside it (458 KB for a 7B's 14336-wide rows).
constexpr int64_t kTileBytes = 512 * 1024;

template <int BITS, int GS>
EXO_AVX512 void many_rows(const Problem& p, int64_t n0, int64_t n1) {
  constexpr int R = 4;
  constexpr int64_t unit = kUnit<BITS, GS>;
  const int64_t units = p.K / unit;
  // Rows of x per tile (read from p.xp in place: 64-byte aligned rows, K % 16 == 0). Every
  // tile expands every weight row again, so the tile is as large as L2 allows beside the
  // expanded batch: 192 KB held a 1B's 8192-wide down projection to 4 rows a tile, and its
  // expansions (~13 instructions per 64 weights) cost about half of 16 FMAs' time.
  const int64_t tile = std::min(p.M, std::max<int64_t>(R, (kTileBytes / (p.K * 4)) / R * R));
  constexpr int64_t batch = 8;  // weight rows expanded at once (in L2)
  const int64_t span = std::max<int64_t>(1, 640 / unit);  // units per pass (in L1)
  thread_local Scratch expanded;
  float* buf = expanded.get(batch * p.K);
  alignas(64) float carry[batch][R * 16];
  for (int64_t t0 = 0; t0 < p.M; t0 += tile) {
    const int64_t t1 = std::min(p.M, t0 + tile);
    for (int64_t nb = n0; nb < n1; nb += batch) {
      const int64_t nb1 = std::min(n1, nb + batch);
      for (int64_t n = nb; n < nb1; ++n) {
        // The next batch's row, read after this batch's products: without it those reads
        // waited on memory (~17 % of an 8-row decode step's samples).
        prefetch_row(p, n + batch);
        expand_row<BITS>(p, n, buf + (n - nb) * p.K);
      }
      for (int64_t m0 = t0; m0 < t1; m0 += R) {
        const int64_t rows = std::min<int64_t>(R, t1 - m0);
        const float* xb = p.xp + m0 * p.K;
        alignas(16) float bias[batch][4];
        bias_terms(p.biases, p.G, nb, nb1, p.xst + 4 * p.G * (m0 / R), bias);
        for (int64_t u0 = 0; u0 < units; u0 += span) {
          const int64_t u1 = std::min(units, u0 + span);
          int64_t n = nb;
          for (; n + 2 <= nb1; n += 2) {
            const float* q[2] = {buf + (n - nb) * p.K, buf + (n + 1 - nb) * p.K};
            tile_rows<BITS, GS, 2>(rows, p, q, xb, bias[n - nb], n, m0, u0, u1, carry[n - nb]);
          }
          for (; n < nb1; ++n) {
            const float* q[1] = {buf + (n - nb) * p.K};
            tile_rows<BITS, GS, 1>(rows, p, q, xb, bias[n - nb], n, m0, u0, u1, carry[n - nb]);
          }
        }
      }
    }
  }
}

// 16-bit scales reach here only for one row (`reads_half_scales`); `rows` widens the rest.
template <int BITS, int GS>
void rows_gs(const Problem& p, int64_t n0, int64_t n1) {
  if (p.M > 1)
    many_rows<BITS, GS>(p, n0, n1);
  else if (p.scale_type == ScaleType::f16)
    one_row<BITS, GS, F16>(p, n0, n1);
  else if (p.scale_type == ScaleType::bf16)
    one_row<BITS, GS, BF16>(p, n0, n1);
  else
    one_row<BITS, GS, float>(p, n0, n1);
}

template <int BITS>
void rows_bits(const Problem& p, int64_t n0, int64_t n1) {
  switch (p.group_size) {
    case 32: rows_gs<BITS, 32>(p, n0, n1); break;
    case 64: rows_gs<BITS, 64>(p, n0, n1); break;
    default: rows_gs<BITS, 128>(p, n0, n1); break;
  }
}

}  // namespace

void compute_avx512(Problem p, void (*run)(const Problem&)) {
  // Per thread (each MLX stream calls from its own): reused across calls.
  thread_local Scratch xp_store;
  thread_local Scratch xst_store;
  float* xp = xp_store.get(p.M * p.K);
  if (p.bits == 4)
    permute_x512(p.x, xp, p.M * p.K);
  else
    std::copy(p.x, p.x + p.M * p.K, xp);  // aligned rows for the kernels' loads
  p.xp = xp;
  if (p.M > 1) {  // the many-rows kernel's bias sums: 4 rows per SSE vector
    const int64_t blocks = (p.M + 3) / 4;
    float* xst = xst_store.get(blocks * 4 * p.G);
    std::fill(xst, xst + blocks * 4 * p.G, 0.0f);
    for (int64_t m = 0; m < p.M; ++m)
      for (int64_t g = 0; g < p.G; ++g) xst[((m / 4) * p.G + g) * 4 + m % 4] = p.xsum[m * p.G + g];
    p.xst = xst;
  }
  run(p);
}

void rows_avx512(const Problem& p, int64_t n0, int64_t n1) {
  if (p.bits == 4)
    rows_bits<4>(p, n0, n1);
  else
    rows_bits<8>(p, n0, n1);
}
#else
void compute_avx512(Problem p, void (*run)(const Problem&)) {
  run(p);
}
void rows_avx512(const Problem&, int64_t, int64_t) {}
#endif

}  // namespace exo_kernels
