// A prompt's attention (many query rows at once) as one tiled primitive: flash-style, the
// scores of a tile of queries against a block of keys stay in the cache, never n x n in memory.
//
// On the CPU `mx.fast.scaled_dot_product_attention` runs MLX's fallback graph: the scores of
// every query row against every key (heads x L x N floats), the mask, a softmax and a second
// product, each a pass over that array, mostly single-threaded. On SmolLM2 a chunk of 256 rows
// against 2,048 keys took ~93 ms a layer of CPU, ~10 ms of it the products: past ~1k keys the
// attention cost more than the rest of the model, and a 2k prompt was read at less than half
// the rate of a 512-token one (bench/profile_long_prefill.py).
//
// Here each unit of work is (batch row, kv head, tile of query rows): the group's query heads
// over the tile's rows are one block of R rows sharing the kv head's keys. For each block of 64
// keys: S = (q * scale) k^T into a small buffer, the mask, an online softmax (the running
// maximum, the sum rescaled when the maximum grows) and O += P v. Blocks a causal mask hides
// entirely are never read; a boolean mask's all-false blocks are skipped too. Units are spread
// over threads. The result equals MLX's up to float32 rounding (other summation orders).
//
// A row every key of which is masked gets the mean of the values, as MLX's softmax over
// `lowest` scores gives (a batch's left-padding rows): finite, never NaN.

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifdef __linux__
#include <sched.h>
#endif

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"

#include "kernels.h"
#include "vexp.h"

namespace nb = nanobind;
namespace mx = mlx::core;

namespace {

enum class Mask { none = 0, causal = 1, boolean = 2, additive = 3 };

constexpr int64_t TK = 64;  // keys a block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One call's shapes and where its arrays are (elements, not bytes).
struct Call {
  int64_t B, H, KVH, L, N, Dk, Dv, G;
  float scale;
  Mask mask;
  const float *q, *k, *v;
  int64_t qs[4], ks[4], vs[4];
  const void* m = nullptr;  // (B, 1, L, N) broadcast view
  int64_t ms[4] = {0, 0, 0, 0};
  float* out;  // (B, H, L, Dv) contiguous
};

// A tile's buffers, kept by the thread between units and calls.
struct Scratch {
  std::vector<float> q, kt, v, s, o, m, l, corr;
  void size(int64_t R, int64_t Dk, int64_t Dv) {
    q.resize(R * Dk);
    kt.resize(Dk * TK);
    v.resize(TK * Dv);
    s.resize(R * TK);
    o.resize(R * Dv);
    m.resize(R);
    l.resize(R);
    corr.resize(R);
  }
};
thread_local Scratch t_scratch;

// ---------------------------------------------------------------- the block kernels
// Generic forms: plain loops GCC vectorises, compiled once for AVX2+FMA and once portable.
// Always inlined into the per-target drivers below.

// s[r][j] = sum_d q[r][d] * kt[d][j] for R rows and TK keys.
#define EXO_INLINE __attribute__((always_inline)) inline

EXO_INLINE void scores_generic(const float* q, const float* kt, int64_t R, int64_t D, float* s) {
  for (int64_t r = 0; r < R; ++r) {
    float acc[TK] = {};
    const float* qr = q + r * D;
    for (int64_t d = 0; d < D; ++d) {
      const float a = qr[d];
      const float* kd = kt + d * TK;
      for (int64_t j = 0; j < TK; ++j) acc[j] += a * kd[j];
    }
    std::memcpy(s + r * TK, acc, sizeof acc);
  }
}

EXO_INLINE float exp_generic(float x) {
  return exo_kernels::exp_scalar(x);
}

// Online softmax over row r's TK scores: the new maximum, the factor the earlier sums take, the
// scores replaced by their weights. Returns false when the row has seen no key yet (all -inf).
EXO_INLINE void softmax_generic(float* s, int64_t R, float* m, float* l, float* corr) {
  for (int64_t r = 0; r < R; ++r) {
    float* row = s + r * TK;
    float top = m[r];
    for (int64_t j = 0; j < TK; ++j) top = std::max(top, row[j]);
    if (top == kNegInf) {  // nothing allowed yet: no weight, nothing to rescale
      for (int64_t j = 0; j < TK; ++j) row[j] = 0.0f;
      corr[r] = 1.0f;
      continue;
    }
    corr[r] = exp_generic(m[r] - top);
    float sum = 0.0f;
    for (int64_t j = 0; j < TK; ++j) {
      row[j] = exp_generic(row[j] - top);
      sum += row[j];
    }
    l[r] = l[r] * corr[r] + sum;
    m[r] = top;
  }
}

// o[r] = o[r] * corr[r] + sum_j p[r][j] * v[j] over the block's `count` keys.
EXO_INLINE void values_generic(const float* p, const float* v, const float* corr, int64_t R,
                               int64_t count, int64_t D, float* o) {
  for (int64_t r = 0; r < R; ++r) {
    float* orow = o + r * D;
    const float c = corr[r];
    for (int64_t d = 0; d < D; ++d) orow[d] *= c;
    const float* pr = p + r * TK;
    for (int64_t j = 0; j < count; ++j) {
      const float w = pr[j];
      const float* vj = v + j * D;
      for (int64_t d = 0; d < D; ++d) orow[d] += w * vj[d];
    }
  }
}

struct GenericOps {
  static EXO_INLINE void scores(const float* q, const float* kt, int64_t R, int64_t D, float* s) {
    scores_generic(q, kt, R, D, s);
  }
  static EXO_INLINE void softmax(float* s, int64_t R, float* m, float* l, float* corr) {
    softmax_generic(s, R, m, l, corr);
  }
  static EXO_INLINE void values(const float* p, const float* v, const float* corr, int64_t R,
                                int64_t count, int64_t D, float* o) {
    values_generic(p, v, corr, R, count, D, o);
  }
};

// ---------------------------------------------------------------- AVX-512
#ifdef EXO_X86
#define EXO_AVX512 __attribute__((target("avx512f,avx2,fma")))

// exp of 16 lanes: vexp.h's polynomial (Cephes), with fused multiply-adds.
EXO_AVX512 EXO_INLINE __m512 exp512(__m512 x) {
  using namespace exo_kernels;
  const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kMinArg), _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_set1_ps(kMaxArg), x);
  const __m512 n = _mm512_roundscale_ps(
      _mm512_fmadd_ps(x, _mm512_set1_ps(kLog2e), _mm512_set1_ps(0.5f)),
      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kC1), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kC2), r);
  __m512 y = _mm512_set1_ps(kP0);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP1));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP2));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP3));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP4));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP5));
  y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  const __m512i bits =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~under), y, _mm512_castsi512_ps(bits));
}

