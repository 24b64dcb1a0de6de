// LoRA as a lazy weight patch: the planned schedule (y += s B(A x) per slab) against the naive
// schedule on weights merged by the test itself, on random configurations with awkward sizes,
// several adapters and strengths, dense and quantized bases; the estimated peak against the
// measured one; the naming schemes on small synthetic files; and bad input.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <random>

#include "exec/device/device.hpp"
#include "exec/device/memory.hpp"
#include "exec/registry.hpp"
#include "exec/run/executor.hpp"
#include "models/builder.hpp"
#include "models/checkpoint.hpp"
#include "models/families.hpp"
#include "models/lora_file.hpp"
#include "models/tensor_io.hpp"
#include "recognize/lora_names.hpp"
#include "test_util.hpp"

namespace {

using namespace sp;

using test::error_of;

// Adds 1 or 2 adapters (random rank, strength, row range) to about two thirds of the Linears;
// their A/B go into `w` in `dt`. Returns how many were added.
int add_random_adapters(ir::Model& m, exec::TensorWeights& w, std::mt19937_64& rng, at::ScalarType dt) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  int count = 0;
  ir::for_each_linear(m, [&](ir::Linear& l) {
    if (pick(0, 2) == 0) return;
    const int64_t n = pick(1, 2);
    for (int64_t i = 0; i < n; ++i) {
      ir::LoraAdapter a;
      a.rank = pick(1, 9);
      a.scale = double(pick(-8, 12)) / 8.0;
      // A fused weight's part (a row range), or the whole weight.
      a.row_offset = pick(0, 1) ? 0 : pick(0, l.out_features - 1);
      a.rows = pick(1, l.out_features - a.row_offset);
      a.a = "lora." + std::to_string(count) + ".A";
      a.b = "lora." + std::to_string(count) + ".B";
      w.add(a.a, (at::randn({a.rank, l.in_features}) * 0.3).to(dt));
      w.add(a.b, (at::randn({a.rows, a.rank}) * 0.3).to(dt));
      l.loras.push_back(a);
      ++count;
    }
  });
  return count;
}

// The same model without adapters on weights W + s B A, merged here (dense weights only).
models::Instance merged_by_test(const models::Instance& inst, const contracts::Registry& reg) {
  models::Instance out{inst.model, std::make_shared<exec::TensorWeights>(&reg), inst.inputs};
  for (const auto& [k, v] : inst.weights->all()) out.weights->add(k, v.clone());
  ir::for_each_linear(out.model, [&](ir::Linear& l) {
    if (l.loras.empty()) return;
    at::Tensor w = out.weights->tensor(l.weight).to(at::kDouble);
    for (const auto& a : l.loras)
      w.narrow(0, a.row_offset, a.rows) += a.scale * at::mm(inst.weights->tensor(a.b).to(at::kDouble),
                                                           inst.weights->tensor(a.a).to(at::kDouble));
    out.weights->add(l.weight, w.to(inst.weights->tensor(l.weight).scalar_type()));
    l.loras.clear();
  });
  return out;
}

using test::metered;

bool feature_sliced(const plan::Plan& p) {
  for (const auto& b : p.blocks)
    for (const auto& s : b.sublayers)
      if (s.chosen(legality::Transform::FeatureSlicedMlp)) return true;
  return false;
}

int64_t lora_steps(const ir::Model& m, const plan::Plan& p, const contracts::Registry& reg,
                   const contracts::DeviceCaps& dev) {
  int64_t n = 0;
  for (size_t bi = 0; bi < m.blocks.size(); ++bi)
    for (size_t si = 0; si < m.blocks[bi].sublayers.size(); ++si) {
      const auto prog = plan::compile_sublayer(m, m.blocks[bi], m.blocks[bi].sublayers[si],
                                               p.blocks[bi].sublayers[si], reg, dev);
      for (const auto& s : prog.steps) n += std::holds_alternative<plan::LoraStep>(s.body);
    }
  return n;
}

