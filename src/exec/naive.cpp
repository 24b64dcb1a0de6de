// The naive schedule: every IR op on full tensors, the way the original model computes
// it. It is the reference every planned schedule is tested against, so it is kept as
// plain as possible and shares no slab machinery with bounded.cpp.
#include <cmath>
#include <stdexcept>

#include "exec/consumers.hpp"
#include "exec/executor.hpp"
#include "exec/patches.hpp"

namespace sp::exec {

const at::Tensor& Inputs::table(const std::string& name) const {
  auto it = tables.find(name);
  if (it == tables.end()) throw std::invalid_argument("input table '" + name + "' is missing");
  return it->second;
}

namespace {

std::string shape_str(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

void expect_shape(const std::string& what, const at::Tensor& t, std::vector<int64_t> shape) {
  if (!t.defined()) throw std::invalid_argument(what + ": missing");
  if (t.sizes().vec() != shape) {
    std::string want = "[";
    for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
    throw std::invalid_argument(what + ": expected shape " + want + "], got " + shape_str(t));
  }
}

struct Ctx {
  const ir::Model& m;
  const WeightSource& w;
  const Inputs& in;
  const contracts::Registry& reg;
  at::ScalarType dt;
};

at::Tensor linear(const Ctx& c, const ir::Linear& l, const at::Tensor& x, at::ScalarType dt) {
  at::Tensor w = c.w.acquire(l, {}, {}, c.reg.format(l.format).dense ? c.dt : dt).to(dt);
  at::Tensor b = l.bias.empty() ? at::Tensor() : c.w.tensor(l.bias).to(dt);
  return at::linear(x.to(dt), w, b);
}

// Per-token [T, count, dim] view of a block's modulation table.
at::Tensor per_token_mod(const Ctx& c, const ir::Modulation& mod) {
  const at::Tensor& t = c.in.table(mod.table);
  if (mod.scope == ir::ModScope::PerToken) return t;
  std::vector<int64_t> lens;
  for (const auto& s : c.m.segments) lens.push_back(s.length);
  return t.repeat_interleave(at::tensor(lens).to(t.device()), 0);
}

at::Tensor norm(const Ctx& c, const ir::Norm& n, const at::Tensor& x) {
  at::Tensor x32 = c.dt == at::kDouble ? x : x.to(at::kFloat);
  const auto ft = x32.scalar_type();
  at::Tensor w = n.affine ? c.w.tensor(n.weight).to(ft) : at::Tensor();
  if (n.kind == ir::NormKind::LayerNorm) {
    at::Tensor b = (n.affine && !n.bias.empty()) ? c.w.tensor(n.bias).to(ft) : at::Tensor();
    return at::layer_norm(x32, {x.size(-1)}, w, b, n.eps);
  }
  at::Tensor y = x32 * at::rsqrt(x32.pow(2).mean(-1, true) + n.eps);
  return n.affine ? y * w : y;
}

// norm, then shift/scale modulation, cast back to the activation dtype.
at::Tensor norm_mod(const Ctx& c, const ir::Norm& n, const ir::Modulation& mod, const ir::ModRef& r,
                    const at::Tensor& x) {
  at::Tensor y = norm(c, n, x);
  if (mod.scope != ir::ModScope::None) {
    at::Tensor t = per_token_mod(c, mod).to(y.scalar_type());
    if (r.scale >= 0) y = y * (1 + t.select(1, r.scale));
    if (r.shift >= 0) y = y + t.select(1, r.shift);
  }
  return y;
}

at::Tensor rope(const at::Tensor& x, const ir::Rope& r, const at::Tensor& cos, const at::Tensor& sin) {
  // x: [T, heads, head_dim]
  if (r.style == ir::RopeStyle::None) return x;
  const int64_t half = r.rotary_dim / 2;
  at::Tensor rot = x.narrow(-1, 0, r.rotary_dim), pass = x.narrow(-1, r.rotary_dim, x.size(-1) - r.rotary_dim);
  at::Tensor c = cos.unsqueeze(1).to(x.scalar_type()), s = sin.unsqueeze(1).to(x.scalar_type());
  at::Tensor out;
  if (r.style == ir::RopeStyle::SplitHalf) {
    at::Tensor a = rot.narrow(-1, 0, half), b = rot.narrow(-1, half, half);
    out = at::cat({a * c - b * s, b * c + a * s}, -1);
  } else {
    at::Tensor pairs = rot.unflatten(-1, {half, 2});
    at::Tensor a = pairs.select(-1, 0), b = pairs.select(-1, 1);
    out = at::stack({a * c - b * s, b * c + a * s}, -1).flatten(-2);
  }
  return at::cat({out, pass}, -1);
}

at::Tensor qk_norm(const Ctx& c, const ir::QkNorm& qn, const std::string& weight, const at::Tensor& x) {
  // x: [T, heads, head_dim] in fp32
  if (qn.kind == ir::QkNormKind::None) return x;
  at::Tensor w = c.w.tensor(weight).to(x.scalar_type());
  if (qn.kind == ir::QkNormKind::PerHead) return x * at::rsqrt(x.pow(2).mean(-1, true) + qn.eps) * w;
  at::Tensor flat = x.flatten(1);
  return (flat * at::rsqrt(flat.pow(2).mean(-1, true) + qn.eps) * w).view(x.sizes());
}

at::Tensor activate(ir::ActKind a, const at::Tensor& x) {
  switch (a) {
    case ir::ActKind::Gelu: return at::gelu(x);
    case ir::ActKind::GeluTanh: return at::gelu(x, "tanh");
    case ir::ActKind::Silu: return at::silu(x);
  }
  throw std::logic_error("activation");
}

at::Tensor attention(const Ctx& c, const ir::Attention& a, const at::Tensor& h) {
  const int64_t T = h.size(0), wq = a.heads * a.head_dim, wkv = a.kv_heads * a.head_dim;
  at::Tensor q, k, v;
  if (a.fused()) {
    at::Tensor qkv = linear(c, *a.qkv, h, c.dt);
    q = qkv.narrow(1, a.qkv->out_region("q")->offset, wq);
    k = qkv.narrow(1, a.qkv->out_region("k")->offset, wkv);
    v = qkv.narrow(1, a.qkv->out_region("v")->offset, wkv);
  } else {
    q = linear(c, *a.q, h, c.dt);
    k = linear(c, *a.k, h, c.dt);
    v = linear(c, *a.v, h, c.dt);
  }
  const auto ft = c.dt == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor q3 = qk_norm(c, a.qk_norm, a.qk_norm.q_weight, q.view({T, a.heads, a.head_dim}).to(ft));
  at::Tensor k3 = qk_norm(c, a.qk_norm, a.qk_norm.k_weight, k.view({T, a.kv_heads, a.head_dim}).to(ft));
  if (a.rope.style != ir::RopeStyle::None) {
    const at::Tensor& cs = c.in.table(a.rope.table + ".cos");
    const at::Tensor& sn = c.in.table(a.rope.table + ".sin");
    q3 = rope(q3, a.rope, cs, sn);
    k3 = rope(k3, a.rope, cs, sn);
  }
  at::Tensor qp = q3.to(c.dt).contiguous();
  apply_patches(c.reg, a.patches, contracts::TensorRole::Q, qp);
  at::Tensor kk = k3.to(c.dt).transpose(0, 1).unsqueeze(0);
  at::Tensor vv = v.view({T, a.kv_heads, a.head_dim}).transpose(0, 1).unsqueeze(0);
  if (a.kv_heads != a.heads) {
    kk = kk.repeat_interleave(a.heads / a.kv_heads, 1);
    vv = vv.repeat_interleave(a.heads / a.kv_heads, 1);
  }
  at::Tensor o = consumer_impl(a.consumer)(qp.transpose(0, 1).unsqueeze(0), kk, vv, 1.0 / std::sqrt(double(a.head_dim)));
  at::Tensor out = o.squeeze(0).transpose(0, 1).reshape({T, wq});
  apply_patches(c.reg, a.patches, contracts::TensorRole::AttnOut, out);
  return linear(c, a.out, out, c.dt);
}

at::Tensor mlp(const Ctx& c, const ir::Mlp& m, const at::Tensor& h) {
  at::Tensor hidden;
  switch (m.layout) {
    case ir::GateUpLayout::None: hidden = activate(m.act, linear(c, *m.up, h, c.dt)); break;
    case ir::GateUpLayout::Separate:
      hidden = activate(m.act, linear(c, *m.gate, h, c.dt)) * linear(c, *m.up, h, c.dt);
      break;
    case ir::GateUpLayout::FusedHalves: {
      auto parts = linear(c, *m.up, h, c.dt).chunk(2, -1);
      hidden = activate(m.act, parts[0]) * parts[1];
      break;
    }
    case ir::GateUpLayout::Interleaved: {
      at::Tensor u = linear(c, *m.up, h, c.dt).unflatten(-1, {m.hidden, 2});
      hidden = activate(m.act, u.select(-1, 0)) * u.select(-1, 1);
      break;
    }
  }
  hidden = hidden.contiguous();
  apply_patches(c.reg, m.patches, contracts::TensorRole::MlpHidden, hidden);
  return linear(c, m.down, hidden, c.dt);
}

}  // namespace

void validate_inputs(const ir::Model& m, const Inputs& in) {
  const int64_t T = m.tokens();
  expect_shape("input x", in.x, {T, m.input_features()});
  auto check_mod = [&](const ir::Modulation& mod, const std::string& where) {
    if (mod.scope == ir::ModScope::None) return;
    const int64_t rows = mod.scope == ir::ModScope::PerSegment ? int64_t(m.segments.size()) : T;
    expect_shape(where + " modulation table '" + mod.table + "'", in.table(mod.table), {rows, mod.count, m.dim});
  };
  for (const auto& b : m.blocks) {
    check_mod(b.modulation, "block " + b.name);
    for (const auto& s : b.sublayers)
      if (const auto* a = std::get_if<ir::Attention>(&s.body); a && a->rope.style != ir::RopeStyle::None) {
        expect_shape("rope table '" + a->rope.table + ".cos'", in.table(a->rope.table + ".cos"), {T, a->rope.rotary_dim / 2});
        expect_shape("rope table '" + a->rope.table + ".sin'", in.table(a->rope.table + ".sin"), {T, a->rope.rotary_dim / 2});
      }
  }
  if (m.final_layer) check_mod(m.final_layer->modulation, "final layer");
  if (in.x.scalar_type() != to_aten(m.dtype))
    throw std::invalid_argument(std::string("input x: dtype ") + c10::toString(in.x.scalar_type()) +
                                " does not match the model dtype " + ir::to_string(m.dtype));
}

at::Tensor run_naive(const ir::Model& m, const WeightSource& w, const Inputs& in, const contracts::Registry& reg,
                     const Progress& progress) {
  validate_inputs(m, in);
  Ctx c{m, w, in, reg, to_aten(m.dtype)};
  at::Tensor x = m.embed ? linear(c, *m.embed, in.x, c.dt) : in.x.clone();
  int64_t done = 0, total = 0;
  for (const auto& b : m.blocks) total += int64_t(b.sublayers.size());
  for (const auto& b : m.blocks) {
    for (const auto& s : b.sublayers) {
      at::Tensor h = norm_mod(c, s.norm, b.modulation, s.mod, x).to(c.dt);
      at::Tensor y = s.is_attention() ? attention(c, std::get<ir::Attention>(s.body), h)
                                      : mlp(c, std::get<ir::Mlp>(s.body), h);
      if (s.mod.gate >= 0) y = y * per_token_mod(c, b.modulation).select(1, s.mod.gate);
      x = x + y;
      if (progress) progress(++done, total);
    }
  }
  if (!m.final_layer) return x.to(c.dt == at::kDouble ? at::kDouble : at::kFloat);
  const ir::FinalLayer& f = *m.final_layer;
  const auto ft = c.dt == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor h = norm_mod(c, f.norm, f.modulation, f.mod, x);
  return linear(c, f.proj, h, ft);
}

}  // namespace sp::exec