// Called, not inlined, from the driver (a default-target template): one call a block.
struct Avx512Ops {
  // Four rows at a time: 16 accumulators (4 rows x 64 keys), 4 key loads and 4 broadcasts a d.
  static EXO_AVX512 void scores(const float* q, const float* kt, int64_t R, int64_t D,
                                           float* s) {
    int64_t r = 0;
    for (; r + 4 <= R; r += 4) {
      __m512 a[4][4];
      for (auto& row : a)
        for (auto& x : row) x = _mm512_setzero_ps();
      const float* q0 = q + r * D;
      for (int64_t d = 0; d < D; ++d) {
        const float* kd = kt + d * TK;
        const __m512 k0 = _mm512_loadu_ps(kd), k1 = _mm512_loadu_ps(kd + 16),
                     k2 = _mm512_loadu_ps(kd + 32), k3 = _mm512_loadu_ps(kd + 48);
        for (int i = 0; i < 4; ++i) {
          const __m512 x = _mm512_set1_ps(q0[i * D + d]);
          a[i][0] = _mm512_fmadd_ps(x, k0, a[i][0]);
          a[i][1] = _mm512_fmadd_ps(x, k1, a[i][1]);
          a[i][2] = _mm512_fmadd_ps(x, k2, a[i][2]);
          a[i][3] = _mm512_fmadd_ps(x, k3, a[i][3]);
        }
      }
      for (int i = 0; i < 4; ++i)
        for (int c = 0; c < 4; ++c) _mm512_storeu_ps(s + (r + i) * TK + 16 * c, a[i][c]);
    }
    for (; r < R; ++r) {
      __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
      for (int64_t d = 0; d < D; ++d) {
        const __m512 x = _mm512_set1_ps(q[r * D + d]);
        for (int c = 0; c < 4; ++c)
          a[c] = _mm512_fmadd_ps(x, _mm512_loadu_ps(kt + d * TK + 16 * c), a[c]);
      }
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(s + r * TK + 16 * c, a[c]);
    }
  }