TEST(Lora, PlannedMatchesNaiveOnMergedWeights) {
  const auto reg = exec::builtin_registry();
  const auto dev = exec::describe_device(at::Device(at::kCPU));
  const std::vector<ir::GateUpLayout> layouts = {ir::GateUpLayout::None, ir::GateUpLayout::Separate,
                                                 ir::GateUpLayout::FusedHalves, ir::GateUpLayout::Interleaved};
  int sliced = 0, quantized = 0;
  for (uint64_t seed = 500; seed < 560; ++seed) {
    std::mt19937_64 rng(seed);
    auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
    models::ModelConfig c = models::demo_config();
    c.layers = int(pick(1, 2));
    c.kv_heads = pick(1, 2);
    c.heads = c.kv_heads * pick(1, 2);
    c.head_dim = 2 * pick(4, 8);
    c.dim = 8 * pick(3, 7);
    c.format = seed % 3 == 0 ? "int8-rowwise" : "dense";
    c.hidden = c.format == "int8-rowwise" && pick(0, 1) ? pick(512, 600) : pick(17, 90);
    c.fused_qkv = pick(0, 1) == 1;
    c.layout = layouts[size_t(pick(0, 3))];
    c.joint = pick(0, 1) == 1;
    c.qkv_bias = c.out_bias = c.mlp_bias = pick(0, 1) == 1;
    c.rotary_dim = c.head_dim;
    c.video_h = c.video_w = 0;
    c.segments = {{"text", pick(1, 30)}, {"video", 2 * pick(5, 60) + 1}};  // odd lengths
    if (pick(0, 2) == 0) {  // cross-attention on a context
      c.context_tokens = pick(1, 20);
      c.context_dim = 8 * pick(2, 5);
    }
    if (pick(0, 3) == 0) c.parallel_hidden = pick(9, 60);  // fused qkv|mlp, linear2 over [attn | mlp]
    c.per_segment_mlp = pick(0, 3) == 0;
    c.embed = pick(0, 1) == 1;
    if (!c.embed) c.in_features = c.dim;
    plan::Options opt;
    opt.token_chunk = pick(5, 33);
    opt.feature_slice = pick(0, 2) == 0 ? -1 : (c.format == "int8-rowwise" ? 256 : pick(7, 40));
    SCOPED_TRACE("seed " + std::to_string(seed) + " format " + c.format + " fused " + std::to_string(c.fused_qkv) +
                 " layout " + ir::to_string(c.layout) + " joint " + std::to_string(c.joint) + " ctx " +
                 std::to_string(c.context_tokens) + " parallel " + std::to_string(c.parallel_hidden) + " chunk " +
                 std::to_string(opt.token_chunk) + " fslice " + std::to_string(opt.feature_slice));
    at::manual_seed(seed);
    auto inst = models::instantiate(c, reg, at::kCPU);
    ASSERT_GT(add_random_adapters(inst.model, *inst.weights, rng, at::kFloat), 0);
    const plan::Plan p = plan::make_plan(inst.model, reg, dev, opt);
    EXPECT_GT(lora_steps(inst.model, p, reg, dev), 0);
    const auto [planned, peak] = metered(inst, p, reg, dev);
    EXPECT_EQ(p.estimated_peak_bytes, peak);
    // The naive schedule merges the adapters itself (LoraImpl::merged); on dense weights also
    // the naive run of weights merged here, without adapters.
    const at::Tensor naive = exec::run_naive(inst.model, *inst.weights, inst.inputs, reg);
    if (c.format == "dense") {
      const auto m = merged_by_test(inst, reg);
      const at::Tensor naive_merged = exec::run_naive(m.model, *m.weights, m.inputs, reg);
      EXPECT_LE(test::rel_l2(naive, naive_merged), 1e-6);
    } else {
      ++quantized;
    }
    if (feature_sliced(p)) {
      ++sliced;
      const auto ref = models::upcast_f64(inst, reg);
      const at::Tensor r64 = exec::run_naive(ref.model, *ref.weights, ref.inputs, reg);
      EXPECT_LE(test::rel_l2(planned, r64), 2 * test::rel_l2(naive, r64) + 1e-12);
    } else {
      EXPECT_LE(test::rel_l2(planned, naive), 1e-5);
    }
  }
  EXPECT_GT(sliced, 5);
  EXPECT_GT(quantized, 5);
}

