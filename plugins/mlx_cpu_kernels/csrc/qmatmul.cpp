// A multi-threaded, vectorised quantized matmul for MLX's CPU backend.
//
// out[m, n] = sum_k x[m, k] * W[n, k] with W in MLX's affine layout: packed uint32 words
// (element i of a row at bits (i % per_word) * bits of word i / per_word), one scale and one
// bias per group of `group_size` elements: W = scale * q + bias. This is x @ W.T, what
// nn.QuantizedLinear computes.
//
// Per group g of row n:  scale[n,g] * dot(q, x_g) + bias[n,g] * sum(x_g).
// The sums of x per group are computed once per call; the integer weights of a group are
// expanded once into an L1 buffer and reused by every row of x (8 streams decode as one
// call with 8 rows). Rows of W are split over a small thread pool. AVX2+FMA is chosen at run
// time (__builtin_cpu_supports); the scalar path does the same arithmetic elsewhere.

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

#include "kernels.h"
#include "scales.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>


namespace nb = nanobind;
namespace mx = mlx::core;

namespace {

using exo_kernels::Problem;

// Rows of x handled together: their accumulators stay in registers.
constexpr int kRowBlock = 8;

// ---------------------------------------------------------------- portable path

void rows_scalar(const Problem& p, int64_t n0, int64_t n1) {
  const int per_word = 32 / p.bits;
  const uint32_t mask = (1u << p.bits) - 1;
  const int64_t words_per_row = p.K / per_word;
  std::vector<float> q(p.group_size);
  for (int64_t n = n0; n < n1; ++n) {
    const uint32_t* wr = p.w + n * words_per_row;
    for (int64_t m = 0; m < p.M; ++m) {
      const float* xr = p.x + m * p.K;
      float total = 0.0f;
      for (int64_t g = 0; g < p.G; ++g) {
        float dot = 0.0f;
        for (int i = 0; i < p.group_size; ++i) {
          int64_t k = g * p.group_size + i;
          uint32_t word = wr[k / per_word];
          float v = static_cast<float>((word >> ((k % per_word) * p.bits)) & mask);
          dot += v * xr[k];
        }
        total += p.scales[n * p.G + g] * dot + p.biases[n * p.G + g] * p.xsum[m * p.G + g];
      }
      p.out[m * p.N + n] = total;
    }
  }
}

void dequantize_scalar(const Problem& p, int64_t n0, int64_t n1) {
  const int per_word = 32 / p.bits;
  const uint32_t mask = (1u << p.bits) - 1;
  for (int64_t n = n0; n < n1; ++n) {
    const uint32_t* wr = p.w + n * (p.K / per_word);
    for (int64_t k = 0; k < p.K; ++k) {
      const int64_t g = n * p.G + k / p.group_size;
      float v = static_cast<float>((wr[k / per_word] >> ((k % per_word) * p.bits)) & mask);
      p.out[n * p.K + k] = p.scales[g] * v + p.biases[g];
    }
  }
}

// ---------------------------------------------------------------- int8 activations
//
// llama.cpp's way to memory speed: the activations are quantized to int8 once per call (one
// scale per 32 values), the weights are centred (q - c, c = 2^(bits-1), a signed int8) and
// each block of 32 is one integer dot product. Per group g of row n:
//   sum_k (s q_k + b) x_k = s sum_k (q_k - c) x_k + (b + c s) sum_k x_k
// The first sum uses x ~= dx * qx; the second the exact float sum of x (xsum). Centring
// halves the rounding error (|q - c| <= c) and keeps the 8-bit products inside int16.

// Position of element i (0..31) of a block in the int8 layout (4 bits: evens, then odds).
inline int q8_slot(int i, int bits) {
  return bits == 4 ? (i % 2 == 0 ? i / 2 : 16 + i / 2) : i;
}

// Rounds to nearest, ties to even (lrint in the default mode, as cvtps_epi32 does).
void quantize_rows_scalar(const float* x, int64_t blocks, int bits, int8_t* qx, float* dx) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float* src = x + 32 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(src[i]));
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    dx[b] = d;
    for (int i = 0; i < 32; ++i)
      qx[32 * b + q8_slot(i, bits)] = static_cast<int8_t>(std::lrint(src[i] * id));
  }
}

// sum_g (b_g + c s_g) xsum_g: the bias term of one output.
inline float centred_bias_term(const Problem& p, int64_t n, int64_t m) {
  const float c = static_cast<float>(1 << (p.bits - 1));
  const float* sr = p.scales + n * p.G;
  const float* br = p.biases + n * p.G;
  const float* xs = p.xsum + m * p.G;
  float total = 0.0f;
  for (int64_t g = 0; g < p.G; ++g) total += (br[g] + c * sr[g]) * xs[g];
  return total;
}

void rows_scalar_q8(const Problem& p, int64_t n0, int64_t n1) {
  const int per_word = 32 / p.bits;
  const uint32_t mask = (1u << p.bits) - 1;
  const int c = 1 << (p.bits - 1);
  const int64_t words_per_row = p.K / per_word;
  const int blocks_per_group = p.group_size / 32;
  for (int64_t n = n0; n < n1; ++n) {
    const uint32_t* wr = p.w + n * words_per_row;
    for (int64_t m = 0; m < p.M; ++m) {
      float total = 0.0f;
      for (int64_t b = 0; b < p.K / 32; ++b) {
        const int8_t* qb = p.qx + m * p.K + 32 * b;
        int32_t dot = 0;
        for (int i = 0; i < 32; ++i) {
          const int64_t k = 32 * b + i;
          const int q = static_cast<int>((wr[k / per_word] >> ((k % per_word) * p.bits)) & mask);
          dot += (q - c) * qb[q8_slot(i, p.bits)];
        }
        const float s = p.scales[n * p.G + b / blocks_per_group];
        total += static_cast<float>(dot) * (s * p.dx[m * (p.K / 32) + b]);
      }
      p.out[m * p.N + n] = total + centred_bias_term(p, n, m);
    }
  }
}

// ---------------------------------------------------------------- AVX2 + FMA path

#ifdef EXO_X86
using exo_kernels::hsum;

using exo_kernels::prefetch_row;

// The integer weights of one group, expanded to floats (8 per vector), into `q`.
__attribute__((target("avx2,fma"))) inline void expand_group(
    const uint32_t* words, int group_size, int bits, float* q) {
  if (bits == 4) {
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i mask = _mm256_set1_epi32(0xF);
    for (int j = 0; j < group_size / 8; ++j) {
      __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(words[j])), shifts);
      _mm256_store_ps(q + 8 * j, _mm256_cvtepi32_ps(_mm256_and_si256(v, mask)));
    }
  } else {  // 8 bits: little-endian bytes are the elements in order
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(words);
    for (int j = 0; j < group_size / 8; ++j) {
      __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + 8 * j));
      _mm256_store_ps(q + 8 * j, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)));
    }
  }
}

