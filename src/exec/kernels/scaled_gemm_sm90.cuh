// The 8-bit GEMM of the quantized formats fused with its epilogue, for sm_90a (Hopper), on the
// CUTLASS 3.x / CuTe headers (CMake option STREAMPLAN_SCALED_GEMM_SM90): int8 x int8 with int32
// accumulators (the int8 and convrot-int8 formats) or fp8 e4m3 x fp8 e4m3 with fp32 accumulators
// (the fp8-e4m3 format). Plain CUDA, no ATen: exec/formats/quantized.cpp adapts tensors.
//
// Design note. The unfused paths (at::_int_mm then int8_epilogue; at::_scaled_mm then bias and
// add passes) write the slab's product to memory and read it back: on the Wan projections as
// much time as the product itself. Here it stays in the accumulator registers and the epilogue
// visitor tree of each output tile does
//
//     y[r, c] (+)= acc[r, c] · row_scale[r] · col_scale[c] (+ bias[c])
//
// (C, the existing output, read only where accumulate is set). x [rows, k] and w [cols, k] are
// K-major 8-bit ("TN"), y row-major 16-bit; TMA needs 16-byte aligned rows and base addresses
// (scaled_gemm_sm90_fits). Picked at run time where scaled_gemm_sm90_ready(). The fp8 fast
// accumulation and the two tile configurations (ping-pong 128 / cooperative 256, GemmTile::Auto
// by the measured shapes): scaled_gemm_sm90.cu and kernels/README.md.
//
// Example:
//     sp::kernels::ScaledGemmParams p;
//     p.operand = sp::kernels::GemmOperand::F8E4M3;  // or Int8
//     p.x = xq; p.x_stride = k; p.w = wq; p.w_stride = k; p.row_scale = sx; p.col_scale = sw;
//     p.y = y; p.y_stride = n; p.y_type = sp::kernels::Elem::BF16; p.rows = m; p.cols = n; p.k = k;
//     if (sp::kernels::scaled_gemm_sm90_ready() && sp::kernels::scaled_gemm_sm90_fits(p))
//       sp::kernels::scaled_gemm_sm90(p, stream);
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "exec/kernels/row_kernels.cuh"

namespace sp::kernels {

enum class GemmTile : int { Auto, PingPong128, Coop256 };

// The element type of both operands: int8 (int32 accumulators) or float8 e4m3fn (fp32).
enum class GemmOperand : int { Int8, F8E4M3 };

struct ScaledGemmParams {
  GemmOperand operand = GemmOperand::Int8;
  const void* x = nullptr;  // [rows, k] of operand, row stride x_stride
  int64_t x_stride = 0;
  const void* w = nullptr;  // [cols, k] of operand, row stride w_stride
  int64_t w_stride = 0;
  const float* row_scale = nullptr;  // [rows]
  const float* col_scale = nullptr;  // [cols]
  const void* bias = nullptr;        // [cols] of y_type, or null
  void* y = nullptr;                 // [rows, cols], row stride y_stride, 16-bit
  int64_t y_stride = 0;
  Elem y_type = Elem::BF16;          // BF16 or F16
  bool accumulate = false;           // y += instead of y =
  int64_t rows = 0, cols = 0, k = 0;
  GemmTile tile = GemmTile::Auto;
};

// True when the current device is compute capability 9.0 and the sm_90a image of every kernel
// scaled_gemm_sm90 may launch was built and loads (probed once per device).
bool scaled_gemm_sm90_ready();
// Whether the kernel takes these operands: Int8 or F8E4M3, 16-bit output, k % 16 == 0,
// cols % 8 == 0, y_stride % 8 == 0, x_stride % 16 == 0, w_stride % 16 == 0, every pointer
// 16-byte aligned, sizes within int32.
bool scaled_gemm_sm90_fits(const ScaledGemmParams& p);
// cudaErrorNotSupported unless scaled_gemm_sm90_ready() and scaled_gemm_sm90_fits(p);
// cudaErrorInvalidValue for a CUTLASS status other than success.
cudaError_t scaled_gemm_sm90(const ScaledGemmParams& p, cudaStream_t stream);

}  // namespace sp::kernels
