#include "exec/formats/quantized.hpp"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#ifdef STREAMPLAN_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "exec/kernels/elem.hpp"
#include "exec/kernels/quantize.cuh"
#endif
#ifdef STREAMPLAN_SCALED_GEMM_SM90
#include "exec/kernels/scaled_gemm_sm90.cuh"
#endif

namespace sp::exec::quant {

std::string scale_name(const std::string& weight) { return weight + ".scale"; }
std::string input_scale_name(const std::string& weight) { return weight + ".input_scale"; }

std::vector<std::string> companions(const ir::Linear& l) { return {scale_name(l.weight), input_scale_name(l.weight)}; }

at::Tensor row_scale(const WeightSource& src, const ir::Linear& l, Slice rows) {
  const std::string name = scale_name(l.weight);
  if (!src.contains(name))
    throw std::invalid_argument("weight '" + l.weight + "' (format " + l.format + ") has no scale tensor '" + name + "'");
  const at::Tensor s = src.tensor(name);
  if (s.numel() == 1) return s.reshape({}).to(at::kFloat);
  const bool per_row = (s.dim() == 1 && s.size(0) == l.out_features) ||
                       (s.dim() == 2 && s.size(0) == l.out_features && s.size(1) == 1);
  if (!per_row)
    throw std::invalid_argument("scale '" + name + "' has shape " + shape_text(s) + "; weight '" + l.weight +
                                "' [" + std::to_string(l.out_features) + ", " + std::to_string(l.in_features) +
                                "] needs one value ([] or [1]) or one per output row ([" +
                                std::to_string(l.out_features) + "] or [" + std::to_string(l.out_features) + ", 1])");
  return slice(s.reshape({l.out_features}), 0, rows).to(at::kFloat).unsqueeze(1);
}

std::vector<std::string> ScaledFormat::companions(const ir::Linear& l) const { return quant::companions(l); }

at::Tensor ScaledFormat::acquire(const WeightSource& src, const ir::Linear& l, Slice rows, Slice cols,
                                 at::ScalarType dtype, const at::Tensor& out) const {
  const at::Tensor scale = row_scale(src, l, rows);
  return converted(stored_slice(src, l, rows, cols), dtype, out).mul_(scale);
}

void store_int8_rows(TensorWeights& into, const ir::Linear& l, const at::Tensor& w) {
  auto [q, s] = quantize_rows(w, at::kChar);
  into.add(l.weight, q);
  into.add(scale_name(l.weight), s.squeeze(1));
}

at::Tensor hadamard(int64_t g, at::ScalarType dtype, const at::Device& device) {
  int64_t n = 4;
  while (n < g) n *= 4;
  if (n != g) throw std::invalid_argument("ConvRot group size " + std::to_string(g) + " is not a power of 4");
  const at::Tensor h4 = at::tensor({1., 1., 1., -1., 1., 1., -1., 1., 1., -1., 1., 1., -1., 1., 1., 1.},
                                   at::TensorOptions().dtype(at::kDouble)).view({4, 4});
  at::Tensor h = h4;
  for (int64_t k = 4; k < g; k *= 4) h = at::kron(h, h4);
  return h.div(std::sqrt(double(g))).to(at::TensorOptions().dtype(dtype).device(device));
}

at::Tensor rotate(const at::Tensor& x, int64_t g) {
  const int64_t n = x.size(0), k = x.size(1);
  if (k % g != 0)
    throw std::invalid_argument("ConvRot rotation of " + std::to_string(k) + " features: not a multiple of the group " +
                                std::to_string(g));
  return at::matmul(x.reshape({n, k / g, g}), hadamard(g, x.scalar_type(), x.device())).reshape({n, k});
}

#ifdef STREAMPLAN_WITH_CUDA
static cudaStream_t stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.get_device()).stream(); }
#endif

