// ATen's scaled_dot_product_attention, and "whole": the same kernel registered with no
// declared capabilities (the planner must give it complete Q/K/V). On CUDA, 16-bit calls of 128K
// elements or more run cuDNN's fused attention where it passed its self-test and raced no more
// than 5% slower than ATen's own choice, measured once per device, dtype and head_dim
// (docs/attention.md, "sdpa on CUDA"; sdpa_kernel says what was found).
#include "exec/consumers/consumer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#ifdef STREAMPLAN_WITH_CUDA
#include <ATen/native/transformers/cuda/sdp_utils.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace sp::exec {

namespace {

at::Tensor aten_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, scale);
}

#ifdef STREAMPLAN_WITH_CUDA
at::Tensor cudnn_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  return std::get<0>(at::_scaled_dot_product_cudnn_attention(q, k, v, std::nullopt, false, 0.0, false, false, scale));
}

bool cudnn_takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return at::globalContext().userEnabledCuDNNSDP() &&
         sdp::can_use_cudnn_attention(sdp::sdp_params{q, k, v, std::nullopt, 0.0, false, false}, false);
}

// [1, heads, rows, d] as a view of a token-major [1, rows, heads * d] projection, as the
// planner hands Q, K and V to consumers that take strided heads.
at::Tensor token_major(int64_t heads, int64_t rows, int64_t d, const at::TensorOptions& o, at::Generator& gen) {
  return at::randn({1, rows, heads, d}, gen, o.dtype(at::kFloat).device(at::kCPU)).to(o).transpose(1, 2);
}

// The self-test and the race (cuDNN against ATen's own choice at a video model's long K/V);
// returns the choice and what decided it. ATen's own choice follows the process's backend
// priority, which a host may change later: a kernel chosen by name stays chosen.
std::pair<bool, std::string> cudnn_choice_measured(const at::Device& d, at::ScalarType dt, int64_t dim) {
  at::Generator gen = at::detail::createCPUGenerator(4321);
  const auto o = at::TensorOptions().dtype(dt).device(d);
  {
    const at::Tensor q = token_major(3, 130, dim, o, gen), k = token_major(3, 200, dim, o, gen),
                     v = token_major(3, 200, dim, o, gen);
    if (!cudnn_takes(q, k, v)) return {false, "ATen does not take cuDNN attention for these inputs"};
    const double scale = 1.0 / std::sqrt(double(dim));
    const at::Tensor want = at::softmax(at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(-1, -2)) * scale, -1)
                                .matmul(v.to(at::kFloat));
    const double e = self_test_rel_l2(cudnn_sdpa(q, k, v, scale), want);
    if (!(e <= 2e-2)) return {false, "cuDNN attention failed its self-test (rel L2 " + std::to_string(e) + " > 0.02)"};
  }
  const at::Tensor q = token_major(8, 4096, dim, o, gen), k = token_major(8, 16384, dim, o, gen),
                   v = token_major(8, 16384, dim, o, gen);
  auto seconds = [&](auto&& f) {
    f(q, k, v, 0.1);
    c10::cuda::getCurrentCUDAStream(d.index()).synchronize();
    std::vector<double> t;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int j = 0; j < 3; ++j) f(q, k, v, 0.1);
      c10::cuda::getCurrentCUDAStream(d.index()).synchronize();
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[1];
  };
  const double aten = seconds(aten_sdpa), cudnn = seconds(cudnn_sdpa);
  std::ostringstream why;
  why << std::fixed << std::setprecision(2) << aten / cudnn << "x ATen's own choice at 8 heads, 4096 x 16384 rows";
  return {cudnn <= aten * 1.05, why.str()};
}

struct CudnnChoice {
  bool use = false;
  std::string why;
};

// Per device, dtype and head_dim, once per process (never destroyed: read at exit).
const CudnnChoice& cudnn_choice(const at::Device& d, at::ScalarType dt, int64_t dim) {
  static std::mutex mu;
  static auto* made = new std::map<std::tuple<int, int, int64_t>, CudnnChoice>;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(int(d.index()), int(dt), dim);
  auto it = made->find(key);
  if (it == made->end()) {
    CudnnChoice c;
    try {
      std::tie(c.use, c.why) = cudnn_choice_measured(d, dt, dim);
    } catch (const std::exception& e) {
      const std::string m = e.what();
      c.why = "cuDNN attention failed its self-test: " + m.substr(0, m.find('\n'));
    }
    it = made->emplace(key, std::move(c)).first;
  }
  return it->second;
}
#endif

// Calls with fewer query elements take ATen's own choice: cuDNN's fixed cost per call is not
// worth it there.
constexpr int64_t kCudnnMinElements = 128 * 1024;

}  // namespace

double self_test_rel_l2(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor w = want.to(at::kFloat);
  return (got.to(at::kFloat) - w).norm().item<double>() / std::max(w.norm().item<double>(), 1e-30);
}

at::Tensor sdpa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
#ifdef STREAMPLAN_WITH_CUDA
  if (q.is_cuda() && q.numel() >= kCudnnMinElements && (q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf) &&
      cudnn_choice(q.device(), q.scalar_type(), q.size(-1)).use && cudnn_takes(q, k, v))
    return cudnn_sdpa(q, k, v, scale);
