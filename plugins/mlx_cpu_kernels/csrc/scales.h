// How the primitives take a layer's scales and biases: in the 16 bits they came in when both
// are float16 (or both bfloat16), else as float32. The kernels widen 16-bit ones a few rows at
// a time (`widen`), exactly, so the dtype changes the bytes a step reads, never its result.
#pragma once

#include <optional>
#include <stdexcept>
#include <utility>

#include "mlx/array.h"
#include "mlx/stream.h"
#include "mlx/ops.h"

#include "kernels.h"

namespace exo_kernels {

inline ScaleType scale_type(const mlx::core::array& scales, const mlx::core::array& biases) {
  if (scales.dtype() != biases.dtype()) return ScaleType::f32;
  if (scales.dtype() == mlx::core::float16) return ScaleType::f16;
  if (scales.dtype() == mlx::core::bfloat16) return ScaleType::bf16;
  return ScaleType::f32;
}

// A layer's packed weights, scales or biases as a primitive's input: an evaluated row-contiguous
// array as it is, anything else through mx::contiguous. mx::contiguous copies a view of a much
// larger buffer even when the view is row-contiguous, and a fused layer's parts are such views
// (fused_linear.py: q/k/v and gate/up share one buffer each): every prompt's call on them copied
// its weights, ~20 % of a 1B prompt's q/k/v and gate/up time.
inline mlx::core::array packed(const mlx::core::array& a, mlx::core::Stream s) {
  return a.is_available() && a.flags().row_contiguous ? a : mlx::core::contiguous(a, false, s);
}

// The primitive's scale inputs: 16-bit ones as they are, anything else cast to float32. `keep`
// makes an array row-contiguous (`packed`, or the caller's own way).
template <class Keep>
std::pair<mlx::core::array, mlx::core::array> scale_inputs(
    const mlx::core::array& scales, const mlx::core::array& biases, mlx::core::Stream s,
    Keep keep) {
  if (scale_type(scales, biases) != ScaleType::f32) return {keep(scales), keep(biases)};
  return {
      keep(mlx::core::astype(scales, mlx::core::float32, s)),
      keep(mlx::core::astype(biases, mlx::core::float32, s))};
}

// Biases may be left out (None) only for Q4_0's layout: 4 bits and 16-bit scales, each bias
// -8 x its scale (`Problem::implicit_bias`).
inline void check_left_out_biases(
    const std::optional<mlx::core::array>& biases, const mlx::core::array& scales, int bits) {
  if (biases) return;
  if (bits != 4 || (scales.dtype() != mlx::core::float16 && scales.dtype() != mlx::core::bfloat16))
    throw std::invalid_argument(
        "biases may be left out (Q4_0: each -8 x its scale) only for 4 bits with float16 or "
        "bfloat16 scales");
}

// Points `scales`/`biases` (float32) or `scales16`/`biases16` of `p` at the evaluated inputs.
template <class P>
void set_scales(P& p, const mlx::core::array& scales, const mlx::core::array& biases) {
  p.scale_type = scale_type(scales, biases);
  if (p.scale_type == ScaleType::f32) {
    p.scales = scales.data<float>();
    p.biases = biases.data<float>();
  } else {
    p.scales16 = reinterpret_cast<const uint16_t*>(scales.data<uint8_t>());
    p.biases16 = reinterpret_cast<const uint16_t*>(biases.data<uint8_t>());
  }
}

}  // namespace exo_kernels
