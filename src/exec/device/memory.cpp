#include "exec/device/memory.hpp"

#include <cstdio>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>

#ifdef STREAMPLAN_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace sp::exec {

namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

// Sizes of live blocks by address: ATen's raw_allocate() requires the context of a DataPtr
// to be its data pointer, so the size cannot travel in the context.
std::mutex g_mu;
std::unordered_map<void*, size_t>& sizes() {
  static std::unordered_map<void*, size_t> m;
  return m;
}

void release(void* p) {
  if (!p) return;
  size_t n = 0;
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto it = sizes().find(p);
    if (it != sizes().end()) {
      n = it->second;
      sizes().erase(it);
    }
  }
  const int64_t live = g_live.fetch_sub(static_cast<int64_t>(n)) - static_cast<int64_t>(n);
  c10::free_cpu(p);
  // As ATen's own CPU allocator does: torch.profiler(profile_memory=True) sees the block go.
  c10::reportMemoryUsageToProfiler(p, -static_cast<int64_t>(n), static_cast<size_t>(live), static_cast<size_t>(live),
                                   c10::Device(c10::DeviceType::CPU));
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* p = n ? c10::alloc_cpu(n) : nullptr;
    if (p) {
      std::lock_guard<std::mutex> l(g_mu);
      sizes()[p] = n;
    }
    const int64_t live = g_live.fetch_add(static_cast<int64_t>(p ? n : 0)) + static_cast<int64_t>(p ? n : 0);
    int64_t peak = g_peak.load();
    while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
    }
    if (p)
      c10::reportMemoryUsageToProfiler(p, static_cast<int64_t>(n), static_cast<size_t>(live), static_cast<size_t>(live),
                                       c10::Device(c10::DeviceType::CPU));
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
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

int64_t cpu_peak_of(const std::function<void()>& f) {
  install_cpu_meter();
  const int64_t outer = g_peak.load(), start = g_live.load();
  g_peak.store(start);
  f();
  const int64_t peak = g_peak.load();
  int64_t now = peak;
  while (now < outer && !g_peak.compare_exchange_weak(now, outer)) {
  }
  return peak - start;
}

int64_t peak_of(const at::Device& d, const std::function<void()>& f) {
  if (d.is_cpu()) return cpu_peak_of(f);
  const PeakMeter meter(d);
  f();
  return meter.peak_above_start();
}

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

std::string allocator_state(const at::Device& d) {
  auto gib = [](int64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(int64_t{1} << 30));
    return std::string(buf);
  };
#ifdef STREAMPLAN_WITH_CUDA
  if (d.is_cuda()) {
    const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index());
    return "allocated " + gib(st.allocated_bytes[0].current) + ", held " + gib(st.reserved_bytes[0].current) + " in " +
           std::to_string(st.segment[0].current) + " segments";
  }
#endif
  return "allocated " + gib(cpu_live_bytes());
}

int64_t PeakMeter::peak_reserved() const {
#ifdef STREAMPLAN_WITH_CUDA
  if (device_.is_cuda()) return c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index()).reserved_bytes[0].peak;
#endif
  return peak();
}

}  // namespace sp::exec