TEST(Lora, AdaptersChangeTheOutput) {
  const auto reg = exec::builtin_registry();
  const auto dev = exec::describe_device(at::Device(at::kCPU));
  std::mt19937_64 rng(3);
  models::ModelConfig c = models::demo_config();
  c.layers = 1;
  models::set_total_tokens(c, 300);
  auto inst = models::instantiate(c, reg, at::kCPU);
  const plan::Plan p0 = plan::make_plan(inst.model, reg, dev, {});
  const at::Tensor base = exec::run_planned(inst.model, p0, *inst.weights, inst.inputs, reg, dev);
  add_random_adapters(inst.model, *inst.weights, rng, at::kFloat);
  const plan::Plan p = plan::make_plan(inst.model, reg, dev, {});
  const at::Tensor with = exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, dev);
  EXPECT_GT(test::rel_l2(with, base), 1e-2);
  // The A·x slabs are placed buffers of the programs.
  const auto prog = plan::compile_sublayer(inst.model, inst.model.blocks[0], inst.model.blocks[0].sublayers[0],
                                           p.blocks[0].sublayers[0], reg, dev);
  bool placed = false;
  for (const auto& b : prog.buffers) placed |= b.role == plan::BufRole::LoraAx && b.bytes() > 0;
  EXPECT_TRUE(placed);
}

// ---- files: naming schemes, matching, errors -------------------------------------------------

struct Family {
  recognize::FamilyConfig cfg;
  explicit Family(const std::string& variant) : cfg(recognize::preset(variant, 2, true)) {}
  int64_t dim() const { return cfg.dim; }
};

at::Tensor r(std::initializer_list<int64_t> shape) { return at::randn(shape); }

TEST(LoraNames, KohyaDiffusersPeftAndTrainerNamingsMapOntoCanonicalWeights) {
  const Family wan("wan2.1-1.3b"), flux("flux1-dev");
  const int64_t D = flux.dim();
  struct Want {
    std::string module, canonical;
    int64_t row_offset;
  };
  const std::vector<std::pair<const Family*, Want>> cases = {
      // Flux: kohya on the original layout, diffusers (split q/k/v of the fused qkv), PEFT.
      {&flux, {"lora_unet_double_blocks_1_img_attn_qkv", "double_blocks.1.img_attn.qkv.weight", 0}},
      {&flux, {"lora_unet_single_blocks_0_linear1", "single_blocks.0.linear1.weight", 0}},
      {&flux, {"transformer.transformer_blocks.0.attn.to_k", "double_blocks.0.img_attn.qkv.weight", D}},
      {&flux, {"transformer.transformer_blocks.1.attn.add_v_proj", "double_blocks.1.txt_attn.qkv.weight", 2 * D}},
      {&flux, {"transformer.single_transformer_blocks.1.proj_mlp", "single_blocks.1.linear1.weight", 3 * D}},
      {&flux, {"base_model.model.single_transformer_blocks.0.proj_out", "single_blocks.0.linear2.weight", 0}},
      {&flux, {"lora_transformer_transformer_blocks_0_attn_to_v", "double_blocks.0.img_attn.qkv.weight", 2 * D}},
      {&flux, {"diffusion_model.double_blocks.0.img_mlp.0", "double_blocks.0.img_mlp.0.weight", 0}},
      // Wan: the trainers' ComfyUI-layout names, kohya (musubi), diffusers.
      {&wan, {"diffusion_model.blocks.1.self_attn.q", "blocks.1.self_attn.q.weight", 0}},
      {&wan, {"lora_unet_blocks_0_cross_attn_k", "blocks.0.cross_attn.k.weight", 0}},
      {&wan, {"transformer.blocks.1.attn2.to_out.0", "blocks.1.cross_attn.o.weight", 0}},
      {&wan, {"blocks.0.ffn.net.0.proj", "blocks.0.ffn.0.weight", 0}},
  };
  for (const auto& [fam, want] : cases) {
    SCOPED_TRACE(want.module);
    const auto t = recognize::LoraNames(fam->cfg).find(want.module);
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(t->canonical, want.canonical);
    EXPECT_EQ(t->row_offset, want.row_offset);
  }
  EXPECT_FALSE(recognize::LoraNames(wan.cfg).find("transformer.transformer_blocks.0.attn.to_q").has_value());
  for (const auto& [key, part] : std::vector<std::pair<std::string, recognize::LoraPart>>{
           {"a.lora_A.weight", recognize::LoraPart::Down}, {"a.lora_up.weight", recognize::LoraPart::Up},
           {"a.lora.down.weight", recognize::LoraPart::Down}, {"a.alpha", recognize::LoraPart::Alpha}}) {
    const auto k = recognize::parse_lora_key(key);
    ASSERT_TRUE(k.has_value()) << key;
    EXPECT_EQ(k->module, "a");
    EXPECT_EQ(k->part, part);
  }
  EXPECT_FALSE(recognize::parse_lora_key("blocks.0.self_attn.q.diff").has_value());
}

