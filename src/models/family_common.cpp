#include "models/family_common.hpp"

#include <cmath>
#include <stdexcept>

namespace sp::models::detail {

at::Tensor sinusoid(const at::Tensor& t, int64_t dim) {
  const int64_t half = dim / 2;
  const auto opt = at::TensorOptions().dtype(at::kFloat).device(t.device());
  at::Tensor f = at::exp(at::arange(half, opt) * (-std::log(10000.0) / double(half)));
  at::Tensor a = t.to(at::kFloat).reshape({1}) * f;
  return at::cat({at::cos(a), at::sin(a)}, 0);
}

at::Tensor affine(const exec::WeightSource& w, const std::string& prefix, const at::Tensor& x) {
  const at::Tensor& wt = w.tensor(prefix + ".weight");
  at::Tensor b = w.contains(prefix + ".bias") ? w.tensor(prefix + ".bias") : at::Tensor();
  return at::linear(x.to(wt.scalar_type()), wt, b);
}

void set_rope_tables(std::map<std::string, at::Tensor>& tables, const at::Tensor& pos,
                     const std::vector<int64_t>& axes_dim, double theta) {
  if (pos.size(1) != int64_t(axes_dim.size()))
    throw std::invalid_argument("rope positions have " + std::to_string(pos.size(1)) + " axes, the model " +
                                std::to_string(axes_dim.size()));
  std::vector<at::Tensor> cols;
  const auto opt = at::TensorOptions().dtype(at::kDouble).device(pos.device());
  for (size_t a = 0; a < axes_dim.size(); ++a) {
    const int64_t d = axes_dim[a];
    at::Tensor freq = at::pow(theta, at::arange(0, d, 2, opt) / -double(d));
    cols.push_back(pos.select(1, int64_t(a)).to(at::kDouble).unsqueeze(1) * freq);
  }
  at::Tensor angle = at::cat(cols, 1);
  tables["rope.cos"] = angle.cos().to(at::kFloat);
  tables["rope.sin"] = angle.sin().to(at::kFloat);
}

ir::FinalLayer final_layer(std::vector<std::string> segments, ir::Norm norm, ir::ModScope scope,
                           const std::string& table, ir::Linear proj) {
  ir::FinalLayer fl;
  fl.segments = std::move(segments);
  fl.norm = norm;
  fl.modulation = {scope, 2, table};
  fl.mod = {0, 1, -1};
  fl.proj = std::move(proj);
  fl.proj.fp32_compute = true;
  return fl;
}

ir::Attention fused_qkv_attention(const std::string& prefix, const QkvNames& names, const recognize::FamilyConfig& c,
                                  const std::string& consumer) {
  const int64_t w = c.heads * c.head_dim;
  ir::Attention a;
  a.heads = a.kv_heads = c.heads;
  a.head_dim = c.head_dim;
  a.proj.qkv = linear(prefix + names.qkv, c.dim, 3 * w, false);
  a.proj.qkv->out_regions = {{"q", 0, w}, {"k", w, w}, {"v", 2 * w, w}};
  a.proj.q_norm = prefix + names.q_norm;
  a.proj.k_norm = prefix + names.k_norm;
  a.proj.out = linear(prefix + names.out, w, c.dim, false);
  a.qk_norm = {ir::QkNormKind::PerHead, c.eps};
  a.rope = {ir::RopeStyle::SplitHalf, c.rotary_dim, "rope"};
  a.consumer = consumer;
  return a;
}

ir::Mlp swiglu_halves(const std::string& fc1, const std::string& fc2, const recognize::FamilyConfig& c) {
  ir::Mlp f;
  f.layout = ir::GateUpLayout::FusedHalves;
  f.act = ir::ActKind::Silu;
  f.hidden = c.ffn;
  f.up = linear(fc1, c.dim, 2 * c.ffn, false);
  f.down = linear(fc2, c.ffn, c.dim, false);
  return f;
}

at::Tensor grid_positions(int64_t f, int64_t h, int64_t w, const at::Device& d) {
  const auto opt = at::TensorOptions().dtype(at::kFloat).device(d);
  auto g = at::meshgrid({at::arange(f, opt), at::arange(h, opt), at::arange(w, opt)}, "ij");
  return at::stack({g[0].reshape(-1), g[1].reshape(-1), g[2].reshape(-1)}, 1);
}

const at::Tensor& need(const TensorMap& raw, const std::string& name, std::vector<int64_t> dims) {
  auto it = raw.find(name);
  if (it == raw.end()) throw std::invalid_argument("inputs: tensor '" + name + "' is missing");
  const at::Tensor& t = it->second;
  if (t.dim() != int64_t(dims.size()))
    throw std::invalid_argument("inputs: tensor '" + name + "' must have " + std::to_string(dims.size()) +
                                " dimensions, has " + std::to_string(t.dim()));
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i] >= 0 && t.size(int64_t(i)) != dims[i])
      throw std::invalid_argument("inputs: tensor '" + name + "' dimension " + std::to_string(i) + " must be " +
                                  std::to_string(dims[i]) + ", is " + std::to_string(t.size(int64_t(i))));
  return t;
}

ir::Linear linear(const std::string& name, int64_t in, int64_t out, bool bias, const std::string& format) {
  ir::Linear l;
  l.weight = name + ".weight";
  if (bias) l.bias = name + ".bias";
  l.in_features = in;
  l.out_features = out;
  l.format = format;
  return l;
}

ir::Norm layer_norm(double eps) { return {ir::NormKind::LayerNorm, false, "", "", eps}; }
ir::Norm rms_norm(double eps) { return {ir::NormKind::RMSNorm, false, "", "", eps}; }

}  // namespace sp::models::detail
