// fp8-e4m3, fp8-e5m2 and fp8-e4m3-cast (what each stores and runs: README.md). The CPU
// (forced native in tests) runs _scaled_mm per tensor: the slab quantized with the
// checkpoint's input scale, else its maximum.
#include <cstdlib>
#include <tuple>

#include "exec/consumers/consumer.hpp"
#include "exec/formats/quantized.hpp"

namespace sp::exec::formats {

namespace {

constexpr double kMax = 448.0;  // largest finite float8_e4m3fn

// A float8 weight with an fp32 per-tensor scale, stored as ComfyUI quantizes (w * (1/s), so a
// converted file holds the bytes ComfyUI itself writes, clamped to the type's finite range) and
// acquired as the dequantized slice.
struct ScaledFloat8 : quant::ScaledFormat {
  ScaledFloat8(at::ScalarType type, double max) : type_(type), max_(max) {}
  void store(TensorWeights& into, const ir::Linear& l, const at::Tensor& w, at::ScalarType) const override {
    const at::Tensor s = w.abs().max().to(at::kFloat).div(max_).clamp_min(1e-12);
    into.add(l.weight, w.to(at::kFloat).mul(s.reciprocal()).clamp_(-max_, max_).to(type_));
    into.add(quant::scale_name(l.weight), s);
  }

 private:
  at::ScalarType type_;
  double max_;
};

struct Fp8 : ScaledFloat8 {
  Fp8() : ScaledFloat8(at::kFloat8_e4m3fn, kMax) {}
  void gemm(const WeightSource& src, const ir::Linear& l, Slice rows, Slice, const at::Tensor& stored,
            const at::Tensor& x, const at::Tensor& y, const at::Tensor& bias, bool accumulate) const override {
    const at::Tensor sw = quant::row_scale(src, l, rows);
    const at::Tensor w = stored.contiguous();
    const auto reference = [&] { quant::reference_gemm(x, w.to(at::kFloat).mul_(sw), y, bias, accumulate); };
    // Both fp8 GEMMs need in_features % 16 (TMA and cuBLASLt rows of 16-byte multiples).
    if (x.is_cuda() && x.size(1) % 16 != 0) return reference();
    const std::string in_name = quant::input_scale_name(l.weight);
    // The activations are quantized with the weight's input scale where it has one (what its
    // host computes: ComfyUI quantizes with the checkpoint's input scale, else 1), else per row.
    // On CUDA in one kernel, against the weight's scale per output row (one value repeated where
    // the weight has one). The CPU, whose _scaled_mm takes per-tensor scales only, quantizes
    // with the input scale or the slab's maximum.
    const at::Tensor fixed = src.contains(in_name) ? src.tensor(in_name) : at::Tensor();
    // _scaled_mm takes scales per row on CUDA only, and then writes bf16; with one scale each (a
    // fixed input scale, or the CPU's per-tensor one, and a per-tensor weight scale) y's dtype.
    const bool cuda = x.is_cuda(), per_tensor = (!cuda || fixed.defined()) && sw.dim() == 0;
    if (!cuda && !per_tensor) return reference();
    at::Tensor sa, xq;
    if (cuda || fixed.defined()) {
      std::tie(xq, sa) = quant::quantize_rows(x, at::kFloat8_e4m3fn, fixed);
      // The fused kernel where it runs: no product tensor, bias and accumulation in its epilogue.
      if (cuda && quant::fp8_gemm(xq, sa, w, sw, y, bias, accumulate)) return;
      // cuBLASLt's fp8 GEMM needs output widths that are multiples of 16.
      if (cuda && w.size(0) % 16 != 0) return reference();
      if (per_tensor) sa = sa.reshape(-1).narrow(0, 0, 1).reshape({});
    } else {  // the CPU without an input scale: the slab's maximum
      sa = x.abs().max().to(at::kFloat).div_(kMax).clamp_min_(1e-12);
      xq = x.to(at::kFloat).div(sa).clamp_(-kMax, kMax).to(at::kFloat8_e4m3fn);
    }
    const at::Tensor sb =
        per_tensor ? sw : (sw.dim() > 0 ? sw.t() : sw.reshape({1, 1}).expand({1, w.size(0)})).contiguous();
    const at::ScalarType od = per_tensor ? y.scalar_type() : at::kBFloat16;
    if (!accumulate && y.scalar_type() == od && y.is_contiguous()) {
      at::Tensor out = y;
      at::_scaled_mm_out(out, xq, w.t(), sa, sb, std::nullopt, std::nullopt, od);
      if (bias.defined()) y.add_(bias);
      return;
    }
    quant::write_product(at::_scaled_mm(xq, w.t(), sa, sb, std::nullopt, std::nullopt, od), y, bias, accumulate);
  }
};

constexpr double kMaxE5M2 = 57344.0;  // largest finite float8_e5m2

// A float8 format that runs as the dequantized slice on every device, sliceable both ways.
void register_dequantized(contracts::Registry& reg, const std::string& name, const std::string& description,
                          ir::DType storage, at::ScalarType type, double max, double tolerance) {
  contracts::FormatCaps f = quant::format_caps(name, description + "; the dequantized slice, then a matmul", storage);
  f.tolerance = tolerance;
  f.impl = std::make_shared<ScaledFloat8>(type, max);
  reg.add(f);
}

}  // namespace

void register_fp8(contracts::Registry& reg) {
  // Bare float8_e4m3fn weights (a plain cast, no scale): computed as the host that stores them
  // computes them, the slice cast to the activation dtype, so the result is the host's. e4m3
  // weights: 3 mantissa bits, ~3% relative L2 on normal data.
  register_dequantized(reg, "fp8-e4m3-cast", "float8 e4m3 cast to the activation dtype per slice (weight-only)",
                       ir::DType::F8E4M3, at::kFloat8_e4m3fn, kMax, 0.06);
  // float8_e5m2 (ComfyUI's float8_e5m2 and plain e5m2 casts): no 8-bit GEMM here takes e5m2
  // weights with e4m3 activations. 2 mantissa bits, ~6-8% relative L2 on normal data.
  register_dequantized(reg, "fp8-e5m2", "float8 e5m2 with an fp32 scale", ir::DType::F8E5M2, at::kFloat8_e5m2,
                       kMaxE5M2, 0.12);
  contracts::FormatCaps f = quant::format_caps(
      "fp8-e4m3",
      "float8 e4m3 with an fp32 scale; fp8 GEMM with quantized activations on sm_89+ (fused CUTLASS kernel on sm_90a, "
      "else _scaled_mm)",
      ir::DType::F8E4M3);
  // STREAMPLAN_FP8_CPU=1: the CPU runs it through _scaled_mm too, as a host running fp8
  // matmuls there computes (for comparisons with such a host).
  f.native_gemm = [](const contracts::DeviceCaps& d) {
    if (d.kind == contracts::DeviceKind::CPU) return std::getenv("STREAMPLAN_FP8_CPU") != nullptr;
    return d.kind == contracts::DeviceKind::CUDA && d.cc_major * 10 + d.cc_minor >= 89;
  };
  f.gemm_workspace = quant::fp8_gemm_workspace;
  f.gemm_kernel = quant::fp8_gemm_kernel;
  f.tolerance = 0.08;  // fp8 activations: ~3-5% relative L2 on normal data
  f.impl = std::make_shared<Fp8>();
  reg.add(f);
}

}  // namespace sp::exec::formats
