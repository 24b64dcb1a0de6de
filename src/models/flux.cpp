// Flux.1: one residual stream [txt | img]. Double-stream blocks: joint attention over both
// segments with per-stream projections, Q/K RMSNorm and modulation, then one MLP per
// stream; single-stream blocks: a fused linear1 -> [q | k | v | mlp], attention and a
// GELU-tanh MLP in parallel, linear2 over [attention | mlp]; final layer on image tokens.
// Conditioning vector vec = time_in(t) + guidance_in(g) (dev) + vector_in(pooled).
#include <ATen/CPUGeneratorImpl.h>

#include "models/family_common.hpp"
#include "models/family_table.hpp"

namespace sp::models::detail {

namespace {

std::string dbl(int64_t i) { return "double_blocks." + std::to_string(i) + "."; }
std::string sgl(int64_t i) { return "single_blocks." + std::to_string(i) + "."; }

ir::AttnProj stream_proj(const recognize::FamilyConfig& c, const std::string& p) {
  const int64_t w = c.heads * c.head_dim;
  ir::AttnProj pr;
  pr.qkv = linear(p + "qkv", c.dim, 3 * w, c.qkv_bias);
  pr.qkv->out_regions = {{"q", 0, w}, {"k", w, w}, {"v", 2 * w, w}};
  pr.q_norm = p + "norm.query_norm.scale";
  pr.k_norm = p + "norm.key_norm.scale";
  pr.out = linear(p + "proj", w, c.dim, true);
  return pr;
}

ir::Attention attention(const recognize::FamilyConfig& c, const std::string& consumer) {
  ir::Attention a;
  a.heads = a.kv_heads = c.heads;
  a.head_dim = c.head_dim;
  a.qk_norm = {ir::QkNormKind::PerHead, c.eps};
  a.rope = {ir::RopeStyle::Interleaved, c.rotary_dim, "rope"};
  a.consumer = consumer;
  return a;
}

ir::Model build(const recognize::FamilyConfig& c, int64_t img, int64_t txt, ir::DType dtype,
                const std::string& consumer) {
  ir::Model m;
  m.name = c.variant;
  m.dim = c.dim;
  m.dtype = dtype;
  m.segments = {{"txt", txt}, {"img", img}};
  m.embeds = {{"txt", linear("txt_in", c.text_dim, c.dim, true)}, {"img", linear("img_in", c.in_channels, c.dim, true)}};
  const int64_t w = c.heads * c.head_dim;
  for (int64_t i = 0; i < c.layers; ++i) {
    ir::Block b;
    b.name = "double." + std::to_string(i);
    b.modulation = {ir::ModScope::PerSegment, 6, dbl(i) + "mod"};  // rows: txt, img
    ir::Attention a = attention(c, consumer);
    a.proj = stream_proj(c, dbl(i) + "img_attn.");
    a.segment_proj = {{"txt", stream_proj(c, dbl(i) + "txt_attn.")}};
    b.sublayers.push_back({"attn", {}, layer_norm(c.eps), {0, 1, 2}, a});
    for (const char* s : {"txt", "img"}) {
      ir::Mlp f;
      f.act = ir::ActKind::GeluTanh;
      f.hidden = c.ffn;
      f.up = linear(dbl(i) + s + "_mlp.0", c.dim, c.ffn, true);
      f.down = linear(dbl(i) + s + "_mlp.2", c.ffn, c.dim, true);
      b.sublayers.push_back({std::string(s) + "_mlp", {s}, layer_norm(c.eps), {3, 4, 5}, f});
    }
    m.blocks.push_back(std::move(b));
  }
  for (int64_t i = 0; i < c.single_layers; ++i) {
    ir::Block b;
    b.name = "single." + std::to_string(i);
    b.modulation = {ir::ModScope::Shared, 3, sgl(i) + "mod"};
    ir::Attention a = attention(c, consumer);
    a.parallel = ir::ParallelMlp{c.ffn, ir::ActKind::GeluTanh};
    a.proj.qkv = linear(sgl(i) + "linear1", c.dim, 3 * w + c.ffn, true);
    a.proj.qkv->out_regions = {{"q", 0, w}, {"k", w, w}, {"v", 2 * w, w}, {"mlp", 3 * w, c.ffn}};
    a.proj.q_norm = sgl(i) + "norm.query_norm.scale";
    a.proj.k_norm = sgl(i) + "norm.key_norm.scale";
    a.proj.out = linear(sgl(i) + "linear2", w + c.ffn, c.dim, true);
    a.proj.out.in_regions = {{"attn", 0, w}, {"mlp", w, c.ffn}};
    b.sublayers.push_back({"parallel", {}, layer_norm(c.eps), {0, 1, 2}, a});
    m.blocks.push_back(std::move(b));
  }
  m.final_layer = final_layer({"img"}, layer_norm(c.eps), ir::ModScope::Shared, "final.mod",
                              linear("final_layer.linear", c.dim, c.out_channels, true));
  ir::validate(m);
  return m;
}

at::Tensor mlp_embed(const exec::WeightSource& w, const std::string& p, const at::Tensor& x) {
  return affine(w, p + ".out_layer", at::silu(affine(w, p + ".in_layer", x)));
}

FamilyRun prepare(const recognize::FamilyConfig& c, const exec::WeightSource& w, const TensorMap& raw,
                  ir::DType dtype, const std::string& consumer) {
  const at::Tensor& lat = need(raw, "latents", {-1, c.in_channels});
  const at::Tensor& img_ids = need(raw, "img_ids", {lat.size(0), 3});
  const at::Tensor& text = need(raw, "text", {-1, c.text_dim});
  const at::Tensor& txt_ids = need(raw, "txt_ids", {text.size(0), 3});
  const at::Tensor& pooled = need(raw, "pooled", {c.vec_dim});
  const at::Tensor& t = need(raw, "timestep", {1});
  const at::Device dev = w.tensor("img_in.weight").device();
  const at::ScalarType dt = exec::to_aten(dtype);

  FamilyRun run;
  run.model = build(c, lat.size(0), text.size(0), dtype, consumer);
  run.inputs.tokens["img"] = lat.to(dev, dt);
  run.inputs.tokens["txt"] = text.to(dev, dt);
  at::Tensor vec = mlp_embed(w, "time_in", sinusoid(t.to(dev) * c.timestep_scale, c.freq_dim));
  if (c.guidance) {
    const at::Tensor& g = need(raw, "guidance", {1});
    vec = vec + mlp_embed(w, "guidance_in", sinusoid(g.to(dev) * c.timestep_scale, c.freq_dim));
  }
  vec = at::silu(vec + mlp_embed(w, "vector_in", pooled.to(dev)));
  for (int64_t i = 0; i < c.layers; ++i)
    run.inputs.tables[dbl(i) + "mod"] =
        at::stack({affine(w, dbl(i) + "txt_mod.lin", vec), affine(w, dbl(i) + "img_mod.lin", vec)}, 0)
            .view({2, 6, c.dim})
            .to(dt);
  for (int64_t i = 0; i < c.single_layers; ++i)
    run.inputs.tables[sgl(i) + "mod"] = affine(w, sgl(i) + "modulation.lin", vec).view({1, 3, c.dim}).to(dt);
  run.inputs.tables["final.mod"] = affine(w, "final_layer.adaLN_modulation.1", vec).view({1, 2, c.dim}).to(dt);
  set_rope_tables(run.inputs.tables, at::cat({txt_ids, img_ids}, 0).to(dev), c.rope_axes_dim, c.rope_theta);
  return run;
}

TensorMap random_inputs(const recognize::FamilyConfig& c, const Geometry& g, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  int64_t h = 1, w = g.tokens;
  if (g.tokens <= 0) {
    if (g.height <= 0 || g.width <= 0 || g.height % 16 || g.width % 16)
      throw std::invalid_argument("flux geometry: height and width must be positive multiples of 16, got " +
                                  std::to_string(g.height) + "x" + std::to_string(g.width));
    h = g.height / 16;  // VAE 8x, then 2x2 patches packed into channels
    w = g.width / 16;
  }
  const int64_t L = g.text_tokens > 0 ? g.text_tokens : c.text_tokens;
  TensorMap raw;
  raw["latents"] = at::randn({h * w, c.in_channels}, gen);
  at::Tensor pos = grid_positions(1, h, w, at::kCPU);
  pos.select(1, 0).zero_();
  raw["img_ids"] = pos;
  raw["text"] = at::randn({L, c.text_dim}, gen);
  raw["txt_ids"] = at::zeros({L, 3});
  raw["pooled"] = at::randn({c.vec_dim}, gen);
  raw["timestep"] = at::full({1}, 0.5);
  if (c.guidance) raw["guidance"] = at::full({1}, 3.5);
  return raw;
}

}  // namespace

const FamilyOps kFlux{"flux1", random_inputs, prepare};

}  // namespace sp::models::detail