  static EXO_AVX512 void softmax(float* s, int64_t R, float* m, float* l, float* corr) {
    for (int64_t r = 0; r < R; ++r) {
      float* row = s + r * TK;
      __m512 x[4];
      for (int c = 0; c < 4; ++c) x[c] = _mm512_loadu_ps(row + 16 * c);
      const float top = std::max(
          m[r], _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(x[0], x[1]),
                                                   _mm512_max_ps(x[2], x[3]))));
      if (top == kNegInf) {
        for (int c = 0; c < 4; ++c) _mm512_storeu_ps(row + 16 * c, _mm512_setzero_ps());
        corr[r] = 1.0f;
        continue;
      }
      corr[r] = exo_kernels::exp_scalar(m[r] - top);
      const __m512 t = _mm512_set1_ps(top);
      __m512 sum = _mm512_setzero_ps();
      for (int c = 0; c < 4; ++c) {
        const __m512 e = exp512(_mm512_sub_ps(x[c], t));
        _mm512_storeu_ps(row + 16 * c, e);
        sum = _mm512_add_ps(sum, e);
      }
      l[r] = l[r] * corr[r] + _mm512_reduce_add_ps(sum);
      m[r] = top;
    }
  }

  // NV vectors of 16 values a row, 4 rows at a time.
  template <int NV>
  static EXO_AVX512 EXO_INLINE void values_cols(const float* p, const float* v, const float* corr,
                                                int64_t R, int64_t count, int64_t D, int64_t d0,
                                                float* o) {
    int64_t r = 0;
    for (; r + 4 <= R; r += 4) {
      __m512 a[4][NV];
      for (int i = 0; i < 4; ++i) {
        const __m512 c = _mm512_set1_ps(corr[r + i]);
        for (int n = 0; n < NV; ++n)
          a[i][n] = _mm512_mul_ps(_mm512_loadu_ps(o + (r + i) * D + d0 + 16 * n), c);
      }
      for (int64_t j = 0; j < count; ++j) {
        __m512 vj[NV];
        for (int n = 0; n < NV; ++n) vj[n] = _mm512_loadu_ps(v + j * D + d0 + 16 * n);
        for (int i = 0; i < 4; ++i) {
          const __m512 w = _mm512_set1_ps(p[(r + i) * TK + j]);
          for (int n = 0; n < NV; ++n) a[i][n] = _mm512_fmadd_ps(w, vj[n], a[i][n]);
        }
      }
      for (int i = 0; i < 4; ++i)
        for (int n = 0; n < NV; ++n) _mm512_storeu_ps(o + (r + i) * D + d0 + 16 * n, a[i][n]);
    }
    for (; r < R; ++r) {
      __m512 a[NV];
      const __m512 c = _mm512_set1_ps(corr[r]);
      for (int n = 0; n < NV; ++n) a[n] = _mm512_mul_ps(_mm512_loadu_ps(o + r * D + d0 + 16 * n), c);
      for (int64_t j = 0; j < count; ++j) {
        const __m512 w = _mm512_set1_ps(p[r * TK + j]);
        for (int n = 0; n < NV; ++n)
          a[n] = _mm512_fmadd_ps(w, _mm512_loadu_ps(v + j * D + d0 + 16 * n), a[n]);
      }
      for (int n = 0; n < NV; ++n) _mm512_storeu_ps(o + r * D + d0 + 16 * n, a[n]);
    }
  }

  static EXO_AVX512 void values(const float* p, const float* v, const float* corr,
                                           int64_t R, int64_t count, int64_t D, float* o) {
    int64_t d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) values_cols<4>(p, v, corr, R, count, D, d0, o);
    for (; d0 < D; d0 += 16) values_cols<1>(p, v, corr, R, count, D, d0, o);
  }
};
#endif

// ---------------------------------------------------------------- one unit of work

// Whether any query row [i0, i1) of batch row b may see a key of [j0, j1).
bool block_visible(const Call& c, int64_t b, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  if (c.mask == Mask::causal) return j0 <= c.N - c.L + i1 - 1;
  if (c.mask != Mask::boolean) return true;
  const bool* m = static_cast<const bool*>(c.m);
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t j = j0; j < j1; ++j)
      if (m[b * c.ms[0] + i * c.ms[2] + j * c.ms[3]]) return true;
  return false;
}

