// The "lora" patch: capabilities and implementation (see lora.hpp).
#include "exec/patches/lora.hpp"

#include "exec/consumers/consumer.hpp"

namespace sp::exec {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

}  // namespace

void LoraImpl::apply(const WeightSource& w, const ir::LoraAdapter& a, Slice rows, Slice cols, const at::Tensor& x,
                     const at::Tensor& out, const at::Tensor& ax) const {
  // Projected rows j (begin + j * step) that the adapter covers: k_lo <= j < k_hi.
  const int64_t len = rows.length < 0 ? out.size(1) : rows.length;
  const int64_t k_lo = std::max<int64_t>(0, ceil_div(a.row_offset - rows.begin, rows.step));
  const int64_t k_hi = std::min(len, ceil_div(a.row_offset + a.rows - rows.begin, rows.step));
  if (k_lo >= k_hi) return;
  const at::ScalarType dt = out.scalar_type();
  const at::Tensor A = slice(w.tensor(a.a), 1, cols).to(dt);
  const at::Tensor B = slice(w.tensor(a.b), 0, {rows.begin + k_lo * rows.step - a.row_offset, k_hi - k_lo, rows.step}).to(dt);
  const int64_t n = x.size(0);
  at::Tensor xa = ax.view(-1).narrow(0, 0, n * a.rank).view({n, a.rank});
  at::mm_out(xa, x, A.t());
  out.narrow(1, k_lo, k_hi - k_lo).addmm_(xa, B.t(), 1, a.scale);
}

at::Tensor LoraImpl::merged(const WeightSource& w, const ir::Linear& l, const at::Tensor& base) const {
  at::Tensor out = base.clone();
  for (const ir::LoraAdapter& a : l.loras) {
    const at::Tensor d = at::mm(w.tensor(a.b).to(at::kDouble), w.tensor(a.a).to(at::kDouble)).mul_(a.scale);
    out.narrow(0, a.row_offset, a.rows).add_(d.to(out.scalar_type()));
  }
  return out;
}

namespace patches {

void register_lora(contracts::Registry& reg) {
  using contracts::Cap;
  contracts::PatchCaps p;
  p.name = "lora";
  p.description =
      "low-rank weight update y += s * B(A x), per projection slab after the base projection; input-feature slices "
      "each add their partial B(A_slice x_slice), which sums to B(A x)";
  // It edits projections, not one of the tensor roles: the LoRA step follows every projection
  // of a weight that carries adapters, so no role-based patch step applies it.
  p.row_local = Cap::Yes;
  p.feature_local = Cap::Yes;
  p.impl = std::make_shared<LoraImpl>();
  reg.add(p);
}

}  // namespace patches
}  // namespace sp::exec
