#include "models/builder.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <stdexcept>

#include "models/family_common.hpp"

namespace sp::models {

int64_t ModelConfig::tokens() const {
  int64_t t = 0;
  for (const auto& s : segments) t += s.length;
  return t;
}

ModelConfig demo_config() {
  ModelConfig c;
  c.video_t = 8;
  c.video_h = 16;
  c.video_w = 24;
  c.segments = {{"text", 128}, {"video", c.video_t * c.video_h * c.video_w}};
  return c;
}

void set_total_tokens(ModelConfig& c, int64_t tokens) {
  int64_t other = 0;
  ir::Segment* video = nullptr;
  for (auto& s : c.segments) {
    if (s.name == "video") video = &s;
    else other += s.length;
  }
  if (!video) throw std::invalid_argument("--tokens: the model has no 'video' segment to resize");
  if (tokens <= other)
    throw std::invalid_argument("--tokens: " + std::to_string(tokens) + " leaves no video tokens after " +
                                std::to_string(other) + " text tokens");
  video->length = tokens - other;
}

namespace {

using detail::blk;
using detail::linear;

ir::Norm norm(const ModelConfig& c, const std::string& name) {
  const bool bias = c.norm_affine && c.norm == ir::NormKind::LayerNorm;
  return {c.norm, c.norm_affine, c.norm_affine ? name + ".weight" : "", bias ? name + ".bias" : "", c.eps};
}

struct Maker {
  at::Generator gen;
  at::ScalarType dt;
  exec::TensorWeights& w;

  at::Tensor randn(at::IntArrayRef shape, double std, double mean = 0.0) {
    return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)).mul_(std).add_(mean);
  }
  void dense(const std::string& name, at::Tensor t) { w.add(name, t.to(dt)); }
  void linear(const ir::Linear& l) {
    w.store(l, randn({l.out_features, l.in_features}, 1.0 / std::sqrt(double(l.in_features))), dt);
    if (!l.bias.empty()) dense(l.bias, randn({l.out_features}, 0.02));
  }
  void norm(const ir::Norm& n, int64_t dim) {
    if (!n.affine) return;
    dense(n.weight, randn({dim}, 0.1, 1.0));
    if (!n.bias.empty()) dense(n.bias, randn({dim}, 0.05));
  }
};

// cos/sin [T, half]: text (and any non-video segment) at position 0; video along (t, h, w)
// with the frequencies split across the three axes, or along one axis without a grid.
std::pair<at::Tensor, at::Tensor> rope_tables(const ModelConfig& c, int64_t half) {
  const int64_t T = c.tokens();
  at::Tensor angle = at::zeros({T, half}, at::kFloat);
  int64_t start = 0;
  for (const auto& s : c.segments) {
    if (s.name == "video") {
      at::Tensor idx = at::arange(s.length, at::kLong);
      std::vector<std::pair<at::Tensor, int64_t>> axes;
      if (c.video_h > 0 && c.video_w > 0) {
        const int64_t hw = c.video_h * c.video_w, n = half / 3;
        axes = {{idx.div(hw, "floor"), half - 2 * n}, {idx.remainder(hw).div(c.video_w, "floor"), n},
                {idx.remainder(c.video_w), n}};
      } else {
        axes = {{idx, half}};
      }
      int64_t col = 0;
      for (auto& [pos, n] : axes) {
        at::Tensor inv = at::pow(10000.0, at::arange(n, at::kFloat).div_(-double(std::max<int64_t>(n, 1))));
        angle.narrow(0, start, s.length).narrow(1, col, n).copy_(pos.to(at::kFloat).unsqueeze(1) * inv);
        col += n;
      }
    }
    start += s.length;
  }
  return {angle.cos(), angle.sin()};
}

}  // namespace