// The tile's scores of keys [j0, j0 + count) take the mask: -inf where a key is hidden (and for
// the block's padding past `count`), the additive mask's values added.
void apply_mask(const Call& c, int64_t b, int64_t i0, int64_t tq, int64_t j0, int64_t count,
                float* s) {
  const int64_t R = c.G * tq;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t i = i0 + r % tq;
    float* row = s + r * TK;
    for (int64_t j = count; j < TK; ++j) row[j] = kNegInf;
    switch (c.mask) {
      case Mask::none:
        break;
      case Mask::causal: {
        const int64_t last = c.N - c.L + i;  // the last key row i sees
        for (int64_t j = std::max<int64_t>(0, last + 1 - j0); j < count; ++j) row[j] = kNegInf;
        break;
      }
      case Mask::boolean: {
        const bool* m = static_cast<const bool*>(c.m) + b * c.ms[0] + i * c.ms[2];
        for (int64_t j = 0; j < count; ++j)
          if (!m[(j0 + j) * c.ms[3]]) row[j] = kNegInf;
        break;
      }
      case Mask::additive: {
        const float* m = static_cast<const float*>(c.m) + b * c.ms[0] + i * c.ms[2];
        for (int64_t j = 0; j < count; ++j) row[j] = row[j] + m[(j0 + j) * c.ms[3]];
        break;
      }
    }
  }
}

// Query rows [i0, i0 + tq) of batch row b, kv head h: every head of its group.
template <class Ops>
EXO_INLINE void run_unit(const Call& c, int64_t b, int64_t h, int64_t i0, int64_t tq) {
  const int64_t R = c.G * tq, Dk = c.Dk, Dv = c.Dv;
  Scratch& t = t_scratch;
  t.size(R, Dk, Dv);
  for (int64_t g = 0; g < c.G; ++g)
    for (int64_t i = 0; i < tq; ++i) {
      const float* src = c.q + b * c.qs[0] + (h * c.G + g) * c.qs[1] + (i0 + i) * c.qs[2];
      float* dst = t.q.data() + (g * tq + i) * Dk;
      for (int64_t d = 0; d < Dk; ++d) dst[d] = src[d * c.qs[3]] * c.scale;
    }
  std::fill(t.m.begin(), t.m.begin() + R, kNegInf);
  std::fill(t.l.begin(), t.l.begin() + R, 0.0f);
  std::fill(t.o.begin(), t.o.begin() + R * Dv, 0.0f);
  const float* kb = c.k + b * c.ks[0] + h * c.ks[1];
  const float* vb = c.v + b * c.vs[0] + h * c.vs[1];
  for (int64_t j0 = 0; j0 < c.N; j0 += TK) {
    const int64_t count = std::min(TK, c.N - j0);
    if (!block_visible(c, b, i0, i0 + tq, j0, j0 + count)) {
      if (c.mask == Mask::causal) break;  // every later block is hidden too
      continue;
    }
    for (int64_t j = 0; j < TK; ++j)
      for (int64_t d = 0; d < Dk; ++d)
        t.kt[d * TK + j] = j < count ? kb[(j0 + j) * c.ks[2] + d * c.ks[3]] : 0.0f;
    for (int64_t j = 0; j < count; ++j)
      for (int64_t d = 0; d < Dv; ++d) t.v[j * Dv + d] = vb[(j0 + j) * c.vs[2] + d * c.vs[3]];
    Ops::scores(t.q.data(), t.kt.data(), R, Dk, t.s.data());
    apply_mask(c, b, i0, tq, j0, count, t.s.data());
    Ops::softmax(t.s.data(), R, t.m.data(), t.l.data(), t.corr.data());
    Ops::values(t.s.data(), t.v.data(), t.corr.data(), R, count, Dv, t.o.data());
  }
  for (int64_t g = 0; g < c.G; ++g)
    for (int64_t i = 0; i < tq; ++i) {
      const int64_t r = g * tq + i;
      float* dst = c.out + (((b * c.H) + h * c.G + g) * c.L + i0 + i) * Dv;
      if (t.l[r] > 0.0f) {
        const float inv = 1.0f / t.l[r];
        for (int64_t d = 0; d < Dv; ++d) dst[d] = t.o[r * Dv + d] * inv;
        continue;
      }
      // Every key hidden: MLX's softmax of equal `lowest` scores, the mean of the values.
      std::fill(dst, dst + Dv, 0.0f);
      for (int64_t j = 0; j < c.N; ++j)
        for (int64_t d = 0; d < Dv; ++d) dst[d] += vb[j * c.vs[2] + d * c.vs[3]];
      for (int64_t d = 0; d < Dv; ++d) dst[d] = dst[d] / static_cast<float>(c.N);
    }
}

