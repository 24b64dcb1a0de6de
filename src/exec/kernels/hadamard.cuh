// Activation rotation + int8 quantization for ConvRot weights, as plain CUDA (no ATen).
//
// Design note. A ConvRot int8 weight was stored rotated: W' = W·H, H block-diagonal with a
// normalized Hadamard matrix per group of `group` input features (H = H4⊗H4⊗H4⊗H4 / 16 for
// 256, H4 the regular 4x4 Hadamard matrix of ComfyUI's convrot format, symmetric, so H·Hᵀ = I).
// The projection then needs x·H, quantized per row to int8: q[r] = round(x[r]·H / s[r]),
// s[r] = max|x[r]·H| / 127. One block per row; a warp transforms one group at a time in shared
// memory (four radix-4 butterfly stages, (H4·v)_i = Σv - 2·v_{3-i}), first to find the row's
// maximum, then again to quantize: twice the arithmetic, one read of x from memory and one
// write of q, no fp32 copy of the rotated row.
//
// Example:
//     sp::kernels::RotateQuantParams p;
//     p.x = x_ptr; p.x_stride = k; p.x_type = sp::kernels::Elem::BF16;
//     p.q = q_ptr; p.scale = s_ptr; p.rows = n; p.cols = k; p.group = 256;
//     sp::kernels::rotate_quantize_int8(p, stream);
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "exec/kernels/row_kernels.cuh"

namespace sp::kernels {

struct RotateQuantParams {
  const void* x = nullptr;  // [rows, cols], row stride x_stride
  int64_t x_stride = 0;
  Elem x_type = Elem::BF16;
  int8_t* q = nullptr;      // [rows, cols] contiguous
  float* scale = nullptr;   // [rows]
  int64_t rows = 0, cols = 0;
  int group = 256;          // only 256: cols must be a multiple
};

// cudaErrorInvalidValue for a group other than 256 or cols not a multiple of it.
cudaError_t rotate_quantize_int8(const RotateQuantParams& p, cudaStream_t stream);

}  // namespace sp::kernels
