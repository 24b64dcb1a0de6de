// MiniMax H3 (joint video + stereo audio DiT): the released checkpoint layout ("original"
// only) and presets; docs/checkpoints.md lists the symbols, features, tensors and variants.
#include "recognize/table.hpp"

namespace sp::recognize::detail {
namespace {

using Op = Source::Op;

constexpr const char* kFamily = "minimax-h3";

// Attention + SwiGLU MLP tensors shared by token-refiner and DiT blocks, under `block`
// (e.g. "blocks.{layers}.").
void add_transformer_block(std::vector<Entry>& out, const std::string& block) {
  out.insert(out.end(), {
                            {block + "norm1.weight", "dim"},
                            {block + "norm2.weight", "dim"},
                            {block + "attn.qkv_proj.weight", "3*heads*head_dim, dim"},
                            {block + "attn.q_norm.weight", "head_dim"},
                            {block + "attn.k_norm.weight", "head_dim"},
                            {block + "attn.out_proj.weight", "dim, heads*head_dim"},
                            {block + "mlp.fc1.weight", "2*ffn, dim"},
                            {block + "mlp.fc2.weight", "dim, ffn"},
                        });
}

std::vector<Entry> original_entries() {
  std::vector<Entry> e = {
      {"video_patch_proj.weight+bias", "dim, feat"},
      {"audio_patch_proj.weight+bias", "dim, audio_dim"},
      {"condition_proj.weight+bias", "dim, text_dim"},
      {"time_embedder.proj_in.weight+bias", "dim, freq_dim", "", Op::Copy, 0, "plain"},
      {"time_embedder.proj_out.weight+bias", "time_dim, dim", "", Op::Copy, 0, "plain"},
      {"adaln_t_table", "grid, time_dim", "", Op::Copy, 0, "curve"},
      {"rope.inv_freq", "pairs"},
  };
  add_transformer_block(e, "token_refiner.blocks.{refiner_layers}.");
  e.push_back({"token_refiner.final_norm.weight", "dim"});
  add_transformer_block(e, "blocks.{layers}.");
  e.insert(e.end(), {
                        {"blocks.{layers}.attn.to_gate_compress.weight", "heads*head_dim, dim",
                         "", Op::Copy, 0, "gate_compress"},
                        {"blocks.{layers}.adaln_proj.linear.weight+bias", "18*dim, time_dim"},
                        {"final_layer.norm.weight", "dim"},
                        {"final_layer.adaln_proj.linear.weight+bias", "2*dim, time_dim"},
                        {"final_layer.video_out.weight+bias", "bank*feat, dim"},
                        {"final_layer.audio_out.weight+bias", "bank*audio_dim, dim"},
                    });
  return with_biases(std::move(e));
}

// Every form's symbols; freq_dim (plain form) and grid (curve form) are the time path's own.
using C = FamilyConfig;
const Field kFields[] = {{"dim", &C::dim},           {"heads", &C::heads},       {"head_dim", &C::head_dim},
                         {"ffn", &C::ffn},           {"feat", &C::in_channels},  {"audio_dim", &C::audio_dim},
                         {"text_dim", &C::text_dim}, {"time_dim", &C::time_dim}, {"bank", &C::head_bank},
                         {"layers", &C::layers},     {"refiner_layers", &C::refiner_layers}};

FamilyConfig structure(const Symbols& s, const Features& f, const Sidecar& sidecar) {
  FamilyConfig c;
  c.family = kFamily;
  set_fields(c, s, kFields);
  check_sidecar_head_dim(c, sidecar, "q_norm");
  c.out_channels = c.in_channels;
  // Which time path is present is checked in check(); here each form reads its own symbols.
  c.freq_dim = s.count("freq_dim") ? s.at("freq_dim") : 0;
  c.time_table_rows = s.count("grid") ? s.at("grid") : 0;
  c.gate_compress = f.count("gate_compress") > 0;
  c.qkv_bias = false;
  // Rope widths are convention fields, but this layout stores them (rope.inv_freq: 3 axes (t, h,
  // w) of 2*pairs dims each): a config matching no preset keeps these (custom_defaults leaves
  // them), a preset's must agree (check()).
  const int64_t pairs = s.at("pairs");
  c.rope_axes_dim = {2 * pairs, 2 * pairs, 2 * pairs};
  c.rotary_dim = 6 * pairs;
  return c;
}

Symbols symbols(const FamilyConfig& c) {
  if (c.rotary_dim <= 0 || c.rotary_dim % 6 != 0)
    throw RecognizeError(std::string(kFamily) + ": rope.rotary_dim " + std::to_string(c.rotary_dim) +
                         " is not 3 axes of 2*pairs dims (a positive multiple of 6)");
  Symbols s = field_symbols(c, kFields);
  s.insert({{"freq_dim", c.freq_dim}, {"grid", c.time_table_rows}, {"pairs", c.rotary_dim / 6}});
  return s;
}

Features features(const FamilyConfig& c) {
  Features f = {c.time_table_rows > 0 ? "curve" : "plain"};
  if (c.gate_compress) f.insert("gate_compress");
  return f;
}

void custom_defaults(FamilyConfig& c) {
  c.eps = 1e-5;
  c.rope_theta = 10000;
  // rotary_dim and rope_axes_dim: already set from rope.inv_freq by structure().
  c.text_tokens = 512;
  c.timestep_scale = 1;  // timesteps in [0, 1] (t = 1 - sigma)
  c.segments = {};
}

void check(const FamilyConfig& c, const Symbols& s) {
  const bool plain = s.count("freq_dim") > 0, curve = s.count("grid") > 0;
  if (plain && curve)
    throw RecognizeError(
        "both time paths are present: time_embedder.proj_in/proj_out (plain form, freq_dim " +
        std::to_string(s.at("freq_dim")) + ") and adaln_t_table (curve form, " +
        std::to_string(s.at("grid")) + " rows); a checkpoint holds exactly one");
  if (!plain && !curve)
    throw RecognizeError(
        "no time path: neither time_embedder.proj_in/proj_out (plain form) nor adaln_t_table "
        "(curve form) is present; a checkpoint holds exactly one");
  if (curve && s.at("grid") < 2)
    throw RecognizeError("adaln_t_table has " + std::to_string(s.at("grid")) +
                         " row(s); the curve form interpolates between rows and needs at least 2");
  const int64_t pairs = s.at("pairs");
  const std::vector<int64_t> axes = {2 * pairs, 2 * pairs, 2 * pairs};
  if (c.rotary_dim != 6 * pairs || c.rope_axes_dim != axes)
    throw RecognizeError("rope.inv_freq has " + std::to_string(pairs) + " pairs per axis, so 3 axes rotate " +
                         shape_string(axes) + " = " + std::to_string(6 * pairs) + " dims, but rope.axes_dim is " +
                         shape_string(c.rope_axes_dim) + " and rope.rotary_dim " + std::to_string(c.rotary_dim));
  if (!c.segments.empty())
    throw RecognizeError(
        "sidecar field segments applies to avdit only (minimax-h3 picks modulation rows by timestep class and "
        "modality tag)");
}

// A preset (the plain form), built from its symbols as recognition builds a config. Tiny keeps
// every structural trait: heads*head_dim != dim, rotary over 3/4 of the head (pairs: 24 = 8/8/8
// of 32, 96 = 32/32/32 of 128), text_dim != dim, audio rows narrower than video patches (feat:
// video latent channels (4 / 24) x 2x2 patch).
FamilyConfig make(bool tiny) {
  FamilyConfig c = structure({{"dim", tiny ? 64 : 5376}, {"heads", tiny ? 3 : 56}, {"head_dim", tiny ? 32 : 128},
                              {"ffn", tiny ? 160 : 14336}, {"feat", tiny ? 16 : 96}, {"audio_dim", tiny ? 6 : 32},
                              {"text_dim", tiny ? 40 : 5120}, {"freq_dim", tiny ? 32 : 256},
                              {"time_dim", tiny ? 32 : 2688}, {"bank", 1}, {"pairs", tiny ? 4 : 16}, {"layers", 50},
                              {"refiner_layers", 2}},
                             {}, {});
  c.variant = tiny ? "minimax-h3-tiny" : "minimax-h3";
  custom_defaults(c);
  return c;
}

}  // namespace

const Family& minimax_h3_family() {
  static const Family f = {
      kFamily,
      {{"original", original_entries()}},
      {{"minimax-h3", make(false), make(true)}},
      structure,
      symbols,
      features,
      custom_defaults,
      check,
  };
  return f;
}

}  // namespace sp::recognize::detail
