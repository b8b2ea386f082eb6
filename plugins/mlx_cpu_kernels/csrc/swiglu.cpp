// SwiGLU, silu(gate) * up, vectorised: the MLP activation of llama-shaped models.
//
// MLX's CPU backend runs its compiled sigmoid with a scalar exp that calls libm's fmaf for every
// multiply-add (the wheel's JIT builds for baseline x86-64): on SmolLM2 that was ~20 % of a
// prompt's prefill (8 x 45 tokens, perf). Here exp is vexp.h's, 8 lanes at a time, the same bits
// in the loop's tail; sigmoid(g) = 1 / (1 + exp(-g)) and out = (g * sigmoid(g)) * up, the order
// of mlx.nn.silu(g) * up. `swiglu` is also fused_linear's SwiGLU prologue (a decode step), so a
// prompt and a decode step share one activation.

#include <nanobind/nanobind.h>

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

namespace exo_kernels {

namespace {

inline float swiglu_one(float g, float u) {
  const float sigmoid = 1.0f / (1.0f + exp_scalar(-g));
  return (g * sigmoid) * u;
}

#ifdef EXO_X86
__attribute__((target("avx2,fma"))) void swiglu_avx2(
    const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_avx2(_mm256_xor_ps(g, sign));
    const __m256 sigmoid = _mm256_div_ps(one, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = swiglu_one(gate[i], up[i]);
}
#endif

}  // namespace

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
#ifdef EXO_X86
  if (use_avx2()) {
    swiglu_avx2(gate, up, out, n);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = swiglu_one(gate[i], up[i]);
}

}  // namespace exo_kernels

namespace {

class SwigluCPU : public mx::UnaryPrimitive {
 public:
  explicit SwigluCPU(mx::Stream stream) : mx::UnaryPrimitive(stream) {}

  // inputs: gate, up (float32, row-contiguous, the same shape)
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(inputs[0]);
    encoder.set_input_array(inputs[1]);
    encoder.set_output_array(out);
    encoder.dispatch([gate = inputs[0], up = inputs[1], out = out]() mutable {
      exo_kernels::swiglu(
          gate.data<float>(), up.data<float>(), out.data<float>(),
          static_cast<int64_t>(out.size()));
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("exo_mlx_cpu_kernels: swiglu runs on the CPU only");
  }

  const char* name() const override {
    return "ExoSwigluCPU";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const SwigluCPU*>(&other) != nullptr;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }
};

mx::array swiglu(const mx::array& gate, const mx::array& up) {
  if (gate.shape() != up.shape()) throw std::invalid_argument("gate and up must have one shape");
  if (gate.dtype() != mx::float32 || up.dtype() != mx::float32)
    throw std::invalid_argument("gate and up must be float32");
  auto stream = mx::default_stream(mx::Device(mx::Device::cpu));
  return mx::array(
      gate.shape(), mx::float32, std::make_shared<SwigluCPU>(stream),
      {mx::contiguous(gate, false, stream), mx::contiguous(up, false, stream)});
}

}  // namespace

void register_swiglu(nb::module_& m) {
  m.def(
      "swiglu",
      &swiglu,
      nb::arg("gate"),
      nb::arg("up"),
      "silu(gate) * up for float32 arrays of one shape, vectorised (the exp of vexp.h).");
}
