#include "exec/consumers/int8_common.hpp"

#include <cmath>
#include <map>
#include <mutex>
#include <sstream>

#include "exec/consumers/block_sparse.hpp"
#include "exec/consumers/consumer.hpp"

#ifdef STREAMPLAN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace sp::exec::int8c {

namespace {

constexpr int64_t kSampleRows = 64;

// Dense and sparse int8 attention against the fp32 references; "" when they agree.
std::string self_test_or_throw(const at::Device& d) {
  std::ostringstream failed;
  at::Generator gen = at::detail::createCPUGenerator(1234);
  for (int64_t dim : {64, 128}) {
    const auto opt = at::TensorOptions().dtype(at::kBFloat16);
    const at::Tensor q = at::randn({3, 130, dim}, gen, opt.dtype(at::kFloat)).to(at::kBFloat16).to(d);
    const at::Tensor k = (at::randn({3, 200, dim}, gen, opt.dtype(at::kFloat)) + 2).to(at::kBFloat16).to(d);
    const at::Tensor v = at::randn({3, 200, dim}, gen, opt.dtype(at::kFloat)).to(at::kBFloat16).to(d);
    const double scale = 1.0 / std::sqrt(double(dim));
    const auto kc = int8attn::quantize_k(k);
    const auto qt = int8attn::quantize_q(q, scale);
    // Dense against all tiles; sparse against every other key tile (at least one per row).
    const at::Tensor all = at::ones({3, 3, 4}, at::TensorOptions().dtype(at::kBool));
    at::Tensor half = at::zeros_like(all);
    half.select(2, 0).fill_(true);
    half.select(2, 2).fill_(true);
    half[1][2][3] = true;
    for (const at::Tensor& keep : {all, half}) {
      int8attn::TileList tl;
      if (!keep.all().item<bool>()) {
        const at::Tensor counts = keep.sum(2).flatten().to(at::kInt);
        tl.offsets = at::cat({at::zeros({1}, counts.options()), counts.cumsum(0).to(at::kInt)}).to(d);
        tl.indices = keep.nonzero().select(1, 2).to(at::kInt).contiguous().to(d);
      }
      const at::Tensor got = int8attn::attend(qt, kc, v, tl);
      const at::Tensor want = block_sparse_reference(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat),
                                                     keep.to(d), scale);
      const double e = self_test_rel_l2(got, want);
      if (!(e <= 2e-2))
        failed << (failed.tellp() ? "; " : "") << (tl.offsets.defined() ? "sparse" : "dense") << " head_dim " << dim
               << ": rel L2 " << e << " > 0.02";
    }
  }
  return failed.str();
}

// "" when the kernels agree with the references on this device, else what failed (a kernel
// that does not launch, e.g. built for other architectures, fails it too).
std::string self_test(const at::Device& d) {
  try {
    return self_test_or_throw(d);
  } catch (const c10::Error& e) {
    const std::string m = e.what_without_backtrace();
    return m.substr(0, m.find('\n'));
  } catch (const std::exception& e) {
    return e.what();
  }
}

// Never destroyed: its tensors must not be freed after the CUDA runtime at exit.
struct State {
  std::mutex mu;
  std::map<int, std::string> tested;  // device index -> self-test result ("" passed)
  Carrier cached;
  at::Tensor sample;
  const void* ptr = nullptr;
  std::vector<int64_t> shape;
  uint64_t phases = 0;
  uint64_t carried_phase = 0;  // the phase of the carrier a K/V phase filled last
};
State& state() {
  static State* s = new State;
  return *s;
}

at::Tensor sample_of(const at::Tensor& k) {
  const int64_t rows = k.size(1), n = std::min<int64_t>(rows, kSampleRows);
  const at::Tensor idx = at::linspace(0, double(rows - 1), n, k.options().dtype(at::kDouble)).to(at::kLong);
  return k.index_select(1, idx);
}

}  // namespace

at::Tensor heads_rows(const at::Tensor& t, const char* what, const std::string& consumer) {
  if (t.dim() != 4 || t.size(0) != 1) {
    std::ostringstream os;
    os << "consumer '" << consumer << "': " << what << " must be [1, heads, rows, head_dim], got " << t.sizes();
    throw contracts::ContractError(os.str());
  }
  return t.select(0, 0);
}

std::string unusable(const std::string& consumer, const at::Device& device, at::ScalarType dtype) {
  try {
    require(consumer, at::empty({1, 0, 64}, at::TensorOptions().dtype(dtype).device(device)));
  } catch (const contracts::ContractError& e) {
    return e.what();
  }
  return {};
}

