// Memory accounting: the activation high-water mark of a forward pass.
//
// Design note. On the CPU a counting allocator installed over c10's counts live bytes and
// their peak exactly as requested; on CUDA the caching allocator's statistics (512-byte rounded)
// are used. A measurement is the peak above the live bytes when it started.
//
// Example:
//     sp::exec::PeakMeter meter(at::kCPU);
//     at::Tensor out = run(...);
//     int64_t activation_peak = meter.peak_above_start();
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <string>

namespace sp::exec {

class PeakMeter {
 public:
  explicit PeakMeter(at::Device device);  // resets the peak to the current live bytes
  int64_t peak_above_start() const;
  int64_t peak() const { return start_ + peak_above_start(); }  // everything allocated, at its peak
  int64_t peak_reserved() const;  // CUDA: what the caching allocator held at its peak; CPU: peak()

 private:
  at::Device device_;
  int64_t start_ = 0;
};

// What the caching allocator holds on `d` now, for messages: "allocated 5.30 GiB, held
// 7.61 GiB in 212 segments" (CUDA); "allocated 120.0 MiB" (CPU).
std::string allocator_state(const at::Device& d);

// Installs the counting CPU allocator (idempotent); called by PeakMeter.
void install_cpu_meter();
int64_t cpu_live_bytes();
// The CPU bytes f allocates at its peak above those live before it, measured without
// disturbing a PeakMeter around the call (whose peak then includes f's, as it would anyway).
int64_t cpu_peak_of(const std::function<void()>& f);
// The same on any device: on CUDA from the caching allocator's statistics, whose peak it
// resets (a CUDA PeakMeter around the call no longer holds its own peak).
int64_t peak_of(const at::Device& d, const std::function<void()>& f);

}  // namespace sp::exec