__attribute__((target("avx2,fma"))) void rows_avx2(const Problem& p, int64_t n0, int64_t n1) {
  const int64_t words_per_group = p.group_size * p.bits / 32;
  const int64_t words_per_row = p.G * words_per_group;
  const int vecs = p.group_size / 8;
  alignas(32) float q[128];
  for (int64_t n = n0; n < n1; ++n) {
    const uint32_t* wr = p.w + n * words_per_row;
    const float* sr = p.scales + n * p.G;
    const float* br = p.biases + n * p.G;
    for (int64_t m0 = 0; m0 < p.M; m0 += kRowBlock) {
      const int rows = static_cast<int>(std::min<int64_t>(kRowBlock, p.M - m0));
      __m256 total[kRowBlock];
      for (int r = 0; r < rows; ++r) total[r] = _mm256_setzero_ps();
      for (int64_t g = 0; g < p.G; ++g) {
        expand_group(wr + g * words_per_group, p.group_size, p.bits, q);
        const __m256 scale = _mm256_set1_ps(sr[g]);
        for (int r = 0; r < rows; ++r) {
          const float* xg = p.x + (m0 + r) * p.K + g * p.group_size;
          __m256 a0 = _mm256_setzero_ps();
          __m256 a1 = _mm256_setzero_ps();
          int j = 0;
          for (; j + 1 < vecs; j += 2) {
            a0 = _mm256_fmadd_ps(_mm256_load_ps(q + 8 * j), _mm256_loadu_ps(xg + 8 * j), a0);
            a1 = _mm256_fmadd_ps(
                _mm256_load_ps(q + 8 * j + 8), _mm256_loadu_ps(xg + 8 * j + 8), a1);
          }
          for (; j < vecs; ++j)
            a0 = _mm256_fmadd_ps(_mm256_load_ps(q + 8 * j), _mm256_loadu_ps(xg + 8 * j), a0);
          total[r] = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), scale, total[r]);
        }
      }
      for (int r = 0; r < rows; ++r) {
        const float* xs = p.xsum + (m0 + r) * p.G;
        float bias_term = 0.0f;
        for (int64_t g = 0; g < p.G; ++g) bias_term += br[g] * xs[g];
        p.out[(m0 + r) * p.N + n] = hsum(total[r]) + bias_term;
      }
    }
  }
}
#endif

#ifdef EXO_X86
// 8 bits, one row of x against 4 weight rows (the output head of a decode step): the bytes
// are widened straight from the weights (no buffer) and the x loads are shared. Each output's
// arithmetic is rows_avx2's, op for op (two accumulators alternating over the vectors).
__attribute__((target("avx2,fma"))) inline void q8f_row_x4w(
    const Problem& p, int64_t n, int64_t m) {
  constexpr int W = 4;
  const uint8_t* wr[W];
  const float* sr[W];
  const float* br[W];
  for (int j = 0; j < W; ++j) {
    wr[j] = reinterpret_cast<const uint8_t*>(p.w) + (n + j) * p.K;
    sr[j] = p.scales + (n + j) * p.G;
    br[j] = p.biases + (n + j) * p.G;
  }
  const float* xr = p.x + m * p.K;
  const int vecs = p.group_size / 8;  // even: 4, 8 or 16
  __m256 total[W];
  for (int j = 0; j < W; ++j) total[j] = _mm256_setzero_ps();
  for (int64_t g = 0; g < p.G; ++g) {
    const int64_t first = g * p.group_size;
    __m256 a0[W], a1[W];
    for (int j = 0; j < W; ++j) a0[j] = a1[j] = _mm256_setzero_ps();
    for (int v = 0; v < vecs; v += 2) {
      const __m256 x0 = _mm256_loadu_ps(xr + first + 8 * v);
      const __m256 x1 = _mm256_loadu_ps(xr + first + 8 * v + 8);
      for (int j = 0; j < W; ++j) {
        const uint8_t* b = wr[j] + first + 8 * v;
        const __m256 q0 = _mm256_cvtepi32_ps(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b))));
        const __m256 q1 = _mm256_cvtepi32_ps(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 8))));
        a0[j] = _mm256_fmadd_ps(q0, x0, a0[j]);
        a1[j] = _mm256_fmadd_ps(q1, x1, a1[j]);
      }
    }
    for (int j = 0; j < W; ++j)
      total[j] = _mm256_fmadd_ps(_mm256_add_ps(a0[j], a1[j]), _mm256_set1_ps(sr[j][g]), total[j]);
  }
  const float* xs = p.xsum + m * p.G;
  float bias_term[W] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t g = 0; g < p.G; ++g)
    for (int j = 0; j < W; ++j) bias_term[j] += br[j][g] * xs[g];
  for (int j = 0; j < W; ++j) p.out[m * p.N + n + j] = hsum(total[j]) + bias_term[j];
}
#endif

#ifdef EXO_X86
// 4 bits, straight from the packed words: 4 words (32 elements) are put in both halves of a
// vector, the upper half shifted by 4; shifting by 0, 8, 16, 24 then gives 8 elements per
// step: lane w = element 8w + 2t, lane 4 + w = element 8w + 2t + 1 (t = 0..3). x is permuted
// once per call to that order (`permute_x`), so no shuffles are needed per weight.
void permute_x(const float* x, float* xp, int64_t count) {
  for (int64_t b = 0; b < count / 32; ++b) {
    const float* src = x + 32 * b;
    float* dst = xp + 32 * b;
    for (int t = 0; t < 4; ++t)
      for (int w = 0; w < 4; ++w) {
        dst[8 * t + w] = src[8 * w + 2 * t];
        dst[8 * t + 4 + w] = src[8 * w + 2 * t + 1];
      }
  }
}

