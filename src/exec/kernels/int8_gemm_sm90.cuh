// The int8 GEMM of the quantized formats fused with its epilogue, for sm_90a (Hopper), built on
// the CUTLASS 3.x / CuTe headers (the PyPI wheel nvidia-cutlass; CMake option
// STREAMPLAN_INT8_GEMM_SM90). Plain CUDA, no ATen: exec/formats/quantized.cpp adapts tensors.
//
// Design note. The unfused path (at::_int_mm, then int8_epilogue in quantize.cuh) writes the
// int32 product of the whole slab to memory and reads it back: 4 bytes per output element
// twice, more than the 16-bit output itself, and on the Wan projections as much time as the
// product (1.5-3.5 ms of 4-12 ms). Here the product stays in the accumulator registers and the
// epilogue of each output tile does what int8_epilogue does:
//
//     y[r, c] (+)= acc[r, c] · row_scale[r] · col_scale[c] (+ bias[c])
//
// as an epilogue visitor tree of the TMA warp-specialized epilogue (per-row scale: a column
// broadcast, per-column scale and bias: row broadcasts, the existing output: the source C, read
// only where accumulate is set, beta = 1). x [rows, k] and w [cols, k] are K-major int8 ("TN"),
// y is row-major 16-bit. TMA needs every row stride and base address 16-byte aligned: k a
// multiple of 16, cols and y's row stride multiples of 8 (int8_gemm_sm90_fits). The kernel is
// compiled for sm_90a only (its own object library), and picked at run time where
// int8_gemm_sm90_ready() (cc 9.0 with the sm_90a image loaded, probed once per device).
//
// Two tile configurations are built: 128x128x128 ping-pong (two consumer warpgroups on
// alternate tiles; the epilogue of one overlaps the other's mainloop) and 256x128x128
// cooperative (both warpgroups on one tile), each with clusters of 2 along M sharing the B tile
// by TMA multicast. Int8GemmTile::Auto picks by the measured shapes (README.md of this folder).
//
// Example:
//     sp::kernels::Int8GemmParams p;
//     p.x = xq; p.x_stride = k; p.w = wq; p.w_stride = k; p.row_scale = sx; p.col_scale = sw;
//     p.y = y; p.y_stride = n; p.y_type = sp::kernels::Elem::BF16; p.rows = m; p.cols = n; p.k = k;
//     if (sp::kernels::int8_gemm_sm90_ready() && sp::kernels::int8_gemm_sm90_fits(p))
//       sp::kernels::int8_gemm_sm90(p, stream);
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "exec/kernels/row_kernels.cuh"

namespace sp::kernels {

enum class Int8GemmTile : int { Auto, PingPong128, Coop256 };

struct Int8GemmParams {
  const int8_t* x = nullptr;  // [rows, k], row stride x_stride
  int64_t x_stride = 0;
  const int8_t* w = nullptr;  // [cols, k], row stride w_stride
  int64_t w_stride = 0;
  const float* row_scale = nullptr;  // [rows]
  const float* col_scale = nullptr;  // [cols]
  const void* bias = nullptr;        // [cols] of y_type, or null
  void* y = nullptr;                 // [rows, cols], row stride y_stride, 16-bit
  int64_t y_stride = 0;
  Elem y_type = Elem::BF16;          // BF16 or F16
  bool accumulate = false;           // y += instead of y =
  int64_t rows = 0, cols = 0, k = 0;
  Int8GemmTile tile = Int8GemmTile::Auto;
};

// Whether this build holds the kernel (the CUTLASS headers were found).
bool int8_gemm_sm90_built();
// True when the current device is compute capability 9.0 and the sm_90a image of the kernel
// was built and loads (probed once per device).
bool int8_gemm_sm90_ready();
// Whether the kernel takes these operands: 16-bit output, k % 16 == 0, cols % 8 == 0,
// y_stride % 8 == 0, x_stride % 16 == 0, w_stride % 16 == 0, every pointer 16-byte aligned,
// sizes within int32.
bool int8_gemm_sm90_fits(const Int8GemmParams& p);
// cudaErrorNotSupported unless int8_gemm_sm90_ready() and int8_gemm_sm90_fits(p);
// cudaErrorInvalidValue for a CUTLASS status other than success.
cudaError_t int8_gemm_sm90(const Int8GemmParams& p, cudaStream_t stream);

}  // namespace sp::kernels
