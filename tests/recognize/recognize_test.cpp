// Tests for src/recognize: round trips preset -> tensor list -> recognize for every variant
// and layout, canonical-name resolution, errors (unexplained, missing, gaps, shapes), the
// sidecar, and a real tiny safetensors file.
#include "recognize/recognize.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "io/safetensors.hpp"

namespace {

using namespace sp::recognize;
using sp::io::TensorInfo;

std::vector<TensorInfo> infos_of(const std::vector<TensorSpec>& specs,
                                 const std::string& prefix = "") {
  std::vector<TensorInfo> out;
  for (const auto& s : specs) {
    TensorInfo t;
    t.name = prefix + s.name;
    t.dtype = sp::io::DType::BF16;
    t.shape = s.shape;
    out.push_back(t);
  }
  return out;
}

std::vector<TensorInfo> tiny_infos(const std::string& variant, const std::string& layout,
                                   int layers = 2) {
  return infos_of(checkpoint_tensors(preset(variant, layers, true), layout));
}

void erase_name(std::vector<TensorInfo>& v, const std::string& name) {
  auto it = std::find_if(v.begin(), v.end(), [&](const TensorInfo& t) { return t.name == name; });
  ASSERT_NE(it, v.end()) << name;
  v.erase(it);
}

TensorInfo& find_name(std::vector<TensorInfo>& v, const std::string& name) {
  auto it = std::find_if(v.begin(), v.end(), [&](const TensorInfo& t) { return t.name == name; });
  if (it == v.end()) throw std::runtime_error("no tensor " + name);
  return *it;
}

// Runs f, expects RecognizeError (or SidecarError) and returns its message.
template <class Error = RecognizeError, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---- round trips ----

struct Case {
  std::string variant;
  bool tiny;
  int layers;
};

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const auto& v : preset_names())
    for (bool tiny : {false, true})
      for (int layers : {-1, 2}) cases.push_back({v, tiny, layers});
  return cases;
}

TEST(RoundTrip, EveryVariantLayoutAndSize) {
  for (const Case& c : all_cases()) {
    const FamilyConfig cfg = preset(c.variant, c.layers, c.tiny);
    for (const auto& layout : layouts(cfg.family)) {
      SCOPED_TRACE(c.variant + (c.tiny ? " tiny " : " real ") + layout + " layers " +
                   std::to_string(c.layers));
      const auto infos = infos_of(checkpoint_tensors(cfg, layout));
      Recognized with = recognize(infos, sidecar_for(cfg));
      EXPECT_EQ(with.config, cfg);
      EXPECT_EQ(with.layout, layout);
      // Without a sidecar every preset is recognized from names and shapes alone, except
      // tiny Wan, whose head_dim (16) is not the default (128).
      if (cfg.variant == "wan2.1-tiny") {
        EXPECT_TRUE(has(error_of([&] { recognize(infos); }), "head_dim 128"));
      } else {
        Recognized bare = recognize(infos);
        EXPECT_EQ(bare.config, cfg);
        EXPECT_EQ(bare.layout, layout);
      }
    }
  }
}

TEST(RoundTrip, PresetDimensions) {
  const auto wan = preset("wan2.1-14b");
  EXPECT_EQ(wan.dim, 5120);
  EXPECT_EQ(wan.heads, 40);
  EXPECT_EQ(wan.layers, 40);
  EXPECT_EQ(wan.rope_axes_dim, (std::vector<int64_t>{44, 42, 42}));
  const auto flux = preset("flux1-dev", 3);
  EXPECT_EQ(flux.layers, 3);
  EXPECT_EQ(flux.single_layers, 6);
  EXPECT_TRUE(flux.guidance);
  EXPECT_EQ(preset("flux1-schnell").single_layers, 38);
  EXPECT_FALSE(preset("flux1-schnell").guidance);
  const auto avdit = preset("avdit");
  EXPECT_EQ(avdit.heads * avdit.head_dim, 7168);
  EXPECT_EQ(avdit.rotary_dim, 96);
  EXPECT_EQ(preset("avdit-tiny"), preset("avdit", -1, true));
  EXPECT_TRUE(has(error_of([] { preset("sd3"); }), "sd3"));
}