// R rows of x at once, R a compile-time constant so the accumulators live in registers.
template <int R>
__attribute__((target("avx2,fma"))) inline void q4_rows_block(
    const Problem& p, int64_t n, int64_t m0) {
  const uint32_t* wr = p.w + n * (p.K / 8);
  const float* sr = p.scales + n * p.G;
  const int blocks = p.group_size / 32;
  const __m256i mask = _mm256_set1_epi32(0xF);
  __m256 total[R];
  for (int r = 0; r < R; ++r) total[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < p.G; ++g) {
    __m256 a[R], b[R];
    for (int r = 0; r < R; ++r) a[r] = b[r] = _mm256_setzero_ps();
    for (int blk = 0; blk < blocks; ++blk) {
      const int64_t first = g * p.group_size + 32 * blk;
      __m128i w4 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + first / 8));
      __m256i v = _mm256_set_m128i(_mm_srli_epi32(w4, 4), w4);
      __m256 q0 = _mm256_cvtepi32_ps(_mm256_and_si256(v, mask));
      __m256 q1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 8), mask));
      __m256 q2 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 16), mask));
      __m256 q3 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 24), mask));
      for (int r = 0; r < R; ++r) {
        const float* xr = p.xp + (m0 + r) * p.K + first;
        a[r] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(xr), a[r]);
        b[r] = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xr + 8), b[r]);
        a[r] = _mm256_fmadd_ps(q2, _mm256_loadu_ps(xr + 16), a[r]);
        b[r] = _mm256_fmadd_ps(q3, _mm256_loadu_ps(xr + 24), b[r]);
      }
    }
    const __m256 scale = _mm256_set1_ps(sr[g]);
    for (int r = 0; r < R; ++r)
      total[r] = _mm256_fmadd_ps(_mm256_add_ps(a[r], b[r]), scale, total[r]);
  }
  const float* br = p.biases + n * p.G;
  for (int r = 0; r < R; ++r) {
    const float* xs = p.xsum + (m0 + r) * p.G;
    float bias_term = 0.0f;
    for (int64_t g = 0; g < p.G; ++g) bias_term += br[g] * xs[g];
    p.out[(m0 + r) * p.N + n] = hsum(total[r]) + bias_term;
  }
}

// One row of x against 4 weight rows (a decode step): the x loads and the loop overhead are
// shared and the 4 rows' dependency chains interleave. Each output's arithmetic is
// q4_rows_block's, op for op, so a row's result depends neither on its neighbours nor on the
// batch it came in.
__attribute__((target("avx2,fma"))) inline void q4_row_x4w(
    const Problem& p, int64_t n, int64_t m) {
  constexpr int W = 4;
  const uint32_t* wr[W];
  const float* sr[W];
  const float* br[W];
  for (int j = 0; j < W; ++j) {
    wr[j] = p.w + (n + j) * (p.K / 8);
    sr[j] = p.scales + (n + j) * p.G;
    br[j] = p.biases + (n + j) * p.G;
  }
  const float* xr = p.xp + m * p.K;
  const int blocks = p.group_size / 32;
  const __m256i mask = _mm256_set1_epi32(0xF);
  __m256 total[W];
  for (int j = 0; j < W; ++j) total[j] = _mm256_setzero_ps();
  for (int64_t g = 0; g < p.G; ++g) {
    __m256 a[W], b[W];
    for (int j = 0; j < W; ++j) a[j] = b[j] = _mm256_setzero_ps();
    for (int blk = 0; blk < blocks; ++blk) {
      const int64_t first = g * p.group_size + 32 * blk;
      const __m256 x0 = _mm256_loadu_ps(xr + first);
      const __m256 x1 = _mm256_loadu_ps(xr + first + 8);
      const __m256 x2 = _mm256_loadu_ps(xr + first + 16);
      const __m256 x3 = _mm256_loadu_ps(xr + first + 24);
      for (int j = 0; j < W; ++j) {
        __m128i w4 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr[j] + first / 8));
        __m256i v = _mm256_set_m128i(_mm_srli_epi32(w4, 4), w4);
        __m256 q0 = _mm256_cvtepi32_ps(_mm256_and_si256(v, mask));
        __m256 q1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 8), mask));
        __m256 q2 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 16), mask));
        __m256 q3 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 24), mask));
        a[j] = _mm256_fmadd_ps(q0, x0, a[j]);
        b[j] = _mm256_fmadd_ps(q1, x1, b[j]);
        a[j] = _mm256_fmadd_ps(q2, x2, a[j]);
        b[j] = _mm256_fmadd_ps(q3, x3, b[j]);
      }
    }
    for (int j = 0; j < W; ++j)
      total[j] = _mm256_fmadd_ps(_mm256_add_ps(a[j], b[j]), _mm256_set1_ps(sr[j][g]), total[j]);
  }
  const float* xs = p.xsum + m * p.G;
  float bias_term[W] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t g = 0; g < p.G; ++g)
    for (int j = 0; j < W; ++j) bias_term[j] += br[j][g] * xs[g];
  for (int j = 0; j < W; ++j) p.out[m * p.N + n + j] = hsum(total[j]) + bias_term[j];
}

// One row of x (`rows` sends two or more to rows_avx2_many).
__attribute__((target("avx2,fma"))) void rows_avx2_q4(const Problem& p, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    for (int j = 0; j < 4; ++j) prefetch_row(p, n + 8 + j);
    q4_row_x4w(p, n, 0);
  }
  for (; n < n1; ++n) q4_rows_block<1>(p, n, 0);
}

__attribute__((target("avx2,fma"))) void dequantize_avx2(
    const Problem& p, int64_t n0, int64_t n1) {
  const int64_t words_per_group = p.group_size * p.bits / 32;
  alignas(32) float q[128];
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t g = 0; g < p.G; ++g) {
      expand_group(p.w + (n * p.G + g) * words_per_group, p.group_size, p.bits, q);
      const __m256 scale = _mm256_set1_ps(p.scales[n * p.G + g]);
      const __m256 bias = _mm256_set1_ps(p.biases[n * p.G + g]);
      float* dst = p.out + n * p.K + g * p.group_size;
      for (int j = 0; j < p.group_size / 8; ++j)
        _mm256_storeu_ps(dst + 8 * j, _mm256_fmadd_ps(_mm256_load_ps(q + 8 * j), scale, bias));
    }
  }
}
#endif

#ifdef EXO_X86
// Weight block b, unpacked and centred (q - c as signed bytes, 4 bits in nibble order).
template <int BITS>
__attribute__((target("avx2,fma"))) inline __m256i q8_weights(const uint8_t* wr, int64_t b) {
  if constexpr (BITS == 4) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + 16 * b));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8));
  } else {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr + 32 * b));
    return _mm256_xor_si256(raw, _mm256_set1_epi8(static_cast<char>(0x80)));  // q - 128
  }
}

// 4 rows at once, their dot products folded into one vector (lanes j and j + 4: row j) by
// horizontal adds, so that one conversion, one scale and one FMA serve the 4 rows (instead of
// one of each per row): the many-rows case (batched decode, prefill) is compute-bound.
template <int BITS>
__attribute__((target("avx2,fma"))) inline void q8_rows_block4(
    const Problem& p, int64_t n, int64_t m0) {
  const int64_t blocks = p.K / 32;
  const int group_shift = p.group_size == 32 ? 0 : p.group_size == 64 ? 1 : 2;
  const uint8_t* wr = reinterpret_cast<const uint8_t*>(p.w) + n * (p.K * BITS / 8);
  const float* sr = p.scales + n * p.G;
  const int8_t* x0 = p.qx + m0 * p.K;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const __m256i centred = q8_weights<BITS>(wr, b);
    const __m256i magnitude = _mm256_abs_epi8(centred);
    __m256i dot[4];
    for (int r = 0; r < 4; ++r) {
      const __m256i xq =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0 + r * p.K + 32 * b));
      dot[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xq, centred)), ones);
    }
    const __m256i folded = _mm256_hadd_epi32(
        _mm256_hadd_epi32(dot[0], dot[1]), _mm256_hadd_epi32(dot[2], dot[3]));
    const __m256 scale = _mm256_mul_ps(
        _mm256_broadcast_ps(reinterpret_cast<const __m128*>(p.dxt + b * p.m4 + m0)),
        _mm256_set1_ps(sr[b >> group_shift]));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(folded), scale, acc);
  }
  alignas(16) float rows4[4];
  _mm_store_ps(rows4, _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)));
  for (int r = 0; r < 4; ++r)
    p.out[(m0 + r) * p.N + n] = rows4[r] + centred_bias_term(p, n, m0 + r);
}