#endif
  return aten_sdpa(q, k, v, scale);
}

namespace {

// The output and the rows' log-sum-exp from the kernel that computes both: on the CPU ATen's
// flash kernel (the one scaled_dot_product_attention takes there), on CUDA flash attention or
// else the memory-efficient kernel (whose log-sum-exp is padded to 32 rows); explicit scores
// where neither takes the inputs (fp64 on CUDA).
std::pair<at::Tensor, at::Tensor> sdpa_attention_lse(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     double scale) {
  if (q.is_cpu()) {
    auto [o, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, false, std::nullopt, scale);
    return {o, lse};
  }
#ifdef STREAMPLAN_WITH_CUDA
  const sdp::sdp_params params{q, k, v, std::nullopt, 0.0, false, false};
  if (sdp::can_use_flash_attention(params, false)) {
    auto r = at::_scaled_dot_product_flash_attention(q, k, v, 0.0, false, false, scale);
    return {std::get<0>(r), std::get<1>(r)};
  }
  if (sdp::can_use_mem_efficient_attention(params, false)) {
    auto r = at::_scaled_dot_product_efficient_attention(q, k, v, std::nullopt, true, 0.0, false, scale);
    return {std::get<0>(r), std::get<1>(r).narrow(2, 0, q.size(2))};
  }
#endif
  return math_attention_lse(q, k, v, scale);
}

struct SdpaConsumer : ConsumerImpl {
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) const override {
    return sdpa_attention(q, k, v, scale);
  }
  std::pair<at::Tensor, at::Tensor> attend_lse(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               double scale) const override {
    return sdpa_attention_lse(q, k, v, scale);
  }
};

}  // namespace

std::string sdpa_kernel(const at::Device& device, at::ScalarType dtype, int64_t head_dim) {
#ifdef STREAMPLAN_WITH_CUDA
  if (device.is_cuda() && (dtype == at::kBFloat16 || dtype == at::kHalf)) {
    const CudnnChoice& c = cudnn_choice(device, dtype, head_dim);
    return c.use ? "cuDNN fused attention (" + c.why + ")" : "ATen's own choice (cuDNN not used: " + c.why + ")";
  }
#endif
  return "ATen's own choice";
}

namespace {

// Output is one Q-sized slab plus the row log-sum-exp (fp32) the fused kernels keep. On the
// CPU the flash kernel adds per-thread tiles: a q-split x kv-split score tile, row max/sum,
// an output accumulator (fp32), and for reduced dtypes a reduced copy of the score tile.
// The split sizes mirror the kernel's own choice (256/64/32 query rows by length, 512 keys).
int64_t sdpa_call_bytes(const contracts::AttnShape& s) {
  const int64_t esz = static_cast<int64_t>(ir::dtype_size(s.dtype));
  int64_t bytes = s.q_rows * s.heads * s.head_dim * esz + s.heads * s.q_rows * 4;
  if (s.device == contracts::DeviceKind::CPU) {
    const int64_t qs = std::min<int64_t>(s.q_rows, s.q_rows >= 768 ? 256 : (s.q_rows >= 192 ? 64 : 32));
    const int64_t ks = s.kv_rows >= 512 ? 512 : s.kv_rows;
    int64_t per_thread = (qs * ks + 2 * qs + qs * s.head_dim) * 4;
    // Reduced dtypes: a reduced copy of the score tile, and on CPUs with packed bf16/fp16
    // GEMMs (AMX, AVX512-BF16) their packing tiles (DeviceCaps::gemm_scratch).
    if (s.dtype != ir::DType::F32 && s.dtype != ir::DType::F64)
      per_thread += qs * ks * esz +
                    contracts::gemm_packing_per_thread(s.gemm_scratch_per_thread, (qs + s.head_dim) * ks + qs * s.head_dim);
    bytes += per_thread * s.threads;
  }
  return bytes;
}

}  // namespace

namespace consumers {

void register_sdpa(contracts::Registry& reg) {
  using contracts::Cap;
  const std::set<ir::DType> floats = {ir::DType::F32, ir::DType::BF16, ir::DType::F16, ir::DType::F64};
  contracts::ConsumerCaps c;
  c.name = "sdpa";
  c.description = "ATen scaled_dot_product_attention (on CUDA cuDNN's where it passed its self-test and ran no slower)";
  c.accepts_bounded_q = c.requires_global_k = c.requires_global_v = c.slab_output = Cap::Yes;
  c.strided_heads = Cap::Yes;  // its flash, cuDNN and CPU kernels read strided heads in place
  c.lse = Cap::Yes;
  c.positions = Cap::No;  // no mask, no bias: a softmax over the keys in whatever order
  c.dtypes = floats;
  c.call_bytes = sdpa_call_bytes;
  c.impl = std::make_shared<SdpaConsumer>();
  reg.add(c);

  contracts::ConsumerCaps whole;
  whole.name = "whole";
  whole.description = "an attention kernel that declares no capabilities (needs complete Q/K/V)";
  whole.dtypes = floats;
  whole.call_bytes = sdpa_call_bytes;
  whole.impl = c.impl;
  reg.add(whole);
}

}  // namespace consumers
}  // namespace sp::exec