void unit_portable(const Call& c, int64_t b, int64_t h, int64_t i0, int64_t tq) {
  run_unit<GenericOps>(c, b, h, i0, tq);
}
#ifdef EXO_X86
__attribute__((target("avx2,fma"))) void unit_avx2(const Call& c, int64_t b, int64_t h,
                                                   int64_t i0, int64_t tq) {
  run_unit<GenericOps>(c, b, h, i0, tq);
}
EXO_AVX512 void unit_avx512(const Call& c, int64_t b, int64_t h, int64_t i0, int64_t tq) {
  run_unit<Avx512Ops>(c, b, h, i0, tq);
}
#endif

// ---------------------------------------------------------------- threads
//
// Threads started for the call: the calling thread takes units itself and waits only for units
// a helper has started, so a helper that wakes late (a busy machine) finds nothing left and
// the call does not wait for it (the kernel pool's rule, qmatmul.cpp). A call is ~30 layers x
// a few ms or more: a thread start (~20 µs) does not show.
std::atomic<int> g_threads{0};  // 0: the usable cores

int usable_threads() {
  const int set = g_threads.load(std::memory_order_relaxed);
  if (set > 0) return set;
#ifdef __linux__
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof cpus, &cpus) == 0) return std::max(1, CPU_COUNT(&cpus));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

