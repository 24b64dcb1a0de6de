// avdit, a generic single-stream audio+video DiT (layout in docs/checkpoints.md): video, text
// and audio tokens embedded into one residual stream; per block RMSNorm + per-segment 6-way AdaLN,
// fused QKV, per-head Q/K RMSNorm, split-half RoPE over the leading rotary dims on a
// (t, h, w) grid, SwiGLU MLP with [gate | up] halves; final RMSNorm + per-segment
// shift/scale and an fp32 projection of the video tokens to patch features.
#include <ATen/CPUGeneratorImpl.h>

#include "models/family_common.hpp"
#include "models/family_table.hpp"

namespace sp::models::detail {

namespace {

struct Lengths {
  int64_t video, text, audio;
};

ir::Model build(const recognize::FamilyConfig& c, const Lengths& n, ir::DType dtype, const std::string& consumer) {
  ir::Model m;
  m.name = c.variant;
  m.dim = c.dim;
  m.dtype = dtype;
  for (const auto& s : c.segments) {
    m.segments.push_back({s, s == "video" ? n.video : s == "text" ? n.text : n.audio});
    const int64_t in = s == "video" ? c.in_channels : s == "text" ? c.text_dim : c.audio_dim;
    m.embeds.push_back({s, linear(s == "video" ? "patch_embed" : s + "_embed", in, c.dim, true)});
  }
  for (int64_t i = 0; i < c.layers; ++i) {
    ir::Block b;
    b.name = std::to_string(i);
    b.modulation = {ir::ModScope::PerSegment, 6, blk(i) + "mod"};
    const ir::Attention a =
        fused_qkv_attention(blk(i), {"attn.qkv", "attn.norm_q.weight", "attn.norm_k.weight", "attn.out"}, c, consumer);
    b.sublayers.push_back({"attn", {}, rms_norm(c.eps), {0, 1, 2}, a});
    b.sublayers.push_back({"mlp", {}, rms_norm(c.eps), {3, 4, 5}, swiglu_halves(blk(i) + "mlp.fc1", blk(i) + "mlp.fc2", c)});
    m.blocks.push_back(std::move(b));
  }
  m.final_layer = final_layer({"video"}, rms_norm(c.eps), ir::ModScope::PerSegment, "final.mod",
                              linear("final.proj", c.dim, c.out_channels, true));
  ir::validate(m);
  return m;
}

FamilyRun prepare(const recognize::FamilyConfig& c, const exec::WeightSource& w, const TensorMap& raw,
                  ir::DType dtype, const std::string& consumer) {
  const at::Tensor& video = need(raw, "video", {-1, c.in_channels});
  const at::Tensor& grid = need(raw, "grid", {3});
  const at::Tensor& text = need(raw, "text", {-1, c.text_dim});
  const at::Tensor& audio = need(raw, "audio", {-1, c.audio_dim});
  const at::Tensor& t = need(raw, "timestep", {1});
  const int64_t gf = grid[0].item<int64_t>(), gh = grid[1].item<int64_t>(), gw = grid[2].item<int64_t>();
  if (gf * gh * gw != video.size(0))
    throw std::invalid_argument("inputs: grid " + std::to_string(gf) + "x" + std::to_string(gh) + "x" +
                                std::to_string(gw) + " does not hold the " + std::to_string(video.size(0)) +
                                " video tokens");
  const at::Device dev = w.tensor("patch_embed.weight").device();
  const at::ScalarType dt = exec::to_aten(dtype);

  FamilyRun run;
  run.model = build(c, {video.size(0), text.size(0), audio.size(0)}, dtype, consumer);
  run.inputs.tokens["video"] = video.to(dev, dt);
  run.inputs.tokens["text"] = text.to(dev, dt);
  run.inputs.tokens["audio"] = audio.to(dev, dt);
  at::Tensor temb = affine(w, "time_embed.2", at::silu(affine(w, "time_embed.0", sinusoid(t.to(dev), c.freq_dim))));
  at::Tensor m6 = affine(w, "time_proj", at::silu(temb)).view({1, 6, c.dim});
  for (int64_t i = 0; i < c.layers; ++i) run.inputs.tables[blk(i) + "mod"] = (w.tensor(blk(i) + "modulation") + m6).to(dt);
  run.inputs.tables["final.mod"] = (w.tensor("final.modulation") + temb.view({1, 1, c.dim})).to(dt);
  // Video tokens on their (t, h, w) grid; text and audio at position 0.
  at::Tensor pos = at::zeros({run.model.tokens(), 3}, at::TensorOptions().dtype(at::kFloat).device(dev));
  pos.narrow(0, run.model.segment_begin("video"), video.size(0)).copy_(grid_positions(gf, gh, gw, dev));
  set_rope_tables(run.inputs.tables, pos, c.rope_axes_dim, c.rope_theta);
  return run;
}

TensorMap random_inputs(const recognize::FamilyConfig& c, const Geometry& g, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  int64_t f = 1, h = 1, w = g.tokens;
  if (g.tokens <= 0) {
    if (g.frames <= 0 || g.height <= 0 || g.width <= 0 || g.height % 32 || g.width % 32)
      throw std::invalid_argument("avdit geometry: latent frames positive, height and width positive multiples of 32, got " +
                                  std::to_string(g.frames) + "x" + std::to_string(g.height) + "x" + std::to_string(g.width));
    f = g.frames;
    h = g.height / 32;
    w = g.width / 32;
  }
  TensorMap raw;
  raw["video"] = at::randn({f * h * w, c.in_channels}, gen);
  raw["grid"] = at::tensor({f, h, w}, at::kLong);
  raw["text"] = at::randn({g.text_tokens > 0 ? g.text_tokens : c.text_tokens, c.text_dim}, gen);
  raw["audio"] = at::randn({g.audio_tokens > 0 ? g.audio_tokens : 256, c.audio_dim}, gen);
  raw["timestep"] = at::full({1}, 500.0);
  return raw;
}

}  // namespace

const FamilyOps kAvdit{"avdit", random_inputs, prepare};

}  // namespace sp::models::detail