// One row of x against 4 weight rows (from n, clamped to n_end - 1), folded the same way:
// lane j (+ 4) holds weight row j. Each output sees exactly the arithmetic of
// q8_rows_block4 (the same integer sums, products dx * s, FMAs and final add), so a row's
// result does not depend on how many rows share its call: a batch equals its solo runs.
template <int BITS>
__attribute__((target("avx2,fma"))) inline void q8_row_x4w(
    const Problem& p, int64_t n, int64_t n_end, int64_t m) {
  const int64_t blocks = p.K / 32;
  const int group_shift = p.group_size == 32 ? 0 : p.group_size == 64 ? 1 : 2;
  const uint8_t* wr[4];
  const float* sr[4];
  for (int j = 0; j < 4; ++j) {
    const int64_t row = std::min(n + j, n_end - 1);
    wr[j] = reinterpret_cast<const uint8_t*>(p.w) + row * (p.K * BITS / 8);
    sr[j] = p.scales + row * p.G;
  }
  const int8_t* xr = p.qx + m * p.K;
  const float* dxr = p.dx + m * blocks;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + 32 * b));
    __m256i dot[4];
    for (int j = 0; j < 4; ++j) {
      const __m256i centred = q8_weights<BITS>(wr[j], b);
      dot[j] = _mm256_madd_epi16(
          _mm256_maddubs_epi16(_mm256_abs_epi8(centred), _mm256_sign_epi8(xq, centred)), ones);
    }
    const __m256i folded = _mm256_hadd_epi32(
        _mm256_hadd_epi32(dot[0], dot[1]), _mm256_hadd_epi32(dot[2], dot[3]));
    const int64_t g = b >> group_shift;
    const __m128 s4 = _mm_setr_ps(sr[0][g], sr[1][g], sr[2][g], sr[3][g]);
    const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(dxr[b]), _mm256_set_m128(s4, s4));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(folded), scale, acc);
  }
  alignas(16) float cols4[4];
  _mm_store_ps(cols4, _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)));
  for (int j = 0; j < 4 && n + j < n_end; ++j)
    p.out[m * p.N + n + j] = cols4[j] + centred_bias_term(p, n + j, m);
}

template <int BITS>
__attribute__((target("avx2,fma"))) void rows_avx2_q8(const Problem& p, int64_t n0, int64_t n1) {
  const int64_t tile = std::max<int64_t>(4, (16384 / p.K) & ~int64_t{3});
  for (int64_t t0 = 0; t0 < p.M; t0 += tile) {
    const int64_t t1 = std::min(p.M, t0 + tile);
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t m0 = t0; m0 + 4 <= t1; m0 += 4) q8_rows_block4<BITS>(p, n, m0);
    }
    // The last 1-3 rows of the tile (a single decode row): 4 weight rows per pass instead.
    for (int64_t m = t0 + (t1 - t0) / 4 * 4; m < t1; ++m)
      for (int64_t n = n0; n < n1; n += 4) q8_row_x4w<BITS>(p, n, n1, m);
  }
}
#endif

#ifdef EXO_X86
// quantize_rows_scalar, 32 values per step: the same scale and rounding, so the same bytes.
__attribute__((target("avx2,fma"))) void quantize_rows_avx2(
    const float* x, int64_t blocks, int bits, int8_t* qx, float* dx) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  // packs_epi32/epi16 interleave 128-bit lanes; this puts the dwords back in element order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  // Per 128-bit lane (16 elements): the even elements, then the odd ones (the nibble order).
  const __m256i evens_odds = _mm256_setr_epi8(
      0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
      0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* src = x + 32 * b;
    __m256 v[4];
    for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(src + 8 * j);
    __m256 amax = _mm256_max_ps(
        _mm256_max_ps(_mm256_andnot_ps(sign_bit, v[0]), _mm256_andnot_ps(sign_bit, v[1])),
        _mm256_max_ps(_mm256_andnot_ps(sign_bit, v[2]), _mm256_andnot_ps(sign_bit, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float d = _mm_cvtss_f32(m4) / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    dx[b] = d;
    const __m256 mul = _mm256_set1_ps(id);
    __m256i i[4];
    for (int j = 0; j < 4; ++j) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], mul));
    __m256i bytes = _mm256_packs_epi16(
        _mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    bytes = _mm256_permutevar8x32_epi32(bytes, order);
    if (bits == 4)
      bytes = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(bytes, evens_odds), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qx + 32 * b), bytes);
  }
}
#endif

#ifdef EXO_X86
// ---------------------------------------------------------------- many rows, float activations
//
// 2..N rows of x (batched decode, prefill) at compute speed: a pair of weight rows is
// expanded once into L1 (floats, in the order the one-row kernels read them) and then serves
// every row of an L2-sized tile of x, R rows x W weight rows of accumulators in registers, so
// each FMA needs (W + R) / (W * R) loads and no expansion. Each output's arithmetic is the
// one-row kernels' (q4_row_x4w / q8f_row_x4w / rows_avx2), op for op: per group the even
// vectors go to one accumulator and the odd ones to another, total = fma(a + b, scale, total),
// then hsum(total) + sum_g bias[g] * xsum[g] in g order: a row gives the same bits alone
// and in any batch. The bias sums run 4 rows per SSE vector (each lane the scalar order).

// Weight row n as floats: 4 bits in the lane order of permute_x, 8 bits in element order.
template <int BITS>
__attribute__((target("avx2,fma"))) inline void expand_row(const Problem& p, int64_t n, float* q) {
  if constexpr (BITS == 4) {
    const uint32_t* wr = p.w + n * (p.K / 8);
    const __m256i mask = _mm256_set1_epi32(0xF);
    for (int64_t first = 0; first < p.K; first += 32) {
      const __m128i w4 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + first / 8));
      const __m256i v = _mm256_set_m128i(_mm_srli_epi32(w4, 4), w4);
      _mm256_store_ps(q + first, _mm256_cvtepi32_ps(_mm256_and_si256(v, mask)));
      _mm256_store_ps(
          q + first + 8, _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 8), mask)));
      _mm256_store_ps(
          q + first + 16, _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 16), mask)));
      _mm256_store_ps(
          q + first + 24, _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 24), mask)));
    }
  } else {
    const uint8_t* b = reinterpret_cast<const uint8_t*>(p.w) + n * p.K;
    for (int64_t k = 0; k < p.K; k += 8)
      _mm256_store_ps(
          q + k,
          _mm256_cvtepi32_ps(
              _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + k)))));
  }
}