void require(const std::string& consumer, const at::Tensor& q) {
  const std::string who = "consumer '" + consumer + "' (int8 attention kernels)";
  if (!int8attn::built()) throw contracts::ContractError(who + " needs CUDA; this build has no CUDA kernels");
  if (!q.is_cuda()) {
    std::ostringstream os;
    os << who << " needs a CUDA device; the attention runs on " << q.device();
    throw contracts::ContractError(os.str());
  }
  if (q.scalar_type() != at::kBFloat16 && q.scalar_type() != at::kHalf) {
    std::ostringstream os;
    os << who << " takes bf16 or fp16 activations; q has dtype " << q.scalar_type();
    throw contracts::ContractError(os.str());
  }
  if (q.size(-1) != 64 && q.size(-1) != 128)
    throw contracts::ContractError(who + " takes head_dim 64 or 128, got " + std::to_string(q.size(-1)));
#ifdef STREAMPLAN_WITH_CUDA
  const int index = q.device().index();
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(index);
  if (prop->major < 8)
    throw contracts::ContractError(who + " needs sm_80 or newer; " + prop->name + " is sm_" +
                                   std::to_string(prop->major) + std::to_string(prop->minor));
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  auto it = st.tested.find(index);
  if (it == st.tested.end()) it = st.tested.emplace(index, self_test(q.device())).first;
  if (!it->second.empty())
    throw contracts::ContractError(who + " failed its self-test on " + prop->name + ": " + it->second);
#endif
}

Carrier carrier_for(const at::Tensor& k) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  std::vector<int64_t> shape(k.sizes().begin(), k.sizes().end());
  shape.insert(shape.end(), k.strides().begin(), k.strides().end());
  const at::Tensor sample = sample_of(k);
  const bool hit = st.ptr == k.data_ptr() && st.shape == shape && st.sample.defined() &&
                   st.sample.device() == k.device() && st.sample.scalar_type() == k.scalar_type() &&
                   at::equal(st.sample, sample);
  if (!hit) {
    st.cached = {};  // the old carrier goes before the new one is made
    st.cached.k = int8attn::quantize_k(k);
    st.cached.phase = ++st.phases;
    st.sample = sample;
    st.ptr = k.data_ptr();
    st.shape = shape;
  }
  return st.cached;
}

void drop_carrier() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  st.cached = {};
  st.sample = at::Tensor();
  st.ptr = nullptr;
  st.shape.clear();
}

void after_slab(int64_t q_begin, int64_t q_rows, int64_t kv_rows) {
  if (q_begin + q_rows >= kv_rows) drop_carrier();
}

void carry_k(const std::string& consumer, const at::Tensor& k, const at::Tensor& bytes, int64_t row0, int64_t kv_rows) {
  const at::Tensor k3 = heads_rows(k, "k", consumer);
  require(consumer, k3);
  const int8attn::KCarrier c = int8attn::carrier_view(bytes, k3.size(0), kv_rows, k3.size(2));
  int8attn::quantize_k_rows(k3, c, row0);
  if (row0 == 0) {
    State& st = state();
    std::lock_guard<std::mutex> lock(st.mu);
    st.carried_phase = ++st.phases;
  }
}

Carrier carried(const at::Tensor& bytes, int64_t kv_rows, int64_t head_dim) {
  Carrier c;
  c.k = int8attn::carrier_view(bytes, bytes.size(0), kv_rows, head_dim);
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  c.phase = st.carried_phase;
  return c;
}

void declare_carrier(contracts::ConsumerCaps& c) {
  c.k_carrier_bytes = int8attn::k_carrier_bytes;
  c.k_carrier_align = int8attn::kTile;
}

int64_t call_bytes(const contracts::AttnShape& s) {
  // Grouped-query heads arrive as kv_heads groups of rep x q_rows rows. Uncarried K: the
  // cached carrier and two K samples (the cached one and the call's).
  const int64_t esz = static_cast<int64_t>(ir::dtype_size(s.dtype));
  const int64_t g = s.kv_heads > 0 ? s.kv_heads : s.heads, rows = s.q_rows * (s.heads / g);
  const int64_t own = g * rows * s.head_dim * esz + int8attn::q_tiles_bytes(g, rows, s.head_dim);
  if (s.k_carried) return own;
  return own + int8attn::k_carrier_bytes(g, s.kv_rows, s.head_dim) +
         2 * g * std::min<int64_t>(s.kv_rows, kSampleRows) * s.head_dim * esz;
}

}  // namespace sp::exec::int8c
