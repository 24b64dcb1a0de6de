// Shared pieces of the quantized weight formats (fp8.cpp, int8.cpp, convrot.cpp).
//
// Design note. A quantized weight is held as the stored tensor under the linear's weight
// name (fp8 e4m3 or int8, [out, in]) and its fp32 scale under "<weight>.scale": one value for
// the tensor (shape [] or [1]) or one per output row ([out] or [out, 1]); fp8 may carry a
// per-tensor activation scale under "<weight>.input_scale". Dequantized, W = stored * scale
// (ConvRot: then rotated back to the original input basis). Checkpoint loading
// (models/quant_load.cpp) and the formats' store functions write these names; nothing else
// knows them.
//
// Example:
//     at::Tensor s = sp::exec::quant::row_scale(src, lin, rows);   // [] or [rows, 1] fp32
//     at::Tensor w = src.tensor(lin.weight).to(at::kFloat) * s;     // dequantized
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "contracts/contracts.hpp"
#ifdef STREAMPLAN_SCALED_GEMM_SM90
#include "exec/kernels/scaled_gemm_sm90.cuh"
#endif
#include "exec/formats/weights.hpp"

namespace sp::exec::quant {

std::string scale_name(const std::string& weight);        // "<weight>.scale"
std::string input_scale_name(const std::string& weight);  // "<weight>.input_scale"
// Both names: the tensors that travel with a quantized weight (FormatImpl::companions).
std::vector<std::string> companions(const ir::Linear& l);

// The weight scale of `l` for output rows `rows`: a 0-dim tensor (per-tensor scale) or
// [rows, 1] (per row), fp32, on the weight's device. Throws naming the tensor and both shapes
// when the stored scale is neither one value nor one per output row.
at::Tensor row_scale(const WeightSource& src, const ir::Linear& l, Slice rows);

// The normalized regular Hadamard matrix of ConvRot, [g, g] (g a power of 4): H4⊗...⊗H4 / sqrt(g),
// H4 = [[1,1,1,-1],[1,1,-1,1],[1,-1,1,1],[-1,1,1,1]]; symmetric and orthogonal.
at::Tensor hadamard(int64_t g, at::ScalarType dtype, const at::Device& device);
// x [n, k] with each group of g features multiplied by H (x·blockdiag(H)); k a multiple of g.
at::Tensor rotate(const at::Tensor& x, int64_t g);

// Per-row symmetric 8-bit: q = x / s rounded (int8: to the nearest integer, clamped to ±127;
// fp8 e4m3: to the nearest value, saturating at ±448), s = max|x| / qmax per row ([n, 1]
// fp32), or `fixed` (one fp32 value) for every row. `qtype` is at::kChar or
// at::kFloat8_e4m3fn. On CUDA one kernel (kernels/quantize.cuh).
std::pair<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x, at::ScalarType qtype,
                                                const at::Tensor& fixed = {});

// y (+)= (xq @ wq^T) * sx * sw (+ bias), int8 x int8, xq [n, k] int8, sx [n, 1], wq [r, k] int8,
// sw [] or [r, 1]. On CUDA the fused sm_90a kernel where fused_int8_gemm holds and the operands
// fit it (16-bit y, k % 16, r % 8, 16-byte aligned rows), else at::_int_mm and int8_epilogue.
void int8_gemm(const at::Tensor& xq, const at::Tensor& sx, const at::Tensor& wq, const at::Tensor& sw,
               const at::Tensor& y, const at::Tensor& bias, bool accumulate);
// The same for fp8 e4m3 operands (xq, wq float8_e4m3fn) through the same fused kernel (fp32
// accumulators), where fused_fp8_gemm holds for the device and the operands fit it; true when
// it ran, false (nothing done) elsewhere: the caller then runs at::_scaled_mm.
bool fp8_gemm(const at::Tensor& xq, const at::Tensor& sx, const at::Tensor& wq, const at::Tensor& sw,
              const at::Tensor& y, const at::Tensor& bias, bool accumulate);
#ifdef STREAMPLAN_SCALED_GEMM_SM90
// The fused kernel's parameters for xq [n, k] and wq [r, k] (int8 or fp8 e4m3), row scales rs
// [n], column scales cs [r] (fp32) and y [n, r] (16-bit); the caller sets bias, accumulate, tile.
kernels::ScaledGemmParams scaled_gemm_params(const at::Tensor& xq, const at::Tensor& rs, const at::Tensor& wq,
                                             const at::Tensor& cs, const at::Tensor& y);
#endif
// Whether int8_gemm runs the fused kernel on `dev`: a build with it, a cc 9.0 device whose
// sm_90a images load, and STREAMPLAN_INT8_GEMM not "aten" (which keeps _int_mm + epilogue).
bool fused_int8_gemm(const contracts::DeviceCaps& dev);
// The same for fp8_gemm, with STREAMPLAN_FP8_GEMM=aten keeping _scaled_mm; the second also for
// a call of this shape (16-bit output, in_features % 16, out_features % 8).
bool fused_fp8_gemm(const contracts::DeviceCaps& dev);
bool fused_fp8_gemm(const contracts::DeviceCaps& dev, const contracts::GemmCall& g);
// The kernel int8_gemm / the fp8-e4m3 format runs on `dev` (FormatCaps::gemm_kernel, named by
// --explain).
std::string int8_gemm_kernel(const contracts::DeviceCaps& dev);
std::string fp8_gemm_kernel(const contracts::DeviceCaps& dev);
// Bytes of the fp8-e4m3 format's quantize_rows + GEMM beside its operands: the fp8 activations,
// their scales, the weight scales as a row, and _scaled_mm's bf16 product where it runs and is
// added to the output or the output is not bf16.
int64_t fp8_gemm_workspace(const contracts::GemmCall& g, const contracts::DeviceCaps& dev);

// A format whose weight dequantizes as stored * scale: the scales travel with it (companions)
// and an acquire is the converted slice times its row_scale.
struct ScaledFormat : FormatImpl {
  std::vector<std::string> companions(const ir::Linear& l) const override;
  at::Tensor acquire(const WeightSource& src, const ir::Linear& l, Slice rows, Slice cols, at::ScalarType dtype,
                     const at::Tensor& out) const override;
};
// `w` quantized per row to int8 (quantize_rows), stored as l's weight with its scales ([out]).
void store_int8_rows(TensorWeights& into, const ir::Linear& l, const at::Tensor& w);

// The caps every quantized format shares: stored in `storage` (not dense), sliced by rows and
// by columns, held for a block.
contracts::FormatCaps format_caps(std::string name, std::string description, ir::DType storage);
// The int8 GEMM as a format's own: on CUDA, with its workspace and int8_gemm_kernel.
void native_int8_gemm(contracts::FormatCaps& f);

// y (+)= r (+ bias); r, a product in fp32 or bf16, is modified.
void write_product(at::Tensor r, const at::Tensor& y, const at::Tensor& bias, bool accumulate);
// y (+)= dequantized: the reference a native GEMM falls back to where its kernel cannot run.
void reference_gemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& y, const at::Tensor& bias,
                    bool accumulate);

}  // namespace sp::exec::quant
