// The 8-bit GEMM of the quantized formats fused with its epilogue, for sm_90a (Hopper), built on
// the CUTLASS 3.x / CuTe headers (the PyPI wheel nvidia-cutlass; CMake option
// STREAMPLAN_SCALED_GEMM_SM90). One kernel template serves two operand types: int8 x int8 with
// int32 accumulators (the int8 and convrot-int8 formats) and fp8 e4m3 x fp8 e4m3 with fp32
// accumulators (the fp8-e4m3 format). Plain CUDA, no ATen: exec/formats/quantized.cpp adapts
// tensors.
//
// Design note. The unfused paths (at::_int_mm then int8_epilogue in quantize.cuh; at::_scaled_mm
// then a bias pass and an add into the output) write the product of the whole slab to memory
// and read it back: for int8 4 bytes per output element twice, more than the 16-bit output
// itself, and on the Wan projections as much time as the product (1.5-3.5 ms of 4-12 ms). Here
// the product stays in the accumulator registers and the epilogue of each output tile does:
//
//     y[r, c] (+)= acc[r, c] · row_scale[r] · col_scale[c] (+ bias[c])
//
// as an epilogue visitor tree of the TMA warp-specialized epilogue (per-row scale: a column
// broadcast, per-column scale and bias: row broadcasts, the existing output: the source C, read
// only where accumulate is set, beta = 1). x [rows, k] and w [cols, k] are K-major 8-bit
// ("TN"), y is row-major 16-bit. TMA needs every row stride and base address 16-byte aligned
// (16 elements of either operand type): k a multiple of 16, cols and y's row stride multiples
// of 8 (scaled_gemm_sm90_fits). The kernels are compiled for sm_90a only (their own object
// library), and picked at run time where scaled_gemm_sm90_ready() (cc 9.0 with the sm_90a
// images loaded, probed once per device).
//
// fp8 runs CUTLASS's FP8FastAccum mainloop: the tensor cores accumulate over the whole k. The
// mainloop with accumulation promotion (partial sums added into a second set of fp32 registers
// every 4 k-blocks) holds two accumulator tiles per consumer warpgroup, spilled about 0.9 KB a
// thread and ran 4x slower on the H200; the fast one differs from it by 2.5e-3 - 3.6e-3 rel L2,
// a tenth of the fp8 quantization's own error (kernels/README.md).
//
// Two tile configurations are built per operand type: 128x128x128 ping-pong (two consumer
// warpgroups on alternate tiles; the epilogue of one overlaps the other's mainloop) and
// 256x128x128 cooperative (both warpgroups on one tile), each with clusters of 2 along M sharing
// the B tile by TMA multicast. GemmTile::Auto picks by the measured shapes (README.md of this
// folder).
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
