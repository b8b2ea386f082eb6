// 4-bit weights x int8 activations on AVX-512 VNNI (`vpdpbusd`), where the CPU has it: llama.cpp's
// Q4_0 x Q8_0 way, on MLX's affine layout.
//
// The int8 path (qmatmul.cpp) rounds x to int8 per block of 32 (dx = max|x| / 127) and computes,
// per block b of weight row n, the integer dot product of the centred weights (q - 8) with the
// int8 x, then sum_b s dx dot_b + sum_g (bias + 8 s) xsum_g. Its AVX2 kernel needs abs, sign,
// maddubs and madd per 32 weights; here one `vpdpbusd` multiplies 64 unsigned nibbles by 64 int8
// values and sums them in fours into 16 int32 lanes. The centring is folded into the
// accumulator's start: one lane of each block (lanes 0 and 4) begins at -8 * (the sum of the
// block's 32 int8 values), computed once per call for x, so each block's lanes together end at
// its exact centred dot product: the same integers as the AVX2 and portable paths, only the
// float sums after differ in order.
//
// Layout: 32 packed bytes (64 weights, two blocks) become one vector, the low nibbles in the low
// half, the high ones in the high half, so lanes 0-3 hold block 0's even elements, 4-7 block 1's
// evens, 8-11 block 0's odds, 12-15 block 1's odds; x is reordered once per call to match
// (`compute_vnni`). Per unit of 64: total = fma(cvt(dot) * dx, scale, total), each lane with its
// own block's dx and scale; the bias term sums 16 groups a vector; then hsum(total + bias). The
// one-row kernel (4 weight rows) and the many-rows one (4 x 4) do that op for op: a row gives the
// same bits alone and in any batch on a given CPU.
//
// x's side data is 8 bytes a unit (the two starts; dx is read from the int8 path's own 2 floats)
// and both are spread to their lanes with one permute each, shared by 4 weight rows: x's rows
// then take 72 bytes a unit instead of 192, and a prompt's rows stay in L2 (a 1B's 8192-wide
// down projection ran at ~60 % of the 2048-wide layers' rate with 16-lane starts and dx).

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "kernels.h"

namespace exo_kernels {

namespace {
std::atomic<bool> g_no_vnni{false};
}  // namespace

void force_no_vnni(bool on) {
  g_no_vnni = on;
}

bool vnni_available() {
#ifdef EXO_X86
  static const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return cpu && avx512_available() && !g_no_vnni.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

bool vnni_takes(const Problem& p) {
  return p.int8 && p.bits == 4 && p.K % 64 == 0 && !p.dequantize && vnni_available();
}

#ifdef EXO_X86
#define EXO_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace {

// Weight rows prefetched ahead by the kernels (a decode step's rows are too short for the
// hardware prefetcher to run ahead), into L2, not L1: a core has few L1 miss buffers, and
// prefetches held there starved the loads. One row, 1 thread, 1B shapes streamed from memory:
// 8.4-12 GB/s a CPU-second with L1 prefetches, 12-15.5 into L2 (as llama.cpp's ~13.5 a core).
constexpr int64_t kAhead = 8;

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

// Each lane's block within a unit (0 or 1): the index that spreads a unit's two per-block values.
EXO_VNNI inline __m512i block_lanes() {
  return _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
}

// The scale of each lane in unit u (64 weights) of a row whose scales start at sr.
template <int GS, class T>
EXO_VNNI inline __m512 unit_scale(const T* sr, int64_t u) {
  if constexpr (GS == 32) {
    return _mm512_permutexvar_ps(block_lanes(), _mm512_castps128_ps512(two_scales(sr + 2 * u)));
  } else {
    return _mm512_set1_ps(scale_at(sr, u * 64 / GS));
  }
}

// Two 32-bit words (a unit's two starts or two dx) in the low lanes of a vector.
template <class V>
EXO_VNNI inline __m512i two_words(const V* at) {
  return _mm512_castsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at)));
}

// 32 packed bytes as 64 unsigned nibbles in the lane order above.
EXO_VNNI inline __m512i nibbles64(const uint8_t* w) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m512i both =
      _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm256_srli_epi16(lo, 4), 1);
  return _mm512_and_si512(both, _mm512_set1_epi8(0x0F));
}

