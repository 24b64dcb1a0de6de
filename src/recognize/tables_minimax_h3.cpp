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

// Rotary widths follow rope.inv_freq: 3 axes (t, h, w) of 2*pairs dims each.
void set_rope_from_pairs(FamilyConfig& c, int64_t pairs) {
  c.rope_axes_dim = {2 * pairs, 2 * pairs, 2 * pairs};
  c.rotary_dim = 6 * pairs;
}

FamilyConfig structure(const Symbols& s, const Features& f, const Sidecar& sidecar) {
  FamilyConfig c;
  c.family = kFamily;
  c.dim = s.at("dim");
  c.heads = s.at("heads");
  c.head_dim = s.at("head_dim");
  if (sidecar.head_dim && *sidecar.head_dim != c.head_dim)
    throw RecognizeError("sidecar head_dim " + std::to_string(*sidecar.head_dim) +
                         " contradicts the checkpoint's q_norm width " + std::to_string(c.head_dim));
  c.ffn = s.at("ffn");
  c.layers = s.at("layers");
  c.refiner_layers = s.at("refiner_layers");
  c.in_channels = s.at("feat");
  c.out_channels = s.at("feat");
  c.audio_dim = s.at("audio_dim");
  c.text_dim = s.at("text_dim");
  // Which time path is present is checked in check(); here each form reads its own symbols.
  c.freq_dim = s.count("freq_dim") ? s.at("freq_dim") : 0;
  c.time_table_rows = s.count("grid") ? s.at("grid") : 0;
  c.time_dim = s.at("time_dim");
  c.head_bank = s.at("bank");
  c.gate_compress = f.count("gate_compress") > 0;
  c.qkv_bias = false;
  // Rope widths are convention fields, but this layout stores them: a config matching no
  // preset keeps these (custom_defaults leaves them), a preset's must agree (check()).
  set_rope_from_pairs(c, s.at("pairs"));
  return c;
}

Symbols symbols(const FamilyConfig& c) {
  if (c.rotary_dim <= 0 || c.rotary_dim % 6 != 0)
    throw RecognizeError(std::string(kFamily) + ": rope.rotary_dim " + std::to_string(c.rotary_dim) +
                         " is not 3 axes of 2*pairs dims (a positive multiple of 6)");
  return {{"dim", c.dim},
          {"heads", c.heads},
          {"head_dim", c.head_dim},
          {"ffn", c.ffn},
          {"feat", c.in_channels},
          {"audio_dim", c.audio_dim},
          {"text_dim", c.text_dim},
          {"freq_dim", c.freq_dim},
          {"time_dim", c.time_dim},
          {"grid", c.time_table_rows},
          {"pairs", c.rotary_dim / 6},
          {"bank", c.head_bank},
          {"layers", c.layers},
          {"refiner_layers", c.refiner_layers}};
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
  c.rope_interleaved = false;
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

FamilyConfig make(bool tiny) {
  FamilyConfig c;
  c.family = kFamily;
  c.variant = tiny ? "minimax-h3-tiny" : "minimax-h3";
  // Tiny keeps every structural trait: heads*head_dim != dim, rotary over 3/4 of the head,
  // text_dim != dim, audio rows narrower than video patches.
  c.dim = tiny ? 64 : 5376;
  c.heads = tiny ? 3 : 56;
  c.head_dim = tiny ? 32 : 128;
  c.ffn = tiny ? 160 : 14336;
  c.layers = 50;
  c.refiner_layers = 2;
  c.in_channels = tiny ? 16 : 96;  // video latent channels (4 / 24) x 2x2 patch
  c.out_channels = c.in_channels;
  c.audio_dim = tiny ? 6 : 32;
  c.text_dim = tiny ? 40 : 5120;
  c.freq_dim = tiny ? 32 : 256;
  c.time_dim = tiny ? 32 : 2688;
  c.time_table_rows = 0;
  c.head_bank = 1;
  c.gate_compress = false;
  c.qkv_bias = false;
  custom_defaults(c);
  set_rope_from_pairs(c, tiny ? 4 : 16);  // 24 = 8/8/8 of 32, 96 = 32/32/32 of 128
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
