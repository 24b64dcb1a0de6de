// Activation rotation + per-row 8-bit quantization for the quantized formats, as plain CUDA
// (no ATen).
//
// Design note. A ConvRot int8 weight was stored rotated: W' = W·H, H block-diagonal with a
// normalized Hadamard matrix per group of `group` input features (H = H4⊗H4⊗H4⊗H4 / 16 for
// 256, H4 the regular 4x4 Hadamard matrix of ComfyUI's convrot format, symmetric, so H·Hᵀ = I).
// The projection then needs x·H, quantized per row to int8: q[r] = round(x[r]·H / s[r]),
// s[r] = max|x[r]·H| / 127.
//
// The kernel is meant to be memory-bound: it reads the 16-bit row once and writes the int8 row
// and its scale once, nothing else. A block holds a whole row in registers: each warp 2048
// values (8 groups of 256), four lanes per group with 64 values each. A lane's values are 8
// chunks of 8 consecutive features (one 16-byte load each), chunk k·4 + lane%4 of its group,
// so that every load instruction of a warp reads 4 x 128 contiguous bytes. The 256 features
// of a group are four base-4 digits, and H4⊗H4⊗H4⊗H4 is one radix-4 butterfly
// ((H4·v)_i = Σv - 2·v_{3-i}) along each digit, in any order: digits 0 and 3 lie in a lane's
// own registers, digits 1 and 2 each across a pair of lanes (one shuffle per value and
// stage). The row's maximum is a warp then block reduction (one barrier), the values are
// quantized (times the reciprocal of the row's scale) and written 8 bytes per store. Blocks are
// persistent (as many as fit at once) and loop over rows; for 16-bit rows the next row's
// loads are issued before the current row is rotated, so that a block always has a row in
// flight. Rows of up to 32,768 features (16 warps); longer rows and rows not 16-byte aligned
// take the two-pass kernel of the first version (rotating each group in shared memory twice).
//
// Example:
//     sp::kernels::RotateQuantParams p;
//     p.x = x_ptr; p.x_stride = k; p.x_type = sp::kernels::Elem::BF16;
//     p.q = q_ptr; p.scale = s_ptr; p.rows = n; p.cols = k; p.group = 256;
//     sp::kernels::rotate_quantize_int8(p, stream);
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "exec/kernels/quantize.cuh"
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

// The first version (one block per row, two rotations per group in shared memory), kept for
// rows the register kernel does not take and for comparison.
cudaError_t rotate_quantize_int8_two_pass(const RotateQuantParams& p, cudaStream_t stream);

// The register kernel without the rotation, for quantize_rows: cudaErrorNotSupported where it
// does not take the rows (cols not a multiple of 8 or above 32,768, a row not 16-byte aligned).
cudaError_t quantize_rows_registers(const QuantizeParams& p, cudaStream_t stream);

}  // namespace sp::kernels