ir::Model build_ir(const ModelConfig& c) {
  ir::Model m;
  m.name = c.name;
  m.dim = c.dim;
  m.dtype = c.dtype;
  m.segments = c.segments;
  if (c.embed)
    for (const auto& seg : c.segments) m.embeds.push_back({seg.name, linear("embed." + seg.name, c.in_features, c.dim, true)});
  const int64_t wq = c.heads * c.head_dim, wkv = c.kv_heads * c.head_dim;
  for (int i = 0; i < c.layers; ++i) {
    ir::Block b;
    b.name = std::to_string(i);
    b.modulation = {c.mod_scope, c.mod_scope == ir::ModScope::None ? 0 : 6, blk(i) + "mod"};
    const bool mod = c.mod_scope != ir::ModScope::None;

    ir::Attention a;
    a.heads = c.heads;
    a.kv_heads = c.kv_heads;
    a.head_dim = c.head_dim;
    const int64_t mlp_in = c.parallel_hidden;
    if (mlp_in > 0) a.parallel = ir::ParallelMlp{mlp_in, c.act};
    auto proj = [&](const std::string& p) {
      ir::AttnProj pr;
      if (c.fused_qkv || mlp_in > 0) {
        pr.qkv = linear(p + "qkv", c.dim, wq + 2 * wkv + mlp_in, c.qkv_bias, c.format);
        pr.qkv->out_regions = {{"q", 0, wq}, {"k", wq, wkv}, {"v", wq + wkv, wkv}};
        if (mlp_in > 0) pr.qkv->out_regions.push_back({"mlp", wq + 2 * wkv, mlp_in});
      } else {
        pr.q = linear(p + "q", c.dim, wq, c.qkv_bias, c.format);
        pr.k = linear(p + "k", c.dim, wkv, c.qkv_bias, c.format);
        pr.v = linear(p + "v", c.dim, wkv, c.qkv_bias, c.format);
      }
      if (c.qk_norm != ir::QkNormKind::None) {
        pr.q_norm = p + "norm_q.weight";
        pr.k_norm = p + "norm_k.weight";
      }
      pr.out = linear(p + "out", wq + mlp_in, c.dim, c.out_bias, c.format);
      if (mlp_in > 0) pr.out.in_regions = {{"attn", 0, wq}, {"mlp", wq, mlp_in}};
      return pr;
    };
    a.proj = proj(blk(i) + "attn.");
    if (c.joint) a.segment_proj = {{c.segments.front().name, proj(blk(i) + "attn_" + c.segments.front().name + ".")}};
    a.qk_norm = {c.qk_norm, c.eps};
    a.rope = {c.rope, c.rope == ir::RopeStyle::None ? 0 : c.rotary_dim, "rope"};
    a.consumer = c.consumer;
    a.patches = c.attn_patches;
    b.sublayers.push_back({"attn", {}, norm(c, blk(i) + "norm1"), mod ? ir::ModRef{0, 1, 2} : ir::ModRef{}, a});

    if (c.context_tokens > 0) {
      ir::Attention x;
      x.kind = ir::AttnKind::Cross;
      x.context = "context";
      x.heads = x.kv_heads = c.heads;
      x.head_dim = c.head_dim;
      x.proj.q = linear(blk(i) + "cross.q", c.dim, wq, true, c.format);
      x.proj.k = linear(blk(i) + "cross.k", c.context_dim, wq, true, c.format);
      x.proj.v = linear(blk(i) + "cross.v", c.context_dim, wq, true, c.format);
      x.proj.out = linear(blk(i) + "cross.out", wq, c.dim, true, c.format);
      x.qk_norm = {ir::QkNormKind::AcrossHeads, c.eps};
      x.proj.q_norm = blk(i) + "cross.norm_q.weight";
      x.proj.k_norm = blk(i) + "cross.norm_k.weight";
      x.consumer = c.consumer;
      ir::Norm n{ir::NormKind::LayerNorm, true, blk(i) + "norm_cross.weight", blk(i) + "norm_cross.bias", c.eps};
      b.sublayers.push_back({"cross", {}, n, {}, x});
    }

    if (mlp_in == 0) {
      auto mlp = [&](const std::string& p) {
        ir::Mlp f;
        f.layout = c.layout;
        f.act = c.act;
        f.hidden = c.hidden;
        const bool two = c.layout == ir::GateUpLayout::FusedHalves || c.layout == ir::GateUpLayout::Interleaved;
        f.up = linear(p + "fc1", c.dim, two ? 2 * c.hidden : c.hidden, c.mlp_bias, c.format);
        if (c.layout == ir::GateUpLayout::Separate) f.gate = linear(p + "gate", c.dim, c.hidden, c.mlp_bias, c.format);
        f.down = linear(p + "fc2", c.hidden, c.dim, c.mlp_bias, c.format);
        f.patches = c.mlp_patches;
        return f;
      };
      const ir::ModRef mr = mod ? ir::ModRef{3, 4, 5} : ir::ModRef{};
      if (c.per_segment_mlp) {
        for (const auto& seg : c.segments)
          b.sublayers.push_back({"mlp_" + seg.name, {seg.name}, norm(c, blk(i) + "norm2_" + seg.name), mr,
                                 mlp(blk(i) + "mlp_" + seg.name + ".")});
      } else {
        b.sublayers.push_back({"mlp", {}, norm(c, blk(i) + "norm2"), mr, mlp(blk(i) + "mlp.")});
      }
    }
    m.blocks.push_back(std::move(b));
  }
  if (c.context_tokens > 0) m.contexts = {{"context", c.context_tokens, c.context_dim}};
  if (c.final_layer) {
    ir::FinalLayer fl;
    fl.segments = c.final_segments;
    fl.norm = norm(c, "final.norm");
    fl.modulation = {c.mod_scope, c.mod_scope == ir::ModScope::None ? 0 : 2, "final.mod"};
    if (c.mod_scope != ir::ModScope::None) fl.mod = {0, 1, -1};
    fl.proj = linear("final.proj", c.dim, c.out_features, true, "dense");
    fl.proj.fp32_compute = true;
    m.final_layer = fl;
  }
  ir::validate(m);
  return m;
}