EXO_VNNI inline float hsum512(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return hsum(_mm256_add_ps(lo, hi));
}

// Outputs [m0, m0 + R) x [n, n + W). T: how the scales are stored (float, F16, BF16), read in
// place. p.qx: x in this file's lane order; p.qc: per row and unit, the two blocks' starts
// (`compute_vnni`); p.dx: per row and block, dx.
template <int GS, int W, int R, class T>
EXO_VNNI inline void block(const Problem& p, int64_t n, int64_t m0) {
  const int64_t units = p.K / 64;
  const int64_t row_bytes = p.K / 2;
  const uint8_t* wr[W];
  const T* sr[W];
  const T* br[W];
  for (int j = 0; j < W; ++j) {
    wr[j] = reinterpret_cast<const uint8_t*>(p.w) + (n + j) * row_bytes;
    sr[j] = scales_of<T>(p) + (n + j) * p.G;
    br[j] = p.implicit_bias ? nullptr : biases_of<T>(p) + (n + j) * p.G;
  }
  const int8_t* xr[R];
  const int32_t* cr[R];
  const float* dr[R];
  for (int r = 0; r < R; ++r) {
    xr[r] = p.qx + (m0 + r) * p.K;
    cr[r] = p.qc + (m0 + r) * units * 2;
    dr[r] = p.dx + (m0 + r) * units * 2;
  }
  const __m512i lanes = block_lanes();
  __m512 total[W][R];
  for (int j = 0; j < W; ++j)
    for (int r = 0; r < R; ++r) total[j][r] = _mm512_setzero_ps();
  for (int64_t u = 0; u < units; ++u) {
    __m512i wv[W];
    __m512 sv[W];
    for (int j = 0; j < W; ++j) {
      if (n + j + kAhead < p.N)
        _mm_prefetch(reinterpret_cast<const char*>(wr[j] + kAhead * row_bytes + 32 * u), _MM_HINT_T1);
      wv[j] = nibbles64(wr[j] + 32 * u);
      sv[j] = unit_scale<GS>(sr[j], u);
    }
    for (int r = 0; r < R; ++r) {
      const __m512i xv = _mm512_loadu_si512(xr[r] + 64 * u);
      const __m512i start = _mm512_maskz_permutexvar_epi32(0x0011, lanes, two_words(cr[r] + 2 * u));
      const __m512 dv = _mm512_permutexvar_ps(lanes, _mm512_castsi512_ps(two_words(dr[r] + 2 * u)));
      for (int j = 0; j < W; ++j) {
        const __m512i dot = _mm512_dpbusd_epi32(start, wv[j], xv);
        total[j][r] =
            _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), dv), sv[j], total[j][r]);
      }
    }
  }
  // sum_g (bias + 8 scale) xsum_g, 16 groups a vector (a tail masked to 0).
  const __m512 eight = _mm512_set1_ps(8.0f);
  __m512 bias[W][R];
  for (int j = 0; j < W; ++j)
    for (int r = 0; r < R; ++r) bias[j][r] = _mm512_setzero_ps();
  // Q4_0 (`implicit_bias`): bias + 8 scale is 0 in every group, the term 0: neither read nor summed.
  for (int64_t g = 0; g < (p.implicit_bias ? 0 : p.G); g += 16) {
    const int64_t count = std::min<int64_t>(16, p.G - g);
    __m512 xs[R];
    for (int r = 0; r < R; ++r) xs[r] = load16(p.xsum + (m0 + r) * p.G + g, count);
    for (int j = 0; j < W; ++j) {
      const __m512 b =
          _mm512_add_ps(load16(br[j] + g, count), _mm512_mul_ps(eight, load16(sr[j] + g, count)));
      for (int r = 0; r < R; ++r) bias[j][r] = _mm512_fmadd_ps(b, xs[r], bias[j][r]);
    }
  }
  for (int j = 0; j < W; ++j)
    for (int r = 0; r < R; ++r)
      p.out[(m0 + r) * p.N + n + j] = hsum512(_mm512_add_ps(total[j][r], bias[j][r]));
}