// Outputs [m0, m0 + R) x [n, n + W), groups [g0, g1): q[w] = expanded weight row n + w, x
// row m0 of the tile's float rows (p.xp's order for 4 bits, p.x's for 8), bias the outputs'
// bias terms ([W][4], `bias_terms`), `carry` the running totals between group ranges
// ([W][R][8]: stored and reloaded exactly). The last range writes the outputs. VECS = group / 8.
template <int W, int R, int VECS>
__attribute__((target("avx2,fma"))) inline void tile_block(
    const Problem& p, const float* const* q, const float* x, const float* bias, int64_t n,
    int64_t m0, int64_t g0, int64_t g1, float* carry) {
  const float* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = x + r * p.K;
  __m256 total[W][R];
  for (int w = 0; w < W; ++w)
    for (int r = 0; r < R; ++r)
      total[w][r] = g0 == 0 ? _mm256_setzero_ps() : _mm256_load_ps(carry + 8 * (w * R + r));
  for (int64_t g = g0; g < g1; ++g) {
    __m256 a[W][R], b[W][R];
    for (int w = 0; w < W; ++w)
      for (int r = 0; r < R; ++r) a[w][r] = b[w][r] = _mm256_setzero_ps();
#pragma GCC unroll 16
    for (int v = 0; v < VECS; v += 2) {
      const int64_t o = g * (8 * VECS) + 8 * v;
      __m256 q0[W];
      for (int w = 0; w < W; ++w) q0[w] = _mm256_load_ps(q[w] + o);
      for (int r = 0; r < R; ++r) {
        const __m256 x0 = _mm256_load_ps(xr[r] + o);
        for (int w = 0; w < W; ++w) a[w][r] = _mm256_fmadd_ps(q0[w], x0, a[w][r]);
      }
      __m256 q1[W];
      for (int w = 0; w < W; ++w) q1[w] = _mm256_load_ps(q[w] + o + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 x1 = _mm256_load_ps(xr[r] + o + 8);
        for (int w = 0; w < W; ++w) b[w][r] = _mm256_fmadd_ps(q1[w], x1, b[w][r]);
      }
    }
    for (int w = 0; w < W; ++w) {
      const __m256 scale = _mm256_set1_ps(p.scales[(n + w) * p.G + g]);
      for (int r = 0; r < R; ++r)
        total[w][r] = _mm256_fmadd_ps(_mm256_add_ps(a[w][r], b[w][r]), scale, total[w][r]);
    }
  }
  if (g1 < p.G) {
    for (int w = 0; w < W; ++w)
      for (int r = 0; r < R; ++r) _mm256_store_ps(carry + 8 * (w * R + r), total[w][r]);
    return;
  }
  for (int w = 0; w < W; ++w)
    for (int r = 0; r < R; ++r)
      p.out[(m0 + r) * p.N + n + w] = hsum(total[w][r]) + bias[4 * w + r];
}

// One block of `rows` (1..R) rows: the block size is a compile-time constant.
template <int R, int VECS>
__attribute__((target("avx2,fma"))) inline void tile_block_rows(
    int64_t rows, const Problem& p, const float* const* q, const float* x, const float* bias,
    int64_t n, int64_t m0, int64_t g0, int64_t g1, float* carry) {
  static_assert(R == 4, "blocks of 4 rows and their tails");
  switch (rows) {
    case 4: tile_block<1, 4, VECS>(p, q, x, bias, n, m0, g0, g1, carry); break;
    case 3: tile_block<1, 3, VECS>(p, q, x, bias, n, m0, g0, g1, carry); break;
    case 2: tile_block<1, 2, VECS>(p, q, x, bias, n, m0, g0, g1, carry); break;
    default: tile_block<1, 1, VECS>(p, q, x, bias, n, m0, g0, g1, carry); break;
  }
}

template <int BITS, int VECS>
__attribute__((target("avx2,fma"))) void rows_avx2_tiled(
    const Problem& p, int64_t n0, int64_t n1) {
  // Blocks of 4 rows x 1 weight row: 12 accumulators in registers. Measured (1 thread,
  // SmolLM2's shapes, 8 and 40 rows) against 3 x 2 (6 totals spilled or 18 registers) and
  // 2 x 2: 4 x 1 wins at 8 rows (a decode batch) by 20-30 % and is within 5 % at 40.
  constexpr int R = 4;
  const float* x = BITS == 4 ? p.xp : p.x;
  // Rows of x per tile (copied, 32-byte aligned: a load across two cache lines costs two).
  const int64_t tile = std::min(p.M, std::max<int64_t>(R, (196608 / (p.K * 4)) / R * R));
  // `batch` weight rows are expanded at once (in L2) and each block of R rows of x passes over
  // them in ranges of groups (`span` elements) that fit L1 with the block: every float read in
  // the FMA loop comes from L1, and x and the expanded rows come from L2 once per range.
  constexpr int64_t batch = 8;
  const int64_t chunks = (p.K + 599) / 600;
  const int64_t span_groups = (p.G + chunks - 1) / chunks;
  std::unique_ptr<float[], void (*)(float*)> buf(
      static_cast<float*>(std::aligned_alloc(32, sizeof(float) * (batch + tile) * p.K)),
      [](float* f) { std::free(f); });
  float* xtile = buf.get() + batch * p.K;
  alignas(32) float carry[batch][R * 8];
  // xsum of each R-row block, transposed to [G][4] (lane r = row m0 + r).
  std::vector<float> xst_store((tile + R - 1) / R * 4 * p.G + 8, 0.0f);
  float* xst = reinterpret_cast<float*>(
      (reinterpret_cast<uintptr_t>(xst_store.data()) + 15) & ~uintptr_t{15});
  for (int64_t t0 = 0; t0 < p.M; t0 += tile) {
    const int64_t t1 = std::min(p.M, t0 + tile);
    for (int64_t m = t0; m < t1; ++m) {
      const int64_t blk = (m - t0) / R, lane = (m - t0) % R;
      for (int64_t g = 0; g < p.G; ++g) xst[(blk * p.G + g) * 4 + lane] = p.xsum[m * p.G + g];
    }
    std::copy(x + t0 * p.K, x + t1 * p.K, xtile);
    for (int64_t nb = n0; nb < n1; nb += batch) {
      const int64_t nb1 = std::min(n1, nb + batch);
      for (int64_t n = nb; n < nb1; ++n) {
        prefetch_row(p, n + batch);  // the next batch's row, read after this batch's products
        expand_row<BITS>(p, n, buf.get() + (n - nb) * p.K);
      }
      for (int64_t m0 = t0; m0 < t1; m0 += R) {
        const int64_t rows = std::min<int64_t>(R, t1 - m0);
        const float* xb = xtile + (m0 - t0) * p.K;
        alignas(16) float bias[batch][4];
        exo_kernels::bias_terms(p.biases, p.G, nb, nb1, xst + 4 * p.G * ((m0 - t0) / R), bias);
        for (int64_t g0 = 0; g0 < p.G; g0 += span_groups) {
          const int64_t g1 = std::min(p.G, g0 + span_groups);
          for (int64_t n = nb; n < nb1; ++n) {
            const float* q[1] = {buf.get() + (n - nb) * p.K};
            tile_block_rows<R, VECS>(rows, p, q, xb, bias[n - nb], n, m0, g0, g1, carry[n - nb]);
          }
        }
      }
    }
  }
}

