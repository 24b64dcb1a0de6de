// "int8": dense attention with Q and K quantized to int8 per 64-row tile (K smoothed by its
// per-head mean) and P·V in 16 bits (kernels/int8_attention.cuh). CUDA only, sm_80 or newer.
#include "exec/consumers/consumer.hpp"
#include "exec/consumers/int8_common.hpp"

namespace sp::exec::consumers {

namespace {

struct Int8Consumer : ConsumerImpl {
  std::string unusable(const at::Device& d, at::ScalarType dt) const override { return int8c::unusable("int8", d, dt); }
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) const override {
    const at::Tensor q3 = int8c::heads_rows(q, "q", "int8");
    int8c::require("int8", q3);
    const int8c::Carrier kc = int8c::carrier_for(int8c::heads_rows(k, "k", "int8"));
    return int8attn::attend(int8attn::quantize_q(q3, scale), kc.k, int8c::heads_rows(v, "v", "int8"), {}).unsqueeze(0);
  }
  at::Tensor attend_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                         const contracts::AttnCall& call) const override {
    at::Tensor o = attend(q, k, v, scale);
    int8c::after_slab(call.q_begin, q.size(2), k.size(2));
    return o;
  }
  void carry_k(const at::Tensor& k, const at::Tensor& carrier, int64_t row0, int64_t kv_rows) const override {
    int8c::carry_k("int8", k, carrier, row0, kv_rows);
  }
  at::Tensor attend_carried(const at::Tensor& q, const at::Tensor& carrier, const at::Tensor& v, double scale,
                            const contracts::AttnCall&, int64_t kv_rows) const override {
    const at::Tensor q3 = int8c::heads_rows(q, "q", "int8");
    int8c::require("int8", q3);
    const int8c::Carrier kc = int8c::carried(carrier, kv_rows, q3.size(2));
    return int8attn::attend(int8attn::quantize_q(q3, scale), kc.k, int8c::heads_rows(v, "v", "int8"), {}).unsqueeze(0);
  }
};

}  // namespace

void register_int8_attention(contracts::Registry& reg) {
  using contracts::Cap;
  contracts::ConsumerCaps c;
  c.name = "int8";
  c.description = "INT8 QK^T (per-tile scales, smoothed K), 16-bit PV on tensor cores; CUDA sm_80+, head_dim 64/128";
  c.accepts_bounded_q = c.requires_global_k = c.requires_global_v = c.slab_output = Cap::Yes;
  c.dtypes = {ir::DType::BF16, ir::DType::F16};
  c.call_bytes = int8c::call_bytes;
  c.call_allocations = 3;  // output, quantized Q; uncarried K: its carrier (scales and samples are small)
  int8c::declare_carrier(c);
  c.impl = std::make_shared<Int8Consumer>();
  reg.add(c);
}

}  // namespace sp::exec::consumers
