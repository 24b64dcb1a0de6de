// The run's device as a capability contract (contracts::DeviceCaps).
//
// Example:
//     at::Device d = sp::exec::pick_device("auto");        // cuda:0 when present, else cpu
//     sp::contracts::DeviceCaps caps = sp::exec::describe_device(d);
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "contracts/contracts.hpp"

namespace sp::exec {

// "cpu", "cuda", "cuda:N" or "auto"; throws std::invalid_argument for anything else or an absent GPU.
at::Device pick_device(const std::string& name);
contracts::DeviceCaps describe_device(const at::Device& d);
// describe_device without the memory queries (memory_total and memory_free stay 0): what a
// per-call check such as FormatCaps::native_gemm reads.
contracts::DeviceCaps static_device_caps(const at::Device& d);
// Bytes a CPU GEMM in `dtype` allocates per worker thread, at most, to pack its operands
// (oneDNN on AMX / AVX512-BF16 units; 0 where it packs nothing). Measured once per dtype, at
// a shape that reaches the kernel's block sizes.
int64_t cpu_gemm_scratch(at::ScalarType dtype);
void synchronize(const at::Device& d);
// Returns the caching allocator's unused blocks to the device (after an out-of-memory).
void release_cached(const at::Device& d);
// Caps what the caching allocator may hold on `d`, its cached blocks included, at `bytes`
// (releasing the cache first; an allocation beyond is an out-of-memory error) until the returned
// object goes; new segments grow in place from then on (expandable_segments). Nothing on the
// CPU. Throws std::invalid_argument when `bytes` exceeds the device's memory. With `own_held`,
// at `bytes` beyond what the process holds on `d` now apart from `own_held` of it: a host
// process whose other models keep their memory while one call runs capped.
std::shared_ptr<void> cap_device_memory(const at::Device& d, int64_t bytes,
                                        std::optional<int64_t> own_held = std::nullopt);
// Milliseconds `f` takes on the device: CUDA events around it on a GPU, a steady clock
// (after it returns) on the CPU.
double time_ms(const at::Device& d, const std::function<void()>& f);

// A point in the device's queue of work, recorded at construction: a CUDA event on a GPU,
// the host clock on the CPU. ms_until(later) once the device has reached `later`
// (synchronize first).
class Mark {
 public:
  explicit Mark(const at::Device& d);
  double ms_until(const Mark& later) const;

 private:
  std::shared_ptr<void> event_;  // the CUDA event, or null
  std::chrono::steady_clock::time_point host_;
};

}  // namespace sp::exec
