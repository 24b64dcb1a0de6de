// int8: symmetric int8 weights with one fp32 scale for the tensor or one per output row
// (ComfyUI's int8_tensorwise); what it stores and runs: README.md.
#include "exec/consumers/consumer.hpp"
#include "exec/formats/quantized.hpp"

namespace sp::exec::formats {

namespace {

struct Int8 : quant::ScaledFormat {
  void store(TensorWeights& into, const ir::Linear& l, const at::Tensor& w, at::ScalarType) const override {
    quant::store_int8_rows(into, l, w);
  }
  void gemm(const WeightSource& src, const ir::Linear& l, Slice rows, Slice, const at::Tensor& stored,
            const at::Tensor& x, const at::Tensor& y, const at::Tensor& bias, bool accumulate) const override {
    const at::Tensor sw = quant::row_scale(src, l, rows);
    const at::Tensor w = stored.contiguous();
    // at::_int_mm's CUDA kernel needs more than 16 rows and widths that are multiples of 8.
    if (x.is_cuda() && (x.size(0) <= 16 || x.size(1) % 8 != 0 || w.size(0) % 8 != 0))
      return quant::reference_gemm(x, w.to(at::kFloat).mul_(sw), y, bias, accumulate);
    auto [xq, sx] = quant::quantize_rows(x, at::kChar);
    quant::int8_gemm(xq, sx, w, sw, y, bias, accumulate);
  }
};

}  // namespace

void register_int8(contracts::Registry& reg) {
  contracts::FormatCaps f = quant::format_caps(
      "int8", "int8 with one fp32 scale per tensor or per output row; int8 GEMM with per-row activation scales",
      ir::DType::I8);
  quant::native_int8_gemm(f);
  f.tolerance = 0.02;  // per-row int8 activations: ~1% relative L2 on normal data
  f.impl = std::make_shared<Int8>();
  reg.add(f);
}

}  // namespace sp::exec::formats