struct Shared {
  std::function<void(int64_t)> work;
  int64_t units = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void drain() {
    for (int64_t u; (u = next.fetch_add(1)) < units;) {
      work(u);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

void parallel_units(int64_t units, int threads, std::function<void(int64_t)> work) {
  auto shared = std::make_shared<Shared>();
  shared->work = std::move(work);
  shared->units = units;
  for (int i = 1; i < std::min<int64_t>(threads, units); ++i)
    std::thread([shared] { shared->drain(); }).detach();
  shared->drain();
  while (shared->done.load(std::memory_order_acquire) < units) std::this_thread::yield();
}

// ---------------------------------------------------------------- the primitive
struct Settings {
  float scale_;
  Mask mask_;

  bool operator==(const Settings& o) const {
    return scale_ == o.scale_ && mask_ == o.mask_;
  }

  void compute(const std::vector<mx::array>& in, mx::array& out) const;
};

void Settings::compute(const std::vector<mx::array>& in, mx::array& out) const {
  const mx::array &q = in[0], &k = in[1], &v = in[2];
  Call c{};
  c.B = q.shape(0);
  c.H = q.shape(1);
  c.L = q.shape(2);
  c.Dk = q.shape(3);
  c.KVH = k.shape(1);
  c.N = k.shape(2);
  c.Dv = v.shape(3);
  c.G = c.H / c.KVH;
  c.scale = scale_;
  c.mask = mask_;
  c.q = q.data<float>();
  c.k = k.data<float>();
  c.v = v.data<float>();
  for (int i = 0; i < 4; ++i) {
    c.qs[i] = q.strides()[i];
    c.ks[i] = k.strides()[i];
    c.vs[i] = v.strides()[i];
  }
  if (mask_ == Mask::boolean || mask_ == Mask::additive) {
    const mx::array& m = in[3];
    c.m = mask_ == Mask::boolean ? static_cast<const void*>(m.data<bool>())
                                 : static_cast<const void*>(m.data<float>());
    for (int i = 0; i < 4; ++i) c.ms[i] = m.strides()[i];
  }
  c.out = out.data<float>();
  // Rows a tile: R = G x tq rows share each block of keys (~48-64 rows keeps S, O and the
  // block of keys in L1/L2).
  const int64_t tq = std::min<int64_t>(c.L, c.G >= 3 ? 16 : 64 / c.G);
  const int64_t tiles = (c.L + tq - 1) / tq;
  void (*unit)(const Call&, int64_t, int64_t, int64_t, int64_t) = unit_portable;
#ifdef EXO_X86
  if (exo_kernels::avx512_available() && c.Dk % 16 == 0 && c.Dv % 16 == 0)
    unit = unit_avx512;
  else if (exo_kernels::use_avx2())
    unit = unit_avx2;
#endif
  // The last tiles see the most keys under a causal mask: they go first.
  auto work = [&c, tiles, tq, unit](int64_t u) {
    const int64_t tile = tiles - 1 - u % tiles, bh = u / tiles;
    const int64_t i0 = tile * tq;
    unit(c, bh / c.KVH, bh % c.KVH, i0, std::min(tq, c.L - i0));
  };
  const int64_t units = c.B * c.KVH * tiles;
  const double flop = 4.0 * c.B * c.H * c.L * c.N * c.Dk;
  const int threads = flop < 4e6 ? 1 : usable_threads();
  parallel_units(units, threads, work);
}

class PrefillAttentionCPU : public mx::UnaryPrimitive {
 public:
  PrefillAttentionCPU(mx::Stream stream, Settings settings)
      : mx::UnaryPrimitive(stream), s_(settings) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) encoder.set_input_array(in);
    encoder.set_output_array(out);
    encoder.dispatch([s = s_, ins = inputs, out = out]() mutable { s.compute(ins, out); });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("exo_mlx_cpu_kernels: prefill_attention runs on the CPU only");
  }

  const char* name() const override {
    return "ExoPrefillAttentionCPU";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const PrefillAttentionCPU*>(&other);
    return o != nullptr && o->s_ == s_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const auto& q = inputs[0];
    return {{q.shape(0), q.shape(1), q.shape(2), inputs[2].shape(3)}};
  }

 private:
  Settings s_;
};

mx::array prefill_attention(
    const mx::array& q,
    const mx::array& k,
    const mx::array& v,
    float scale,
    const std::optional<std::string>& causal,
    const std::optional<mx::array>& mask) {
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4)
    throw std::invalid_argument("q must be (B, heads, L, D), k and v (B, kv heads, N, D)");
  if (q.dtype() != mx::float32 || k.dtype() != mx::float32 || v.dtype() != mx::float32)
    throw std::invalid_argument("q, k and v must be float32");
  const int B = q.shape(0), H = q.shape(1), L = q.shape(2), KVH = k.shape(1), N = k.shape(2);
  if (k.shape(0) != B || v.shape(0) != B || v.shape(1) != KVH || v.shape(2) != N ||
      k.shape(3) != q.shape(3) || KVH < 1 || H % KVH != 0 || N < 1 || L < 1)
    throw std::invalid_argument(
        "k and v must be (B, kv heads, N >= 1, D) with kv heads dividing q's heads");
  if (causal && mask) throw std::invalid_argument("give a mask array or \"causal\", not both");
  if (causal && *causal != "causal") throw std::invalid_argument("the only named mask is causal");
  if (causal && N < L) throw std::invalid_argument("a causal mask needs N >= L keys");
  auto stream = mx::default_stream(mx::Device(mx::Device::cpu));
  std::vector<mx::array> inputs = {q, k, v};
  Mask kind = causal ? Mask::causal : Mask::none;
  if (mask) {
    if (mask->ndim() == 4 && mask->shape(1) != 1)
      throw std::invalid_argument("the mask must be the same for every head: (B, 1, L, N)");
    if (mask->dtype() == mx::bool_) {
      kind = Mask::boolean;
      inputs.push_back(mx::broadcast_to(*mask, {B, 1, L, N}, stream));
    } else if (mx::issubdtype(mask->dtype(), mx::floating)) {
      kind = Mask::additive;
      inputs.push_back(
          mx::broadcast_to(mx::astype(*mask, mx::float32, stream), {B, 1, L, N}, stream));
    } else {
      throw std::invalid_argument("mask must be boolean or floating point");
    }
  }
  const mx::Shape shape = {B, H, L, v.shape(3)};
  return mx::array(
      shape, mx::float32, std::make_shared<PrefillAttentionCPU>(stream, Settings{scale, kind}),
      std::move(inputs));
}

}  // namespace

void register_prefill_attention(nb::module_& m) {
  m.def(
      "prefill_attention",
      &prefill_attention,
      nb::arg("q"),
      nb::arg("k"),
      nb::arg("v"),
      nb::arg("scale"),
      nb::arg("causal") = nb::none(),
      nb::arg("mask") = nb::none(),
      "softmax((q * scale) k^T [masked]) v for many query rows, float32, tiled (no L x N "
      "scores in memory): q (B, heads, L, D), k and v (B, kv heads, N, D); causal=\"causal\" "
      "(row i sees keys up to N - L + i) or a boolean or additive mask broadcastable to "
      "(B, 1, L, N).");
  m.def(
      "set_prefill_attention_threads",
      [](int n) { g_threads.store(std::max(0, n), std::memory_order_relaxed); },
      nb::arg("n"),
      "Threads of prefill_attention (0: the usable cores).");
}
