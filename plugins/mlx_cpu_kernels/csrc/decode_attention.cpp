// A one-token step's attention over the KV cache with grouped query heads, as one primitive.
//
// engine_mlx's decode_attention runs it as ~8-10 MLX ops a layer (scale, reshape, a BLAS
// product, the mask, softmax, a second product, reshape), each with its own dispatch and
// allocation: on a small model that is ~20 % of a single stream's step. Here, per (row, kv
// head), the group's query heads are scaled once, every key's scores are dot products, masked
// keys take the lowest float (boolean mask) or add the mask (additive), the softmax subtracts
// the maximum in float32, and the weights multiply the values. k and v are read through their
// strides (the cache hands over a slice of a bigger buffer): no copy.
//
// A row's result never depends on the rest of its batch, nor on masked keys before its own
// (a batch's left padding): scores are per key, the maximum is exact, exp is one function for
// vectors and scalars, the softmax's sum assigns keys to lanes by their distance from the last
// key (padding only adds exact zeros at the end of each lane's sum), and the weighted sum of
// the values runs over the keys in order (leading zero weights add exact zeros).

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <vector>

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

using exo_kernels::exp_scalar;
#ifdef EXO_X86
using exo_kernels::exp_avx2;
#endif

enum class Mask { none = 0, boolean = 1, additive = 2 };

// Pairwise-reduce 8 lane sums in the order of exo_kernels::hsum (lanes l and l + 4, then pairs).
float reduce_lanes(const float* a) {
  const float t0 = a[0] + a[4], t1 = a[1] + a[5], t2 = a[2] + a[6], t3 = a[3] + a[7];
  return (t0 + t1) + (t2 + t3);
}

// ---------------------------------------------------------------- portable path
float dot_portable(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void exp_shifted_portable(float* s, int64_t n, float shift) {
  for (int64_t i = 0; i < n; ++i) s[i] = exp_scalar(s[i] - shift);
}

// Lane l sums the keys n with (count - 1 - n) % 8 == 7 - l, from the last key back.
float lane_sum_portable(const float* e, int64_t count) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = count;
  for (; i >= 8; i -= 8)
    for (int l = 0; l < 8; ++l) acc[l] += e[i - 8 + l];
  for (int64_t j = 0; j < i; ++j) acc[8 - i + j] += e[j];
  return reduce_lanes(acc);
}

// out[d] = sum_n w[n] * v[n * stride + d], the keys in order.
void weighted_sum_portable(const float* w, const float* v, int64_t stride, int64_t count,
                           int64_t dim, float* out) {
  std::fill(out, out + dim, 0.0f);
  for (int64_t n = 0; n < count; ++n) {
    const float* row = v + n * stride;
    for (int64_t d = 0; d < dim; ++d) out[d] += w[n] * row[d];
  }
}

// ---------------------------------------------------------------- AVX2 + FMA path
#ifdef EXO_X86
using exo_kernels::hsum;

__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  if (i + 8 <= n) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    i += 8;
  }
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

__attribute__((target("avx2,fma"))) void exp_shifted_avx2(float* s, int64_t n, float shift) {
  const __m256 m = _mm256_set1_ps(shift);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(s + i, exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + i), m)));
  for (; i < n; ++i) s[i] = exp_scalar(s[i] - shift);  // the same function, lane for lane
}

__attribute__((target("avx2,fma"))) float lane_sum_avx2(const float* e, int64_t count) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = count;
  for (; i >= 8; i -= 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(e + i - 8));
  if (i > 0) {
    alignas(32) float head[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(head + 8 - i, e, i * sizeof(float));
    acc = _mm256_add_ps(acc, _mm256_load_ps(head));
  }
  return hsum(acc);
}

