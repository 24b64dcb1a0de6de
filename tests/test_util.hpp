// Shared helpers of the execution tests.
#pragma once

#include <ATen/ATen.h>

#include "exec/device/device.hpp"
#include "exec/device/memory.hpp"
#include "exec/run/executor.hpp"
#include "models/builder.hpp"

#include <functional>
#include <string>
#include <utility>

namespace sp::test {

// Whether a CUDA device is present (GPU tests skip without one).
inline bool have_cuda() {
  try {
    return sp::exec::pick_device("auto").is_cuda();
  } catch (const std::exception&) {
    return false;
  }
}

// ||a - b|| / ||b|| in float64.
inline double rel_l2(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor bd = b.to(at::kDouble);
  return ((a.to(at::kDouble) - bd).norm() / bd.norm().clamp_min(1e-300)).item<double>();
}

// Whether this CPU's GEMMs in `dtype` allocate scratch of their own (oneDNN packs operands
// for AMX / AVX512-BF16 units; exec::cpu_gemm_scratch); the contracts count it only inside
// attention calls, as an allowance, so exact memory checks in such dtypes only hold where this
// is false.
inline bool cpu_gemm_allocates(at::ScalarType dtype) { return sp::exec::cpu_gemm_scratch(dtype) > 0; }

// Whether this CPU's elementwise kernels take a 16-bit tensor times an fp32 one in place
// without a temporary (vectorized mixed-dtype kernels) or cast through an fp32 copy of the
// output (seen on AVX2 machines); formats that scale dequantized weights by fp32 row scales
// (int8-rowwise) declare no such copy, so exact memory checks on them hold only where false.
inline bool cpu_mixed_ops_allocate() {
  at::Tensor x = at::ones({35, 80}, at::kBFloat16);
  const at::Tensor s = at::full({35, 1}, 0.5);
  return sp::exec::cpu_peak_of([&] { x.mul_(s); }) > 0;
}

// The message of the exception f throws ("" when it throws none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A planned run on the CPU: its output and its activation peak above what was live before it.
inline std::pair<at::Tensor, int64_t> metered(const models::Instance& inst, const plan::Plan& p,
                                              const contracts::Registry& reg, const contracts::DeviceCaps& dev) {
  sp::exec::install_cpu_meter();
  sp::exec::PeakMeter m(at::Device(at::kCPU));
  at::Tensor out = sp::exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, dev);
  return {out, m.peak_above_start()};
}

}  // namespace sp::test