// Every layout's tensors assemble exactly the original layout's tensors and shapes.
TEST(RoundTrip, LayoutsAssembleCanonicalShapes) {
  for (const auto& v : preset_names()) {
    const FamilyConfig cfg = preset(v, 2, true);
    std::map<std::string, std::vector<int64_t>> canon;
    for (const auto& t : checkpoint_tensors(cfg, "original")) canon[t.name] = t.shape;
    for (const auto& layout : layouts(cfg.family)) {
      SCOPED_TRACE(v + " " + layout);
      const auto specs = checkpoint_tensors(cfg, layout);
      std::map<std::string, std::vector<TensorSpec>> by_canon;
      for (const auto& s : specs) by_canon[s.canonical].push_back(s);
      EXPECT_EQ(by_canon.size(), canon.size());
      const Recognized r = recognize(infos_of(specs), sidecar_for(cfg));
      EXPECT_EQ(r.tensors.size(), canon.size());
      for (auto& [name, parts] : by_canon) {
        ASSERT_TRUE(canon.count(name)) << name;
        std::vector<int64_t> shape = parts[0].shape;
        std::sort(parts.begin(), parts.end(),
                  [](const auto& a, const auto& b) { return a.row_offset < b.row_offset; });
        int64_t rows = 0;
        for (const auto& p : parts) {
          EXPECT_EQ(p.row_offset, rows) << p.name;
          rows += p.shape[0];
        }
        shape[0] = rows;
        EXPECT_EQ(shape, canon[name]) << name;
        const Source& src = r.tensors.at(name);
        ASSERT_EQ(src.tensors.size(), parts.size()) << name;
        for (size_t i = 0; i < parts.size(); ++i) EXPECT_EQ(src.tensors[i], parts[i].name);
        EXPECT_EQ(src.op, parts[0].op);
        if (src.op == Source::Op::SwapHalves0) {
          EXPECT_EQ(shape[0] % 2, 0);
        }
      }
    }
  }
}

// ---- canonical names per family ----

TEST(Canonical, FluxDiffusersFusesAndSwaps) {
  const Recognized r = recognize(tiny_infos("flux1-dev", "diffusers"));
  EXPECT_EQ(r.config.variant, "flux1-dev-tiny");
  EXPECT_EQ(
      r.tensors.at("double_blocks.0.img_attn.qkv.weight"),
      (Source{Source::Op::Concat0,
              {"transformer_blocks.0.attn.to_q.weight", "transformer_blocks.0.attn.to_k.weight",
               "transformer_blocks.0.attn.to_v.weight"}}));
  EXPECT_EQ(r.tensors.at("double_blocks.1.txt_attn.qkv.bias"),
            (Source{Source::Op::Concat0,
                    {"transformer_blocks.1.attn.add_q_proj.bias",
                     "transformer_blocks.1.attn.add_k_proj.bias",
                     "transformer_blocks.1.attn.add_v_proj.bias"}}));
  EXPECT_EQ(r.tensors.at("single_blocks.3.linear1.weight"),
            (Source{Source::Op::Concat0,
                    {"single_transformer_blocks.3.attn.to_q.weight",
                     "single_transformer_blocks.3.attn.to_k.weight",
                     "single_transformer_blocks.3.attn.to_v.weight",
                     "single_transformer_blocks.3.proj_mlp.weight"}}));
  EXPECT_EQ(r.tensors.at("single_blocks.0.linear2.weight"),
            (Source{Source::Op::Copy, {"single_transformer_blocks.0.proj_out.weight"}}));
  EXPECT_EQ(r.tensors.at("final_layer.adaLN_modulation.1.weight"),
            (Source{Source::Op::SwapHalves0, {"norm_out.linear.weight"}}));
  EXPECT_EQ(r.tensors.at("final_layer.adaLN_modulation.1.bias"),
            (Source{Source::Op::SwapHalves0, {"norm_out.linear.bias"}}));
  EXPECT_EQ(r.tensors.at("final_layer.linear.weight"),
            (Source{Source::Op::Copy, {"proj_out.weight"}}));
  EXPECT_EQ(r.tensors.at("double_blocks.0.txt_attn.norm.key_norm.scale"),
            (Source{Source::Op::Copy, {"transformer_blocks.0.attn.norm_added_k.weight"}}));
  EXPECT_EQ(r.tensors.at("guidance_in.in_layer.weight"),
            (Source{Source::Op::Copy, {"time_text_embed.guidance_embedder.linear_1.weight"}}));

  // The tensor list for make-checkpoint places each part at its canonical rows.
  const auto specs = checkpoint_tensors(r.config, "diffusers");
  auto spec = [&](const std::string& n) {
    return *std::find_if(specs.begin(), specs.end(), [&](const auto& s) { return s.name == n; });
  };
  EXPECT_EQ(spec("single_transformer_blocks.0.proj_mlp.weight").row_offset, 3 * 64);
  EXPECT_EQ(spec("single_transformer_blocks.0.proj_mlp.weight").canonical,
            "single_blocks.0.linear1.weight");
  EXPECT_EQ(spec("transformer_blocks.1.attn.to_v.bias").row_offset, 2 * 64);
}

TEST(Canonical, FluxGuidanceTellsDevFromSchnell) {
  EXPECT_TRUE(recognize(tiny_infos("flux1-dev", "original")).config.guidance);
  const Recognized s = recognize(tiny_infos("flux1-schnell", "original"));
  EXPECT_FALSE(s.config.guidance);
  EXPECT_EQ(s.config.variant, "flux1-schnell-tiny");
  EXPECT_EQ(s.config.text_tokens, 256);
  auto partial = tiny_infos("flux1-dev", "original");
  erase_name(partial, "guidance_in.out_layer.bias");
  EXPECT_TRUE(has(error_of([&] { recognize(partial); }), "guidance_in.out_layer.bias"));
}

