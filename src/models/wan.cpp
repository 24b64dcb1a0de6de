// Wan 2.1 text-to-video: patchified latent video tokens (t, h, w order) in one segment;
// text embedded by an MLP as the cross-attention context; per block: self-attention
// (LayerNorm + shared 6-way modulation, Q/K RMSNorm across heads, 3-D interleaved RoPE),
// cross-attention (affine LayerNorm, no modulation, no gate), GELU-tanh MLP; final
// LayerNorm + shift/scale from the time embedding, projection, unpatchify.
#include <ATen/CPUGeneratorImpl.h>

#include "models/family_common.hpp"
#include "models/family_table.hpp"

namespace sp::models::detail {

namespace {

ir::Model build(const recognize::FamilyConfig& c, int64_t tokens, int64_t text, ir::DType dtype,
                const std::string& consumer) {
  ir::Model m;
  m.name = c.variant;
  m.dim = c.dim;
  m.dtype = dtype;
  m.segments = {{"video", tokens}};
  m.contexts = {{"text", text, c.dim}};
  const int64_t patch = c.in_channels * c.patch[0] * c.patch[1] * c.patch[2];
  m.embeds = {{"video", linear("patch_embedding", patch, c.dim, true)}};
  const int64_t w = c.heads * c.head_dim;
  for (int64_t i = 0; i < c.layers; ++i) {
    ir::Block b;
    b.name = std::to_string(i);
    b.modulation = {ir::ModScope::Shared, 6, blk(i) + "mod"};
    auto attention = [&](const std::string& p, ir::AttnKind kind) {
      ir::Attention a;
      a.kind = kind;
      a.heads = a.kv_heads = c.heads;
      a.head_dim = c.head_dim;
      a.proj.q = linear(p + "q", c.dim, w, true);
      a.proj.k = linear(p + "k", c.dim, w, true);
      a.proj.v = linear(p + "v", c.dim, w, true);
      a.proj.out = linear(p + "o", w, c.dim, true);
      a.qk_norm = {ir::QkNormKind::AcrossHeads, c.eps};
      a.proj.q_norm = p + "norm_q.weight";
      a.proj.k_norm = p + "norm_k.weight";
      a.consumer = consumer;
      return a;
    };
    ir::Attention self = attention(blk(i) + "self_attn.", ir::AttnKind::Self);
    self.rope = {ir::RopeStyle::Interleaved, c.rotary_dim, "rope"};
    b.sublayers.push_back({"self_attn", {}, layer_norm(c.eps), {0, 1, 2}, self});
    ir::Attention cross = attention(blk(i) + "cross_attn.", ir::AttnKind::Cross);
    cross.context = "text";
    ir::Norm n3{ir::NormKind::LayerNorm, true, blk(i) + "norm3.weight", blk(i) + "norm3.bias", c.eps};
    b.sublayers.push_back({"cross_attn", {}, n3, {}, cross});
    ir::Mlp f;
    f.act = ir::ActKind::GeluTanh;
    f.hidden = c.ffn;
    f.up = linear(blk(i) + "ffn.0", c.dim, c.ffn, true);
    f.down = linear(blk(i) + "ffn.2", c.ffn, c.dim, true);
    b.sublayers.push_back({"ffn", {}, layer_norm(c.eps), {3, 4, 5}, f});
    m.blocks.push_back(std::move(b));
  }
  m.final_layer = final_layer({}, layer_norm(c.eps), ir::ModScope::Shared, "head.mod",
                              linear("head.head", c.dim, c.out_channels * c.patch[0] * c.patch[1] * c.patch[2], true));
  ir::validate(m);
  return m;
}

FamilyRun prepare(const recognize::FamilyConfig& c, const exec::WeightSource& w, const TensorMap& raw,
                  ir::DType dtype, const std::string& consumer) {
  const at::Tensor& lat = need(raw, "latents", {c.in_channels, -1, -1, -1});
  const at::Tensor& text = need(raw, "text", {-1, c.text_dim});
  const at::Tensor& t = need(raw, "timestep", {1});
  const auto [pt, ph, pw] = c.patch;
  const int64_t C = c.in_channels, F = lat.size(1), H = lat.size(2), W = lat.size(3);
  if (F % pt || H % ph || W % pw)
    throw std::invalid_argument("inputs: latents [" + std::to_string(C) + ", " + std::to_string(F) + ", " +
                                std::to_string(H) + ", " + std::to_string(W) + "] not divisible by the patch");
  const int64_t f = F / pt, h = H / ph, wd = W / pw;
  const at::Device dev = w.tensor("patch_embedding.weight").device();
  const at::ScalarType dt = exec::to_aten(dtype);

  FamilyRun run;
  run.model = build(c, f * h * wd, text.size(0), dtype, consumer);
  // Patches in (c, pt, ph, pw) order (the flattened Conv3d kernel); tokens in (f, h, w) order.
  run.inputs.tokens["video"] = lat.to(dev, at::kFloat)
                                   .view({C, f, pt, h, ph, wd, pw})
                                   .permute({1, 3, 5, 0, 2, 4, 6})
                                   .reshape({f * h * wd, C * pt * ph * pw})
                                   .to(dt);
  at::Tensor e = affine(w, "time_embedding.2", at::silu(affine(w, "time_embedding.0", sinusoid(t.to(dev), c.freq_dim))));
  at::Tensor e0 = affine(w, "time_projection.1", at::silu(e)).view({6, c.dim});
  for (int64_t i = 0; i < c.layers; ++i)
    run.inputs.tables[blk(i) + "mod"] = (w.tensor(blk(i) + "modulation").view({1, 6, c.dim}) + e0).to(dt);
  run.inputs.tables["head.mod"] = (w.tensor("head.modulation").view({1, 2, c.dim}) + e).to(dt);
  run.inputs.tables["text"] =
      affine(w, "text_embedding.2", at::gelu(affine(w, "text_embedding.0", text.to(dev)), "tanh")).to(dt);
  set_rope_tables(run.inputs.tables, grid_positions(f, h, wd, dev), c.rope_axes_dim, c.rope_theta);
  run.finish = [=](const at::Tensor& out) {
    return out.view({f, h, wd, pt, ph, pw, c.out_channels}).permute({6, 0, 3, 1, 4, 2, 5}).reshape({c.out_channels, F, H, W});
  };
  return run;
}

TensorMap random_inputs(const recognize::FamilyConfig& c, const Geometry& g, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  int64_t F = 1, H = c.patch[1], W = c.patch[2] * g.tokens;
  if (g.tokens <= 0) {
    if (g.frames < 1 || (g.frames - 1) % 4 || g.height % 16 || g.width % 16 || g.height <= 0 || g.width <= 0)
      throw std::invalid_argument("wan geometry: frames must be 4k+1 and height/width positive multiples of 16, got " +
                                  std::to_string(g.frames) + "x" + std::to_string(g.height) + "x" + std::to_string(g.width));
    F = (g.frames - 1) / 4 + 1;  // the VAE compresses time 4x (first frame kept) and space 8x
    H = g.height / 8;
    W = g.width / 8;
  }
  const int64_t L = g.text_tokens > 0 ? g.text_tokens : c.text_tokens;
  TensorMap raw;
  raw["latents"] = at::randn({c.in_channels, F, H, W}, gen);
  raw["text"] = at::randn({L, c.text_dim}, gen);
  raw["timestep"] = at::full({1}, 500.0);
  return raw;
}

}  // namespace

const FamilyOps kWan{"wan2.1", random_inputs, prepare};

}  // namespace sp::models::detail