TEST(LoraFile, ScalesByAlphaOverRankAndReportsUnmatchedKeys) {
  const Family flux("flux1-dev");
  const int64_t D = flux.dim();
  models::LoraInput kohya{"kohya", {}, 1.0};
  kohya.tensors["lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight"] = r({4, D});
  kohya.tensors["lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight"] = r({3 * D, 4});
  kohya.tensors["lora_unet_double_blocks_0_img_attn_qkv.alpha"] = at::scalar_tensor(2.0);
  kohya.tensors["lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight"] = r({4, 8});
  kohya.tensors["lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_up.weight"] = r({8, 4});
  // Through a file, with the strength after the last ':'.
  const std::string path = "/tmp/streamplan-kohya-" + std::to_string(::getpid()) + ".safetensors";
  models::write_tensors(path, kohya.tensors);
  kohya = models::read_lora(path + ":0.5");
  std::remove(path.c_str());
  EXPECT_EQ(kohya.name, path);
  EXPECT_DOUBLE_EQ(kohya.strength, 0.5);
  models::LoraInput peft{"peft", {}, 1.5};
  peft.tensors["transformer.transformer_blocks.0.attn.to_k.lora_A.weight"] = r({2, D});
  peft.tensors["transformer.transformer_blocks.0.attn.to_k.lora_B.weight"] = r({D, 2});
  const auto set = models::load_loras({kohya, peft}, flux.cfg, at::kFloat, at::kCPU);
  const auto& ads = set.adapters.at("double_blocks.0.img_attn.qkv.weight");
  ASSERT_EQ(ads.size(), 2u);
  EXPECT_DOUBLE_EQ(ads[0].scale, 0.5 * 2.0 / 4.0);
  EXPECT_EQ(ads[0].rows, 3 * D);
  EXPECT_DOUBLE_EQ(ads[1].scale, 1.5);
  EXPECT_EQ(ads[1].row_offset, D);
  EXPECT_EQ(ads[1].rows, D);
  EXPECT_EQ(set.unmatched.size(), 2u);
  EXPECT_NE(set.summary().find("lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight"), std::string::npos);
}