TEST(Canonical, WanDiffusersRenames) {
  auto cfg = preset("wan2.1-1.3b", 2);
  const Recognized r = recognize(infos_of(checkpoint_tensors(cfg, "diffusers")));
  EXPECT_EQ(r.config.variant, "wan2.1-1.3b");
  EXPECT_EQ(r.config.heads, 12);
  auto copy = [](std::string n) { return Source{Source::Op::Copy, {std::move(n)}}; };
  EXPECT_EQ(r.tensors.at("blocks.1.norm3.weight"), copy("blocks.1.norm2.weight"));
  EXPECT_EQ(r.tensors.at("blocks.0.modulation"), copy("blocks.0.scale_shift_table"));
  EXPECT_EQ(r.tensors.at("head.modulation"), copy("scale_shift_table"));
  EXPECT_EQ(r.tensors.at("head.head.weight"), copy("proj_out.weight"));
  EXPECT_EQ(r.tensors.at("blocks.0.cross_attn.o.weight"), copy("blocks.0.attn2.to_out.0.weight"));
  EXPECT_EQ(r.tensors.at("blocks.1.ffn.0.weight"), copy("blocks.1.ffn.net.0.proj.weight"));
  EXPECT_EQ(r.tensors.at("time_projection.1.weight"), copy("condition_embedder.time_proj.weight"));
}

TEST(Canonical, ComfyPrefixIsStripped) {
  auto cfg = preset("wan2.1-14b", 2);
  const auto infos = infos_of(checkpoint_tensors(cfg, "original"), "model.diffusion_model.");
  const Recognized r = recognize(infos);
  EXPECT_EQ(r.config, cfg);
  EXPECT_EQ(r.prefix, "model.diffusion_model.");
  EXPECT_EQ(r.tensors.at("blocks.1.self_attn.q.weight").tensors[0],
            "model.diffusion_model.blocks.1.self_attn.q.weight");
}

TEST(Canonical, AvditRealDimensions) {
  const Recognized r = recognize(infos_of(checkpoint_tensors(preset("avdit", 3), "original")));
  EXPECT_EQ(r.config.variant, "avdit");
  EXPECT_EQ(r.config.dim, 5376);
  EXPECT_EQ(r.config.heads, 56);
  EXPECT_EQ(r.config.head_dim, 128);
  EXPECT_EQ(r.config.ffn, 14336);
  EXPECT_EQ(r.config.in_channels, 96);
  EXPECT_EQ(r.config.audio_dim, 128);
  EXPECT_EQ(r.config.eps, 1e-5);
  EXPECT_EQ(r.config.segments, (std::vector<std::string>{"video", "text", "audio"}));
}

// ---- errors ----

TEST(Errors, UnexplainedTensorsNameClosestFamily) {
  auto infos = tiny_infos("wan2.1-14b", "original");
  for (const char* extra :
       {"img_emb.proj.0.weight", "img_emb.proj.0.bias", "blocks.0.cross_attn.k_img.weight"})
    infos.push_back(TensorInfo{extra, sp::io::DType::BF16, {64}, 0, 0});
  const std::string msg = error_of([&] { recognize(infos); });
  EXPECT_TRUE(has(msg, "family wan2.1, original layout")) << msg;
  EXPECT_TRUE(has(msg,
                  "unexplained (3): img_emb.proj.0.weight, img_emb.proj.0.bias, "
                  "blocks.0.cross_attn.k_img.weight"))
      << msg;

  std::vector<TensorInfo> many;
  for (int i = 0; i < 30; ++i)
    many.push_back(TensorInfo{"layers." + std::to_string(i) + ".w", sp::io::DType::F32, {4}, 0, 0});
  many.push_back(TensorInfo{"img_in.weight", sp::io::DType::F32, {64, 16}, 0, 0});
  const std::string m2 = error_of([&] { recognize(many); });
  EXPECT_TRUE(has(m2, "family flux1")) << m2;
  EXPECT_TRUE(has(m2, "(30 in all)")) << m2;
  EXPECT_TRUE(has(m2, "layers.0.w")) << m2;
  EXPECT_FALSE(has(m2, "layers.29.w")) << m2;  // only the first 20 are listed
}

TEST(Errors, MissingTensor) {
  auto infos = tiny_infos("wan2.1-1.3b", "original", 3);
  erase_name(infos, "blocks.1.self_attn.k.weight");
  erase_name(infos, "head.head.bias");
  const std::string msg = error_of([&] { recognize(infos, sidecar_for(preset("wan2.1-tiny"))); });
  EXPECT_TRUE(has(msg, "missing 2 tensor(s)")) << msg;
  EXPECT_TRUE(has(msg, "blocks.1.self_attn.k.weight")) << msg;
  EXPECT_TRUE(has(msg, "head.head.bias")) << msg;
}

