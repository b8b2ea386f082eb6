// The row-wise work around a decode step's matmuls, folded into the matmul's own primitive.
//
// A one-token llama block on MLX's CPU backend is ~80 primitives, each with its own dispatch,
// allocation and bookkeeping; the matmuls are ~4 of them. `fused_linear` is one primitive for
//   out = [residual +] prologue(x) @ dequantize(W).T      (split into parts along the columns)
// with prologue one of: nothing, RMSNorm (x * rsqrt(mean(x^2) + eps) * weight, MLX's own
// formula in float32) or SwiGLU over x's two halves (silu(gate) * up, as mlx-lm's swiglu). The
// matmul is exactly quantized_matmul's (same kernels, same pool); the prologue differs from
// MLX's ops only in the order of the RMSNorm's sum and in exp/sin/cos's last bit (tests hold it
// to a tolerance). A q/k/v call can also apply the rotary embedding to q and k (`rope_*`, the
// position from an offset array): in MLX's CPU fallback that is ~30 ops a layer. Each part of the output (q/k/v, or one layer) is its own array: no split op.

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"

#include "kernels.h"
#include "scales.h"

namespace nb = nanobind;
namespace mx = mlx::core;

namespace {

enum class Prologue { none = 0, rms_norm = 1, swiglu = 2 };

// Row-contiguous float32 copy of a (possibly strided) array's elements, or its own data.
const float* dense_rows(const mx::array& a, std::vector<float>& scratch) {
  if (a.flags().row_contiguous) return a.data<float>();
  scratch.resize(a.size());
  const auto& shape = a.shape();
  const auto& strides = a.strides();
  const float* base = a.data<float>();
  std::vector<int64_t> index(shape.size(), 0);
  for (size_t i = 0; i < a.size(); ++i) {
    int64_t offset = 0;
    for (size_t d = 0; d < shape.size(); ++d) offset += index[d] * strides[d];
    scratch[i] = base[offset];
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return scratch.data();
}

// Reused across calls on the stream's thread: a decode step makes ~120 of these calls.
thread_local std::vector<float> t_x, t_in, t_out, t_residual, t_weight;

struct Settings {
  int group_size_;
  int bits_;
  bool int8_;
  Prologue prologue_;
  float eps_;
  bool residual_;
  std::vector<int> ends_;
  // Rotary embedding of the first two parts (q, k) by head: 0 dims = none.
  int rope_dims_ = 0;
  int head_dim_ = 0;
  bool rope_traditional_ = false;
  float rope_base_ = 0.0f;
  float rope_scale_ = 1.0f;
  // Parts shaped (B, n / head_dim, 1, head_dim) instead of (B, 1, n): the same memory when
  // x is (B, 1, K), so a step's q/k/v need no unflatten + transpose ops.
  bool heads_out_ = false;
  // No biases stored (Q4_0: each -8 x its scale); the scales stand in as input 3, unread.
  bool implicit_bias_ = false;

  bool operator==(const Settings& o) const {
    return group_size_ == o.group_size_ && bits_ == o.bits_ && int8_ == o.int8_ &&
        prologue_ == o.prologue_ && eps_ == o.eps_ && residual_ == o.residual_ &&
        ends_ == o.ends_ && rope_dims_ == o.rope_dims_ && head_dim_ == o.head_dim_ &&
        rope_traditional_ == o.rope_traditional_ && rope_base_ == o.rope_base_ &&
        rope_scale_ == o.rope_scale_ && heads_out_ == o.heads_out_ &&
        implicit_bias_ == o.implicit_bias_;
  }

  void rope(float* y, int64_t M, int64_t N, const mx::array& offset) const;

  void compute(const std::vector<mx::array>& in, std::vector<mx::array>& out) const;
};

mx::Shape part_shape(const mx::Shape& x_shape, int columns, const Settings& s) {
  if (s.heads_out_) return {x_shape[0], columns / s.head_dim_, 1, s.head_dim_};
  mx::Shape shape = x_shape;
  shape.back() = columns;
  return shape;
}

class FusedLinearCPU : public mx::Primitive {
 public:
  FusedLinearCPU(mx::Stream stream, Settings settings)
      : mx::Primitive(stream), s_(std::move(settings)) {}

  // inputs: x, w, scales, biases[, norm weight][, residual]
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    for (auto& out : outputs) out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) encoder.set_input_array(in);
    for (auto& out : outputs) encoder.set_output_array(out);
    std::vector<mx::array> ins = inputs;
    std::vector<mx::array> outs = outputs;
    // A copy of the settings, not `this`: the task may outlive the graph's primitives.
    encoder.dispatch([s = s_, ins = std::move(ins), outs = std::move(outs)]() mutable {
      s.compute(ins, outs);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("exo_mlx_cpu_kernels: fused_linear runs on the CPU only");
  }

  const char* name() const override {
    return "ExoFusedLinearCPU";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const FusedLinearCPU*>(&other);
    return o != nullptr && o->s_ == s_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    std::vector<mx::Shape> shapes;
    int start = 0;
    for (int end : s_.ends_) {
      shapes.push_back(part_shape(inputs[0].shape(), end - start, s_));
      start = end;
    }
    return shapes;
  }

 private:
  Settings s_;
};


void Settings::compute(const std::vector<mx::array>& in, std::vector<mx::array>& out) const {
  const mx::array& x = in[0];
  const int64_t width = x.shape(-1);
  const int64_t K = prologue_ == Prologue::swiglu ? width / 2 : width;
  const int64_t M = static_cast<int64_t>(x.size()) / width;
  const int64_t N = ends_.back();
  const float* xr = dense_rows(x, t_x);
  const float* input = xr;
  if (prologue_ == Prologue::rms_norm) {
    const float* weight = dense_rows(in[4], t_weight);
    t_in.resize(M * K);
    // MLX's rms_norm on the CPU: x * rsqrt(sum(x^2) * (1/K) + eps), then * weight.
    const float inv_k = static_cast<float>(1.0 / static_cast<double>(K));
    for (int64_t m = 0; m < M; ++m) {
      const float* row = xr + m * K;
      float squares = 0.0f;
      for (int64_t k = 0; k < K; ++k) squares += row[k] * row[k];
      const float scale = 1.0f / std::sqrt(squares * inv_k + eps_);
      for (int64_t k = 0; k < K; ++k) t_in[m * K + k] = (row[k] * scale) * weight[k];
    }
    input = t_in.data();
  } else if (prologue_ == Prologue::swiglu) {
    t_in.resize(M * K);
    for (int64_t m = 0; m < M; ++m) {
      const float* gate = xr + m * width;
      exo_kernels::swiglu(gate, gate + K, t_in.data() + m * K, K);
    }
    input = t_in.data();
  }
  const bool whole = ends_.size() == 1;
  float* y = whole ? out[0].data<float>() : nullptr;
  if (!whole) {
    t_out.resize(M * N);
    y = t_out.data();
  }
  exo_kernels::matmul_rows(
      input, M, K, in[1].data<uint32_t>(), in[2].data<uint8_t>(),
      implicit_bias_ ? nullptr : in[3].data<uint8_t>(),
      exo_kernels::scale_type(in[2], in[3]), N, group_size_, bits_, int8_, y);
  if (residual_) {
    const float* r = dense_rows(in.back(), t_residual);
    for (int64_t i = 0; i < M * N; ++i) y[i] = r[i] + y[i];
  }
  if (rope_dims_ > 0) rope(y, M, N, in.back());
  if (whole) return;
  int64_t start = 0;
  for (size_t part = 0; part < ends_.size(); ++part) {
    const int64_t cols = ends_[part] - start;
    float* dst = out[part].data<float>();
    for (int64_t m = 0; m < M; ++m)
      std::memcpy(dst + m * cols, y + m * N + start, cols * sizeof(float));
    start = ends_[part];
  }
}

// mx.fast.rope's CPU formula, in float32: position (0 + offset) * scale, frequencies
// exp(-i * log(base) / (dims / 2)), each pair (x1, x2) -> (x1 c - x2 s, x1 s + x2 c); pairs are
// (2i, 2i + 1) when traditional, else (i, i + dims / 2); the head's dims past `dims` stay.
void Settings::rope(float* y, int64_t M, int64_t N, const mx::array& offset) const {
  const int half = rope_dims_ / 2;
  const float step = static_cast<float>(std::log(rope_base_) / half);
  std::vector<float> c(half), sn(half);
  for (int64_t m = 0; m < M; ++m) {
    const int64_t at = offset.size() == 1 ? 0 : m * offset.strides()[0];  // 0-d or 1-d
    const float position = (0.0f + static_cast<float>(offset.data<int32_t>()[at])) * rope_scale_;
    for (int i = 0; i < half; ++i) {
      const float theta = position * std::exp(static_cast<float>(-i) * step);
      c[i] = std::cos(theta);
      sn[i] = std::sin(theta);
    }
    for (int64_t col = 0; col < ends_[1]; col += head_dim_) {  // the q and k parts' heads
      float* head = y + m * N + col;
      for (int i = 0; i < half; ++i) {
        float& x1 = head[rope_traditional_ ? 2 * i : i];
        float& x2 = head[rope_traditional_ ? 2 * i + 1 : i + half];
        const float a = x1, b = x2;
        x1 = a * c[i] - b * sn[i];
        x2 = a * sn[i] + b * c[i];
      }
    }
  }
}

std::vector<mx::array> fused_linear(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& biases,
    int group_size,
    int bits,
    bool int8_activations,
    const std::vector<int>& ends,
    const std::string& prologue,
    const std::optional<mx::array>& norm_weight,
    float eps,
    const std::optional<mx::array>& residual,
    int rope_dims,
    int head_dim,
    bool rope_traditional,
    float rope_base,
    float rope_scale,
    const std::optional<mx::array>& rope_offset,
    bool heads_out) {
  if (bits != 4 && bits != 8) throw std::invalid_argument("bits must be 4 or 8");
  if (group_size != 32 && group_size != 64 && group_size != 128)
    throw std::invalid_argument("group_size must be 32, 64 or 128");
  if (w.ndim() != 2 || w.dtype() != mx::uint32)
    throw std::invalid_argument("w must be a 2-D uint32 array");
  if (x.ndim() < 1) throw std::invalid_argument("x must have at least one dimension");
  Prologue kind;
  if (prologue == "none")
    kind = Prologue::none;
  else if (prologue == "rms_norm")
    kind = Prologue::rms_norm;
  else if (prologue == "swiglu")
    kind = Prologue::swiglu;
  else
    throw std::invalid_argument("prologue must be none, rms_norm or swiglu");
  const int64_t K = kind == Prologue::swiglu ? x.shape(-1) / 2 : x.shape(-1);
  if (kind == Prologue::swiglu && x.shape(-1) % 2 != 0)
    throw std::invalid_argument("swiglu needs gate and up halves of equal width");
  const int64_t N = w.shape(0);
  if (K % group_size != 0 || w.shape(1) * 32 / bits != K)
    throw std::invalid_argument("x's last dimension does not match the packed weights");
  if (scales.ndim() != 2 || scales.shape(0) != N || scales.shape(1) != K / group_size ||
      (biases && biases->shape() != scales.shape()))
    throw std::invalid_argument("scales and biases must be [N, K / group_size]");
  exo_kernels::check_left_out_biases(biases, scales, bits);
  if (ends.empty() || ends.back() != N)
    throw std::invalid_argument("ends must be increasing and end at w's row count");
  for (size_t i = 0; i < ends.size(); ++i)
    if (ends[i] <= (i ? ends[i - 1] : 0))
      throw std::invalid_argument("ends must be increasing and end at w's row count");
  if (kind == Prologue::rms_norm && (!norm_weight || norm_weight->size() != K))
    throw std::invalid_argument("rms_norm needs a weight of x's width");
  auto stream = mx::default_stream(mx::Device(mx::Device::cpu));
  auto f32 = [&](const mx::array& a) { return mx::astype(a, mx::float32, stream); };
  auto packed = [&](const mx::array& a) { return exo_kernels::packed(a, stream); };
  auto [s, b] = biases ? exo_kernels::scale_inputs(scales, *biases, stream, packed)
                      : std::pair{packed(scales), packed(scales)};
  std::vector<mx::array> inputs = {f32(x), packed(w), s, b};
  if (kind == Prologue::rms_norm) inputs.push_back(f32(*norm_weight));
  if (residual) {
    mx::Shape expected = x.shape();
    expected.back() = static_cast<int>(N);
    if (ends.size() != 1 || residual->shape() != expected)
      throw std::invalid_argument("residual must have the output's shape (one part)");
    inputs.push_back(f32(*residual));
  }
  if (rope_dims > 0) {
    if (residual || ends.size() < 2 || !rope_offset || rope_dims % 2 != 0 || head_dim < rope_dims ||
        ends[0] % head_dim != 0 || (ends[1] - ends[0]) % head_dim != 0)
      throw std::invalid_argument(
          "rope needs q and k parts of whole heads, an even dims <= head_dim and an offset");
    const int64_t rows = x.size() / x.shape(-1);
    if (rope_offset->ndim() > 1 ||
        (rope_offset->size() != 1 && static_cast<int64_t>(rope_offset->size()) != rows))
      throw std::invalid_argument("rope_offset must hold one offset, or one per row");
    inputs.push_back(mx::astype(*rope_offset, mx::int32, stream));
  }
  if (heads_out) {
    bool whole_heads = head_dim > 0 && x.ndim() == 3 && x.shape(1) == 1 && !residual;
    for (size_t i = 0; whole_heads && i < ends.size(); ++i)
      whole_heads = (ends[i] - (i ? ends[i - 1] : 0)) % head_dim == 0;
    if (!whole_heads)
      throw std::invalid_argument("heads_out needs x of shape (B, 1, K) and parts of whole heads");
  }
  const Settings settings{
      group_size,
      bits,
      int8_activations,
      kind,
      eps,
      residual.has_value(),
      ends,
      rope_dims,
      head_dim,
      rope_traditional,
      rope_base,
      rope_scale,
      heads_out,
      !biases.has_value()};
  std::vector<mx::Shape> shapes;
  int start = 0;
  for (int end : ends) {
    shapes.push_back(part_shape(x.shape(), end - start, settings));
    start = end;
  }
  return mx::array::make_arrays(
      std::move(shapes),
      std::vector<mx::Dtype>(ends.size(), mx::float32),
      std::make_shared<FusedLinearCPU>(stream, settings),
      inputs);
}

}  // namespace

void register_fused_block(nb::module_& m) {
  m.def(
      "fused_linear",
      &fused_linear,
      nb::arg("x"),
      nb::arg("w"),
      nb::arg("scales"),
      nb::arg("biases").none(),
      nb::arg("group_size"),
      nb::arg("bits"),
      nb::arg("int8_activations"),
      nb::arg("ends"),
      nb::arg("prologue") = "none",
      nb::arg("norm_weight") = nb::none(),
      nb::arg("eps") = 0.0f,
      nb::arg("residual") = nb::none(),
      nb::arg("rope_dims") = 0,
      nb::arg("head_dim") = 0,
      nb::arg("rope_traditional") = false,
      nb::arg("rope_base") = 10000.0f,
      nb::arg("rope_scale") = 1.0f,
      nb::arg("rope_offset") = nb::none(),
      nb::arg("heads_out") = false,
      "[residual +] prologue(x) @ dequantize(w).T as float32, split at `ends` (output "
      "columns): one primitive for a decode step's norm/activation, matmul and residual add.");
}
