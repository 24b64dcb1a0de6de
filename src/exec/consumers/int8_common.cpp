#include "exec/consumers/int8_common.hpp"

#include <cmath>
#include <map>
#include <mutex>
#include <sstream>

#include "exec/consumers/block_sparse.hpp"
#include "exec/consumers/consumer.hpp"
#include "exec/consumers/sparse.hpp"

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
    const auto qt = int8attn::quantize_q(q, scale, kc);
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

struct Carrier {
  int8attn::KCarrier k;
  uint64_t phase = 0;  // increases with every new K
};

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

// The [G, rows, D] view of the consumer interface's [1, G, rows, D] tensor.
at::Tensor heads_rows(const at::Tensor& t, const char* what, const std::string& consumer) {
  if (t.dim() != 4 || t.size(0) != 1)
    throw contracts::ContractError(
        c10::str("consumer '", consumer, "': ", what, " must be [1, heads, rows, head_dim], got ", t.sizes()));
  return t.select(0, 0);
}

// Throws contracts::ContractError unless the int8 kernels run on q's device.
void require(const std::string& consumer, const at::Tensor& q) {
  const std::string who = "consumer '" + consumer + "' (int8 attention kernels)";
  if (!int8attn::built()) throw contracts::ContractError(who + " needs CUDA; this build has no CUDA kernels");
  if (!q.is_cuda())
    throw contracts::ContractError(c10::str(who, " needs a CUDA device; the attention runs on ", q.device()));
  if (q.scalar_type() != at::kBFloat16 && q.scalar_type() != at::kHalf)
    throw contracts::ContractError(c10::str(who, " takes bf16 or fp16 activations; q has dtype ", q.scalar_type()));
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

// require()'s reason for `device` and `dtype`, or "" where the kernels run there.
std::string unusable(const std::string& consumer, const at::Device& device, at::ScalarType dtype) {
  try {
    require(consumer, at::empty({1, 0, 64}, at::TensorOptions().dtype(dtype).device(device)));
  } catch (const contracts::ContractError& e) {
    return e.what();
  }
  return {};
}

// k [G, kv_rows, D]: the cached carrier of this K, or a new one.
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

// After a Q slab of rows [q_begin, q_begin + q_rows): frees the cached carrier once the slab
// reaches row kv_rows, the end of a self-attention over rows [0, kv_rows) (elsewhere it may
// free it early, which only costs a new carrier).
void after_slab(int64_t q_begin, int64_t q_rows, int64_t kv_rows) {
  if (q_begin + q_rows >= kv_rows) drop_carrier();
}

// The K carrier a K/V phase fills slab by slab in `bytes` ([G, n] int8 of the arena): carry_k
// quantizes the slab k [1, G, rows, D] at row0 (the first slab starts a new phase); carried views
// the filled carrier with the phase of its last first slab.
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

struct Int8Consumer : ConsumerImpl {
  Int8Consumer(std::string name, bool routed) : name(std::move(name)), routed(routed) {}
  std::string unusable(const at::Device& d, at::ScalarType dt) const override { return int8c::unusable(name, d, dt); }
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) const override {
    if (routed) return attend_rows(q, k, v, scale, {});
    const at::Tensor q3 = checked_q(q);
    return attend_with(q3, carrier_for(heads_rows(k, "k", name)), v, scale, {});
  }
  at::Tensor attend_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                         const contracts::AttnCall& call) const override {
    const at::Tensor q3 = checked_q(q);
    const Carrier kc = carrier_for(heads_rows(k, "k", name));
    at::Tensor o = attend_with(q3, kc, v, scale, call);
    after_slab(call.q_begin, q3.size(1), kc.k.rows);
    return o;
  }
  void carry_k(const at::Tensor& k, const at::Tensor& carrier, int64_t row0, int64_t kv_rows) const override {
    int8c::carry_k(name, k, carrier, row0, kv_rows);
  }
  at::Tensor attend_carried(const at::Tensor& q, const at::Tensor& carrier, const at::Tensor& v, double scale,
                            const contracts::AttnCall& call, int64_t kv_rows) const override {
    const at::Tensor q3 = checked_q(q);
    return attend_with(q3, carried(carrier, kv_rows, q3.size(2)), v, scale, call);
  }

  // q's [G, rows, D] view, once the kernels are known to run it.
  at::Tensor checked_q(const at::Tensor& q) const {
    const at::Tensor q3 = heads_rows(q, "q", name);
    require(name, q3);
    return q3;
  }
  // The attention of q3 [G, rows, D] against a K carrier; routed: its phase's figures counted.
  at::Tensor attend_with(const at::Tensor& q3, const Carrier& kc, const at::Tensor& v, double scale,
                         const contracts::AttnCall& call) const {
    const int8attn::QTiles qt = int8attn::quantize_q(q3, scale, kc.k);
    if (!routed) return int8attn::attend(qt, kc.k, heads_rows(v, "v", name), {}).unsqueeze(0);
    const RoutedTiles r = route_slab(qt.tile_mean, kc.k.tile_mean, qt.rows, kc.k.rows, call);
    at::Tensor o = int8attn::attend(qt, kc.k, heads_rows(v, "v", name), {r.offsets, r.indices}).unsqueeze(0);
    if (SparseTally* t = SparseTally::current()) t->add({kc.k.rows, r.visited, r.tiles}, kc.phase);
    return o;
  }

  std::string name;
  bool routed;
};

}  // namespace

contracts::ConsumerCaps caps(const std::string& name, const std::string& description, bool routed) {
  using contracts::Cap;
  contracts::ConsumerCaps c;
  c.name = name;
  c.description = description;
  c.accepts_bounded_q = c.requires_global_k = c.requires_global_v = c.slab_output = Cap::Yes;
  c.dtypes = {ir::DType::BF16, ir::DType::F16};
  c.call_bytes = call_bytes;
  c.call_allocations = 3;  // output, quantized Q; uncarried K: its carrier (scales and samples are small)
  c.k_carrier_bytes = int8attn::k_carrier_bytes;
  c.k_carrier_align = int8attn::kTile;
  c.impl = std::make_shared<Int8Consumer>(name, routed);
  return c;
}

void drop_carrier() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  st.cached = {};
  st.sample = at::Tensor();
  st.ptr = nullptr;
  st.shape.clear();
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