template <int BITS>
__attribute__((target("avx2,fma"))) void rows_avx2_many(const Problem& p, int64_t n0, int64_t n1) {
  switch (p.group_size) {
    case 32: rows_avx2_tiled<BITS, 4>(p, n0, n1); break;
    case 64: rows_avx2_tiled<BITS, 8>(p, n0, n1); break;
    default: rows_avx2_tiled<BITS, 16>(p, n0, n1); break;
  }
}
#endif

// Tests force the portable path to check it on machines that have AVX2.
std::atomic<bool> g_portable{false};

bool has_avx2() {
#ifdef EXO_X86
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok && !g_portable.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void quantize_rows(const float* x, int64_t blocks, int bits, int8_t* qx, float* dx) {
#ifdef EXO_X86
  if (has_avx2()) {
    quantize_rows_avx2(x, blocks, bits, qx, dx);
    return;
  }
#endif
  quantize_rows_scalar(x, blocks, bits, qx, dx);
}

// Every path, by the layer and the call (16-bit scales only where `reads_half_scales`).
void rows_f32(const Problem& p, int64_t n0, int64_t n1) {
#ifdef EXO_X86
  if (has_avx2()) {
    if (p.dequantize)
      dequantize_avx2(p, n0, n1);
    else if (exo_kernels::avx512_takes(p))
      exo_kernels::rows_avx512(p, n0, n1);
    else if (exo_kernels::vnni_takes(p))
      exo_kernels::rows_vnni(p, n0, n1);
    else if (p.int8)
      p.bits == 4 ? rows_avx2_q8<4>(p, n0, n1) : rows_avx2_q8<8>(p, n0, n1);
    else if (p.M > 1 && (p.bits == 8 || p.xp != nullptr))
      p.bits == 4 ? rows_avx2_many<4>(p, n0, n1) : rows_avx2_many<8>(p, n0, n1);
    else if (p.bits == 4 && p.xp != nullptr)
      rows_avx2_q4(p, n0, n1);
    else if (p.bits == 8 && p.M == 1) {
      int64_t n = n0;
      for (; n + 4 <= n1; n += 4) {
        for (int j = 0; j < 4; ++j) prefetch_row(p, n + 8 + j);
        q8f_row_x4w(p, n, 0);
      }
      if (n < n1) rows_avx2(p, n, n1);
    } else
      rows_avx2(p, n0, n1);
    return;
  }
#endif
  if (p.dequantize)
    dequantize_scalar(p, n0, n1);
  else if (p.int8)
    rows_scalar_q8(p, n0, n1);
  else
    rows_scalar(p, n0, n1);
}

// Weight rows per widening of 16-bit scales (their float32 copies, 2 x 4 G bytes a row, stay in
// L1): one block of the one-row kernels (4 rows; the AVX2 4-bit group-32 one-row step with 32
// rows a widening ran ~4 % slower than float32 scales, with 4 as fast, one core), 256 for
// many rows (the widening a small part of their work).
constexpr int64_t kWidenRowsOne = 4;
constexpr int64_t kWidenRowsMany = 256;

// The kernels that read 16-bit scales in place: a one-row decode step on AVX-512 (each row
// block's widened into L1 as it starts), and the VNNI int8 kernels.
bool reads_half_scales(const Problem& p) {
  return (p.M == 1 && exo_kernels::avx512_takes(p)) || exo_kernels::vnni_takes(p);
}

// Rows [n0, n1) of W against x. 16-bit scales and biases are read in place where the kernel
// can (`reads_half_scales`), else widened to float32 a few rows at a time into this thread's
// buffers, which the kernels then read as `p.scales` / `p.biases`. Either way the same values,
// so the same bits as float32 scales, for 2 bytes read a group instead of 4.
void rows(const Problem& p, int64_t n0, int64_t n1) {
  if (p.scale_type == exo_kernels::ScaleType::f32 || reads_half_scales(p)) {
    rows_f32(p, n0, n1);
    return;
  }
  thread_local std::vector<float> scales;
  thread_local std::vector<float> biases;
  const int64_t step = p.M == 1 && !p.dequantize ? kWidenRowsOne : kWidenRowsMany;
  scales.resize(step * p.G);
  biases.resize(step * p.G);
  for (int64_t s0 = n0; s0 < n1; s0 += step) {
    const int64_t s1 = std::min(n1, s0 + step);
    const int64_t count = (s1 - s0) * p.G;
    exo_kernels::widen(p.scales16 + s0 * p.G, p.scale_type, count, scales.data());
    if (p.implicit_bias)
      for (int64_t i = 0; i < count; ++i) biases[i] = -8.0f * scales[i];
    else
      exo_kernels::widen(p.biases16 + s0 * p.G, p.scale_type, count, biases.data());
    Problem q = p;
    // The kernels index row n's scales at n * G: point the copies' base s0 rows back (the
    // kernels only read rows [s0, s1), inside the buffers).
    q.scales = reinterpret_cast<const float*>(
        reinterpret_cast<uintptr_t>(scales.data()) - s0 * p.G * sizeof(float));
    q.biases = reinterpret_cast<const float*>(
        reinterpret_cast<uintptr_t>(biases.data()) - s0 * p.G * sizeof(float));
    q.scale_type = exo_kernels::ScaleType::f32;
    q.implicit_bias = false;
    rows_f32(q, s0, s1);
  }
}

// ---------------------------------------------------------------- the thread pool
//
// The calling thread takes chunks of rows itself and waits only for chunks a worker has
// started: a worker that wakes late (a busy machine) finds nothing left and the call does not
// wait for it. OpenMP's barrier waited for every thread to arrive, which on a loaded 2-core
// machine cost a scheduler time slice per matmul.

struct Job {
  Problem p;
  int64_t chunk = 1;
  int64_t chunks = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void work() {
    for (int64_t c; (c = next.fetch_add(1)) < chunks;) {
      const int64_t n0 = c * chunk;
      rows(p, n0, std::min(p.N, n0 + chunk));
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

class Pool {
 public:
  void resize(int threads) {
    std::lock_guard<std::mutex> submit(submit_);
    stop_workers();
    stop_ = false;
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { loop(); });
  }

  int size() const {
    return static_cast<int>(workers_.size()) + 1;
  }

  void run(const Problem& p) {
    std::unique_lock<std::mutex> submit(submit_, std::try_to_lock);
    const int64_t work = p.N * p.K * std::max<int64_t>(1, p.M);
    // Small matrices, no workers, or another stream's call in flight: run here.
    if (!submit.owns_lock() || workers_.empty() || work < (1 << 16)) {
      rows(p, 0, p.N);
      return;
    }
    auto job = std::make_shared<Job>();
    job->p = p;
    job->chunk = std::max<int64_t>(1, (p.N + size() * 8 - 1) / (size() * 8));
    job->chunks = (p.N + job->chunk - 1) / job->chunk;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = job;
      ++generation_;
    }
    wake_.notify_all();
    job->work();
    while (job->done.load(std::memory_order_acquire) < job->chunks) std::this_thread::yield();
  }

  ~Pool() {
    stop_workers();
  }

 private:
  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      ++generation_;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  void loop() {
    uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        // Spin briefly (back-to-back matmuls of one decode step), then sleep.
        auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
        while (generation_.load() == seen && std::chrono::steady_clock::now() < until) {
        }
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_.load() != seen; });
        seen = generation_.load();
        if (stop_) return;
        job = job_;
      }
      if (job) job->work();
    }
  }

  std::mutex submit_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::thread> workers_;
  std::shared_ptr<Job> job_;
  std::atomic<uint64_t> generation_{0};
  bool stop_ = false;
};