TEST(Errors, BlockIndexGap) {
  auto infos = tiny_infos("avdit", "original", 4);
  std::erase_if(infos, [](const TensorInfo& t) { return t.name.rfind("blocks.2.", 0) == 0; });
  const std::string msg = error_of([&] { recognize(infos); });
  EXPECT_TRUE(has(msg, "gaps")) << msg;
  EXPECT_TRUE(has(msg, "missing 2")) << msg;
  EXPECT_TRUE(has(msg, "avdit (original layout)")) << msg;
}

TEST(Errors, InconsistentShapeNamesTensorAndShapes) {
  auto infos = tiny_infos("flux1-schnell", "diffusers", 3);
  find_name(infos, "transformer_blocks.2.attn.to_k.weight").shape = {64, 48};
  const std::string msg = error_of([&] { recognize(infos); });
  EXPECT_TRUE(has(msg, "transformer_blocks.2.attn.to_k.weight")) << msg;
  EXPECT_TRUE(has(msg, "has shape [64, 48], expected [dim, dim] = [64, 64]")) << msg;
  EXPECT_TRUE(has(msg, "dim=64 from x_embedder.weight")) << msg;

  auto avdit = tiny_infos("avdit", "original");
  find_name(avdit, "blocks.0.attn.qkv.weight").shape = {100, 64};  // not 3*heads*16
  const std::string m2 = error_of([&] { recognize(avdit); });
  EXPECT_TRUE(has(m2, "blocks.0.attn.qkv.weight")) << m2;
  EXPECT_TRUE(has(m2, "3*heads*head_dim")) << m2;

  auto wan = tiny_infos("wan2.1-14b", "original");
  find_name(wan, "blocks.1.modulation").shape = {6, 64};  // wrong rank
  const std::string m3 = error_of([&] { recognize(wan, sidecar_for(preset("wan2.1-tiny"))); });
  EXPECT_TRUE(has(m3, "blocks.1.modulation has shape [6, 64], expected [1, 6, dim]")) << m3;
}

TEST(Errors, EmptyAndDuplicate) {
  EXPECT_TRUE(has(error_of([] { recognize(std::vector<TensorInfo>{}); }), "no tensors"));
  auto infos = tiny_infos("avdit", "original");
  infos.push_back(infos[0]);
  EXPECT_TRUE(has(error_of([&] { recognize(infos); }), "twice"));
}

// ---- sidecar ----

TEST(Sidecar, ParseErrorsNameFieldAndValue) {
  auto err = [](const std::string& text) {
    return error_of<SidecarError>([&] { parse_sidecar(text, "x.json"); });
  };
  EXPECT_TRUE(has(err("{\"head_dim\": 128,"), "x.json: invalid JSON"));
  EXPECT_TRUE(has(err("[1, 2]"), "must be a JSON object"));
  std::string m = err(R"({"head_dim": "abc"})");
  EXPECT_TRUE(has(m, "\"head_dim\"") && has(m, "\"abc\"")) << m;
  m = err(R"({"eps": -1})");
  EXPECT_TRUE(has(m, "\"eps\"") && has(m, "-1")) << m;
  m = err(R"({"family": "sd3"})");
  EXPECT_TRUE(has(m, "\"family\"") && has(m, "sd3") && has(m, "wan2.1")) << m;
  m = err(R"({"head_dim": 128, "rope": {"axes_dim": [44, 42, 40]}})");
  EXPECT_TRUE(has(m, "rope.axes_dim") && has(m, "[44,42,40]") && has(m, "sums to 126") &&
              has(m, "head_dim is 128"))
      << m;
  m = err(R"({"rope": {"axes_dim": [32, 32, 32], "rotary_dim": 64}})");
  EXPECT_TRUE(has(m, "rope.axes_dim") && has(m, "rotary_dim is 64")) << m;
  m = err(R"({"rope": {"axes_dim": [3, 4]}})");
  EXPECT_TRUE(has(m, "rope.axes_dim") && has(m, "[3,4]")) << m;
  m = err(R"({"rope": {"thetta": 10}})");
  EXPECT_TRUE(has(m, "rope.thetta") && has(m, "unknown")) << m;
  m = err(R"({"head_dims": 64})");
  EXPECT_TRUE(has(m, "head_dims") && has(m, "unknown")) << m;
  m = err(R"({"segments": ["video", "video"]})");
  EXPECT_TRUE(has(m, "segments") && has(m, "twice")) << m;
  m = err(R"({"version": 2})");
  EXPECT_TRUE(has(m, "version")) << m;
}

