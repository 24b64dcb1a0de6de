// Fused row kernels of the bounded schedule, as plain CUDA with parameter structs (no ATen).
//
// Design note. Each kernel does in one pass what composed ATen operations do in about 25
// launches per slab: read the rows once, compute in fp32 registers with the composed path's
// arithmetic (two-pass mean/variance), write the dtype and layout the consumer wants
// (kernels/README.md). exec/kernels/fused.hpp adapts ATen tensors to these structs.
//
// Example:
//     sp::kernels::NormModParams p;
//     p.x = x_ptr; p.x_stride = dim; p.out = h_ptr; p.out_stride = dim;
//     p.rows = n; p.dim = dim; p.x_type = p.out_type = sp::kernels::Elem::BF16;
//     p.layer_norm = true; p.eps = 1e-6f;
//     sp::kernels::norm_modulate(p, stream);
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace sp::kernels {

enum class Elem : int { F32, F16, BF16 };

// A row vector read per row: row r uses ptr + r * stride (stride 0: one vector for all rows).
struct RowVec {
  const void* ptr = nullptr;  // null: absent
  int64_t stride = 0;
  Elem type = Elem::F32;
};

// out[r] = ((x[r] - mean) * rstd * weight + bias) * (1 + scale[r]) + shift[r]
// LayerNorm (mean subtracted) or RMSNorm (mean taken as 0); each term only when present.
struct NormModParams {
  const void* x = nullptr;
  int64_t x_stride = 0;
  Elem x_type = Elem::F32;
  void* out = nullptr;
  int64_t out_stride = 0;
  Elem out_type = Elem::F32;
  int64_t rows = 0, dim = 0;
  bool layer_norm = true;
  float eps = 1e-6f;
  RowVec weight, bias, scale, shift;  // weight and bias: stride 0
};

enum class QkNorm : int { None, PerHead, AcrossHeads };
enum class Rope : int { None, SplitHalf, Interleaved };

// For each row r and head h of in [rows, heads * head_dim] (row stride in_stride):
// normalize (per head or across all heads of the row) times weight, rotate the leading
// rotary_dim dims by the row's cos/sin [rotary_dim / 2], and write element (r, h, d) to
// out + r * out_row_stride + h * out_head_stride + d, in the input's dtype.
struct QkRopeParams {
  const void* in = nullptr;
  int64_t in_stride = 0;
  Elem type = Elem::BF16;
  void* out = nullptr;
  int64_t out_row_stride = 0, out_head_stride = 0;
  int64_t rows = 0, heads = 0, head_dim = 0;
  QkNorm norm = QkNorm::None;
  float eps = 1e-6f;
  RowVec weight;  // [head_dim] (per head) or [heads * head_dim] (across heads)
  Rope rope = Rope::None;
  int64_t rotary_dim = 0;
  RowVec cos, sin;  // per row, [rotary_dim / 2]
};

// x[r] += y[r] * gate[r] (gate absent: x[r] += y[r]), computed in fp32 and rounded once to
// x's dtype; x and y [rows, dim] in their own dtypes and row strides.
struct ResidualAddParams {
  void* x = nullptr;
  int64_t x_stride = 0;
  Elem x_type = Elem::F32;
  const void* y = nullptr;
  int64_t y_stride = 0;
  Elem y_type = Elem::F32;
  int64_t rows = 0, dim = 0;
  RowVec gate;
};

// Each returns the launch error (cudaSuccess when launched).
cudaError_t norm_modulate(const NormModParams& p, cudaStream_t stream);
cudaError_t qk_norm_rope(const QkRopeParams& p, cudaStream_t stream);
cudaError_t residual_add(const ResidualAddParams& p, cudaStream_t stream);

}  // namespace sp::kernels
