// ATen's scaled_dot_product_attention, and "whole": the same kernel registered with no
// declared capabilities (an attention kernel the planner must treat as needing complete
// Q/K/V).
#include "exec/consumers/consumer.hpp"

namespace sp::exec {

namespace {

struct FnConsumer : ConsumerImpl {
  explicit FnConsumer(AttentionFn f) : fn(std::move(f)) {}
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) const override {
    return fn(q, k, v, scale);
  }
  AttentionFn fn;
};

at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, scale);
}

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
    if (s.dtype != ir::DType::F32 && s.dtype != ir::DType::F64) per_thread += qs * ks * esz + s.gemm_scratch_per_thread;
    bytes += per_thread * s.threads;
  }
  return bytes;
}

}  // namespace

std::shared_ptr<const ConsumerImpl> consumer_from(AttentionFn fn) {
  return std::make_shared<FnConsumer>(std::move(fn));
}

namespace consumers {

void register_sdpa(contracts::Registry& reg) {
  using contracts::Cap;
  const std::set<ir::DType> floats = {ir::DType::F32, ir::DType::BF16, ir::DType::F16, ir::DType::F64};
  contracts::ConsumerCaps c;
  c.name = "sdpa";
  c.description = "ATen scaled_dot_product_attention (flash / cuDNN / memory-efficient / math)";
  c.accepts_bounded_q = c.requires_global_k = c.requires_global_v = c.slab_output = Cap::Yes;
  c.strided_heads = Cap::Yes;  // its flash, cuDNN and CPU kernels read strided heads in place
  c.dtypes = floats;
  c.call_bytes = sdpa_call_bytes;
  c.impl = consumer_from(sdpa);
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
