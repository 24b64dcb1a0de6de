// Wan 2.1 T2V: recognition tables (original Wan/ComfyUI names, diffusers names), presets.
//
// Symbols: dim, ffn, text_dim, freq_dim, in, out (channels), pt, ph, pw (patch), layers.
// Heads cannot be read from shapes (norm_q/norm_k span all heads): head_dim defaults to 128,
// the sidecar may override it. Diffusers renames only; its blocks.N.norm2 is the original's
// norm3 (the affine cross-attention LayerNorm), and scale_shift_table is modulation.
#include "recognize/table.hpp"

namespace sp::recognize::detail {
namespace {

using Op = Source::Op;

const std::vector<Entry> kOriginal = {
    {"patch_embedding.weight", "dim, in, pt, ph, pw"},
    {"patch_embedding.bias", "dim"},
    {"text_embedding.0.weight", "dim, text_dim"},
    {"text_embedding.0.bias", "dim"},
    {"text_embedding.2.weight", "dim, dim"},
    {"text_embedding.2.bias", "dim"},
    {"time_embedding.0.weight", "dim, freq_dim"},
    {"time_embedding.0.bias", "dim"},
    {"time_embedding.2.weight", "dim, dim"},
    {"time_embedding.2.bias", "dim"},
    {"time_projection.1.weight", "6*dim, dim"},
    {"time_projection.1.bias", "6*dim"},
    {"blocks.{layers}.modulation", "1, 6, dim"},
    {"blocks.{layers}.self_attn.q.weight", "dim, dim"},
    {"blocks.{layers}.self_attn.q.bias", "dim"},
    {"blocks.{layers}.self_attn.k.weight", "dim, dim"},
    {"blocks.{layers}.self_attn.k.bias", "dim"},
    {"blocks.{layers}.self_attn.v.weight", "dim, dim"},
    {"blocks.{layers}.self_attn.v.bias", "dim"},
    {"blocks.{layers}.self_attn.o.weight", "dim, dim"},
    {"blocks.{layers}.self_attn.o.bias", "dim"},
    {"blocks.{layers}.self_attn.norm_q.weight", "dim"},
    {"blocks.{layers}.self_attn.norm_k.weight", "dim"},
    {"blocks.{layers}.norm3.weight", "dim"},
    {"blocks.{layers}.norm3.bias", "dim"},
    {"blocks.{layers}.cross_attn.q.weight", "dim, dim"},
    {"blocks.{layers}.cross_attn.q.bias", "dim"},
    {"blocks.{layers}.cross_attn.k.weight", "dim, dim"},
    {"blocks.{layers}.cross_attn.k.bias", "dim"},
    {"blocks.{layers}.cross_attn.v.weight", "dim, dim"},
    {"blocks.{layers}.cross_attn.v.bias", "dim"},
    {"blocks.{layers}.cross_attn.o.weight", "dim, dim"},
    {"blocks.{layers}.cross_attn.o.bias", "dim"},
    {"blocks.{layers}.cross_attn.norm_q.weight", "dim"},
    {"blocks.{layers}.cross_attn.norm_k.weight", "dim"},
    {"blocks.{layers}.ffn.0.weight", "ffn, dim"},
    {"blocks.{layers}.ffn.0.bias", "ffn"},
    {"blocks.{layers}.ffn.2.weight", "dim, ffn"},
    {"blocks.{layers}.ffn.2.bias", "dim"},
    {"head.modulation", "1, 2, dim"},
    {"head.head.weight", "out*pt*ph*pw, dim"},
    {"head.head.bias", "out*pt*ph*pw"},
};

const std::vector<Entry> kDiffusers = {
    {"patch_embedding.weight", "dim, in, pt, ph, pw", "patch_embedding.weight"},
    {"patch_embedding.bias", "dim", "patch_embedding.bias"},
    {"condition_embedder.text_embedder.linear_1.weight", "dim, text_dim", "text_embedding.0.weight"},
    {"condition_embedder.text_embedder.linear_1.bias", "dim", "text_embedding.0.bias"},
    {"condition_embedder.text_embedder.linear_2.weight", "dim, dim", "text_embedding.2.weight"},
    {"condition_embedder.text_embedder.linear_2.bias", "dim", "text_embedding.2.bias"},
    {"condition_embedder.time_embedder.linear_1.weight", "dim, freq_dim", "time_embedding.0.weight"},
    {"condition_embedder.time_embedder.linear_1.bias", "dim", "time_embedding.0.bias"},
    {"condition_embedder.time_embedder.linear_2.weight", "dim, dim", "time_embedding.2.weight"},
    {"condition_embedder.time_embedder.linear_2.bias", "dim", "time_embedding.2.bias"},
    {"condition_embedder.time_proj.weight", "6*dim, dim", "time_projection.1.weight"},
    {"condition_embedder.time_proj.bias", "6*dim", "time_projection.1.bias"},
    {"blocks.{layers}.scale_shift_table", "1, 6, dim", "blocks.{layers}.modulation"},
    {"blocks.{layers}.attn1.to_q.weight", "dim, dim", "blocks.{layers}.self_attn.q.weight"},
    {"blocks.{layers}.attn1.to_q.bias", "dim", "blocks.{layers}.self_attn.q.bias"},
    {"blocks.{layers}.attn1.to_k.weight", "dim, dim", "blocks.{layers}.self_attn.k.weight"},
    {"blocks.{layers}.attn1.to_k.bias", "dim", "blocks.{layers}.self_attn.k.bias"},
    {"blocks.{layers}.attn1.to_v.weight", "dim, dim", "blocks.{layers}.self_attn.v.weight"},
    {"blocks.{layers}.attn1.to_v.bias", "dim", "blocks.{layers}.self_attn.v.bias"},
    {"blocks.{layers}.attn1.to_out.0.weight", "dim, dim", "blocks.{layers}.self_attn.o.weight"},
    {"blocks.{layers}.attn1.to_out.0.bias", "dim", "blocks.{layers}.self_attn.o.bias"},
    {"blocks.{layers}.attn1.norm_q.weight", "dim", "blocks.{layers}.self_attn.norm_q.weight"},
    {"blocks.{layers}.attn1.norm_k.weight", "dim", "blocks.{layers}.self_attn.norm_k.weight"},
    {"blocks.{layers}.norm2.weight", "dim", "blocks.{layers}.norm3.weight"},
    {"blocks.{layers}.norm2.bias", "dim", "blocks.{layers}.norm3.bias"},
    {"blocks.{layers}.attn2.to_q.weight", "dim, dim", "blocks.{layers}.cross_attn.q.weight"},
    {"blocks.{layers}.attn2.to_q.bias", "dim", "blocks.{layers}.cross_attn.q.bias"},
    {"blocks.{layers}.attn2.to_k.weight", "dim, dim", "blocks.{layers}.cross_attn.k.weight"},
    {"blocks.{layers}.attn2.to_k.bias", "dim", "blocks.{layers}.cross_attn.k.bias"},
    {"blocks.{layers}.attn2.to_v.weight", "dim, dim", "blocks.{layers}.cross_attn.v.weight"},
    {"blocks.{layers}.attn2.to_v.bias", "dim", "blocks.{layers}.cross_attn.v.bias"},
    {"blocks.{layers}.attn2.to_out.0.weight", "dim, dim", "blocks.{layers}.cross_attn.o.weight"},
    {"blocks.{layers}.attn2.to_out.0.bias", "dim", "blocks.{layers}.cross_attn.o.bias"},
    {"blocks.{layers}.attn2.norm_q.weight", "dim", "blocks.{layers}.cross_attn.norm_q.weight"},
    {"blocks.{layers}.attn2.norm_k.weight", "dim", "blocks.{layers}.cross_attn.norm_k.weight"},
    {"blocks.{layers}.ffn.net.0.proj.weight", "ffn, dim", "blocks.{layers}.ffn.0.weight"},
    {"blocks.{layers}.ffn.net.0.proj.bias", "ffn", "blocks.{layers}.ffn.0.bias"},
    {"blocks.{layers}.ffn.net.2.weight", "dim, ffn", "blocks.{layers}.ffn.2.weight"},
    {"blocks.{layers}.ffn.net.2.bias", "dim", "blocks.{layers}.ffn.2.bias"},
    {"scale_shift_table", "1, 2, dim", "head.modulation"},
    {"proj_out.weight", "out*pt*ph*pw, dim", "head.head.weight"},
    {"proj_out.bias", "out*pt*ph*pw", "head.head.bias"},
};

constexpr int64_t kDefaultHeadDim = 128;

// Wan's split of a head into t/h/w rotary axes: d - 4*(d/6), 2*(d/6), 2*(d/6).
std::vector<int64_t> wan_axes(int64_t d) { return {d - 4 * (d / 6), 2 * (d / 6), 2 * (d / 6)}; }

FamilyConfig structure(const Symbols& s, const Features&, const Sidecar& sidecar) {
  FamilyConfig c;
  c.family = "wan2.1";
  c.dim = s.at("dim");
  c.ffn = s.at("ffn");
  c.layers = s.at("layers");
  c.in_channels = s.at("in");
  c.out_channels = s.at("out");
  c.text_dim = s.at("text_dim");
  c.freq_dim = s.at("freq_dim");
  c.patch = {s.at("pt"), s.at("ph"), s.at("pw")};
  c.qkv_bias = true;
  c.head_dim = sidecar.head_dim.value_or(kDefaultHeadDim);
  if (c.dim % c.head_dim != 0) {
    std::string from = sidecar.head_dim ? "sidecar head_dim " : "default head_dim ";
    throw RecognizeError(from + std::to_string(c.head_dim) + " does not divide dim " +
                         std::to_string(c.dim) + " (norm_q spans all heads, so heads cannot be " +
                         "read from shapes); give head_dim in a sidecar");
  }
  c.heads = c.dim / c.head_dim;
  return c;
}

Symbols symbols(const FamilyConfig& c) {
  return {{"dim", c.dim},          {"ffn", c.ffn},           {"layers", c.layers},
          {"in", c.in_channels},   {"out", c.out_channels},  {"text_dim", c.text_dim},
          {"freq_dim", c.freq_dim}, {"pt", c.patch[0]},      {"ph", c.patch[1]},
          {"pw", c.patch[2]}};
}

Features features(const FamilyConfig&) { return {}; }

void custom_defaults(FamilyConfig& c) {
  c.eps = 1e-6;
  c.rope_theta = 10000;
  c.rope_axes_dim = wan_axes(c.head_dim);
  c.rotary_dim = c.head_dim;
  c.rope_interleaved = true;
  c.text_tokens = 512;
  c.timestep_scale = 1;
  c.segments = {};
}

void check(const FamilyConfig& c, const Symbols&) { check_whole_head_rope(c, "Wan", "has one video stream"); }

FamilyConfig make(const std::string& variant, int64_t dim, int64_t heads, int64_t head_dim,
                  int64_t ffn, int64_t layers, int64_t text_dim, int64_t freq_dim) {
  FamilyConfig c;
  c.family = "wan2.1";
  c.variant = variant;
  c.dim = dim;
  c.heads = heads;
  c.head_dim = head_dim;
  c.ffn = ffn;
  c.layers = layers;
  c.in_channels = 16;
  c.out_channels = 16;
  c.text_dim = text_dim;
  c.freq_dim = freq_dim;
  c.patch = {1, 2, 2};
  c.qkv_bias = true;
  custom_defaults(c);
  return c;
}

}  // namespace

const Family& wan_family() {
  static const Family f = {
      "wan2.1",
      {{"original", kOriginal}, {"diffusers", kDiffusers}},
      {{"wan2.1-1.3b", make("wan2.1-1.3b", 1536, 12, 128, 8960, 30, 4096, 256),
        make("wan2.1-tiny", 64, 4, 16, 160, 30, 32, 32)},
       {"wan2.1-14b", make("wan2.1-14b", 5120, 40, 128, 13824, 40, 4096, 256),
        make("wan2.1-tiny", 64, 4, 16, 160, 40, 32, 32)}},
      structure,
      symbols,
      features,
      custom_defaults,
      check,
  };
  return f;
}

}  // namespace sp::recognize::detail
