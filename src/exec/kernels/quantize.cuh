// Per-row 8-bit quantization of an activation slab and the int8 GEMM's epilogue, as plain
// CUDA (no ATen).
//
// Design note. quantize_rows writes each row's 8-bit values and fp32 scale s[r] = max|x[r]| /
// qmax (127 int8, 448 fp8 e4m3) with no fp32 copy of the slab (the register kernel of
// hadamard.cuh where rows fit, else two reads per row). With `fixed`, every row takes that
// scale (one read): a checkpoint's static input scale, as its host quantizes. int8_epilogue turns the int8 GEMM's
// int32 sums into y (+)= acc · s_x[r] · s_w[c] (+ bias[c]) in y's dtype in one pass, where
// the fused GEMM (scaled_gemm_sm90.cuh) does not run.
//
// Example:
//     sp::kernels::QuantizeParams p;
//     p.x = x_ptr; p.x_stride = k; p.x_type = sp::kernels::Elem::BF16;
//     p.q = q_ptr; p.q_type = sp::kernels::QType::Fp8E4M3; p.scale = s_ptr; p.rows = n; p.cols = k;
//     sp::kernels::quantize_rows(p, stream);
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "exec/kernels/row_kernels.cuh"

namespace sp::kernels {

enum class QType : int { Int8, Fp8E4M3 };

struct QuantizeParams {
  const void* x = nullptr;  // [rows, cols], row stride x_stride
  int64_t x_stride = 0;
  Elem x_type = Elem::BF16;
  void* q = nullptr;        // [rows, cols] contiguous, int8 or fp8 e4m3
  QType q_type = QType::Int8;
  float* scale = nullptr;   // [rows]
  const float* fixed = nullptr;  // one scale for every row (a static input scale), else null
  int64_t rows = 0, cols = 0;
};
cudaError_t quantize_rows(const QuantizeParams& p, cudaStream_t stream);

struct Int8EpilogueParams {
  const int32_t* acc = nullptr;  // [rows, cols] contiguous
  const float* row_scale = nullptr;  // [rows]
  const float* col_scale = nullptr;  // [cols], or one value when col_scale_stride is 0
  int64_t col_scale_stride = 1;
  const void* bias = nullptr;   // [cols] of bias_type, or null
  Elem bias_type = Elem::F32;
  void* y = nullptr;            // [rows, cols], row stride y_stride
  int64_t y_stride = 0;
  Elem y_type = Elem::BF16;
  bool accumulate = false;      // y += instead of y =
  int64_t rows = 0, cols = 0;
};
cudaError_t int8_epilogue(const Int8EpilogueParams& p, cudaStream_t stream);

}  // namespace sp::kernels
