#include "exec/device/device.hpp"

#include "exec/device/memory.hpp"
#include "exec/kernels/fused.hpp"

#include <ATen/Parallel.h>
#include <ATen/Context.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>

#ifdef STREAMPLAN_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/core/AllocatorConfig.h>
#endif

namespace sp::exec {

namespace {

int64_t meminfo(const std::string& key) {
  std::ifstream f("/proc/meminfo");
  std::string k;
  int64_t kb = 0;
  std::string unit;
  while (f >> k >> kb >> unit)
    if (k == key + ":") return kb * 1024;
  return 0;
}

int cuda_device_count() {
#ifdef STREAMPLAN_WITH_CUDA
  return at::hasCUDA() ? int(c10::cuda::device_count()) : 0;
#else
  return 0;
#endif
}

bool cuda_present() { return cuda_device_count() > 0; }

// What `measure` gives for a dtype, measured once per dtype and process (a CPU property).
class MeasuredPerDtype {
 public:
  explicit MeasuredPerDtype(std::function<int64_t(at::ScalarType)> measure) : measure_(std::move(measure)) {}
  int64_t operator()(at::ScalarType dtype) {
    std::lock_guard<std::mutex> lock(m_);
    const auto it = known_.find(dtype);
    return it != known_.end() ? it->second : known_[dtype] = measure_(dtype);
  }

