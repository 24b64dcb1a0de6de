// The naive schedule: every IR op on full tensors, the way the original model computes
// it. It is the reference every planned schedule is tested against, so it is kept as
// plain as possible and shares no slab machinery with the planned schedule.
#include <cmath>
#include <stdexcept>

#include "exec/consumers/consumer.hpp"
#include "exec/patches/lora.hpp"
#include "exec/patches/patch.hpp"
#include "exec/run/executor.hpp"
#include "plan/kv_budget.hpp"

namespace sp::exec {

namespace {

struct Ctx {
  const ir::Model& m;
  const WeightSource& w;
  const Inputs& in;
  const contracts::Registry& reg;
  at::ScalarType dt;
};

at::ScalarType acc_of(at::ScalarType dt) { return dt == at::kDouble ? at::kDouble : at::kFloat; }

at::Tensor linear(const Ctx& c, const ir::Linear& l, const at::Tensor& x, at::ScalarType dt) {
  // Dense weights as stored (the model dtype, or fp32 where a family keeps them so), then
  // converted to `dt`; other formats convert into `dt` themselves.
  const at::ScalarType as = c.reg.format(l.format).dense ? c.w.tensor(l.weight).scalar_type() : dt;
  at::Tensor w = c.w.acquire(l, {}, {}, as).to(dt);
  if (!l.loras.empty()) w = impl_of<LoraImpl>(c.reg.patch("lora")).merged(c.w, l, w);
  at::Tensor b = l.bias.empty() ? at::Tensor() : c.w.tensor(l.bias).to(dt);
  return at::linear(x.to(dt), w, b);
}

// Per-token [T, count, dim] view of a block's modulation table.
at::Tensor per_token_mod(const Ctx& c, const ir::Modulation& mod) {
  const at::Tensor& t = c.in.table(mod.table);
  if (mod.scope == ir::ModScope::PerToken) return t;
  if (mod.scope == ir::ModScope::Shared) return t.expand({c.m.tokens(), t.size(1), t.size(2)});
  std::vector<int64_t> lens;
  for (const auto& s : c.m.segments) lens.push_back(s.length);
  return t.repeat_interleave(at::tensor(lens).to(t.device()), 0);
}

// Rows of x a sublayer applies to, and the segments they span (in order).
struct Span {
  int64_t begin, end;
  std::vector<std::pair<std::string, int64_t>> pieces;  // segment, length
};

Span span(const ir::Model& m, const std::vector<std::string>& segs) {
  const ir::RowRange r = m.rows(segs);
  Span s{r.begin, r.end, {}};
  int64_t at = 0;
  for (const auto& seg : m.segments) {
    if (at >= r.begin && at < r.end) s.pieces.push_back({seg.name, seg.length});
    at += seg.length;
  }
  return s;
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

// Applies f(rows of one segment, that segment's projections) piece by piece and concatenates.
template <typename F>
at::Tensor per_segment(const Span& sp, const ir::Attention& a, const at::Tensor& rows, F&& f) {
  std::vector<at::Tensor> parts;
  int64_t at = 0;
  for (const auto& [seg, len] : sp.pieces) {
    parts.push_back(f(rows.narrow(0, at, len), a.proj_for(seg)));
    at += len;
  }
  return parts.size() == 1 ? parts[0] : at::cat(parts, 0);
}

at::Tensor attention(const Ctx& c, const Span& sp, const ir::Attention& a, const at::Tensor& h,
                     contracts::AttnCall call) {
  const int64_t T = h.size(0), wq = a.heads * a.head_dim, wkv = a.kv_heads * a.head_dim;
  const bool cross = a.kind == ir::AttnKind::Cross;
  const at::Tensor kv_src = cross ? c.in.table(a.context) : h;
  auto region = [&](const ir::AttnProj& p, const at::Tensor& x, const char* name, int64_t width) {
    if (!p.fused()) {
      const ir::Linear& l = name[0] == 'q' ? *p.q : name[0] == 'k' ? *p.k : *p.v;
      return linear(c, l, x, c.dt);
    }
    return linear(c, *p.qkv, x, c.dt).narrow(1, p.qkv->out_region(name)->offset, width);
  };
  const auto ft = acc_of(c.dt);
  at::Tensor q = per_segment(sp, a, h, [&](const at::Tensor& x, const ir::AttnProj& p) {
    return qk_norm(c, a.qk_norm, p.q_norm, region(p, x, "q", wq).view({-1, a.heads, a.head_dim}).to(ft));
  });
  auto kv = [&](const char* name, bool normed) {
    auto f = [&](const at::Tensor& x, const ir::AttnProj& p) {
      at::Tensor t = region(p, x, name, wkv).view({-1, a.kv_heads, a.head_dim}).to(ft);
      return normed ? qk_norm(c, a.qk_norm, p.k_norm, t) : t;
    };
    return cross ? f(kv_src, a.proj) : per_segment(sp, a, kv_src, f);
  };
  at::Tensor k = kv("k", true), v = kv("v", false);
  if (a.rope.style != ir::RopeStyle::None) {
    const at::Tensor cs = c.in.table(a.rope.table + ".cos").narrow(0, sp.begin, T);
    const at::Tensor sn = c.in.table(a.rope.table + ".sin").narrow(0, sp.begin, T);
    q = rope(q, a.rope, cs, sn);
    k = rope(k, a.rope, cs, sn);
  }
  at::Tensor qp = q.to(c.dt).contiguous();
  apply_patches(c.reg, a.patches, contracts::TensorRole::Q, qp);
  at::Tensor kk = k.to(c.dt).transpose(0, 1).unsqueeze(0);
  at::Tensor vv = v.to(c.dt).transpose(0, 1).unsqueeze(0);
  if (a.kv_heads != a.heads) {
    kk = kk.repeat_interleave(a.heads / a.kv_heads, 1);
    vv = vv.repeat_interleave(a.heads / a.kv_heads, 1);
  }
  call.q_begin = sp.begin;
  at::Tensor o = impl_of<ConsumerImpl>(c.reg.consumer(a.consumer))
                     .attend_rows(qp.transpose(0, 1).unsqueeze(0), kk, vv, 1.0 / std::sqrt(double(a.head_dim)), call);
  at::Tensor out = o.squeeze(0).transpose(0, 1).reshape({T, wq});
  apply_patches(c.reg, a.patches, contracts::TensorRole::AttnOut, out);
  if (a.parallel) {
    at::Tensor hidden = per_segment(sp, a, h, [&](const at::Tensor& x, const ir::AttnProj& p) {
      return activate(a.parallel->act, region(p, x, "mlp", a.parallel->hidden));
    }).contiguous();
    apply_patches(c.reg, a.patches, contracts::TensorRole::MlpHidden, hidden);
    out = at::cat({out, hidden}, 1);
  }
  return per_segment(sp, a, out, [&](const at::Tensor& x, const ir::AttnProj& p) { return linear(c, p.out, x, c.dt); });
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

at::Tensor run_naive(const ir::Model& m, const WeightSource& w, const Inputs& in, const contracts::Registry& reg,
                     const Progress& progress, double kv_budget) {
  validate_inputs(m, in);
  Ctx c{m, w, in, reg, to_aten(m.dtype)};
  std::vector<at::Tensor> parts;
  for (const auto& seg : m.segments) {
    const ir::SegmentEmbed* e = m.embed_for(seg.name);
    const at::Tensor& t = in.segment_tokens(seg.name);
    parts.push_back(e ? linear(c, e->linear, t, e->linear.fp32_compute ? acc_of(c.dt) : c.dt).to(c.dt) : t);
  }
  at::Tensor x = at::cat(parts, 0);
  int64_t done = 0, total = 0;
  for (const auto& b : m.blocks) total += int64_t(b.sublayers.size());
  for (size_t bi = 0; bi < m.blocks.size(); ++bi) {
    const ir::Block& b = m.blocks[bi];
    w.begin_block(bi);
    for (const auto& s : b.sublayers) {
      const Span sp = span(m, s.segments);
      const at::Tensor xs = x.narrow(0, sp.begin, sp.end - sp.begin);
      at::Tensor h = norm_mod(c, s.norm, b.modulation, s.mod, x).narrow(0, sp.begin, sp.end - sp.begin).to(c.dt);
      at::Tensor y = s.is_attention()
                         ? attention(c, sp, std::get<ir::Attention>(s.body), h, plan::attn_call(m, b, s, kv_budget))
                         : mlp(c, std::get<ir::Mlp>(s.body), h);
      if (s.mod.gate >= 0)
        y = y * per_token_mod(c, b.modulation).select(1, s.mod.gate).narrow(0, sp.begin, sp.end - sp.begin);
      x = at::cat({x.narrow(0, 0, sp.begin), xs + y, x.narrow(0, sp.end, x.size(0) - sp.end)}, 0);
      if (progress) progress(++done, total);
    }
    if (b.post_norm) {
      const Span sp = span(m, b.post_norm->segments);
      const at::Tensor h = norm_mod(c, b.post_norm->norm, ir::Modulation{}, ir::ModRef{}, x)
                               .narrow(0, sp.begin, sp.end - sp.begin)
                               .to(c.dt);
      x = at::cat({x.narrow(0, 0, sp.begin), h, x.narrow(0, sp.end, x.size(0) - sp.end)}, 0);
    }
    w.end_block(bi);
  }
  const auto ft = acc_of(c.dt);
  if (!m.final_layer) return x.to(ft);
  const ir::FinalLayer& f = *m.final_layer;
  const ir::RowRange r = m.rows(f.segments);
  at::Tensor h = norm_mod(c, f.norm, f.modulation, f.mod, x).narrow(0, r.begin, r.size());
  if (f.heads.empty()) return linear(c, f.proj, h, ft);
  // Each segment's rows through its own head; a narrower head fills the leading columns.
  at::Tensor out = at::zeros({r.size(), f.proj.out_features}, h.options().dtype(ft));
  for (const auto& s : m.segments) {
    const int64_t b = m.segment_begin(s.name) - r.begin;
    if (b < 0 || b + s.length > r.size() || s.length == 0) continue;
    const ir::Linear& l = f.proj_for(s.name);
    out.narrow(0, b, s.length).narrow(1, 0, l.out_features).copy_(linear(c, l, h.narrow(0, b, s.length), ft));
  }
  return out;
}

}  // namespace sp::exec
