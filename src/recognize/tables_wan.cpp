// Wan 2.1 T2V: recognition tables (original Wan/ComfyUI names, diffusers names) and presets;
// the symbols, names and conventions are docs/checkpoints.md's.
#include "recognize/table.hpp"

namespace sp::recognize::detail {
namespace {

const std::vector<Entry> kOriginal = with_biases({
    {"patch_embedding.weight+bias", "dim, in, pt, ph, pw"},
    {"text_embedding.0.weight+bias", "dim, text_dim"},
    {"text_embedding.2.weight+bias", "dim, dim"},
    {"time_embedding.0.weight+bias", "dim, freq_dim"},
    {"time_embedding.2.weight+bias", "dim, dim"},
    {"time_projection.1.weight+bias", "6*dim, dim"},
    {"blocks.{layers}.modulation", "1, 6, dim"},
    {"blocks.{layers}.self_attn.q.weight+bias", "dim, dim"},
    {"blocks.{layers}.self_attn.k.weight+bias", "dim, dim"},
    {"blocks.{layers}.self_attn.v.weight+bias", "dim, dim"},
    {"blocks.{layers}.self_attn.o.weight+bias", "dim, dim"},
    {"blocks.{layers}.self_attn.norm_q.weight", "dim"},
    {"blocks.{layers}.self_attn.norm_k.weight", "dim"},
    {"blocks.{layers}.norm3.weight+bias", "dim"},
    {"blocks.{layers}.cross_attn.q.weight+bias", "dim, dim"},
    {"blocks.{layers}.cross_attn.k.weight+bias", "dim, dim"},
    {"blocks.{layers}.cross_attn.v.weight+bias", "dim, dim"},
    {"blocks.{layers}.cross_attn.o.weight+bias", "dim, dim"},
    {"blocks.{layers}.cross_attn.norm_q.weight", "dim"},
    {"blocks.{layers}.cross_attn.norm_k.weight", "dim"},
    {"blocks.{layers}.ffn.0.weight+bias", "ffn, dim"},
    {"blocks.{layers}.ffn.2.weight+bias", "dim, ffn"},
    {"head.modulation", "1, 2, dim"},
    {"head.head.weight+bias", "out*pt*ph*pw, dim"},
});

const std::vector<Entry> kDiffusers = with_biases({
    {"patch_embedding.weight+bias", "dim, in, pt, ph, pw", "patch_embedding.weight"},
    {"condition_embedder.text_embedder.linear_1.weight+bias", "dim, text_dim", "text_embedding.0.weight"},
    {"condition_embedder.text_embedder.linear_2.weight+bias", "dim, dim", "text_embedding.2.weight"},
    {"condition_embedder.time_embedder.linear_1.weight+bias", "dim, freq_dim", "time_embedding.0.weight"},
    {"condition_embedder.time_embedder.linear_2.weight+bias", "dim, dim", "time_embedding.2.weight"},
    {"condition_embedder.time_proj.weight+bias", "6*dim, dim", "time_projection.1.weight"},
    {"blocks.{layers}.scale_shift_table", "1, 6, dim", "blocks.{layers}.modulation"},
    {"blocks.{layers}.attn1.to_q.weight+bias", "dim, dim", "blocks.{layers}.self_attn.q.weight"},
    {"blocks.{layers}.attn1.to_k.weight+bias", "dim, dim", "blocks.{layers}.self_attn.k.weight"},
    {"blocks.{layers}.attn1.to_v.weight+bias", "dim, dim", "blocks.{layers}.self_attn.v.weight"},
    {"blocks.{layers}.attn1.to_out.0.weight+bias", "dim, dim", "blocks.{layers}.self_attn.o.weight"},
    {"blocks.{layers}.attn1.norm_q.weight", "dim", "blocks.{layers}.self_attn.norm_q.weight"},
    {"blocks.{layers}.attn1.norm_k.weight", "dim", "blocks.{layers}.self_attn.norm_k.weight"},
    {"blocks.{layers}.norm2.weight+bias", "dim", "blocks.{layers}.norm3.weight"},
    {"blocks.{layers}.attn2.to_q.weight+bias", "dim, dim", "blocks.{layers}.cross_attn.q.weight"},
    {"blocks.{layers}.attn2.to_k.weight+bias", "dim, dim", "blocks.{layers}.cross_attn.k.weight"},
    {"blocks.{layers}.attn2.to_v.weight+bias", "dim, dim", "blocks.{layers}.cross_attn.v.weight"},
    {"blocks.{layers}.attn2.to_out.0.weight+bias", "dim, dim", "blocks.{layers}.cross_attn.o.weight"},
    {"blocks.{layers}.attn2.norm_q.weight", "dim", "blocks.{layers}.cross_attn.norm_q.weight"},
    {"blocks.{layers}.attn2.norm_k.weight", "dim", "blocks.{layers}.cross_attn.norm_k.weight"},
    {"blocks.{layers}.ffn.net.0.proj.weight+bias", "ffn, dim", "blocks.{layers}.ffn.0.weight"},
    {"blocks.{layers}.ffn.net.2.weight+bias", "dim, ffn", "blocks.{layers}.ffn.2.weight"},
    {"scale_shift_table", "1, 2, dim", "head.modulation"},
    {"proj_out.weight+bias", "out*pt*ph*pw, dim", "head.head.weight"},
});

constexpr int64_t kDefaultHeadDim = 128;

using C = FamilyConfig;
const Field kFields[] = {{"dim", &C::dim},         {"ffn", &C::ffn},           {"layers", &C::layers},
                         {"in", &C::in_channels},  {"out", &C::out_channels},  {"text_dim", &C::text_dim},
                         {"freq_dim", &C::freq_dim}};

// Wan's split of a head into t/h/w rotary axes: d - 4*(d/6), 2*(d/6), 2*(d/6).
std::vector<int64_t> wan_axes(int64_t d) { return {d - 4 * (d / 6), 2 * (d / 6), 2 * (d / 6)}; }

FamilyConfig structure(const Symbols& s, const Features&, const Sidecar& sidecar) {
  FamilyConfig c;
  c.family = "wan2.1";
  set_fields(c, s, kFields);
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
  Symbols s = field_symbols(c, kFields);
  s.insert({{"pt", c.patch[0]}, {"ph", c.patch[1]}, {"pw", c.patch[2]}});
  return s;
}

Features features(const FamilyConfig&) { return {}; }

void custom_defaults(FamilyConfig& c) {
  c.eps = 1e-6;
  c.rope_theta = 10000;
  c.rope_axes_dim = wan_axes(c.head_dim);
  c.rotary_dim = c.head_dim;
  c.text_tokens = 512;
  c.timestep_scale = 1;
  c.segments = {};
}

void check(const FamilyConfig& c, const Symbols&) { check_whole_head_rope(c, "Wan", "has one video stream"); }

// A preset, built from its symbols as recognition builds a config (heads = dim / head_dim).
FamilyConfig make(const std::string& variant, int64_t dim, int64_t head_dim, int64_t ffn, int64_t layers,
                  int64_t text_dim, int64_t freq_dim) {
  Sidecar sc;
  sc.head_dim = head_dim;
  FamilyConfig c = structure({{"dim", dim}, {"ffn", ffn}, {"layers", layers}, {"in", 16}, {"out", 16},
                              {"text_dim", text_dim}, {"freq_dim", freq_dim}, {"pt", 1}, {"ph", 2}, {"pw", 2}},
                             {}, sc);
  c.variant = variant;
  custom_defaults(c);
  return c;
}

}  // namespace

const Family& wan_family() {
  static const Family f = {
      "wan2.1",
      {{"original", kOriginal}, {"diffusers", kDiffusers}},
      {{"wan2.1-1.3b", make("wan2.1-1.3b", 1536, 128, 8960, 30, 4096, 256),
        make("wan2.1-tiny", 64, 16, 160, 30, 32, 32)},
       {"wan2.1-14b", make("wan2.1-14b", 5120, 128, 13824, 40, 4096, 256),
        make("wan2.1-tiny", 64, 16, 160, 40, 32, 32)}},
      structure,
      symbols,
      features,
      custom_defaults,
      check,
  };
  return f;
}

}  // namespace sp::recognize::detail
