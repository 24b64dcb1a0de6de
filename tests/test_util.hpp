// Shared helpers of the execution tests.
#pragma once

#include <ATen/ATen.h>

#include "exec/device/device.hpp"
#include "exec/device/memory.hpp"
#include "exec/run/executor.hpp"
#include "models/builder.hpp"

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <utility>

namespace sp::test {

// Sets an environment variable for the scope (restores the earlier value, or unsets it).
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(const std::string& n, const std::string& v) : name(n) {
    if (const char* o = std::getenv(n.c_str())) old = o;
    ::setenv(n.c_str(), v.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

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
