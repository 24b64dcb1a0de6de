#include "exec/run/ops.hpp"

#include "exec/kernels/fused.hpp"

namespace sp::exec {

template <typename F>
void Ops::pieces(const ir::Modulation& mod, int64_t row0, int64_t n, F&& f) const {
  if (mod.scope != ir::ModScope::PerSegment) {
    f(0, n, int64_t{-1});
    return;
  }
  int64_t start = 0;
  for (size_t s = 0; s < m_.segments.size(); ++s) {
    const int64_t a = std::max(row0, start), b = std::min(row0 + n, start + m_.segments[s].length);
    if (a < b) f(a - row0, b - a, int64_t(s));
    start += m_.segments[s].length;
  }
}

at::Tensor Ops::mod_rows(const ir::Modulation& mod, int idx, int64_t row0, int64_t len, int64_t segment) const {
  const at::Tensor& t = in_.table(mod.table);
  if (mod.scope == ir::ModScope::PerToken) return t.narrow(0, row0, len).select(1, idx);
  return t.select(0, segment < 0 ? 0 : segment).select(0, idx);
}

template <typename F>
void Ops::mod_pieces(const ir::Modulation& mod, int idx, int64_t row0, int64_t n, F&& f) const {
  pieces(mod, row0, n, [&](int64_t lb, int64_t len, int64_t seg) { f(lb, len, mod_rows(mod, idx, row0 + lb, len, seg)); });
}

void Ops::norm_modulate_fused(const at::Tensor& x_rows, const ir::Norm& n, const ir::Modulation& mod,
                              const ir::ModRef& r, int64_t row0, const at::Tensor& out) const {
  fused::NormArgs args{n.kind == ir::NormKind::LayerNorm, n.eps, {}, {}};
  if (n.affine) {
    args.weight = w_.tensor(n.weight);
    if (!n.bias.empty()) args.bias = w_.tensor(n.bias);
  }
  const bool modulated = mod.scope != ir::ModScope::None;
  pieces(mod, row0, x_rows.size(0), [&](int64_t lb, int64_t len, int64_t seg) {
    const at::Tensor scale = modulated && r.scale >= 0 ? mod_rows(mod, r.scale, row0 + lb, len, seg) : at::Tensor();
    const at::Tensor shift = modulated && r.shift >= 0 ? mod_rows(mod, r.shift, row0 + lb, len, seg) : at::Tensor();
    fused::norm_modulate(x_rows.narrow(0, lb, len), out.narrow(0, lb, len), args, scale, shift);
  });
}

void Ops::qk_norm_rope_fused(const at::Tensor& t, const ir::QkNorm& qn, const std::string& weight,
                             const ir::Rope& rope, const at::Tensor& cos, const at::Tensor& sin,
                             const at::Tensor& out3) const {
  const at::Tensor w = qn.kind == ir::QkNormKind::None ? at::Tensor() : w_.tensor(weight);
  fused::qk_norm_rope(t, out3, qn.kind, qn.eps, w, {rope.style, rope.rotary_dim, cos, sin});
}

void Ops::norm_modulate(const at::Tensor& x_rows, const ir::Norm& n, const ir::Modulation& mod, const ir::ModRef& r,
                        int64_t row0, const at::Tensor& n32, const at::Tensor& stats) const {
  n32.copy_(x_rows);
  at::Tensor rs = stats;
  if (n.kind == ir::NormKind::LayerNorm) {
    at::mean_out(rs, n32, {-1}, true);
    n32.sub_(rs);
  }
  at::linalg_vector_norm_out(rs, n32, 2, {-1}, true);
  rs.square_().div_(double(n32.size(-1))).add_(n.eps).rsqrt_();
  n32.mul_(rs);
  if (n.affine) {
    n32.mul_(w_.tensor(n.weight));
    if (!n.bias.empty()) n32.add_(w_.tensor(n.bias));
  }
  if (mod.scope == ir::ModScope::None) return;
  const int64_t rows = n32.size(0);
  if (r.scale >= 0)
    mod_pieces(mod, r.scale, row0, rows, [&](int64_t lb, int64_t len, const at::Tensor& sc) {
      at::Tensor p = n32.narrow(0, lb, len);
      p.addcmul_(p, sc);
    });
  if (r.shift >= 0)
    mod_pieces(mod, r.shift, row0, rows,
               [&](int64_t lb, int64_t len, const at::Tensor& sh) { n32.narrow(0, lb, len).add_(sh); });
}

void Ops::qk_norm_(const at::Tensor& t32, const ir::QkNorm& qn, const std::string& weight, int64_t heads,
                   int64_t head_dim, const at::Tensor& stats) const {
  if (qn.kind == ir::QkNormKind::None) return;
  const int64_t n = t32.size(0);
  at::Tensor v = qn.kind == ir::QkNormKind::PerHead ? t32.view({n, heads, head_dim}) : t32;
  at::Tensor rs = qn.kind == ir::QkNormKind::PerHead ? stats.view({n, heads, 1}) : stats.view({n, 1});
  at::linalg_vector_norm_out(rs, v, 2, {-1}, true);
  rs.square_().div_(double(v.size(-1))).add_(qn.eps).rsqrt_();
  v.mul_(rs);
  v.mul_(w_.tensor(weight));
}

void Ops::rope_(const at::Tensor& t3, const ir::Rope& r, const at::Tensor& cos, const at::Tensor& sin,
                const at::Tensor& tmp) const {
  const int64_t half = r.rotary_dim / 2;
  at::Tensor a, b;
  if (r.style == ir::RopeStyle::SplitHalf) {
    a = t3.narrow(-1, 0, half);
    b = t3.narrow(-1, half, half);
  } else {
    at::Tensor pairs = t3.narrow(-1, 0, r.rotary_dim).unflatten(-1, {half, 2});
    a = pairs.select(-1, 0);
    b = pairs.select(-1, 1);
  }
  at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  tmp.copy_(a);
  a.mul_(c).addcmul_(b, s, -1);  // a' = a cos - b sin
  b.mul_(c).addcmul_(tmp, s);    // b' = b cos + a sin
}

void Ops::activate_(const at::Tensor& t_in, ir::ActKind a) const {
  at::Tensor t = t_in;  // a handle to the same storage
  switch (a) {
    case ir::ActKind::Gelu: at::gelu_(t); return;
    case ir::ActKind::GeluTanh: at::gelu_(t, "tanh"); return;
    case ir::ActKind::Silu: at::silu_(t); return;
  }
}

void Ops::gated_add(const at::Tensor& x_rows, const at::Tensor& y, const ir::Modulation& mod, const ir::ModRef& r,
                    int64_t row0, bool fused) const {
  if (r.gate < 0 || mod.scope == ir::ModScope::None) {
    if (fused) fused::residual_add(x_rows, y, {});
    else x_rows.add_(y);
    return;
  }
  mod_pieces(mod, r.gate, row0, x_rows.size(0), [&](int64_t lb, int64_t len, const at::Tensor& g) {
    if (fused) fused::residual_add(x_rows.narrow(0, lb, len), y.narrow(0, lb, len), g);
    else x_rows.narrow(0, lb, len).addcmul_(y.narrow(0, lb, len), g);
  });
}

}  // namespace sp::exec