TEST(LoraFile, BadInputNamesTheTensorAndShapes) {
  const Family wan("wan2.1-1.3b"), flux("flux1-dev");
  const int64_t W = wan.dim(), F = wan.cfg.ffn;
  auto load = [&](const Family& f, std::map<std::string, at::Tensor> t) {
    return error_of([&] { models::load_loras({{"x.safetensors", std::move(t), 1.0}}, f.cfg, at::kFloat, at::kCPU); });
  };
  // Mismatched ranks.
  std::string e = load(wan, {{"diffusion_model.blocks.0.self_attn.q.lora_A.weight", r({4, W})},
                             {"diffusion_model.blocks.0.self_attn.q.lora_B.weight", r({W, 8})}});
  EXPECT_NE(e.find("diffusion_model.blocks.0.self_attn.q.lora_A.weight' [4, " + std::to_string(W) + "]"),
            std::string::npos) << e;
  EXPECT_NE(e.find("[" + std::to_string(W) + ", 8]"), std::string::npos) << e;
  EXPECT_NE(e.find("one rank"), std::string::npos) << e;
  // Shapes that do not fit the weight.
  e = load(wan, {{"diffusion_model.blocks.0.ffn.0.lora_A.weight", r({4, W + 1})},
                 {"diffusion_model.blocks.0.ffn.0.lora_B.weight", r({F, 4})}});
  EXPECT_NE(e.find("do not fit weight 'blocks.0.ffn.0.weight' [" + std::to_string(F) + ", " + std::to_string(W) + "]"),
            std::string::npos) << e;
  // A LoRA of another family: no key names a weight.
  e = load(wan, {{"transformer.single_transformer_blocks.0.proj_mlp.lora_A.weight", r({4, flux.dim()})},
                 {"transformer.single_transformer_blocks.0.proj_mlp.lora_B.weight", r({4 * flux.dim(), 4})}});
  EXPECT_NE(e.find("names a weight of this wan2.1 model"), std::string::npos) << e;
  // A without B.
  e = load(wan, {{"diffusion_model.blocks.0.self_attn.q.lora_A.weight", r({4, W})}});
  EXPECT_NE(e.find("no lora_B/up tensor"), std::string::npos) << e;
}

// A tiny Flux and a tiny Wan checkpoint with LoRAs in several namings and strengths: planned vs
// the naive schedule on canonical weights merged here, and the estimate exact.
TEST(LoraFile, FamiliesPlannedMatchesNaiveOnMergedCanonicalWeights) {
  const auto reg = exec::builtin_registry();
  const auto dev = exec::describe_device(at::Device(at::kCPU));
  for (const std::string variant : {"flux1-dev", "wan2.1-1.3b"}) {
    SCOPED_TRACE(variant);
    const auto cfg = recognize::preset(variant, 2, true);
    const std::string path = "/tmp/streamplan-lora-" + variant + "-" + std::to_string(::getpid()) + ".safetensors";
    models::write_random_checkpoint(cfg, "original", path, 5, at::kFloat);
    const auto f = io::SafetensorsFile::open(path);
    const auto rec = recognize::recognize(f, models::sidecar_of(f));
    auto w = models::load_canonical(f, rec, at::kFloat, at::kCPU, reg);
    const models::Geometry g = cfg.family == "flux1" ? models::Geometry{.height = 80, .width = 48, .text_tokens = 5}
                                                     : models::Geometry{.frames = 5, .height = 48, .width = 32, .text_tokens = 7};
    auto run = models::prepare(cfg, *w, models::random_raw_inputs(cfg, g, 3), ir::DType::F32, "sdpa");
    const int64_t D = cfg.dim;
    std::vector<models::LoraInput> ins;
    if (cfg.family == "flux1") {
      ins.push_back({"diffusers", {}, 0.7});
      for (const char* m : {"transformer_blocks.0.attn.to_q", "transformer_blocks.1.attn.add_k_proj",
                            "single_transformer_blocks.0.attn.to_v", "single_transformer_blocks.1.proj_mlp"}) {
        const int64_t out = std::string(m).find("proj_mlp") != std::string::npos ? cfg.ffn : D;
        ins[0].tensors[std::string("transformer.") + m + ".lora_A.weight"] = r({3, D}) * 0.2;
        ins[0].tensors[std::string("transformer.") + m + ".lora_B.weight"] = r({out, 3}) * 0.2;
      }
      ins.push_back({"kohya", {}, 1.3});
      ins[1].tensors["lora_unet_single_blocks_1_linear2.lora_down.weight"] = r({5, D + cfg.ffn}) * 0.2;
      ins[1].tensors["lora_unet_single_blocks_1_linear2.lora_up.weight"] = r({D, 5}) * 0.2;
      ins[1].tensors["lora_unet_single_blocks_1_linear2.alpha"] = at::scalar_tensor(4.0);
      ins[1].tensors["lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight"] = r({2, D}) * 0.2;
      ins[1].tensors["lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight"] = r({3 * D, 2}) * 0.2;
    } else {
      ins.push_back({"trainer", {}, 0.9});
      for (const char* m : {"blocks.0.self_attn.q", "blocks.1.cross_attn.v", "blocks.0.ffn.2", "blocks.1.ffn.0"}) {
        const bool up = std::string(m) == "blocks.1.ffn.0", down = std::string(m) == "blocks.0.ffn.2";
        ins[0].tensors[std::string("diffusion_model.") + m + ".lora_A.weight"] = r({4, down ? cfg.ffn : D}) * 0.2;
        ins[0].tensors[std::string("diffusion_model.") + m + ".lora_B.weight"] = r({up ? cfg.ffn : D, 4}) * 0.2;
      }
      ins.push_back({"kohya", {}, -0.6});
      ins[1].tensors["lora_unet_blocks_1_self_attn_o.lora_down.weight"] = r({6, D}) * 0.2;
      ins[1].tensors["lora_unet_blocks_1_self_attn_o.lora_up.weight"] = r({D, 6}) * 0.2;
      ins[1].tensors["lora_unet_blocks_1_self_attn_o.alpha"] = at::scalar_tensor(3.0);
    }
    auto set = models::load_loras(ins, cfg, at::kFloat, at::kCPU);
    EXPECT_TRUE(set.unmatched.empty());
    for (const auto& [name, t] : set.tensors) w->add(name, t);
    EXPECT_TRUE(set.attach(run.model).empty());
    models::Instance inst{run.model, w, run.inputs};
    // The reference: canonical weights merged here, the model without adapters.
    auto mw = std::make_shared<exec::TensorWeights>(&reg);
    for (const auto& [k, v] : w->all()) mw->add(k, v.clone());
    for (const auto& [weight, ads] : set.adapters)
      for (const auto& a : ads)
        mw->tensor(weight).narrow(0, a.row_offset, a.rows) += a.scale * at::mm(set.tensors.at(a.b), set.tensors.at(a.a));
    ir::Model plain = run.model;
    ir::for_each_linear(plain, [](ir::Linear& l) { l.loras.clear(); });
    const at::Tensor ref = exec::run_naive(plain, *mw, run.inputs, reg);
    const at::Tensor base = exec::run_naive(plain, *w, run.inputs, reg);
    EXPECT_GT(test::rel_l2(ref, base), 1e-3);  // the adapters matter
    for (const plan::Options opt : {plan::Options{7, -1}, plan::Options{11, 0}}) {
      const plan::Plan p = plan::make_plan(inst.model, reg, dev, opt);
      const auto [planned, peak] = metered(inst, p, reg, dev);
      EXPECT_EQ(p.estimated_peak_bytes, peak);
      EXPECT_LE(test::rel_l2(planned, ref), 1e-5);
    }
    std::remove(path.c_str());
  }
}