TEST(Sidecar, JsonRoundTripAndFile) {
  const Sidecar s = sidecar_for(preset("avdit", -1, true));
  EXPECT_EQ(parse_sidecar(to_json(s)), s);
  const std::string path = testing::TempDir() + "/recognize_sidecar.json";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    const std::string text = to_json(s);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  EXPECT_EQ(load_sidecar(path), s);
  std::remove(path.c_str());
  EXPECT_TRUE(
      has(error_of<SidecarError>([] { load_sidecar("/nonexistent/x.json"); }), "cannot open"));
}

TEST(Sidecar, OverridesWanHeadDim) {
  const auto infos = infos_of(checkpoint_tensors(preset("wan2.1-1.3b", 2), "original"));
  const Recognized r = recognize(infos, parse_sidecar(R"({"head_dim": 64, "eps": 1e-5})"));
  EXPECT_EQ(r.config.head_dim, 64);
  EXPECT_EQ(r.config.heads, 24);
  EXPECT_EQ(r.config.variant, "custom");
  EXPECT_EQ(r.config.rope_axes_dim, (std::vector<int64_t>{24, 20, 20}));
  EXPECT_EQ(r.config.eps, 1e-5);
  const std::string m = error_of([&] { recognize(infos, parse_sidecar(R"({"head_dim": 100})")); });
  EXPECT_TRUE(has(m, "sidecar head_dim 100 does not divide dim 1536")) << m;
}

TEST(Sidecar, ChecksAgainstCheckpoint) {
  // Axes that do not sum to the inferred head_dim.
  const auto flux = tiny_infos("flux1-dev", "original");
  std::string m =
      error_of([&] { recognize(flux, parse_sidecar(R"({"rope": {"axes_dim": [4, 4, 4]}})")); });
  EXPECT_TRUE(has(m, "rope.axes_dim [4, 4, 4] (sidecar) sums to 12") && has(m, "head_dim 16")) << m;
  m = error_of([&] { recognize(flux, parse_sidecar(R"({"head_dim": 32})")); });
  EXPECT_TRUE(has(m, "sidecar head_dim 32 contradicts")) << m;
  m = error_of([&] { recognize(flux, parse_sidecar(R"({"segments": ["a", "b"]})")); });
  EXPECT_TRUE(has(m, "segments applies to avdit only")) << m;
  // avdit: segment count must match the modulation rows; rotary follows the axes.
  const auto avdit = tiny_infos("avdit", "original");
  m = error_of([&] { recognize(avdit, parse_sidecar(R"({"segments": ["video", "text"]})")); });
  EXPECT_TRUE(has(m, "segments [video, text] name 2 segments") && has(m, "3 rows")) << m;
  const Recognized r =
      recognize(avdit, parse_sidecar(R"({"rope": {"axes_dim": [2, 2, 4]}, "text_tokens": 77})"));
  EXPECT_EQ(r.config.rotary_dim, 8);
  EXPECT_EQ(r.config.text_tokens, 77);
  // Family restriction.
  m = error_of([&] { recognize(flux, parse_sidecar(R"({"family": "wan2.1"})")); });
  EXPECT_TRUE(has(m, "family wan2.1") && !has(m, "flux1/original")) << m;
  // A custom Flux width has no default axes.
  auto custom = preset("flux1-dev", 1, true);
  custom.dim = 128;
  custom.heads = 2;
  custom.head_dim = 64;
  m = error_of([&] { recognize(infos_of(checkpoint_tensors(custom, "original"))); });
  EXPECT_TRUE(has(m, "no default rope.axes_dim") && has(m, "head_dim 64")) << m;
}

// ---- MiniMax H3 ----

// The tiny preset in one of its forms: curve (adaln_t_table of 11 x 8 instead of
// time_embedder), gate_compress, a PDD head bank of `bank` heads. Forms other than the
// preset's plain one match no preset, so recognition names them "custom".
FamilyConfig minimax_tiny(bool curve = false, bool gate = false, int64_t bank = 1, int layers = 2) {
  FamilyConfig c = preset("minimax-h3", layers, true);
  if (curve) {
    c.time_table_rows = 11;
    c.time_dim = 8;
    c.freq_dim = 0;
  }
  c.gate_compress = gate;
  c.head_bank = bank;
  if (curve || gate || bank != 1) c.variant = "custom";
  return c;
}

std::vector<TensorInfo> minimax_infos(const FamilyConfig& c, const std::string& prefix = "") {
  return infos_of(checkpoint_tensors(c, "original"), prefix);
}

