// convrot-int8: ConvRot int8 (ComfyUI's int8_tensorwise with "convrot": true; what it stores
// and runs: README.md). The CPU acquires the dequantized slice rotated back (W = W'·H).
#include "exec/consumers/consumer.hpp"
#include "exec/formats/quantized.hpp"

#ifdef STREAMPLAN_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "exec/kernels/elem.hpp"
#include "exec/kernels/hadamard.cuh"
#endif

namespace sp::exec::formats {

namespace {

constexpr int64_t kGroup = 256;

void check_groups(const ir::Linear& l, Slice cols, int64_t len) {
  if (l.in_features % kGroup != 0 || cols.begin % kGroup != 0 || len % kGroup != 0 || cols.step != 1)
    throw std::invalid_argument("weight '" + l.weight + "' (convrot-int8, " + std::to_string(l.in_features) +
                                " input features): input slice [" + std::to_string(cols.begin) + ", +" +
                                std::to_string(len) + ") does not hold whole rotation groups of " +
                                std::to_string(kGroup));
}

// (x·H quantized per row, its scales).
std::pair<at::Tensor, at::Tensor> rotate_quantize(const at::Tensor& x) {
#ifdef STREAMPLAN_WITH_CUDA
  if (x.is_cuda() && x.stride(1) == 1 && kernels::elem_of(x.scalar_type())) {
    at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kChar));
    at::Tensor s = at::empty({x.size(0), 1}, x.options().dtype(at::kFloat));
    kernels::RotateQuantParams p;
    p.x = x.data_ptr();
    p.x_stride = x.stride(0);
    p.x_type = *kernels::elem_of(x.scalar_type());
    p.q = q.data_ptr<int8_t>();
    p.scale = s.data_ptr<float>();
    p.rows = x.size(0);
    p.cols = x.size(1);
    p.group = int(kGroup);
    const cudaError_t e = kernels::rotate_quantize_int8(p, c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
    TORCH_CHECK(e == cudaSuccess, "rotate_quantize_int8: ", cudaGetErrorString(e));
    return {q, s};
  }
#endif
  return quant::quantize_rows(quant::rotate(x.to(at::kFloat), kGroup), at::kChar);
}

struct ConvRot : FormatImpl {
  std::vector<std::string> companions(const ir::Linear& l) const override { return quant::companions(l); }
  void store(TensorWeights& into, const ir::Linear& l, const at::Tensor& w, at::ScalarType) const override {
    check_groups(l, {}, w.size(1));
    quant::store_int8_rows(into, l, quant::rotate(w.to(at::kFloat), kGroup));
  }
  at::Tensor acquire(const WeightSource& src, const ir::Linear& l, Slice rows, Slice cols, at::ScalarType dtype,
                     const at::Tensor& out) const override {
    const at::Tensor stored = stored_slice(src, l, rows, cols);
    check_groups(l, cols, stored.size(1));
    const at::Tensor w = quant::rotate(stored.to(at::kFloat).mul_(quant::row_scale(src, l, rows)), kGroup);
    return converted(w, dtype, out);
  }
  void gemm(const WeightSource& src, const ir::Linear& l, Slice rows, Slice cols, const at::Tensor& stored,
            const at::Tensor& x, const at::Tensor& y, const at::Tensor& bias, bool accumulate) const override {
    check_groups(l, cols, stored.size(1));
    const at::Tensor sw = quant::row_scale(src, l, rows);
    const at::Tensor w = stored.contiguous();
    if (x.is_cuda() && (x.size(0) <= 16 || w.size(0) % 8 != 0))  // at::_int_mm's CUDA limits
      return quant::reference_gemm(quant::rotate(x.to(at::kFloat), kGroup), w.to(at::kFloat).mul_(sw), y, bias,
                                   accumulate);
    auto [xq, sx] = rotate_quantize(x);
    quant::int8_gemm(xq, sx, w, sw, y, bias, accumulate);
  }
};

}  // namespace

void register_convrot_int8(contracts::Registry& reg) {
  contracts::FormatCaps f = quant::format_caps(
      "convrot-int8", "int8 of Hadamard-rotated input features (groups of 256), one fp32 scale per output row",
      ir::DType::I8);
  f.in_align = kGroup;
  quant::native_int8_gemm(f);
  f.tolerance = 0.02;
  f.impl = std::make_shared<ConvRot>();
  reg.add(f);
}

}  // namespace sp::exec::formats
