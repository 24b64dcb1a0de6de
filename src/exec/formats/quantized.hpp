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
// fp32). `qtype` is at::kChar or at::kFloat8_e4m3fn. On CUDA one kernel (kernels/quantize.cuh).
std::pair<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x, at::ScalarType qtype);
std::pair<at::Tensor, at::Tensor> quantize_rows_int8(const at::Tensor& x);

// y (+)= (xq @ wq^T) * sx * sw (+ bias), int8 x int8 -> int32 (at::_int_mm), xq [n, k] int8,
// sx [n, 1], wq [r, k] int8, sw [] or [r, 1]. On CUDA the scaling, bias and write are one
// pass over the int32 product (kernels/quantize.cuh).
void int8_gemm(const at::Tensor& xq, const at::Tensor& sx, const at::Tensor& wq, const at::Tensor& sw,
               const at::Tensor& y, const at::Tensor& bias, bool accumulate);
// Bytes of a quantize_rows_int8 + int8_gemm call on CUDA beside its operands: the int8
// activations and their scales, the int32 product.
int64_t int8_gemm_workspace(int64_t rows, int64_t in_features, int64_t out_features);

// y (+)= dequantized: the reference a native GEMM falls back to where its kernel cannot run.
void reference_gemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& y, const at::Tensor& bias,
                    bool accumulate);

}  // namespace sp::exec::quant