std::pair<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x, at::ScalarType qtype, const at::Tensor& fixed) {
  const bool fp8 = qtype == at::kFloat8_e4m3fn;
  if (!fp8 && qtype != at::kChar) throw std::invalid_argument("quantize_rows: int8 or fp8 e4m3 only");
  // One fp32 value on x's device (a fill where it is held elsewhere: no copy that waits).
  const at::Tensor one = !fixed.defined() ? fixed
                         : fixed.device() == x.device() ? fixed.reshape({}).to(at::kFloat)
                                                        : at::full({}, fixed.item<double>(), x.options().dtype(at::kFloat));
#ifdef STREAMPLAN_WITH_CUDA
  if (x.is_cuda() && x.dim() == 2 && x.stride(1) == 1 && kernels::elem_of(x.scalar_type())) {
    at::Tensor q = at::empty(x.sizes(), x.options().dtype(qtype));
    at::Tensor s = at::empty({x.size(0), 1}, x.options().dtype(at::kFloat));
    kernels::QuantizeParams p;
    p.x = x.data_ptr();
    p.x_stride = x.stride(0);
    p.x_type = *kernels::elem_of(x.scalar_type());
    p.q = q.data_ptr();
    p.q_type = fp8 ? kernels::QType::Fp8E4M3 : kernels::QType::Int8;
    p.scale = s.data_ptr<float>();
    p.fixed = one.defined() ? one.data_ptr<float>() : nullptr;
    p.rows = x.size(0);
    p.cols = x.size(1);
    const cudaError_t e = kernels::quantize_rows(p, stream_of(x));
    TORCH_CHECK(e == cudaSuccess, "quantize_rows: ", cudaGetErrorString(e));
    return {q, s};
  }
#endif
  const double qmax = fp8 ? 448.0 : 127.0;
  const at::Tensor s = one.defined() ? one.expand({x.size(0), 1})
                                     : x.abs().amax(1, true).to(at::kFloat).div_(qmax).clamp_min_(1e-30);
  at::Tensor v = x.to(at::kFloat).div(s);
  if (!fp8) v.round_();
  return {v.clamp_(-qmax, qmax).to(qtype), s};
}

namespace {

// STREAMPLAN_INT8_GEMM=aten / STREAMPLAN_FP8_GEMM=aten: keep the ATen GEMM (for comparison).
[[maybe_unused]] bool aten_gemm_asked(bool fp8) {
  const char* v = std::getenv(fp8 ? "STREAMPLAN_FP8_GEMM" : "STREAMPLAN_INT8_GEMM");
  return v && std::strcmp(v, "aten") == 0;
}

#ifdef STREAMPLAN_SCALED_GEMM_SM90
// A contiguous copy where t is not contiguous or not 16-byte aligned (a slice of a larger tensor).
at::Tensor aligned(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
}

}  // namespace

kernels::ScaledGemmParams scaled_gemm_params(const at::Tensor& xq, const at::Tensor& rs, const at::Tensor& wq,
                                             const at::Tensor& cs, const at::Tensor& y) {
  kernels::ScaledGemmParams p;
  p.operand = xq.scalar_type() == at::kFloat8_e4m3fn ? kernels::GemmOperand::F8E4M3 : kernels::GemmOperand::Int8;
  p.x = xq.data_ptr();
  p.x_stride = xq.stride(0);
  p.w = wq.data_ptr();
  p.w_stride = wq.stride(0);
  p.row_scale = rs.data_ptr<float>();
  p.col_scale = cs.data_ptr<float>();
  p.y = y.data_ptr();
  p.y_stride = y.stride(0);
  p.y_type = y.scalar_type() == at::kHalf ? kernels::Elem::F16 : kernels::Elem::BF16;
  p.rows = xq.size(0);
  p.cols = wq.size(0);
  p.k = xq.size(1);
  return p;
}