TEST(MiniMaxH3, TinyLayoutHasTheReferenceShapes) {
  // Names and shapes as tests/reference/minimax_h3.py's tensor_shapes(TINY) gives them.
  const auto specs = checkpoint_tensors(minimax_tiny(), "original");
  std::map<std::string, std::vector<int64_t>> s;
  for (const auto& t : specs) s[t.name] = t.shape;
  EXPECT_EQ(s.size(), 6 + 4 + 1 + 2 * 8 + 1 + 2 * 10 + 7u);
  using V = std::vector<int64_t>;
  EXPECT_EQ(s.at("video_patch_proj.weight"), (V{64, 16}));
  EXPECT_EQ(s.at("audio_patch_proj.weight"), (V{64, 6}));
  EXPECT_EQ(s.at("condition_proj.weight"), (V{64, 40}));
  EXPECT_EQ(s.at("time_embedder.proj_in.weight"), (V{64, 32}));
  EXPECT_EQ(s.at("time_embedder.proj_out.weight"), (V{32, 64}));
  EXPECT_EQ(s.at("rope.inv_freq"), (V{4}));
  EXPECT_EQ(s.at("token_refiner.blocks.1.attn.qkv_proj.weight"), (V{288, 64}));
  EXPECT_EQ(s.at("token_refiner.final_norm.weight"), (V{64}));
  EXPECT_EQ(s.at("blocks.1.attn.q_norm.weight"), (V{32}));
  EXPECT_EQ(s.at("blocks.1.attn.out_proj.weight"), (V{64, 96}));
  EXPECT_EQ(s.at("blocks.1.mlp.fc1.weight"), (V{320, 64}));
  EXPECT_EQ(s.at("blocks.1.mlp.fc2.weight"), (V{64, 160}));
  EXPECT_EQ(s.at("blocks.1.adaln_proj.linear.weight"), (V{1152, 32}));
  EXPECT_EQ(s.at("final_layer.adaln_proj.linear.weight"), (V{128, 32}));
  EXPECT_EQ(s.at("final_layer.video_out.weight"), (V{16, 64}));
  EXPECT_EQ(s.at("final_layer.audio_out.bias"), (V{6}));
  EXPECT_FALSE(s.count("adaln_t_table"));
  EXPECT_FALSE(s.count("token_refiner.blocks.0.adaln_proj.linear.weight"));

  const auto v = checkpoint_tensors(minimax_tiny(true, true, 3), "original");
  std::map<std::string, std::vector<int64_t>> sv;
  for (const auto& t : v) sv[t.name] = t.shape;
  EXPECT_EQ(sv.at("adaln_t_table"), (V{11, 8}));
  EXPECT_FALSE(sv.count("time_embedder.proj_in.weight"));
  EXPECT_EQ(sv.at("blocks.0.adaln_proj.linear.weight"), (V{1152, 8}));
  EXPECT_EQ(sv.at("blocks.1.attn.to_gate_compress.weight"), (V{96, 64}));
  EXPECT_EQ(sv.at("final_layer.video_out.weight"), (V{48, 64}));
  EXPECT_EQ(sv.at("final_layer.audio_out.weight"), (V{18, 64}));
}

TEST(MiniMaxH3, EveryVariantWithEachPrefix) {
  for (bool curve : {false, true})
    for (bool gate : {false, true})
      for (int64_t bank : {1, 3})
        for (const std::string prefix : {"", "model.diffusion_model.", "diffusion_model."}) {
          const FamilyConfig cfg = minimax_tiny(curve, gate, bank);
          SCOPED_TRACE(std::string(curve ? "curve" : "plain") + (gate ? " gate_compress" : "") +
                       " bank " + std::to_string(bank) + " prefix '" + prefix + "'");
          const Recognized r = recognize(minimax_infos(cfg, prefix));
          EXPECT_EQ(r.config, cfg);
          EXPECT_EQ(r.prefix, prefix);
          EXPECT_EQ(r.layout, "original");
          EXPECT_EQ(r.config.family, "minimax-h3");
          EXPECT_EQ(r.config.variant, curve || gate || bank != 1 ? "custom" : "minimax-h3-tiny");
          EXPECT_EQ(r.config.time_table_rows, curve ? 11 : 0);
          EXPECT_EQ(r.config.time_dim, curve ? 8 : 32);
          EXPECT_EQ(r.config.freq_dim, curve ? 0 : 32);
          EXPECT_EQ(r.config.gate_compress, gate);
          EXPECT_EQ(r.config.head_bank, bank);
          EXPECT_EQ(r.config.refiner_layers, 2);
          EXPECT_EQ(r.config.layers, 2);
          EXPECT_EQ(r.config.rotary_dim, 24);
          EXPECT_EQ(r.config.rope_axes_dim, (std::vector<int64_t>{8, 8, 8}));
          EXPECT_EQ(r.config.eps, 1e-5);
          EXPECT_EQ(r.tensors.count("adaln_t_table"), curve ? 1u : 0u);
          EXPECT_EQ(r.tensors.count("time_embedder.proj_in.weight"), curve ? 0u : 1u);
          EXPECT_EQ(r.tensors.count("blocks.1.attn.to_gate_compress.weight"), gate ? 1u : 0u);
          EXPECT_EQ(r.tensors.at("blocks.1.mlp.fc2.weight"),
                    (Source{Source::Op::Copy, {prefix + "blocks.1.mlp.fc2.weight"}}));
          EXPECT_EQ(r.tensors.at("token_refiner.blocks.0.attn.qkv_proj.weight").tensors[0],
                    prefix + "token_refiner.blocks.0.attn.qkv_proj.weight");
          // With its sidecar too (what make-checkpoint stores).
          EXPECT_EQ(recognize(minimax_infos(cfg, prefix), sidecar_for(cfg)).config, cfg);
        }
}

