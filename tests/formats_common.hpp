// Helpers shared by the weight-format tests (formats_test.cpp on the CPU, formats_gpu_test.cpp
// on CUDA): the formats, a bare linear, the 8-bit GEMM's float64 reference, a small model.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "ir/model.hpp"
#include "models/builder.hpp"

namespace sp::formats_test {

inline const std::vector<std::string> kFormats = {"fp8-e4m3", "int8", "convrot-int8"};

inline ir::Linear linear(const std::string& format, int64_t out, int64_t in) {
  ir::Linear l;
  l.weight = "l.weight";
  l.out_features = out;
  l.in_features = in;
  l.format = format;
  return l;
}

// (xq @ wq^T) * sx * sw (+ bias) (+ y0) in float64: what int8_gemm and the fused int8 / fp8
// kernel compute, up to the rounding of y's dtype (and the fp32 accumulation of fp8).
inline at::Tensor scaled_reference(const at::Tensor& xq, const at::Tensor& sx, const at::Tensor& wq, const at::Tensor& sw,
                                 const at::Tensor& bias, const at::Tensor& y0) {
  const auto dbl = [](const at::Tensor& t) { return t.to(at::kCPU).to(at::kDouble); };
  at::Tensor r = at::matmul(dbl(xq), dbl(wq).t()).mul_(dbl(sx));
  r.mul_(sw.dim() == 0 ? dbl(sw) : dbl(sw).t());
  if (bias.defined()) r.add_(dbl(bias));
  if (y0.defined()) r.add_(dbl(y0));
  return r;
}

inline models::ModelConfig quant_config(const std::string& format) {
  auto cfg = models::demo_config();
  cfg.format = format;
  cfg.dim = 256;
  cfg.heads = 4;
  cfg.kv_heads = 4;
  cfg.head_dim = 64;
  cfg.hidden = 512;
  cfg.layers = 2;
  models::set_total_tokens(cfg, 301);
  return cfg;
}

}  // namespace sp::formats_test
