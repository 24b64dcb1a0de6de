#include "exec/formats/weights.hpp"

#include <stdexcept>

#include "exec/consumers/consumer.hpp"
#include "exec/device/device.hpp"

namespace sp::exec {

at::ScalarType to_aten(ir::DType d) {
  switch (d) {
    case ir::DType::F32: return at::kFloat;
    case ir::DType::BF16: return at::kBFloat16;
    case ir::DType::F16: return at::kHalf;
    case ir::DType::F64: return at::kDouble;
    case ir::DType::I8: return at::kChar;
    case ir::DType::F8E4M3: return at::kFloat8_e4m3fn;
    case ir::DType::F8E5M2: return at::kFloat8_e5m2;
  }
  throw std::invalid_argument("unsupported dtype");
}

at::Tensor slice(const at::Tensor& t, int64_t dim, Slice s) {
  const int64_t len = s.length < 0 ? (t.size(dim) - s.begin + s.step - 1) / s.step : s.length;
  if (s.begin < 0 || len < 0 || s.begin + (len - 1) * s.step >= t.size(dim) + (len == 0 ? 1 : 0))
    throw std::out_of_range("slice [" + std::to_string(s.begin) + ", +" + std::to_string(len) + " step " +
                            std::to_string(s.step) + ") outside dimension " + std::to_string(dim) + " of size " +
                            std::to_string(t.size(dim)));
  return t.slice(dim, s.begin, s.begin + (len - 1) * s.step + 1, s.step);
}

std::string gemm_provider(const contracts::FormatCaps& f, const contracts::DeviceCaps& dev) {
  if (f.native_gemm && f.native_gemm(dev)) return f.gemm_kernel ? f.gemm_kernel(dev) : "the format's own GEMM";
  return f.dense ? "matmul of the stored weight" : "dequantized slice, then a matmul";
}

at::Tensor stored_slice(const WeightSource& src, const ir::Linear& l, Slice rows, Slice cols) {
  const at::Tensor& w = src.tensor(l.weight);
  if (w.dim() != 2 || w.size(0) != l.out_features || w.size(1) != l.in_features)
    throw std::invalid_argument("weight '" + l.weight + "': shape " + std::to_string(w.size(0)) + "x" +
                                std::to_string(w.dim() > 1 ? w.size(1) : 0) + " does not match the IR's [" +
                                std::to_string(l.out_features) + ", " + std::to_string(l.in_features) + "]");
  return slice(slice(w, 0, rows), 1, cols);
}

at::Tensor native_linear(const contracts::Registry& reg, const WeightSource& src, const ir::Linear& l,
                         const at::Tensor& x, const at::Tensor& bias) {
  const contracts::FormatCaps& f = reg.format(l.format);
  if (!f.native_gemm || !f.native_gemm(static_device_caps(x.device()))) return {};
  const OnDevice on(src, x.device());
  const at::Tensor y = at::empty({x.size(0), l.out_features}, x.options());
  impl_of<FormatImpl>(f).gemm(on, l, {}, {}, stored_slice(on, l, {}, {}), x.contiguous(), y,
                              bias.defined() ? bias.to(x.device()) : bias, false);
  return y;
}

at::Tensor converted(const at::Tensor& stored, at::ScalarType dtype, const at::Tensor& out) {
  if (!out.defined()) return stored.to(dtype);
  out.copy_(stored);
  return out;
}

void FormatImpl::gemm(const WeightSource&, const ir::Linear& l, Slice, Slice, const at::Tensor&, const at::Tensor&,
                      const at::Tensor&, const at::Tensor&, bool) const {
  throw std::logic_error("format '" + l.format + "' of weight '" + l.weight + "' has no GEMM of its own");
}

void TensorWeights::store(const ir::Linear& l, const at::Tensor& w, at::ScalarType model) {
  impl_of<FormatImpl>(reg_->format(l.format)).store(*this, l, w, model);
}

at::Tensor TensorWeights::tensor(const std::string& name) const {
  auto it = t_.find(name);
  if (it == t_.end()) throw std::out_of_range("weight '" + name + "' is not in the weight source");
  return it->second;
}

at::Tensor TensorWeights::take(const std::string& name) {
  auto it = t_.find(name);
  if (it == t_.end()) return {};
  at::Tensor t = std::move(it->second);
  t_.erase(it);
  return t;
}

int64_t TensorWeights::total_bytes() const {
  int64_t b = 0;
  for (const auto& [k, v] : t_) b += v.nbytes();
  return b;
}

at::Tensor TensorWeights::acquire(const ir::Linear& l, Slice rows, Slice cols, at::ScalarType dtype,
                                  const at::Tensor& out) const {
  return impl_of<FormatImpl>(reg_->format(l.format)).acquire(*this, l, rows, cols, dtype, out);
}

}  // namespace sp::exec