namespace {

// The fused kernel where the operands fit it: int8 or fp8 e4m3 operands, as xq's dtype says;
// false (nothing done) where they do not.
bool fused_gemm(const at::Tensor& xq, const at::Tensor& sx, const at::Tensor& wq, const at::Tensor& sw,
                const at::Tensor& y, const at::Tensor& bias, bool accumulate) {
  const bool fp8 = xq.scalar_type() == at::kFloat8_e4m3fn;
  if ((!fp8 && xq.scalar_type() != at::kChar) || wq.scalar_type() != xq.scalar_type() || !xq.is_cuda()) return false;
  if (aten_gemm_asked(fp8) || !kernels::scaled_gemm_sm90_ready()) return false;
  if (y.scalar_type() != at::kBFloat16 && y.scalar_type() != at::kHalf) return false;
  if (xq.dim() != 2 || wq.dim() != 2 || y.dim() != 2 || xq.stride(1) != 1 || wq.stride(1) != 1 || y.stride(1) != 1)
    return false;
  const int64_t n = xq.size(0), r = wq.size(0);
  const at::Tensor rs = aligned(sx.to(at::kFloat).reshape({n}));
  at::Tensor cs = sw.to(at::kFloat).reshape({-1});
  cs = aligned(cs.numel() == 1 ? cs.expand({r}) : cs);
  const at::Tensor b = bias.defined() ? aligned(bias.to(y.scalar_type()).reshape({r})) : bias;
  kernels::ScaledGemmParams p = scaled_gemm_params(xq, rs, wq, cs, y);
  p.bias = b.defined() ? b.data_ptr() : nullptr;
  p.accumulate = accumulate;
  if (!kernels::scaled_gemm_sm90_fits(p)) return false;
  const cudaError_t e = kernels::scaled_gemm_sm90(p, stream_of(y));
  TORCH_CHECK(e == cudaSuccess, "scaled_gemm_sm90: ", cudaGetErrorString(e));
  return true;
}
#endif

// Whether the fused kernel runs on `dev` for int8 (fp8 false) or fp8 e4m3 operands.
bool fused_on(const contracts::DeviceCaps& dev, bool fp8) {
#ifdef STREAMPLAN_SCALED_GEMM_SM90
  return dev.kind == contracts::DeviceKind::CUDA && dev.cc_major == 9 && dev.cc_minor == 0 && !aten_gemm_asked(fp8) &&
         kernels::scaled_gemm_sm90_ready();
#else
  return false;
#endif
}

// ... and for a call of this shape (16-bit output, in_features % 16, out_features % 8).
bool fused_for(const contracts::DeviceCaps& dev, const contracts::GemmCall& g, bool fp8) {
  return (g.out == ir::DType::BF16 || g.out == ir::DType::F16) && g.in_features % 16 == 0 &&
         g.out_features % 8 == 0 && fused_on(dev, fp8);
}

std::string fused_kernel_text(const std::string& operands) {
  return "CUTLASS sm_90a " + operands + " GEMM, scales/bias/accumulate fused in its epilogue";
}

// The quantized activation slab and its row scales (one byte and four bytes a row): what either
// 8-bit GEMM needs beside its operands.
int64_t activation_bytes(const contracts::GemmCall& g) { return g.rows * g.in_features + g.rows * 4; }

}  // namespace

void int8_gemm(const at::Tensor& xq, const at::Tensor& sx, const at::Tensor& wq, const at::Tensor& sw,
               const at::Tensor& y, const at::Tensor& bias, bool accumulate) {
#ifdef STREAMPLAN_WITH_CUDA
  if (xq.is_cuda() && y.dim() == 2 && y.stride(1) == 1 && kernels::elem_of(y.scalar_type()) &&
      (!bias.defined() || kernels::elem_of(bias.scalar_type()))) {
#ifdef STREAMPLAN_SCALED_GEMM_SM90
    if (fused_gemm(xq, sx, wq, sw, y, bias, accumulate)) return;
#endif
    const at::Tensor acc = at::_int_mm(xq, wq.t());
    const at::Tensor rs = sx.to(at::kFloat).contiguous(), cs = sw.to(at::kFloat).contiguous();
    const at::Tensor b = bias.defined() ? bias.contiguous() : bias;
    kernels::Int8EpilogueParams p;
    p.acc = acc.data_ptr<int32_t>();
    p.row_scale = rs.data_ptr<float>();
    p.col_scale = cs.data_ptr<float>();
    p.col_scale_stride = cs.numel() == 1 ? 0 : 1;
    if (b.defined()) {
      p.bias = b.data_ptr();
      p.bias_type = *kernels::elem_of(b.scalar_type());
    }
    p.y = y.data_ptr();
    p.y_stride = y.stride(0);
    p.y_type = *kernels::elem_of(y.scalar_type());
    p.accumulate = accumulate;
    p.rows = acc.size(0);
    p.cols = acc.size(1);
    const cudaError_t e = kernels::int8_epilogue(p, stream_of(y));
    TORCH_CHECK(e == cudaSuccess, "int8_epilogue: ", cudaGetErrorString(e));
    return;
  }
#endif
  write_product(at::_int_mm(xq, wq.t()).to(at::kFloat).mul_(sx).mul_(sw.dim() == 0 ? sw : sw.t()), y, bias, accumulate);
}

