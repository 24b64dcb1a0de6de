// Flux.1 (dev/schnell): recognition tables (original BFL names, diffusers names, the names of
// ComfyUI's modules) and presets; the symbols, names and conventions are docs/checkpoints.md's.
#include "recognize/table.hpp"

namespace sp::recognize::detail {
namespace {

using Op = Source::Op;

const std::vector<Entry> kOriginal = with_biases({
    {"img_in.weight+bias", "dim, in"},
    {"txt_in.weight+bias", "dim, ctx"},
    {"time_in.in_layer.weight+bias", "dim, freq_dim"},
    {"time_in.out_layer.weight+bias", "dim, dim"},
    {"vector_in.in_layer.weight+bias", "dim, vec"},
    {"vector_in.out_layer.weight+bias", "dim, dim"},
    {"guidance_in.in_layer.weight+bias", "dim, freq_dim", "", Op::Copy, 0, "guidance"},
    {"guidance_in.out_layer.weight+bias", "dim, dim", "", Op::Copy, 0, "guidance"},
    {"double_blocks.{layers}.img_mod.lin.weight+bias", "6*dim, dim"},
    {"double_blocks.{layers}.img_attn.qkv.weight+bias", "3*dim, dim"},
    {"double_blocks.{layers}.img_attn.norm.query_norm.scale", "head_dim"},
    {"double_blocks.{layers}.img_attn.norm.key_norm.scale", "head_dim"},
    {"double_blocks.{layers}.img_attn.proj.weight+bias", "dim, dim"},
    {"double_blocks.{layers}.img_mlp.0.weight+bias", "mlp, dim"},
    {"double_blocks.{layers}.img_mlp.2.weight+bias", "dim, mlp"},
    {"double_blocks.{layers}.txt_mod.lin.weight+bias", "6*dim, dim"},
    {"double_blocks.{layers}.txt_attn.qkv.weight+bias", "3*dim, dim"},
    {"double_blocks.{layers}.txt_attn.norm.query_norm.scale", "head_dim"},
    {"double_blocks.{layers}.txt_attn.norm.key_norm.scale", "head_dim"},
    {"double_blocks.{layers}.txt_attn.proj.weight+bias", "dim, dim"},
    {"double_blocks.{layers}.txt_mlp.0.weight+bias", "mlp, dim"},
    {"double_blocks.{layers}.txt_mlp.2.weight+bias", "dim, mlp"},
    {"single_blocks.{single_layers}.modulation.lin.weight+bias", "3*dim, dim"},
    {"single_blocks.{single_layers}.linear1.weight+bias", "3*dim+mlp, dim"},
    {"single_blocks.{single_layers}.norm.query_norm.scale", "head_dim"},
    {"single_blocks.{single_layers}.norm.key_norm.scale", "head_dim"},
    {"single_blocks.{single_layers}.linear2.weight+bias", "dim, dim+mlp"},
    {"final_layer.adaLN_modulation.1.weight+bias", "2*dim, dim"},
    {"final_layer.linear.weight+bias", "out, dim"},
});

// Block prefixes: diffusers' double (DB) and single (SB) blocks, the original ones (OD, OS).
const std::string DB = "transformer_blocks.{layers}.", OD = "double_blocks.{layers}.",
                  SB = "single_transformer_blocks.{single_layers}.", OS = "single_blocks.{single_layers}.";
const std::vector<Entry> kDiffusers = with_biases({
    {"x_embedder.weight+bias", "dim, in", "img_in.weight"},
    {"context_embedder.weight+bias", "dim, ctx", "txt_in.weight"},
    {"time_text_embed.timestep_embedder.linear_1.weight+bias", "dim, freq_dim", "time_in.in_layer.weight"},
    {"time_text_embed.timestep_embedder.linear_2.weight+bias", "dim, dim", "time_in.out_layer.weight"},
    {"time_text_embed.text_embedder.linear_1.weight+bias", "dim, vec", "vector_in.in_layer.weight"},
    {"time_text_embed.text_embedder.linear_2.weight+bias", "dim, dim", "vector_in.out_layer.weight"},
    {"time_text_embed.guidance_embedder.linear_1.weight+bias", "dim, freq_dim",
     "guidance_in.in_layer.weight", Op::Copy, 0, "guidance"},
    {"time_text_embed.guidance_embedder.linear_2.weight+bias", "dim, dim",
     "guidance_in.out_layer.weight", Op::Copy, 0, "guidance"},
    {DB + "norm1.linear.weight+bias", "6*dim, dim", OD + "img_mod.lin.weight"},
    {DB + "attn.to_q.weight", "dim, dim", OD + "img_attn.qkv.weight", Op::Concat0, 0},
    {DB + "attn.to_k.weight", "dim, dim", OD + "img_attn.qkv.weight", Op::Concat0, 1},
    {DB + "attn.to_v.weight", "dim, dim", OD + "img_attn.qkv.weight", Op::Concat0, 2},
    {DB + "attn.to_q.bias", "dim", OD + "img_attn.qkv.bias", Op::Concat0, 0},
    {DB + "attn.to_k.bias", "dim", OD + "img_attn.qkv.bias", Op::Concat0, 1},
    {DB + "attn.to_v.bias", "dim", OD + "img_attn.qkv.bias", Op::Concat0, 2},
    {DB + "attn.norm_q.weight", "head_dim", OD + "img_attn.norm.query_norm.scale"},
    {DB + "attn.norm_k.weight", "head_dim", OD + "img_attn.norm.key_norm.scale"},
    {DB + "attn.to_out.0.weight+bias", "dim, dim", OD + "img_attn.proj.weight"},
    {DB + "ff.net.0.proj.weight+bias", "mlp, dim", OD + "img_mlp.0.weight"},
    {DB + "ff.net.2.weight+bias", "dim, mlp", OD + "img_mlp.2.weight"},
    {DB + "norm1_context.linear.weight+bias", "6*dim, dim", OD + "txt_mod.lin.weight"},
    {DB + "attn.add_q_proj.weight", "dim, dim", OD + "txt_attn.qkv.weight", Op::Concat0, 0},
    {DB + "attn.add_k_proj.weight", "dim, dim", OD + "txt_attn.qkv.weight", Op::Concat0, 1},
    {DB + "attn.add_v_proj.weight", "dim, dim", OD + "txt_attn.qkv.weight", Op::Concat0, 2},
    {DB + "attn.add_q_proj.bias", "dim", OD + "txt_attn.qkv.bias", Op::Concat0, 0},
    {DB + "attn.add_k_proj.bias", "dim", OD + "txt_attn.qkv.bias", Op::Concat0, 1},
    {DB + "attn.add_v_proj.bias", "dim", OD + "txt_attn.qkv.bias", Op::Concat0, 2},
    {DB + "attn.norm_added_q.weight", "head_dim", OD + "txt_attn.norm.query_norm.scale"},
    {DB + "attn.norm_added_k.weight", "head_dim", OD + "txt_attn.norm.key_norm.scale"},
    {DB + "attn.to_add_out.weight+bias", "dim, dim", OD + "txt_attn.proj.weight"},
    {DB + "ff_context.net.0.proj.weight+bias", "mlp, dim", OD + "txt_mlp.0.weight"},
    {DB + "ff_context.net.2.weight+bias", "dim, mlp", OD + "txt_mlp.2.weight"},
    {SB + "norm.linear.weight+bias", "3*dim, dim", OS + "modulation.lin.weight"},
    {SB + "attn.to_q.weight", "dim, dim", OS + "linear1.weight", Op::Concat0, 0},
    {SB + "attn.to_k.weight", "dim, dim", OS + "linear1.weight", Op::Concat0, 1},
    {SB + "attn.to_v.weight", "dim, dim", OS + "linear1.weight", Op::Concat0, 2},
    {SB + "proj_mlp.weight", "mlp, dim", OS + "linear1.weight", Op::Concat0, 3},
    {SB + "attn.to_q.bias", "dim", OS + "linear1.bias", Op::Concat0, 0},
    {SB + "attn.to_k.bias", "dim", OS + "linear1.bias", Op::Concat0, 1},
    {SB + "attn.to_v.bias", "dim", OS + "linear1.bias", Op::Concat0, 2},
    {SB + "proj_mlp.bias", "mlp", OS + "linear1.bias", Op::Concat0, 3},
    {SB + "attn.norm_q.weight", "head_dim", OS + "norm.query_norm.scale"},
    {SB + "attn.norm_k.weight", "head_dim", OS + "norm.key_norm.scale"},
    {SB + "proj_out.weight+bias", "dim, dim+mlp", OS + "linear2.weight"},
    {"norm_out.linear.weight+bias", "2*dim, dim", "final_layer.adaLN_modulation.1.weight", Op::SwapHalves0},
    {"proj_out.weight+bias", "out, dim", "final_layer.linear.weight"},
});

// ComfyUI's own modules (2026 on) name each QK norm's scale `weight` (its RMSNorm); its loader renames
// the original files' `_norm.scale` on load. Everything else is the original layout.
std::vector<Entry> comfyui_entries() {
  std::vector<Entry> out = kOriginal;
  const std::string from = "_norm.scale";
  for (auto& e : out)
    if (e.name.ends_with(from)) {
      e.canonical = e.name;
      e.name = e.name.substr(0, e.name.size() - from.size()) + "_norm.weight";
    }
  return out;
}

using C = FamilyConfig;
const Field kFields[] = {{"dim", &C::dim},           {"head_dim", &C::head_dim},   {"mlp", &C::ffn},
                         {"in", &C::in_channels},    {"out", &C::out_channels},    {"ctx", &C::text_dim},
                         {"vec", &C::vec_dim},       {"freq_dim", &C::freq_dim},   {"layers", &C::layers},
                         {"single_layers", &C::single_layers}};

FamilyConfig structure(const Symbols& s, const Features& f, const Sidecar& sidecar) {
  FamilyConfig c;
  c.family = "flux1";
  set_fields(c, s, kFields);
  if (c.dim % c.head_dim != 0)
    throw RecognizeError("QK-norm width (head_dim) " + std::to_string(c.head_dim) +
                         " does not divide dim " + std::to_string(c.dim));
  check_sidecar_head_dim(c, sidecar, "QK-norm");
  c.heads = c.dim / c.head_dim;
  c.guidance = f.count("guidance") > 0;
  c.qkv_bias = true;
  return c;
}

Symbols symbols(const FamilyConfig& c) { return field_symbols(c, kFields); }

Features features(const FamilyConfig& c) { return c.guidance ? Features{"guidance"} : Features{}; }

void custom_defaults(FamilyConfig& c) {
  c.eps = 1e-6;
  c.rope_theta = 10000;
  // BFL's axes (16, 56, 56) are for head_dim 128; other widths need a sidecar.
  c.rope_axes_dim = c.head_dim == 128 ? std::vector<int64_t>{16, 56, 56} : std::vector<int64_t>{};
  c.rotary_dim = c.head_dim;
  c.text_tokens = c.guidance ? 512 : 256;
  c.timestep_scale = 1000;
  c.segments = {};
}

void check(const FamilyConfig& c, const Symbols&) { check_whole_head_rope(c, "Flux", "orders [text | image]"); }

// A preset, built from its symbols as recognition builds a config.
FamilyConfig make(const std::string& variant, bool guidance, bool tiny) {
  const int64_t dim = tiny ? 64 : 3072, channels = tiny ? 16 : 64;
  FamilyConfig c = structure({{"dim", dim}, {"head_dim", tiny ? 16 : 128}, {"mlp", 4 * dim}, {"in", channels},
                              {"out", channels}, {"ctx", tiny ? 32 : 4096}, {"vec", tiny ? 24 : 768}, {"freq_dim", 256},
                              {"layers", 19}, {"single_layers", 38}},
                             guidance ? Features{"guidance"} : Features{}, {});
  c.variant = variant;
  custom_defaults(c);
  if (tiny) c.rope_axes_dim = {4, 6, 6};
  return c;
}

}  // namespace

const Family& flux_family() {
  static const Family f = {
      "flux1",
      {{"original", kOriginal}, {"diffusers", kDiffusers}, {"comfyui", comfyui_entries()}},
      {{"flux1-dev", make("flux1-dev", true, false), make("flux1-dev-tiny", true, true)},
       {"flux1-schnell", make("flux1-schnell", false, false),
        make("flux1-schnell-tiny", false, true)}},
      structure,
      symbols,
      features,
      custom_defaults,
      check,
  };
  return f;
}

}  // namespace sp::recognize::detail
