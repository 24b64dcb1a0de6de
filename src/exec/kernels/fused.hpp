// ATen adapters of the fused row kernels (exec/kernels/row_kernels.cuh).
//
// Design note. Every pointer, dtype and stride the kernels rely on is checked (a c10::Error
// naming the argument). Without CUDA fused_rows_built() is false and the planner never selects
// them (DeviceCaps::fused_row_kernels).
//
// Example:
//     // h [n, D] bf16 := modulate(norm(x rows)); scale / shift: [n, D] or [D], or undefined
//     sp::exec::fused::norm_modulate(x.narrow(0, r0, n), h, {true, 1e-6, w, b}, scale, shift);
#pragma once

#include <ATen/ATen.h>

#include "ir/model.hpp"

namespace sp::exec::fused {

bool fused_rows_built();

struct NormArgs {
  bool layer_norm = true;
  double eps = 1e-6;
  at::Tensor weight, bias;  // [D] or undefined
};

// out [n, D] (any float dtype) := ((x - mean) * rstd * weight + bias) * (1 + scale) + shift,
// with scale / shift [n, D] (row stride free, unit column stride), [D], or undefined.
void norm_modulate(const at::Tensor& x, const at::Tensor& out, const NormArgs& n, const at::Tensor& scale,
                   const at::Tensor& shift);

struct RopeArgs {
  ir::RopeStyle style = ir::RopeStyle::None;
  int64_t rotary_dim = 0;
  at::Tensor cos, sin;  // [n, rotary_dim / 2], rows of this slab
};

// out [n, heads, head_dim] (any strides, unit last stride) := rope(qk_norm(in)), in [n, heads*head_dim].
void qk_norm_rope(const at::Tensor& in, const at::Tensor& out, ir::QkNormKind norm, double eps,
                  const at::Tensor& weight, const RopeArgs& rope);

// x [n, D] += y [n, D] * gate ([n, D], [D], or undefined: no gate), in place, in fp32.
void residual_add(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate);

}  // namespace sp::exec::fused
