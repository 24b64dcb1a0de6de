// avdit, this project's own audio+video DiT layout (tests, the embedded demo): its recognition
// table ("original" only) and presets; docs/checkpoints.md defines the layout.
#include "recognize/table.hpp"

namespace sp::recognize::detail {
namespace {

const std::vector<Entry> kOriginal = with_biases({
    {"patch_embed.weight+bias", "dim, feat"},
    {"text_embed.weight+bias", "dim, text_dim"},
    {"audio_embed.weight+bias", "dim, audio_dim"},
    {"time_embed.0.weight+bias", "dim, freq_dim"},
    {"time_embed.2.weight+bias", "dim, dim"},
    {"time_proj.weight+bias", "6*dim, dim"},
    {"blocks.{layers}.modulation", "segs, 6, dim"},
    {"blocks.{layers}.attn.qkv.weight", "3*heads*head_dim, dim"},
    {"blocks.{layers}.attn.norm_q.weight", "head_dim"},
    {"blocks.{layers}.attn.norm_k.weight", "head_dim"},
    {"blocks.{layers}.attn.out.weight", "dim, heads*head_dim"},
    {"blocks.{layers}.mlp.fc1.weight", "2*ffn, dim"},
    {"blocks.{layers}.mlp.fc2.weight", "dim, ffn"},
    {"final.modulation", "segs, 2, dim"},
    {"final.proj.weight+bias", "feat, dim"},
});

using C = FamilyConfig;
const Field kFields[] = {{"dim", &C::dim},           {"heads", &C::heads},         {"head_dim", &C::head_dim},
                         {"ffn", &C::ffn},           {"feat", &C::in_channels},    {"text_dim", &C::text_dim},
                         {"audio_dim", &C::audio_dim}, {"freq_dim", &C::freq_dim}, {"layers", &C::layers}};

FamilyConfig structure(const Symbols& s, const Features&, const Sidecar& sidecar) {
  FamilyConfig c;
  c.family = "avdit";
  set_fields(c, s, kFields);
  check_sidecar_head_dim(c, sidecar, "norm_q");
  c.out_channels = c.in_channels;
  c.qkv_bias = false;
  // Placeholder names: the count is structural (it tells presets apart), the names are a
  // convention filled in from the preset, the defaults or the sidecar.
  c.segments.assign(static_cast<size_t>(s.at("segs")), "");
  return c;
}

Symbols symbols(const FamilyConfig& c) {
  Symbols s = field_symbols(c, kFields);
  s["segs"] = static_cast<int64_t>(c.segments.size());
  return s;
}

Features features(const FamilyConfig&) { return {}; }

void custom_defaults(FamilyConfig& c) {
  c.eps = 1e-5;
  c.rope_theta = 10000;
  // Rotary over the first 96 of 128 head dims, 32 per axis (t, h, w); other head widths
  // need a sidecar.
  if (c.head_dim == 128) {
    c.rope_axes_dim = {32, 32, 32};
    c.rotary_dim = 96;
  } else {
    c.rope_axes_dim = {};
    c.rotary_dim = 0;
  }
  c.text_tokens = 512;
  c.timestep_scale = 1;
  c.segments = {"video", "text", "audio"};
}

void check(const FamilyConfig& c, const Symbols& s) {
  const int64_t segs = s.at("segs");
  if (static_cast<int64_t>(c.segments.size()) != segs)
    throw RecognizeError("segments [" + join(c.segments) + "] name " + std::to_string(c.segments.size()) +
                         " segments but blocks.N.modulation has " + std::to_string(segs) +
                         " rows; give segments in a sidecar");
}

// A preset, built from its symbols as recognition builds a config.
FamilyConfig make(bool tiny) {
  FamilyConfig c = structure({{"dim", tiny ? 64 : 5376}, {"heads", tiny ? 4 : 56}, {"head_dim", tiny ? 16 : 128},
                              {"ffn", tiny ? 96 : 14336}, {"feat", tiny ? 12 : 96}, {"text_dim", tiny ? 32 : 4096},
                              {"audio_dim", tiny ? 8 : 128}, {"freq_dim", 256}, {"segs", 3}, {"layers", 50}},
                             {}, {});
  c.variant = tiny ? "avdit-tiny" : "avdit";
  custom_defaults(c);
  if (tiny) {
    c.rope_axes_dim = {4, 4, 4};
    c.rotary_dim = 12;
  }
  return c;
}

}  // namespace

const Family& avdit_family() {
  static const Family f = {
      "avdit",
      {{"original", kOriginal}},
      {{"avdit", make(false), make(true)}},
      structure,
      symbols,
      features,
      custom_defaults,
      check,
  };
  return f;
}

}  // namespace sp::recognize::detail