TEST(GpuLora, PlannedMatchesNaiveInBf16) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto reg = exec::builtin_registry();
  const at::Device cuda = exec::pick_device("cuda");
  const auto dev = exec::describe_device(cuda);
  std::mt19937_64 rng(11);
  models::ModelConfig c = models::demo_config();
  c.layers = 2;
  c.dtype = ir::DType::BF16;
  models::set_total_tokens(c, 1000);
  auto inst = models::instantiate(c, reg, cuda);
  ASSERT_GT(add_random_adapters(inst.model, *inst.weights, rng, at::kBFloat16), 0);
  for (const auto& [k, v] : inst.weights->all()) inst.weights->add(k, v.to(cuda));
  for (const plan::Options opt : {plan::Options{96, -1}, plan::Options{128, 0}}) {
    const plan::Plan p = plan::make_plan(inst.model, reg, dev, opt);
    const at::Tensor planned = exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, dev);
    const auto ref = models::upcast_f64(inst, reg);
    const at::Tensor naive = exec::run_naive(inst.model, *inst.weights, inst.inputs, reg);
    const at::Tensor r64 = exec::run_naive(ref.model, *ref.weights, ref.inputs, reg);
    EXPECT_LE(test::rel_l2(planned, r64), 2 * test::rel_l2(naive, r64) + 1e-3);
  }
}

}  // namespace