Pool& pool() {
  static Pool instance;
  return instance;
}

void run(const Problem& p) {
  pool().run(p);
}

// One call's work on the kernel pool: the per-call sums of x (and its int8 or permuted copy),
// then the rows of W. Runs on the stream's thread (inside a dispatched task).
void compute(Problem p) {
  if (p.dequantize) {
    run(p);
    return;
  }
  std::vector<float> xsum(p.M * p.G);
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t g = 0; g < p.G; ++g) {
      const float* xg = p.x + m * p.K + g * p.group_size;
      float s = 0.0f;
      for (int i = 0; i < p.group_size; ++i) s += xg[i];
      xsum[m * p.G + g] = s;
    }
  p.xsum = xsum.data();
  std::vector<int8_t> qx;
  std::vector<float> dx;
  if (p.int8) {
    qx.resize(p.M * p.K);
    dx.resize(p.M * p.K / 32);
    quantize_rows(p.x, p.M * p.K / 32, p.bits, qx.data(), dx.data());
    p.qx = qx.data();
    p.dx = dx.data();
    p.m4 = (p.M + 3) / 4 * 4;
    std::vector<float> dxt(p.K / 32 * p.m4, 0.0f);
    for (int64_t m = 0; m < p.M; ++m)
      for (int64_t b = 0; b < p.K / 32; ++b) dxt[b * p.m4 + m] = dx[m * (p.K / 32) + b];
    p.dxt = dxt.data();
    if (exo_kernels::vnni_takes(p))
      exo_kernels::compute_vnni(p, &run);
    else
      run(p);
    return;
  }
  if (exo_kernels::avx512_takes(p)) {
    exo_kernels::compute_avx512(p, &run);
    return;
  }
  std::vector<float> xp;
#ifdef EXO_X86
  if (p.bits == 4 && has_avx2()) {
    xp.resize(p.M * p.K);
    permute_x(p.x, xp.data(), p.M * p.K);
    p.xp = xp.data();
  }
#endif
  run(p);
}

// ---------------------------------------------------------------- the MLX primitive

class QuantizedMatmulCPU : public mx::Primitive {
 public:
  QuantizedMatmulCPU(
      mx::Stream stream, int group_size, int bits, bool dequantize, bool int8 = false,
      bool implicit_bias = false)
      : mx::Primitive(stream),
        group_size_(group_size),
        bits_(bits),
        dequantize_(dequantize),
        int8_(int8),
        implicit_bias_(implicit_bias) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& x = inputs[0];
    const auto& w = inputs[1];
    const auto& scales = inputs[2];
    // Without biases (Q4_0, `implicit_bias_`) the scales stand in for them: never read.
    const auto& biases = implicit_bias_ ? inputs[2] : inputs[3];
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));

    Problem p{};
    p.dequantize = dequantize_;
    p.int8 = int8_;
    p.K = dequantize_ ? w.shape(1) * 32 / bits_ : x.shape(-1);
    p.M = dequantize_ ? 0 : x.size() / p.K;
    p.N = w.shape(0);
    p.G = p.K / group_size_;
    p.group_size = group_size_;
    p.bits = bits_;
    p.x = x.data<float>();
    p.w = w.data<uint32_t>();
    exo_kernels::set_scales(p, scales, biases);
    if (implicit_bias_) {
      p.implicit_bias = true;
      p.biases16 = nullptr;
    }
    p.out = out.data<float>();

    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(x);
    encoder.set_input_array(w);
    encoder.set_input_array(scales);
    if (!implicit_bias_) encoder.set_input_array(biases);
    encoder.set_output_array(out);
    encoder.dispatch([p]() { compute(p); });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("exo_mlx_cpu_kernels: quantized_matmul runs on the CPU only");
  }

  const char* name() const override {
    return dequantize_ ? "ExoDequantizeCPU"
        : int8_        ? "ExoQuantizedMatmulInt8CPU"
                       : "ExoQuantizedMatmulCPU";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const QuantizedMatmulCPU*>(&other);
    return o != nullptr && o->group_size_ == group_size_ && o->bits_ == bits_ &&
        o->dequantize_ == dequantize_ && o->int8_ == int8_ && o->implicit_bias_ == implicit_bias_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    if (dequantize_) return {{inputs[1].shape(0), inputs[1].shape(1) * 32 / bits_}};
    mx::Shape shape = inputs[0].shape();
    shape.back() = inputs[1].shape(0);
    return {shape};
  }

 private:
  int group_size_;
  int bits_;
  bool dequantize_;
  bool int8_;
  bool implicit_bias_;
};

