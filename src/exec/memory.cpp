#include "exec/memory.hpp"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <cstring>
#include <mutex>

#ifdef STREAMPLAN_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace sp::exec {

namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

struct Block {
  void* ptr;
  size_t bytes;
};

void release(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  g_live.fetch_sub(static_cast<int64_t>(b->bytes));
  c10::free_cpu(b->ptr);
  delete b;
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* p = n ? c10::alloc_cpu(n) : nullptr;
    const int64_t live = g_live.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = g_peak.load();
    while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
    }
    return {p, new Block{p, n}, &release, c10::Device(c10::DeviceType::CPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

}  // namespace

void install_cpu_meter() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingAllocator alloc;
    c10::SetCPUAllocator(&alloc, /*priority=*/100);
  });
}

int64_t cpu_live_bytes() { return g_live.load(); }

PeakMeter::PeakMeter(at::Device device) : device_(device) {
  if (device.is_cpu()) {
    install_cpu_meter();
    start_ = g_live.load();
    g_peak.store(start_);
    return;
  }
#ifdef STREAMPLAN_WITH_CUDA
  namespace cca = c10::cuda::CUDACachingAllocator;
  cca::resetPeakStats(device.index());
  start_ = cca::getDeviceStats(device.index()).allocated_bytes[0].current;
#endif
}

int64_t PeakMeter::peak_above_start() const {
  if (device_.is_cpu()) return g_peak.load() - start_;
#ifdef STREAMPLAN_WITH_CUDA
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index()).allocated_bytes[0].peak - start_;
#else
  return 0;
#endif
}

int64_t PeakMeter::live_above_start() const {
  if (device_.is_cpu()) return g_live.load() - start_;
#ifdef STREAMPLAN_WITH_CUDA
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index()).allocated_bytes[0].current - start_;
#else
  return 0;
#endif
}

}  // namespace sp::exec