__attribute__((target("avx2,fma"))) void weighted_sum_avx2(
    const float* w, const float* v, int64_t stride, int64_t count, int64_t dim, float* out) {
  int64_t d = 0;
  for (; d + 32 <= dim; d += 32) {  // 4 accumulators: independent chains over the keys
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t n = 0; n < count; ++n) {
      const float* row = v + n * stride + d;
      const __m256 wn = _mm256_set1_ps(w[n]);
      a0 = _mm256_fmadd_ps(wn, _mm256_loadu_ps(row), a0);
      a1 = _mm256_fmadd_ps(wn, _mm256_loadu_ps(row + 8), a1);
      a2 = _mm256_fmadd_ps(wn, _mm256_loadu_ps(row + 16), a2);
      a3 = _mm256_fmadd_ps(wn, _mm256_loadu_ps(row + 24), a3);
    }
    _mm256_storeu_ps(out + d, a0);
    _mm256_storeu_ps(out + d + 8, a1);
    _mm256_storeu_ps(out + d + 16, a2);
    _mm256_storeu_ps(out + d + 24, a3);
  }
  for (; d + 8 <= dim; d += 8) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t n = 0; n < count; ++n)
      a = _mm256_fmadd_ps(_mm256_set1_ps(w[n]), _mm256_loadu_ps(v + n * stride + d), a);
    _mm256_storeu_ps(out + d, a);
  }
  for (; d < dim; ++d) {
    float a = 0.0f;
    for (int64_t n = 0; n < count; ++n) a += w[n] * v[n * stride + d];
    out[d] = a;
  }
}
#endif

// ---------------------------------------------------------------- the computation
struct Settings {
  float scale_;
  Mask mask_;

  bool operator==(const Settings& o) const {
    return scale_ == o.scale_ && mask_ == o.mask_;
  }

  void compute(const std::vector<mx::array>& in, mx::array& out) const;
};

// Reused on the stream's thread: a step makes one call a layer.
thread_local std::vector<float> t_q, t_scores, t_k, t_v;

// The (rows x dim) block at `base` with row stride `row` and element stride `col`: itself when
// its elements are contiguous in a row, else a packed copy (row stride dim).
const float* rows_of(const float* base, int64_t rows, int64_t dim, int64_t row, int64_t col,
                     std::vector<float>& scratch, int64_t& stride) {
  if (col == 1) {
    stride = row;
    return base;
  }
  scratch.resize(rows * dim);
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t d = 0; d < dim; ++d) scratch[n * dim + d] = base[n * row + d * col];
  stride = dim;
  return scratch.data();
}

void Settings::compute(const std::vector<mx::array>& in, mx::array& out) const {
  const mx::array &q = in[0], &k = in[1], &v = in[2];
  const int64_t B = q.shape(0), H = q.shape(1), Dk = q.shape(3);
  const int64_t KVH = k.shape(1), N = k.shape(2), Dv = v.shape(3), G = H / KVH;
  const auto &qs = q.strides(), &ks = k.strides(), &vs = v.strides();
#ifdef EXO_X86
  const bool avx = exo_kernels::use_avx2();
#else
  const bool avx = false;
#endif
  auto dot = [&](const float* a, const float* b) {
#ifdef EXO_X86
    if (avx) return dot_avx2(a, b, Dk);
#endif
    return dot_portable(a, b, Dk);
  };
  t_q.resize(G * Dk);
  t_scores.resize(G * N);
  float* y = out.data<float>();
  const float lowest = std::numeric_limits<float>::lowest();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < KVH; ++h) {
      // The group's queries, scaled once (q * scale, as the MLX ops do).
      for (int64_t g = 0; g < G; ++g) {
        const float* row = q.data<float>() + b * qs[0] + (h * G + g) * qs[1];
        for (int64_t d = 0; d < Dk; ++d) t_q[g * Dk + d] = row[d * qs[3]] * scale_;
      }
      int64_t k_stride = 0, v_stride = 0;
      const float* keys = rows_of(
          k.data<float>() + b * ks[0] + h * ks[1], N, Dk, ks[2], ks[3], t_k, k_stride);
      const float* values = rows_of(
          v.data<float>() + b * vs[0] + h * vs[1], N, Dv, vs[2], vs[3], t_v, v_stride);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t g = 0; g < G; ++g)
          t_scores[g * N + n] = dot(t_q.data() + g * Dk, keys + n * k_stride);
      if (mask_ != Mask::none) {
        const mx::array& m = in[3];
        const int64_t mb = b * m.strides()[0], mn = m.strides()[3];
        for (int64_t n = 0; n < N; ++n) {
          if (mask_ == Mask::boolean) {
            if (m.data<bool>()[mb + n * mn]) continue;
            for (int64_t g = 0; g < G; ++g) t_scores[g * N + n] = lowest;
          } else {
            const float add = m.data<float>()[mb + n * mn];
            for (int64_t g = 0; g < G; ++g) t_scores[g * N + n] = t_scores[g * N + n] + add;
          }
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        float* s = t_scores.data() + g * N;
        float top = s[0];
        for (int64_t n = 1; n < N; ++n) top = std::max(top, s[n]);
        float total;
        float* dst = y + (b * H + h * G + g) * Dv;
#ifdef EXO_X86
        if (avx) {
          exp_shifted_avx2(s, N, top);
          total = lane_sum_avx2(s, N);
        } else
#endif
        {
          exp_shifted_portable(s, N, top);
          total = lane_sum_portable(s, N);
        }
        const float inv = 1.0f / total;
        for (int64_t n = 0; n < N; ++n) s[n] = s[n] * inv;
#ifdef EXO_X86
        if (avx) {
          weighted_sum_avx2(s, values, v_stride, N, Dv, dst);
          continue;
        }
#endif
        weighted_sum_portable(s, values, v_stride, N, Dv, dst);
      }
    }
  }
}

