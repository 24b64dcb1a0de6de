// The reference consumer: explicit scores, an in-place softmax in fp32 (or fp64), then P V.
#include "exec/consumers/consumer.hpp"

namespace sp::exec {

namespace {

// The probabilities in fp32 (or fp64) in place of the scores; with `lse` also each row's
// log-sum-exp of the scaled scores.
at::Tensor probabilities(const at::Tensor& q, const at::Tensor& k, double scale, at::Tensor* lse) {
  at::Tensor s = at::matmul(q, k.transpose(-2, -1));
  at::Tensor p = (s.scalar_type() == at::kFloat || s.scalar_type() == at::kDouble) ? s : s.to(at::kFloat);
  p.mul_(scale);
  const at::Tensor max = std::get<0>(p.max(-1, true));
  p.sub_(max);
  p.exp_();
  const at::Tensor sum = p.sum(-1, true);
  if (lse) *lse = (sum.log() + max).squeeze(-1);
  return p.div_(sum);
}

at::Tensor times_v(const at::Tensor& p, const at::Tensor& q, const at::Tensor& v) {
  return at::matmul(p.scalar_type() == q.scalar_type() ? p : p.to(q.scalar_type()), v);
}

struct MathConsumer : ConsumerImpl {
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) const override {
    return times_v(probabilities(q, k, scale, nullptr), q, v);
  }
  std::pair<at::Tensor, at::Tensor> attend_lse(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               double scale) const override {
    return math_attention_lse(q, k, v, scale);
  }
};

// The score matrix in the activation dtype; for reduced dtypes its fp32 copy (softmax runs in
// place; the scores are freed before) and the probabilities cast back; the output.
int64_t math_call_bytes(const contracts::AttnShape& s) {
  const int64_t esz = static_cast<int64_t>(ir::dtype_size(s.dtype));
  const int64_t scores = s.heads * s.q_rows * s.kv_rows;
  const bool upcast = s.dtype != ir::DType::F32 && s.dtype != ir::DType::F64;
  // Reduced dtypes: the two batched matmuls' packing buffers on a CPU that packs (one at a time).
  const int64_t operands = std::max(s.q_rows + s.kv_rows, s.q_rows + s.head_dim) * std::max(s.kv_rows, s.head_dim);
  const int64_t packing = upcast ? s.threads * contracts::gemm_packing_per_thread(s.gemm_scratch_per_thread, operands) : 0;
  return scores * (upcast ? 4 + esz : esz) + s.q_rows * s.heads * s.head_dim * esz + packing;
}

}  // namespace

std::pair<at::Tensor, at::Tensor> math_attention_lse(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     double scale) {
  at::Tensor lse;
  at::Tensor o = times_v(probabilities(q, k, scale, &lse), q, v);
  return {o, lse};
}

namespace consumers {

void register_math(contracts::Registry& reg) {
  using contracts::Cap;
  contracts::ConsumerCaps c;
  c.name = "math";
  c.description = "explicit softmax(QK^T)V in fp32 (reference)";
  c.accepts_bounded_q = c.requires_global_k = c.requires_global_v = c.slab_output = Cap::Yes;
  c.lse = Cap::Yes;
  c.positions = Cap::No;  // no mask, no bias: a softmax over the keys in whatever order
  c.dtypes = {ir::DType::F32, ir::DType::BF16, ir::DType::F16, ir::DType::F64};
  c.call_bytes = math_call_bytes;
  c.call_allocations = 3;  // the fp32 probabilities, their cast back, the output (the scores before)
  c.impl = std::make_shared<MathConsumer>();
  reg.add(c);
}

}  // namespace consumers
}  // namespace sp::exec
