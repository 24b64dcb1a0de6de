// int8-rowwise: symmetric int8 with one fp32 scale per output channel, stored as the weight
// and "<weight>.scale"; an acquire converts the requested slice only and scales it.
#include "exec/consumers/consumer.hpp"
#include "exec/formats/quantized.hpp"

namespace sp::exec::formats {

namespace {

struct Int8Rowwise : FormatImpl {
  void store(TensorWeights& into, const ir::Linear& l, const at::Tensor& w, at::ScalarType) const override {
    at::Tensor scale = w.abs().amax(1).clamp_min(1e-8).div_(127.0);
    into.add(l.weight, w.div(scale.unsqueeze(1)).round_().clamp_(-127, 127).to(at::kChar));
    into.add(quant::scale_name(l.weight), scale);
  }
  at::Tensor acquire(const WeightSource& src, const ir::Linear& l, Slice rows, Slice cols, at::ScalarType dtype,
                     const at::Tensor& out) const override {
    const at::Tensor view = stored_slice(src, l, rows, cols);
    const at::Tensor scale = slice(src.tensor(quant::scale_name(l.weight)), 0, rows).unsqueeze(1);
    return converted(view, dtype, out).mul_(scale);
  }
  std::vector<std::string> companions(const ir::Linear& l) const override { return {quant::scale_name(l.weight)}; }
};

}  // namespace

void register_int8_rowwise(contracts::Registry& reg) {
  contracts::FormatCaps f = quant::format_caps(
      "int8-rowwise", "int8 with one fp32 scale per output channel; dequantized on acquire", ir::DType::I8);
  f.in_align = 256;
  // The acquire scales the converted slice in place by fp32 row scales: on CPUs whose kernels
  // cast that through a copy, the copy is there while it runs.
  f.acquire_scratch = [](int64_t rows, int64_t cols, ir::DType compute, const contracts::DeviceCaps& dev) {
    return dev.mixed_multiply_bytes(compute, rows * cols);
  };
  f.impl = std::make_shared<Int8Rowwise>();
  reg.add(f);
}

}  // namespace sp::exec::formats