TEST(MiniMaxH3, RealDimensions) {
  const FamilyConfig p = preset("minimax-h3");
  EXPECT_EQ(p.layers, 50);
  const Recognized r = recognize(minimax_infos(preset("minimax-h3", 3), "model.diffusion_model."));
  const FamilyConfig& c = r.config;
  EXPECT_EQ(c.variant, "minimax-h3");
  EXPECT_EQ(c.dim, 5376);
  EXPECT_EQ(c.heads, 56);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.ffn, 14336);
  EXPECT_EQ(c.layers, 3);
  EXPECT_EQ(c.refiner_layers, 2);
  EXPECT_EQ(c.text_dim, 5120);
  EXPECT_EQ(c.in_channels, 96);
  EXPECT_EQ(c.out_channels, 96);
  EXPECT_EQ(c.audio_dim, 32);
  EXPECT_EQ(c.freq_dim, 256);
  EXPECT_EQ(c.time_dim, 2688);
  EXPECT_EQ(c.time_table_rows, 0);
  EXPECT_EQ(c.head_bank, 1);
  EXPECT_FALSE(c.gate_compress);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.rotary_dim, 96);
  EXPECT_EQ(c.rope_axes_dim, (std::vector<int64_t>{32, 32, 32}));
  EXPECT_EQ(c.rope_theta, 10000);
  EXPECT_EQ(c.eps, 1e-5);
  EXPECT_EQ(c.text_tokens, 512);
  EXPECT_EQ(c.timestep_scale, 1);
  EXPECT_TRUE(c.segments.empty());

  // A real-width PDD bank of 2 heads in the curve form: a custom config, same conventions.
  FamilyConfig bank = preset("minimax-h3", 1);
  bank.head_bank = 2;
  bank.time_table_rows = 1001;
  bank.time_dim = 64;
  bank.freq_dim = 0;
  bank.variant = "custom";
  auto infos = minimax_infos(bank);
  EXPECT_EQ(find_name(infos, "final_layer.video_out.weight").shape,
            (std::vector<int64_t>{192, 5376}));
  EXPECT_EQ(recognize(infos).config, bank);
}