// Rows [m0, m0 + R) against weight rows [n0, n1): 4 at a time, then one by one.
template <int GS, int R, class T>
EXO_VNNI inline void weight_rows(const Problem& p, int64_t n0, int64_t n1, int64_t m0) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) block<GS, 4, R, T>(p, n, m0);
  for (; n < n1; ++n) block<GS, 1, R, T>(p, n, m0);
}

// x's share of L2: rows of x are taken in tiles of at most this many bytes (codes, starts and
// dx), each tile against every weight row, so a long prompt's rows are read from L2, not L3.
constexpr int64_t kTileBytes = 512 * 1024;

template <int GS, class T>
EXO_VNNI void rows_gs(const Problem& p, int64_t n0, int64_t n1) {
  // Blocks of 8 weight rows (their packed rows, 8 KB at K = 2048, stay in L1) against every row
  // of a tile of x, 4 rows at a time, then the last 1-3 one by one.
  constexpr int64_t batch = 8;
  const int64_t x_row_bytes = p.K + p.K / 64 * 16;
  const int64_t tile = std::max<int64_t>(4, kTileBytes / x_row_bytes / 4 * 4);
  for (int64_t t0 = 0; t0 < p.M; t0 += tile) {
    const int64_t t1 = std::min(p.M, t0 + tile);
    for (int64_t nb = n0; nb < n1; nb += batch) {
      const int64_t nb1 = std::min(n1, nb + batch);
      int64_t m = t0;
      for (; m + 4 <= t1; m += 4) weight_rows<GS, 4, T>(p, nb, nb1, m);
      for (; m < t1; ++m) weight_rows<GS, 1, T>(p, nb, nb1, m);
    }
  }
}

template <class T>
void rows_t(const Problem& p, int64_t n0, int64_t n1) {
  switch (p.group_size) {
    case 32: rows_gs<32, T>(p, n0, n1); break;
    case 64: rows_gs<64, T>(p, n0, n1); break;
    default: rows_gs<128, T>(p, n0, n1); break;
  }
}

// x (quantized by the int8 path: per block of 32, its 16 even elements, then its 16 odd ones)
// reordered per unit of two blocks to [evens 0, evens 1, odds 0, odds 1]; per unit the two
// blocks' starts, -8 * (the sum of the block's values).
EXO_VNNI void prepare_x(const int8_t* qx, int64_t M, int64_t K, int8_t* qv, int32_t* qc) {
  const int64_t units = K / 64;
  for (int64_t i = 0; i < M * units; ++i) {
    const int8_t* src = qx + 64 * i;
    int8_t* dst = qv + 64 * i;
    std::copy(src, src + 16, dst);
    std::copy(src + 32, src + 48, dst + 16);
    std::copy(src + 16, src + 32, dst + 32);
    std::copy(src + 48, src + 64, dst + 48);
    const __m512i v = _mm512_loadu_si512(dst);
    const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), v);
    qc[2 * i] = -8 * _mm512_mask_reduce_add_epi32(0x0F0F, sums);
    qc[2 * i + 1] = -8 * _mm512_mask_reduce_add_epi32(0xF0F0, sums);
  }
}

// Per thread (each MLX stream calls from its own), reused across calls.
template <class V>
V* scratch(std::vector<V>& store, int64_t count) {
  if (static_cast<int64_t>(store.size()) < count) store.resize(count);
  return store.data();
}

}  // namespace

void compute_vnni(Problem p, void (*run)(const Problem&)) {
  thread_local std::vector<int8_t> qv_store;
  thread_local std::vector<int32_t> qc_store;
  int8_t* qv = scratch(qv_store, p.M * p.K);
  int32_t* qc = scratch(qc_store, p.M * p.K / 64 * 2);
  prepare_x(p.qx, p.M, p.K, qv, qc);
  p.qx = qv;
  p.qc = qc;
  run(p);
}

void rows_vnni(const Problem& p, int64_t n0, int64_t n1) {
  if (p.scale_type == ScaleType::f16)
    rows_t<F16>(p, n0, n1);
  else if (p.scale_type == ScaleType::bf16)
    rows_t<BF16>(p, n0, n1);
  else
    rows_t<float>(p, n0, n1);
}
#else
void compute_vnni(Problem p, void (*run)(const Problem&)) {
  run(p);
}
void rows_vnni(const Problem&, int64_t, int64_t) {}
#endif

}  // namespace exo_kernels
