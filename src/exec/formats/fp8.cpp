// fp8-e4m3: float8_e4m3fn weights with an fp32 scale (per tensor, or per output row where a
// checkpoint's split projections were joined), stored as the weight, "<weight>.scale" and
// optionally "<weight>.input_scale" (quantized.hpp; ComfyUI's float8_e4m3fn and scaled_fp8).
// The CPU acquires the dequantized slice; on devices with fp8 tensor cores (sm_89+) the format
// runs at::_scaled_mm: the activation slab quantized with the checkpoint's input scale, else
// per tensor (per row where the weight scale is per row).
#include <tuple>

#include "exec/consumers/consumer.hpp"
#include "exec/formats/quantized.hpp"

namespace sp::exec::formats {

namespace {

constexpr double kMax = 448.0;  // largest finite float8_e4m3fn

struct Fp8 : FormatImpl {
  std::vector<std::string> companions(const ir::Linear& l) const override { return quant::companions(l); }
  void store(TensorWeights& into, const ir::Linear& l, const at::Tensor& w, at::ScalarType) const override {
    const at::Tensor s = w.abs().max().to(at::kFloat).div(kMax).clamp_min(1e-12);
    // w * (1/s), as ComfyUI quantizes: a converted file holds the bytes ComfyUI itself writes.
    into.add(l.weight, w.to(at::kFloat).mul(s.reciprocal()).clamp_(-kMax, kMax).to(at::kFloat8_e4m3fn));
    into.add(quant::scale_name(l.weight), s);
  }
  at::Tensor acquire(const WeightSource& src, const ir::Linear& l, Slice rows, Slice cols, at::ScalarType dtype,
                     const at::Tensor& out) const override {
    const at::Tensor scale = quant::row_scale(src, l, rows);
    return converted(stored_slice(src, l, rows, cols), dtype, out).mul_(scale);
  }
  void gemm(const WeightSource& src, const ir::Linear& l, Slice rows, Slice, const at::Tensor& stored,
            const at::Tensor& x, const at::Tensor& y, const at::Tensor& bias, bool accumulate) const override {
    const at::Tensor sw = quant::row_scale(src, l, rows);
    const at::Tensor w = stored.is_contiguous() ? stored : stored.contiguous();
    // cuBLASLt's fp8 GEMM needs widths that are multiples of 16.
    if (x.is_cuda() && (x.size(1) % 16 != 0 || w.size(0) % 16 != 0))
      return quant::reference_gemm(x, w.to(at::kFloat).mul_(sw), y, bias, accumulate);
    const std::string in_name = quant::input_scale_name(l.weight);
    // On CUDA the activations are quantized per row in one kernel (a checkpoint's static input
    // scale is not needed: a row's own scale is at least as fine), against the weight's scale
    // per output row (one value repeated where the weight has one). The CPU, whose _scaled_mm
    // takes per-tensor scales only, quantizes with the input scale or the slab's maximum.
    const bool rowwise = x.is_cuda();
    at::Tensor sa, xq, sb;
    if (rowwise) {
      std::tie(xq, sa) = quant::quantize_rows(x, at::kFloat8_e4m3fn);
      sb = (sw.dim() > 0 ? sw.t() : sw.reshape({1, 1}).expand({1, w.size(0)})).contiguous();
    } else {
      if (sw.dim() > 0) return quant::reference_gemm(x, w.to(at::kFloat).mul_(sw), y, bias, accumulate);
      sa = src.contains(in_name) ? src.tensor(in_name).reshape({}).to(at::kFloat)
                                 : x.abs().max().to(at::kFloat).div_(kMax).clamp_min_(1e-12);
      xq = x.to(at::kFloat).div(sa).clamp_(-kMax, kMax).to(at::kFloat8_e4m3fn);
      sb = sw;
    }
    // Row-wise scaling produces bf16 only; per-tensor scaling writes y's dtype directly.
    const at::ScalarType od = rowwise ? at::kBFloat16 : y.scalar_type();
    if (!accumulate && y.scalar_type() == od && y.is_contiguous()) {
      at::Tensor out = y;
      at::_scaled_mm_out(out, xq, w.t(), sa, sb, std::nullopt, std::nullopt, od);
      if (bias.defined()) y.add_(bias);
      return;
    }
    at::Tensor r = at::_scaled_mm(xq, w.t(), sa, sb, std::nullopt, std::nullopt, od);
    if (bias.defined()) r.add_(bias);
    if (accumulate) y.add_(r);
    else y.copy_(r);
  }
};

}  // namespace

void register_fp8(contracts::Registry& reg) {
  using contracts::Cap;
  contracts::FormatCaps f;
  f.name = "fp8-e4m3";
  f.description = "float8 e4m3 with an fp32 scale; fp8 GEMM (_scaled_mm) with quantized activations on sm_89+";
  f.storage = ir::DType::F8E4M3;
  f.dense = false;
  f.out_slicing = f.in_slicing = f.held_execution = Cap::Yes;
  f.native_gemm = [](const contracts::DeviceCaps& d) {
    return d.kind == contracts::DeviceKind::CUDA && d.cc_major * 10 + d.cc_minor >= 89;
  };
  // The quantized activation slab, its row scales and the weight's scales as a row; the bf16
  // product, where it is added to the output or the output is not bf16.
  f.gemm_workspace = [](const contracts::GemmCall& g, const contracts::DeviceCaps&) {
    const int64_t product = g.accumulate || g.out != ir::DType::BF16 ? g.rows * g.out_features * 2 : 0;
    return g.rows * g.in_features + g.rows * 4 + g.out_features * 4 + product;
  };
  f.gemm_kernel = [](const contracts::DeviceCaps&) {
    return std::string("at::_scaled_mm (cuBLASLt), row-wise scales, activations quantized per row");
  };
  f.tolerance = 0.08;  // fp8 activations: ~3-5% relative L2 on normal data
  f.impl = std::make_shared<Fp8>();
  reg.add(f);
}

}  // namespace sp::exec::formats