Instance instantiate(const ModelConfig& c, const contracts::Registry& reg, const at::Device& device) {
  Instance inst;
  inst.model = build_ir(c);
  inst.weights = std::make_shared<exec::TensorWeights>(&reg);
  const ir::Model& m = inst.model;
  const at::ScalarType dt = exec::to_aten(c.dtype);
  Maker mk{at::make_generator<at::CPUGeneratorImpl>(c.seed), dt, *inst.weights};
  const int64_t T = m.tokens();
  const int64_t mod_rows = c.mod_scope == ir::ModScope::PerToken ? T
                           : c.mod_scope == ir::ModScope::Shared ? 1
                                                                 : int64_t(m.segments.size());

  for (const auto& e : m.embeds) mk.linear(e.linear);
  for (const auto& b : m.blocks) {
    if (b.modulation.scope != ir::ModScope::None) {
      // shift/scale near 0, gates near 1, as trained AdaLN tables are.
      at::Tensor t = mk.randn({mod_rows, b.modulation.count, m.dim}, 0.1);
      t.select(1, 2).add_(1.0);
      t.select(1, 5).add_(1.0);
      inst.inputs.tables[b.modulation.table] = t.to(dt);
    }
    for (const auto& s : b.sublayers) {
      mk.norm(s.norm, m.dim);
      if (const auto* a = std::get_if<ir::Attention>(&s.body)) {
        for (const ir::AttnProj* p : a->all_proj()) {
          for (const auto* l : {&p->qkv, &p->q, &p->k, &p->v})
            if (*l) mk.linear(**l);
          if (a->qk_norm.kind != ir::QkNormKind::None) {
            const bool per_head = a->qk_norm.kind == ir::QkNormKind::PerHead;
            mk.dense(p->q_norm, mk.randn({per_head ? a->head_dim : a->heads * a->head_dim}, 0.1, 1.0));
            mk.dense(p->k_norm, mk.randn({per_head ? a->head_dim : a->kv_heads * a->head_dim}, 0.1, 1.0));
          }
          mk.linear(p->out);
        }
      } else {
        const auto& f = std::get<ir::Mlp>(s.body);
        if (f.gate) mk.linear(*f.gate);
        mk.linear(*f.up);
        mk.linear(f.down);
      }
    }
  }
  if (m.final_layer) {
    const auto& fl = *m.final_layer;
    mk.norm(fl.norm, m.dim);
    if (fl.modulation.scope != ir::ModScope::None)
      inst.inputs.tables[fl.modulation.table] = mk.randn({mod_rows, fl.modulation.count, m.dim}, 0.1).to(dt);
    mk.linear(fl.proj);
  }
  if (c.rope != ir::RopeStyle::None) {
    auto [cs, sn] = rope_tables(c, c.rotary_dim / 2);
    inst.inputs.tables["rope.cos"] = cs;
    inst.inputs.tables["rope.sin"] = sn;
  }
  for (const auto& seg : m.segments)
    inst.inputs.tokens[seg.name] = mk.randn({seg.length, m.input_features(seg.name)}, 1.0).to(dt);
  for (const auto& ctx : m.contexts) inst.inputs.tables[ctx.name] = mk.randn({ctx.length, ctx.dim}, 1.0).to(dt);

  if (!device.is_cpu()) {
    auto moved = std::make_shared<exec::TensorWeights>(&reg);
    for (const auto& [k, v] : inst.weights->all()) moved->add(k, v.to(device));
    inst.weights = moved;
    for (auto& [k, v] : inst.inputs.tokens) v = v.to(device);
    for (auto& [k, v] : inst.inputs.tables) v = v.to(device);
  }
  return inst;
}

Instance upcast_f64(const Instance& src, const contracts::Registry& reg) {
  Instance out;
  out.model = src.model;
  out.model.dtype = ir::DType::F64;
  out.weights = std::make_shared<exec::TensorWeights>(&reg);
  // Dequantize every non-dense linear through its own format, then mark it dense.
  auto fix = [&](ir::Linear& l) {
    if (!reg.format(l.format).dense)
      out.weights->add(l.weight, src.weights->acquire(l, {}, {}, at::kDouble));
    l.format = "dense";
  };
  for (const auto& [k, v] : src.weights->all())
    if (v.is_floating_point()) out.weights->add(k, v.to(at::kDouble));
  ir::for_each_linear(out.model, fix);
  for (const auto& [k, v] : src.inputs.tokens) out.inputs.tokens[k] = v.to(at::kDouble);
  for (const auto& [k, v] : src.inputs.tables) out.inputs.tables[k] = v.to(at::kDouble);
  return out;
}

}  // namespace sp::models