 private:
  std::function<int64_t(at::ScalarType)> measure_;
  std::mutex m_;
  std::map<at::ScalarType, int64_t> known_;
};

}  // namespace

int64_t cpu_gemm_scratch(at::ScalarType dtype) {
  // GEMMs under the counting allocator, shaped as the programs call them (activations times a
  // transposed [out, in] weight, written and added to), with constant operands: the scratch
  // does not depend on values, and the default generator stays untouched. Packing grows with
  // the operands up to the kernel's block sizes (reached at about 512 x 1536 x 1536 on
  // oneDNN's bf16 kernels) and with the threads taking part: the largest of a small and a
  // saturating shape, per thread of this process, in 4 KiB units.
  static MeasuredPerDtype measured([](at::ScalarType t) -> int64_t {
    const auto opt = at::TensorOptions().dtype(t);
    int64_t most = 0;
    for (const auto& [n, k, m] : {std::array<int64_t, 3>{64, 256, 512}, std::array<int64_t, 3>{512, 1536, 1536}}) {
      const at::Tensor x = at::full({n, k}, 0.5, opt), w = at::full({m, k}, 0.25, opt);
      at::Tensor out = at::empty({n, m}, opt);
      most = std::max(most, cpu_peak_of([&] {
                        at::mm_out(out, x, w.t());
                        out.addmm_(x, w.t());
                      }));
    }
    const int64_t threads = std::max(1, at::get_num_threads()), unit = int64_t{4} << 10;
    return (most + threads * unit - 1) / (threads * unit) * unit;
  });
  return measured(dtype);
}

// Bytes per element an in-place CPU multiply of a `dtype` tensor by an fp32 one (a row scale)
// allocates: fp32 temporaries where ATen's kernels have no mixed-dtype vectors (8 bytes on an
// AVX2 machine), else 0. Shaped as a dequantizing acquire calls it: [rows, cols] times [rows, 1].
static int64_t cpu_mixed_multiply_bytes(at::ScalarType dtype) {
  static MeasuredPerDtype measured([](at::ScalarType t) -> int64_t {
    constexpr int64_t rows = 35, cols = 80;
    at::Tensor x = at::ones({rows, cols}, at::TensorOptions().dtype(t));
    const at::Tensor s = at::full({rows, 1}, 0.5);
    return (cpu_peak_of([&] { x.mul_(s); }) + rows * cols - 1) / (rows * cols);
  });
  return measured(dtype);
}

at::Device pick_device(const std::string& name) {
  if (name == "auto") return cuda_present() ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  if (name == "cpu") return at::Device(at::kCPU);
  if (name.rfind("cuda", 0) == 0) {
    const int count = cuda_device_count();
    if (count == 0)
      throw std::invalid_argument("--device " + name + ": no CUDA device is available in this build or machine");
    const at::Device d(name == "cuda" ? std::string("cuda:0") : name);
    if (d.index() >= count)
      throw std::invalid_argument("--device " + name + ": this machine has " + std::to_string(count) + " CUDA device" +
                                  (count == 1 ? " (cuda:0)" : "s (cuda:0 to cuda:" + std::to_string(count - 1) + ")"));
    return d;
  }
  throw std::invalid_argument("--device: expected cpu, cuda, cuda:N or auto, got '" + name + "'");
}

contracts::DeviceCaps static_device_caps(const at::Device& d) {
  using ir::DType;
  contracts::DeviceCaps c;
  if (d.is_cpu()) {
    c.name = "cpu";
    c.kind = contracts::DeviceKind::CPU;
    c.dtypes = {DType::F32, DType::BF16, DType::F16, DType::F64};
    c.threads = at::get_num_threads();
    if (const int64_t b = cpu_gemm_scratch(at::kBFloat16)) c.gemm_scratch_per_thread[DType::BF16] = b;
    if (const int64_t b = cpu_gemm_scratch(at::kHalf)) c.gemm_scratch_per_thread[DType::F16] = b;
    if (const int64_t b = cpu_mixed_multiply_bytes(at::kBFloat16)) c.mixed_multiply_bytes_per_element[DType::BF16] = b;
    if (const int64_t b = cpu_mixed_multiply_bytes(at::kHalf)) c.mixed_multiply_bytes_per_element[DType::F16] = b;
    c.alloc_round = 1;
    c.fused_row_kernels = contracts::Cap::No;
    return c;
  }
#ifdef STREAMPLAN_WITH_CUDA
  const auto* p = at::cuda::getDeviceProperties(d.index());
  c.name = std::string("cuda:") + std::to_string(d.index()) + " (" + p->name + ")";
  c.kind = contracts::DeviceKind::CUDA;
  c.cc_major = p->major;
  c.cc_minor = p->minor;
  c.dtypes = {DType::F32, DType::F16, DType::F64};
  if (p->major >= 8) c.dtypes.insert(DType::BF16);
  if (p->major > 8 || (p->major == 8 && p->minor >= 9)) c.dtypes.insert(DType::F8E4M3);
  c.alloc_round = 512;  // the caching allocator rounds every block to 512 bytes
  c.reuse_slack = int64_t{1} << 20;
  c.fused_row_kernels = fused::fused_rows_built() ? contracts::Cap::Yes : contracts::Cap::No;
  c.threads = 1;
  c.compute_units = p->multiProcessorCount;
  return c;
#else
  throw std::invalid_argument("device " + d.str() + " is not supported by this CPU-only build");
#endif
}

contracts::DeviceCaps describe_device(const at::Device& d) {
  contracts::DeviceCaps c = static_device_caps(d);
  if (d.is_cpu()) {
    c.memory_total = meminfo("MemTotal");
    c.memory_free = meminfo("MemAvailable");
    return c;
  }
#ifdef STREAMPLAN_WITH_CUDA
  size_t free_b = 0, total_b = 0;
  AT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  c.memory_total = static_cast<int64_t>(total_b);
  // What this process can still allocate: the device's free memory plus the caching
  // allocator's unused cached segments, within the allocator's memory fraction (a cap set with
  // setMemoryFraction counts against reserved, not physical, memory). Free blocks inside
  // segments that still hold live tensors (the allocator's inactive split blocks) are not
  // counted: they are fragments that a slab of any size may not fit in, yet they count against
  // the cap, so a plan sized on them can run out of memory where it was told it fits.
  // Before its first allocation the allocator holds nothing and has no statistics yet.
  c.memory_free = static_cast<int64_t>(free_b);
  try {
    namespace cca = c10::cuda::CUDACachingAllocator;
    const auto st = cca::getDeviceStats(d.index());
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const int64_t allocated = st.allocated_bytes[agg].current, reserved = st.reserved_bytes[agg].current;
    const int64_t fragments = st.inactive_split_bytes[agg].current;
    const int64_t allowed = static_cast<int64_t>(cca::getMemoryFraction(d.index()) * double(total_b));
    c.memory_free = std::max<int64_t>(
        0, std::min(static_cast<int64_t>(free_b) + (reserved - allocated - fragments), allowed - allocated - fragments));
  } catch (const c10::Error&) {
  }
#endif
  return c;
}

double time_ms(const at::Device& d, const std::function<void()>& f) {
#ifdef STREAMPLAN_WITH_CUDA
  if (d.is_cuda()) {
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    start.record();
    f();
    stop.record();
    stop.synchronize();
    return start.elapsed_time(stop);
  }
#endif
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Mark::Mark(const at::Device& d) {
#ifdef STREAMPLAN_WITH_CUDA
  if (d.is_cuda()) {
    auto e = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    e->record();
    event_ = e;
    return;
  }
#endif
  host_ = std::chrono::steady_clock::now();
}

double Mark::ms_until(const Mark& later) const {
#ifdef STREAMPLAN_WITH_CUDA
  if (event_ && later.event_)
    return static_cast<at::cuda::CUDAEvent*>(event_.get())->elapsed_time(*static_cast<at::cuda::CUDAEvent*>(later.event_.get()));
#endif
  return std::chrono::duration<double, std::milli>(later.host_ - host_).count();
}

void release_cached(const at::Device& d) {
#ifdef STREAMPLAN_WITH_CUDA
  if (d.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

std::shared_ptr<void> cap_device_memory(const at::Device& d, int64_t bytes, std::optional<int64_t> own_held) {
#ifdef STREAMPLAN_WITH_CUDA
  if (d.is_cuda()) {
    namespace cca = c10::cuda::CUDACachingAllocator;
    const int index = d.index();
    // Segments that grow in place: under a cap, a large request is not refused for want of a
    // contiguous free segment while the total would fit (fragmentation across the run's
    // differently sized arenas).
    c10::CachingAllocator::setAllocatorSettings("expandable_segments:True");
    cca::emptyCache();
    if (own_held) {
      const int64_t held = cca::getDeviceStats(index).reserved_bytes[size_t(c10::CachingAllocator::StatType::AGGREGATE)].current;
      bytes += std::max<int64_t>(held - *own_held, 0);
    }
    const int64_t total = describe_device(d).memory_total;
    if (bytes > total)
      throw std::invalid_argument("device memory: " + std::to_string(bytes) + " bytes exceed the " +
                                  std::to_string(total) + " bytes of " + d.str());
    cca::setMemoryFraction(double(bytes) / double(total), index);
    return std::shared_ptr<void>(nullptr, [index](void*) { cca::setMemoryFraction(1.0, index); });
  }
#endif
  return nullptr;
}

void synchronize(const at::Device& d) {
#ifdef STREAMPLAN_WITH_CUDA
  if (d.is_cuda()) c10::cuda::device_synchronize();
#endif
}

}  // namespace sp::exec