class DecodeAttentionCPU : public mx::UnaryPrimitive {
 public:
  DecodeAttentionCPU(mx::Stream stream, Settings settings)
      : mx::UnaryPrimitive(stream), s_(settings) {}

  // inputs: q, k, v[, mask broadcast to (B, 1, 1, N)]
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) encoder.set_input_array(in);
    encoder.set_output_array(out);
    // Copies of the arrays and settings: the task may outlive the graph's primitives.
    encoder.dispatch([s = s_, ins = inputs, out = out]() mutable { s.compute(ins, out); });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("exo_mlx_cpu_kernels: decode_attention runs on the CPU only");
  }

  const char* name() const override {
    return "ExoDecodeAttentionCPU";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const DecodeAttentionCPU*>(&other);
    return o != nullptr && o->s_ == s_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const auto& q = inputs[0];
    return {{q.shape(0), q.shape(1), 1, inputs[2].shape(3)}};
  }

 private:
  Settings s_;
};

mx::array decode_attention(
    const mx::array& q,
    const mx::array& k,
    const mx::array& v,
    float scale,
    const std::optional<mx::array>& mask) {
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4 || q.shape(2) != 1)
    throw std::invalid_argument("q must be (B, heads, 1, D), k and v (B, kv heads, N, D)");
  if (q.dtype() != mx::float32 || k.dtype() != mx::float32 || v.dtype() != mx::float32)
    throw std::invalid_argument("q, k and v must be float32");
  const int B = q.shape(0), H = q.shape(1), KVH = k.shape(1), N = k.shape(2);
  if (k.shape(0) != B || v.shape(0) != B || v.shape(1) != KVH || v.shape(2) != N ||
      k.shape(3) != q.shape(3) || KVH < 1 || H % KVH != 0 || N < 1)
    throw std::invalid_argument(
        "k and v must be (B, kv heads, N >= 1, D) with kv heads dividing q's heads");
  auto stream = mx::default_stream(mx::Device(mx::Device::cpu));
  std::vector<mx::array> inputs = {q, k, v};
  Mask kind = Mask::none;
  if (mask) {
    if (mask->dtype() == mx::bool_) {
      kind = Mask::boolean;
      inputs.push_back(mx::broadcast_to(*mask, {B, 1, 1, N}, stream));
    } else if (mx::issubdtype(mask->dtype(), mx::floating)) {
      kind = Mask::additive;
      inputs.push_back(
          mx::broadcast_to(mx::astype(*mask, mx::float32, stream), {B, 1, 1, N}, stream));
    } else {
      throw std::invalid_argument("mask must be boolean or floating point");
    }
  }
  const mx::Shape shape = {B, H, 1, v.shape(3)};
  return mx::array(
      shape, mx::float32, std::make_shared<DecodeAttentionCPU>(stream, Settings{scale, kind}),
      std::move(inputs));
}

}  // namespace

// prefill_attention.cpp's functions: registered with this file's (the module's list of
// registrations lives in qmatmul.cpp).
void register_prefill_attention(nb::module_& m);

void register_decode_attention(nb::module_& m) {
  register_prefill_attention(m);
  m.def(
      "decode_attention",
      &decode_attention,
      nb::arg("q"),
      nb::arg("k"),
      nb::arg("v"),
      nb::arg("scale"),
      nb::arg("mask") = nb::none(),
      "softmax((q * scale) k^T [masked]) v for one new token with grouped query heads, float32: "
      "q (B, heads, 1, D), k and v (B, kv heads, N, D), mask boolean or additive, broadcastable "
      "to (B, 1, 1, N).");
}
