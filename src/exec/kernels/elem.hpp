// The kernels' element type of an ATen dtype, for the adapters that launch them (this folder's
// fused.cpp, exec/formats). CUDA builds only.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "exec/kernels/row_kernels.cuh"

namespace sp::kernels {

// fp32, fp16 or bf16; nothing for any other dtype.
inline std::optional<Elem> elem_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return Elem::F32;
    case at::kHalf: return Elem::F16;
    case at::kBFloat16: return Elem::BF16;
    default: return std::nullopt;
  }
}

}  // namespace sp::kernels
