// The reference consumer: explicit scores, an in-place softmax in fp32 (or fp64), then P V.
#include "exec/consumers/consumer.hpp"

namespace sp::exec::consumers {

namespace {

at::Tensor math(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  at::Tensor s = at::matmul(q, k.transpose(-2, -1));
  at::Tensor p = (s.scalar_type() == at::kFloat || s.scalar_type() == at::kDouble) ? s : s.to(at::kFloat);
  p.mul_(scale);
  p.sub_(std::get<0>(p.max(-1, true)));
  p.exp_();
  p.div_(p.sum(-1, true));
  return at::matmul(p.scalar_type() == q.scalar_type() ? p : p.to(q.scalar_type()), v);
}

// The score matrix in the activation dtype; for reduced dtypes also its fp32 copy (softmax
// runs in place) and the probabilities cast back; the output.
int64_t math_call_bytes(const contracts::AttnShape& s) {
  const int64_t esz = static_cast<int64_t>(ir::dtype_size(s.dtype));
  const int64_t scores = s.heads * s.q_rows * s.kv_rows;
  const bool upcast = s.dtype != ir::DType::F32 && s.dtype != ir::DType::F64;
  // Reduced dtypes: the two batched matmuls' packing buffers on a CPU that packs (one at a time).
  const int64_t operands = std::max(s.q_rows + s.kv_rows, s.q_rows + s.head_dim) * std::max(s.kv_rows, s.head_dim);
  const int64_t packing = upcast ? s.threads * contracts::gemm_packing_per_thread(s.gemm_scratch_per_thread, operands) : 0;
  return scores * (upcast ? esz + 4 + esz : esz) + s.q_rows * s.heads * s.head_dim * esz + packing;
}

}  // namespace

void register_math(contracts::Registry& reg) {
  using contracts::Cap;
  contracts::ConsumerCaps c;
  c.name = "math";
  c.description = "explicit softmax(QK^T)V in fp32 (reference)";
  c.accepts_bounded_q = c.requires_global_k = c.requires_global_v = c.slab_output = Cap::Yes;
  c.dtypes = {ir::DType::F32, ir::DType::BF16, ir::DType::F16, ir::DType::F64};
  c.call_bytes = math_call_bytes;
  c.call_allocations = 4;  // scores, their fp32 copy, the probabilities cast back, output
  c.impl = consumer_from(math);
  reg.add(c);
}

}  // namespace sp::exec::consumers