TEST(MiniMaxH3, MalformedCheckpointsNameTensorsAndValues) {
  // A missing block tensor.
  auto missing = minimax_infos(minimax_tiny());
  erase_name(missing, "blocks.1.mlp.fc2.weight");
  std::string m = error_of([&] { recognize(missing); });
  EXPECT_TRUE(has(m, "minimax-h3 (original layout): missing 1 tensor(s): blocks.1.mlp.fc2.weight")) << m;

  // adaln_proj rows not 18*dim.
  auto adaln = minimax_infos(minimax_tiny());
  find_name(adaln, "blocks.1.adaln_proj.linear.weight").shape = {17 * 64, 32};
  m = error_of([&] { recognize(adaln); });
  EXPECT_TRUE(has(m, "tensor blocks.1.adaln_proj.linear.weight has shape [1088, 32], expected "
                     "[18*dim, time_dim] = [1152, 32]"))
      << m;
  EXPECT_TRUE(has(m, "dim=64 from video_patch_proj.weight")) << m;
  EXPECT_TRUE(has(m, "time_dim=32 from time_embedder.proj_out.weight")) << m;

  // Both time paths.
  auto both = minimax_infos(minimax_tiny());
  both.push_back(TensorInfo{"adaln_t_table", sp::io::DType::F32, {11, 32}, 0, 0});
  m = error_of([&] { recognize(both); });
  EXPECT_TRUE(has(m, "minimax-h3 (original layout): both time paths are present")) << m;
  EXPECT_TRUE(has(m, "freq_dim 32") && has(m, "adaln_t_table (curve form, 11 rows)")) << m;

  // Neither time path.
  auto neither = minimax_infos(minimax_tiny());
  std::erase_if(neither, [](const TensorInfo& t) { return t.name.rfind("time_embedder.", 0) == 0; });
  m = error_of([&] { recognize(neither); });
  EXPECT_TRUE(has(m, "no time path: neither time_embedder.proj_in/proj_out (plain form) nor "
                     "adaln_t_table (curve form) is present"))
      << m;

  // Half a time path: the missing tensors are listed.
  auto half = minimax_infos(minimax_tiny());
  erase_name(half, "time_embedder.proj_out.bias");
  m = error_of([&] { recognize(half); });
  EXPECT_TRUE(has(m, "missing 1 tensor(s): time_embedder.proj_out.bias")) << m;

  // A one-row curve table.
  auto one_row = minimax_infos(minimax_tiny(true));
  find_name(one_row, "adaln_t_table").shape = {1, 8};
  m = error_of([&] { recognize(one_row); });
  EXPECT_TRUE(has(m, "adaln_t_table has 1 row(s)")) << m;

  // PDD heads disagree between video_out and audio_out.
  auto bank = minimax_infos(minimax_tiny(false, false, 3));
  find_name(bank, "final_layer.audio_out.weight").shape = {12, 64};
  m = error_of([&] { recognize(bank); });
  EXPECT_TRUE(has(m, "tensor final_layer.audio_out.weight has shape [12, 64], expected "
                     "[bank*audio_dim, dim] = [18, 64]"))
      << m;
  EXPECT_TRUE(has(m, "bank=3 from final_layer.video_out.weight")) << m;

  // video_out rows not a multiple of the patch features.
  auto rows = minimax_infos(minimax_tiny());
  find_name(rows, "final_layer.video_out.weight").shape = {20, 64};
  m = error_of([&] { recognize(rows); });
  EXPECT_TRUE(has(m, "final_layer.video_out.weight has shape [20, 64]") &&
              has(m, "does not fit bank*feat for any positive bank (feat=16 from video_patch_proj.weight)"))
      << m;

  // gate_compress on some blocks only.
  auto gate = minimax_infos(minimax_tiny(false, true));
  erase_name(gate, "blocks.1.attn.to_gate_compress.weight");
  m = error_of([&] { recognize(gate); });
  EXPECT_TRUE(has(m, "missing 1 tensor(s): blocks.1.attn.to_gate_compress.weight")) << m;

  // Sidecar rope widths against rope.inv_freq; segments do not apply.
  const auto tiny = minimax_infos(minimax_tiny());
  m = error_of([&] { recognize(tiny, parse_sidecar(R"({"rope": {"axes_dim": [8, 8, 16]}})")); });
  EXPECT_TRUE(has(m, "rope.inv_freq has 4 pairs per axis") && has(m, "rope.axes_dim is [8, 8, 16]")) << m;
  m = error_of([&] { recognize(tiny, parse_sidecar(R"({"segments": ["video", "text"]})")); });
  EXPECT_TRUE(has(m, "segments applies to avdit only")) << m;
  m = error_of([&] { recognize(tiny, parse_sidecar(R"({"head_dim": 64})")); });
  EXPECT_TRUE(has(m, "sidecar head_dim 64 contradicts the checkpoint's q_norm width 32")) << m;
  EXPECT_EQ(recognize(tiny, parse_sidecar(R"({"family": "minimax-h3", "text_tokens": 77})")).config.text_tokens, 77);
}

// What make-checkpoint writes (--tiny, and --curve-rows 11 --curve-basis 8 --gate-compress
// --head-bank 3) is recognized back to the same config.
TEST(MiniMaxH3, MakeCheckpointFileRoundTrip) {
  for (const FamilyConfig& cfg : {minimax_tiny(false, false, 1, 1), minimax_tiny(true, true, 3, 1)}) {
    SCOPED_TRACE(cfg.variant);
    sp::io::SafetensorsWriter w;
    for (const auto& t : checkpoint_tensors(cfg, "original")) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      w.add(t.name, sp::io::DType::F32, t.shape, std::vector<std::byte>(static_cast<size_t>(n) * 4));
    }
    const std::string path = testing::TempDir() + "/recognize_minimax_h3.safetensors";
    w.write(path);
    const auto file = sp::io::SafetensorsFile::open(path);
    EXPECT_EQ(recognize(file).config, cfg);
    EXPECT_EQ(recognize(file, sidecar_for(cfg)).config, cfg);
    std::filesystem::remove(path);
  }
}

// ---- a real file ----

TEST(File, TinyWanDiffusersSafetensors) {
  const FamilyConfig cfg = preset("wan2.1-1.3b", 2, true);
  sp::io::SafetensorsWriter w;
  for (const auto& t : checkpoint_tensors(cfg, "diffusers")) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::vector<std::byte> zeros(static_cast<size_t>(n) * 2);
    w.add(t.name, sp::io::DType::BF16, t.shape, zeros);
  }
  const std::string path = testing::TempDir() + "/recognize_tiny_wan.safetensors";
  w.write(path);
  const auto file = sp::io::SafetensorsFile::open(path);
  const Recognized r = recognize(file, sidecar_for(cfg));
  EXPECT_EQ(r.config, cfg);
  EXPECT_EQ(r.layout, "diffusers");
  EXPECT_EQ(r.tensors.at("patch_embedding.weight").tensors[0], "patch_embedding.weight");
  EXPECT_EQ(file.info("patch_embedding.weight").shape, (std::vector<int64_t>{64, 16, 1, 2, 2}));
  std::filesystem::remove(path);
}

}  // namespace