bool fp8_gemm(const at::Tensor& xq, const at::Tensor& sx, const at::Tensor& wq, const at::Tensor& sw,
              const at::Tensor& y, const at::Tensor& bias, bool accumulate) {
#ifdef STREAMPLAN_SCALED_GEMM_SM90
  return xq.scalar_type() == at::kFloat8_e4m3fn && fused_gemm(xq, sx, wq, sw, y, bias, accumulate);
#else
  return false;
#endif
}

bool fused_int8_gemm(const contracts::DeviceCaps& dev) { return fused_on(dev, false); }

bool fused_fp8_gemm(const contracts::DeviceCaps& dev) { return fused_on(dev, true); }

bool fused_fp8_gemm(const contracts::DeviceCaps& dev, const contracts::GemmCall& g) {
  return fused_for(dev, g, true);
}

std::string int8_gemm_kernel(const contracts::DeviceCaps& dev) {
  if (dev.kind != contracts::DeviceKind::CUDA) return "at::_int_mm (CPU)";
  if (fused_int8_gemm(dev)) return fused_kernel_text("int8");
  return "at::_int_mm + int8_epilogue";
}

std::string fp8_gemm_kernel(const contracts::DeviceCaps& dev) {
  if (dev.kind == contracts::DeviceKind::CPU)
    return "at::_scaled_mm on the CPU, activations quantized per tensor at the input scale, else the slab's maximum";
  return fused_fp8_gemm(dev) ? fused_kernel_text("fp8")
                             : "at::_scaled_mm (cuBLASLt), activations quantized at the input scale, else per row";
}

// Bytes of an int8 quantize_rows (or ConvRot rotation) + int8_gemm call beside its operands: the
// int8 activations and their scales, and the int32 product where the fused kernel does not run
// (where it does, the weight scales as a row). An output view not 16-byte aligned falls back to
// _int_mm, beyond this count.
static int64_t int8_gemm_workspace(const contracts::GemmCall& g, const contracts::DeviceCaps& dev) {
  if (fused_for(dev, g, false)) return activation_bytes(g) + g.out_features * 4;
  return activation_bytes(g) + g.rows * g.out_features * 4;
}

int64_t fp8_gemm_workspace(const contracts::GemmCall& g, const contracts::DeviceCaps& dev) {
  const int64_t operands = activation_bytes(g) + g.out_features * 4;
  if (fused_fp8_gemm(dev, g) || (!g.accumulate && g.out == ir::DType::BF16)) return operands;
  return operands + g.rows * g.out_features * 2;
}

void write_product(at::Tensor r, const at::Tensor& y, const at::Tensor& bias, bool accumulate) {
  if (bias.defined()) r.add_(bias);
  if (accumulate) y.add_(r);
  else y.copy_(r);
}

void reference_gemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& y, const at::Tensor& bias,
                    bool accumulate) {
  write_product(at::matmul(x.to(at::kFloat), w.t()), y, bias, accumulate);
}

contracts::FormatCaps format_caps(std::string name, std::string description, ir::DType storage) {
  contracts::FormatCaps f;
  f.name = std::move(name);
  f.description = std::move(description);
  f.storage = storage;
  f.dense = false;
  f.out_slicing = f.in_slicing = f.held_execution = contracts::Cap::Yes;
  return f;
}

void native_int8_gemm(contracts::FormatCaps& f) {
  f.native_gemm = [](const contracts::DeviceCaps& d) { return d.kind == contracts::DeviceKind::CUDA; };
  f.gemm_workspace = int8_gemm_workspace;
  f.gemm_kernel = int8_gemm_kernel;
}

}  // namespace sp::exec::quant