mx::array quantized_matmul(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& biases,
    int group_size,
    int bits,
    bool int8_activations) {
  if (bits != 4 && bits != 8) throw std::invalid_argument("bits must be 4 or 8");
  if (group_size != 32 && group_size != 64 && group_size != 128)
    throw std::invalid_argument("group_size must be 32, 64 or 128");
  if (w.ndim() != 2 || w.dtype() != mx::uint32)
    throw std::invalid_argument("w must be a 2-D uint32 array");
  if (x.ndim() < 1) throw std::invalid_argument("x must have at least one dimension");
  const int64_t K = x.shape(-1);
  const int64_t N = w.shape(0);
  if (K % group_size != 0 || w.shape(1) * 32 / bits != K)
    throw std::invalid_argument("x's last dimension does not match the packed weights");
  const int64_t G = K / group_size;
  if (scales.ndim() != 2 || scales.shape(0) != N || scales.shape(1) != G ||
      (biases && biases->shape() != scales.shape()))
    throw std::invalid_argument("scales and biases must be [N, K / group_size]");
  exo_kernels::check_left_out_biases(biases, scales, bits);

  auto stream = mx::default_stream(mx::Device(mx::Device::cpu));
  auto f32 = [&](const mx::array& a) {
    return mx::contiguous(mx::astype(a, mx::float32, stream), false, stream);
  };
  auto packed = [&](const mx::array& a) { return exo_kernels::packed(a, stream); };
  mx::Shape out_shape = x.shape();
  out_shape.back() = static_cast<int>(N);
  if (!biases)
    return mx::array(
        out_shape,
        mx::float32,
        std::make_shared<QuantizedMatmulCPU>(
            stream, group_size, bits, false, int8_activations, true),
        {f32(x), packed(w), packed(scales)});
  auto [s, b] = exo_kernels::scale_inputs(scales, *biases, stream, packed);
  return mx::array(
      out_shape,
      mx::float32,
      std::make_shared<QuantizedMatmulCPU>(stream, group_size, bits, false, int8_activations),
      {f32(x), packed(w), s, b});
}

mx::array dequantize(
    const mx::array& w, const mx::array& scales, const mx::array& biases, int group_size, int bits) {
  if (bits != 4 && bits != 8) throw std::invalid_argument("bits must be 4 or 8");
  if (group_size != 32 && group_size != 64 && group_size != 128)
    throw std::invalid_argument("group_size must be 32, 64 or 128");
  if (w.ndim() != 2 || w.dtype() != mx::uint32)
    throw std::invalid_argument("w must be a 2-D uint32 array");
  const int64_t N = w.shape(0);
  const int64_t K = w.shape(1) * 32 / bits;
  if (K % group_size != 0 || scales.ndim() != 2 || scales.shape(0) != N ||
      scales.shape(1) != K / group_size || biases.shape() != scales.shape())
    throw std::invalid_argument("scales and biases must be [N, K / group_size]");
  auto stream = mx::default_stream(mx::Device(mx::Device::cpu));
  auto f32 = [&](const mx::array& a) {
    return mx::contiguous(mx::astype(a, mx::float32, stream), false, stream);
  };
  auto packed = [&](const mx::array& a) { return exo_kernels::packed(a, stream); };
  auto [s, b] = exo_kernels::scale_inputs(scales, biases, stream, packed);
  // The first input is unused by the dequantize path; a float32 scalar stands in for it.
  return mx::array(
      {static_cast<int>(N), static_cast<int>(K)},
      mx::float32,
      std::make_shared<QuantizedMatmulCPU>(stream, group_size, bits, true),
      {mx::array(0.0f), packed(w), s, b});
}

}  // namespace

namespace exo_kernels {

bool use_avx2() {
  return has_avx2();
}

void matmul_rows(
    const float* x, int64_t M, int64_t K, const uint32_t* w, const void* scales,
    const void* biases, ScaleType scale_type, int64_t N, int group_size, int bits, bool int8,
    float* out) {
  Problem p{};
  p.int8 = int8;
  p.K = K;
  p.M = M;
  p.N = N;
  p.G = K / group_size;
  p.group_size = group_size;
  p.bits = bits;
  p.x = x;
  p.w = w;
  p.scale_type = scale_type;
  if (scale_type == ScaleType::f32) {
    p.scales = static_cast<const float*>(scales);
    p.biases = static_cast<const float*>(biases);
  } else {
    p.scales16 = static_cast<const uint16_t*>(scales);
    p.biases16 = static_cast<const uint16_t*>(biases);
    p.implicit_bias = biases == nullptr;  // Q4_0's layout (16-bit scales only)
  }
  p.out = out;
  compute(p);
}

}  // namespace exo_kernels

void register_fused_block(nb::module_& m);
void register_decode_attention(nb::module_& m);
void register_swiglu(nb::module_& m);

NB_MODULE(_ext, m) {
  m.doc() = "Vectorised, multi-threaded affine quantized matmul for MLX on the CPU";
  m.def(
      "quantized_matmul",
      &quantized_matmul,
      nb::arg("x"),
      nb::arg("w"),
      nb::arg("scales"),
      nb::arg("biases").none(),
      nb::arg("group_size"),
      nb::arg("bits"),
      nb::arg("int8_activations") = false,
      "x @ dequantize(w, scales, biases).T for MLX affine 4/8-bit weights, as float32. With "
      "int8_activations, x is quantized to int8 per 32 values (integer dot products). biases None: "
      "Q4_0's layout, each bias -8 x its scale (4 bits, 16-bit scales).");
  m.def(
      "dequantize",
      &dequantize,
      nb::arg("w"),
      nb::arg("scales"),
      nb::arg("biases"),
      nb::arg("group_size"),
      nb::arg("bits"),
      "dequantize(w, scales, biases) as float32 [N, K], vectorised and multi-threaded.");
  m.def(
      "set_num_threads",
      [](int n) { pool().resize(std::max(1, n)); },
      nb::arg("n"),
      "Threads the kernel uses (the runner sets it from the cores it may use).");
  m.def("num_threads", []() { return pool().size(); });
  m.def(
      "force_portable",
      [](bool on) { g_portable = on; },
      nb::arg("on"),
      "Use the portable path even where AVX2 is present (for tests).");
  m.def(
      "force_avx2",
      [](bool on) { exo_kernels::force_avx2(on); },
      nb::arg("on"),
      "Use the AVX2 paths even where AVX-512 is present (for tests).");
  m.def(
      "force_no_vnni",
      [](bool on) { exo_kernels::force_no_vnni(on); },
      nb::arg("on"),
      "Use the AVX2 int8 kernels even where AVX-512 VNNI is present (for tests).");
  m.def("vnni", []() { return exo_kernels::vnni_available(); });
  m.def("simd", []() {
    return exo_kernels::avx512_available() ? "avx512+avx2+fma"
        : has_avx2()                        ? "avx2+fma"
                                            : "portable";
  });
  register_fused_block(m);
  register_decode_attention(m);
  register_swiglu(m);
}
