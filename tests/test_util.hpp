// Shared helpers of the execution tests.
#pragma once

#include <ATen/ATen.h>

namespace sp::test {

// ||a - b|| / ||b|| in float64.
inline double rel_l2(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor bd = b.to(at::kDouble);
  return ((a.to(at::kDouble) - bd).norm() / bd.norm().clamp_min(1e-300)).item<double>();
}

}  // namespace sp::test
