// Planning tests: IR validation, legality rejections as data, and plan sizing.
//
// Pure C++ against streamplan_core (no ATen). Models come from a compact avdit-like
// builder below (fused QKV with q|k|v regions, per-head Q/K RMSNorm, split-half RoPE,
// SwiGLU as fused [gate | up] halves, per-segment 6-vector modulation, fp32 final
// projection) whose knobs each test turns. The default has 520 tokens, which no
// default chunk divides.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <functional>
#include <optional>
#include <ostream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "contracts/contracts.hpp"
#include "ir/model.hpp"
#include "legality/legality.hpp"
#include "plan/budget.hpp"
#include "plan/cost.hpp"
#include "plan/plan.hpp"
#include "exec/registry.hpp"
#include "plan/arena.hpp"
#include "plan/program.hpp"

namespace {

namespace ir = sp::ir;
namespace ct = sp::contracts;
namespace lg = sp::legality;
namespace pl = sp::plan;
using ct::Cap;
using lg::Transform;

// ---------------------------------------------------------------------------------------
// Model builder (fields in designated-initializer order)

struct Knobs {
  ir::DType dtype = ir::DType::F32;
  int64_t heads = 4, kv_heads = 4, head_dim = 32, rotary_dim = 24, hidden = 256;
  int layers = 1;
  std::string consumer = "sdpa";
  std::string qkv_format = "dense", up_format = "dense", down_format = "dense", final_format = "dense";
  std::vector<std::string> attn_patches = {}, mlp_patches = {};
  int64_t dim = 128, out_features = 16;
  std::vector<ir::Segment> segments = {{"text", 40}, {"video", 480}};
};

// bf16 with grouped-query attention: 8 query heads share 2 K/V heads.
Knobs gqa_bf16(int layers = 1) {
  return {.dtype = ir::DType::BF16, .heads = 8, .kv_heads = 2, .head_dim = 16, .rotary_dim = 12, .layers = layers};
}

ir::Linear linear(const std::string& name, int64_t in, int64_t out, const std::string& format) {
  ir::Linear l;
  l.weight = name + ".weight";
  l.in_features = in;
  l.out_features = out;
  l.format = format;
  return l;
}

ir::Model build(const Knobs& k) {
  ir::Model m;
  m.name = "avdit-test";
  m.dim = k.dim;
  m.dtype = k.dtype;
  m.segments = k.segments;
  const int64_t wq = k.heads * k.head_dim, wkv = k.kv_heads * k.head_dim;
  const ir::Norm norm{ir::NormKind::RMSNorm, false, "", "", 1e-5};
  for (int i = 0; i < k.layers; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    ir::Block b{std::to_string(i), {ir::ModScope::PerSegment, 6, p + "mod"}, {}};
    ir::Attention a;
    a.heads = k.heads;
    a.kv_heads = k.kv_heads;
    a.head_dim = k.head_dim;
    a.proj.qkv = linear(p + "attn.qkv", k.dim, wq + 2 * wkv, k.qkv_format);
    a.proj.qkv->out_regions = {{"q", 0, wq}, {"k", wq, wkv}, {"v", wq + wkv, wkv}};
    a.qk_norm = {ir::QkNormKind::PerHead, 1e-5};
    a.proj.q_norm = p + "attn.norm_q.weight";
    a.proj.k_norm = p + "attn.norm_k.weight";
    a.rope = {ir::RopeStyle::SplitHalf, k.rotary_dim, "rope"};
    a.consumer = k.consumer;
    a.proj.out = linear(p + "attn.out", wq, k.dim, "dense");
    a.patches = k.attn_patches;
    b.sublayers.push_back({"attn", {}, norm, {0, 1, 2}, a});
    ir::Mlp f;
    f.layout = ir::GateUpLayout::FusedHalves;
    f.act = ir::ActKind::Silu;
    f.hidden = k.hidden;
    f.up = linear(p + "mlp.fc1", k.dim, 2 * k.hidden, k.up_format);
    f.down = linear(p + "mlp.fc2", k.hidden, k.dim, k.down_format);
    f.patches = k.mlp_patches;
    b.sublayers.push_back({"mlp", {}, norm, {3, 4, 5}, f});
    m.blocks.push_back(std::move(b));
  }
  ir::FinalLayer fl{{}, norm, {ir::ModScope::PerSegment, 2, "final.mod"}, {0, 1, -1}, {}};
  fl.proj = linear("final.proj", k.dim, k.out_features, k.final_format);
  fl.proj.bias = "final.proj.bias";
  fl.proj.fp32_compute = true;
  m.final_layer = fl;
  return m;
}

ir::Attention& attn(ir::Model& m) { return std::get<ir::Attention>(m.blocks[0].sublayers[0].body); }
ir::Mlp& mlp(ir::Model& m) { return std::get<ir::Mlp>(m.blocks[0].sublayers[1].body); }

// ---------------------------------------------------------------------------------------
// Contracts: the device, and custom formats / patches / consumers

const std::set<ir::DType> kFloats = {ir::DType::F32, ir::DType::BF16, ir::DType::F16, ir::DType::F64};

ct::DeviceCaps cpu(std::set<ir::DType> dtypes = kFloats) {
  return {.name = "cpu", .kind = ct::DeviceKind::CPU, .memory_total = int64_t{64} << 30,
          .memory_free = int64_t{64} << 30, .dtypes = std::move(dtypes), .threads = 1, .alloc_round = 1};
}

ct::Registry registry_with_test_contracts() {
  ct::Registry reg = sp::exec::builtin_registry();
  // Dense formats, each lacking one capability.
  reg.add(ct::FormatCaps{.name = "no-held", .description = "re-acquired for every slab", .out_slicing = Cap::Yes,
                         .in_slicing = Cap::Yes, .held_execution = Cap::No});
  reg.add(ct::FormatCaps{.name = "held-undeclared", .description = "declares no held execution",
                         .out_slicing = Cap::Yes, .in_slicing = Cap::Yes});
  reg.add(ct::FormatCaps{.name = "rows-undeclared", .description = "declares no row slicing",
                         .in_slicing = Cap::Yes, .held_execution = Cap::Yes});
  reg.add(ct::FormatCaps{.name = "no-col-slice", .description = "no column slices", .out_slicing = Cap::Yes,
                         .in_slicing = Cap::No, .held_execution = Cap::Yes});
  reg.add(ct::FormatCaps{.name = "rows128", .description = "row slices at multiples of 128",
                         .out_slicing = Cap::Yes, .in_slicing = Cap::Yes, .out_align = 128,
                         .held_execution = Cap::Yes});
  reg.add(ct::PatchCaps{.name = "q-global-norm", .description = "normalizes Q over all tokens",
                        .reads = {ct::TensorRole::Q}, .modifies = {ct::TensorRole::Q}, .row_local = Cap::No,
                        .feature_local = Cap::No});
  ct::ConsumerCaps fp32_only = reg.consumer("sdpa");
  fp32_only.name = "fp32-only";
  fp32_only.dtypes = {ir::DType::F32};
  reg.add(fp32_only);
  ct::ConsumerCaps q64 = reg.consumer("sdpa");
  q64.name = "sdpa-q64";
  q64.q_align = 64;
  reg.add(q64);
  ct::ConsumerCaps kv128 = reg.consumer("sdpa");
  kv128.name = "sdpa-kv128";
  kv128.kv_align = 128;
  reg.add(kv128);
  return reg;
}

// ---------------------------------------------------------------------------------------
// Matchers

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

using lg::Check;
using lg::ComponentKind;

// The component a rejection must name; unset or empty fields match anything.
struct Comp {
  std::optional<ComponentKind> kind;
  std::string name, format;
  std::optional<ct::TensorRole> role;
};
// Read as "rejected by consumer 'whole'".
namespace by {
Comp any() { return {}; }
Comp consumer(const std::string& name) { return {ComponentKind::Consumer, name, "", {}}; }
Comp weight(const std::string& name, const std::string& format = "") {
  return {ComponentKind::Weight, name, format, {}};
}
Comp patch(const std::string& name, std::optional<ct::TensorRole> role = {}) {
  return {ComponentKind::Patch, name, "", role};
}
Comp device(const std::string& name) { return {ComponentKind::Device, name, "", {}}; }
Comp model_quantity(const std::string& name) { return {ComponentKind::Model, name, "", {}}; }
Comp transformation(Transform t) { return {ComponentKind::Transformation, lg::to_string(t), "", {}}; }
}  // namespace by

// Every field matches exactly; an empty string or unset optional matches anything.
struct Want {
  Transform transform;
  Check check;
  Comp component;
  std::string required, actual;
  std::string region;
};

bool matches(const lg::Rejection& r, const Want& w) {
  const Comp& c = w.component;
  return r.transform == w.transform && r.check == w.check && (!c.kind || r.component_kind == *c.kind) &&
         (c.name.empty() || r.component_name == c.name) && (c.format.empty() || r.format == c.format) &&
         (!c.role || r.role == c.role) && (w.required.empty() || r.required == w.required) &&
         (w.actual.empty() || r.actual == w.actual) && (w.region.empty() || r.region == w.region);
}

::testing::AssertionResult Rejected(const std::vector<lg::Rejection>& rs, const Want& w) {
  for (const auto& r : rs)
    if (matches(r, w)) return ::testing::AssertionSuccess();
  const Comp& c = w.component;
  auto f = ::testing::AssertionFailure();
  f << "no rejection of '" << lg::to_string(w.transform) << "' with code " << lg::code_name(w.check) << " component "
    << (c.kind ? lg::to_string(*c.kind) : "any") << " name=\"" << c.name << "\" format=\"" << c.format << "\" role="
    << (c.role ? ct::to_string(*c.role) : "any") << " required=\"" << w.required << "\" actual=\"" << w.actual
    << "\" region=\"" << w.region << "\"; got:";
  for (const auto& r : rs) f << "\n  " << lg::describe(r);
  return f;
}

size_t count_of(const std::vector<lg::Rejection>& rs, Transform t) {
  return std::count_if(rs.begin(), rs.end(), [t](const lg::Rejection& r) { return r.transform == t; });
}

const pl::Decision& decision(const std::vector<pl::Decision>& ds, Transform t) {
  for (const auto& d : ds)
    if (d.transform == t) return d;
  throw std::logic_error(std::string("no decision for ") + lg::to_string(t));
}

// ---------------------------------------------------------------------------------------
// 1. IR validation: every error class throws IrError naming the field and the values

struct IrCase {
  const char* name;
  std::function<void(ir::Model&)> mutate;
  std::vector<std::string> parts;  // substrings what() must contain
};
void PrintTo(const IrCase& c, std::ostream* os) { *os << c.name; }

class IrValidate : public ::testing::TestWithParam<IrCase> {};

TEST_P(IrValidate, ThrowsNamingFieldAndValues) {
  ir::Model m = build({});
  GetParam().mutate(m);
  try {
    ir::validate(m);
    ADD_FAILURE() << "validate accepted the model";
  } catch (const ir::IrError& e) {
    for (const auto& p : GetParam().parts)
      EXPECT_TRUE(contains(e.what(), p)) << "what(): " << e.what() << "\nlacks: " << p;
  }
}

// The default model: q|k|v = 128|128|128 rows of a 384-row fused weight, head_dim 32.
INSTANTIATE_TEST_SUITE_P(
    Errors, IrValidate,
    ::testing::Values(
        IrCase{"HeadsNotMultipleOfKvHeads", [](ir::Model& m) { attn(m).heads = 6, attn(m).kv_heads = 4; },
               {"blocks[0].attn.kv_heads", "heads 6", "kv_heads 4"}},
        IrCase{"FusedRegionsDoNotAddUp", [](ir::Model& m) { attn(m).proj.qkv->out_regions[2].size = 100; },
               {"blocks[0].attn.qkv.out_regions", "add up to 356", "has 384"}},
        IrCase{"RegionGapOrOverlap", [](ir::Model& m) { attn(m).proj.qkv->out_regions[1].offset = 120; },
               {"blocks[0].attn.qkv.out_regions.k", "offset 120", "gap or overlap", "expected 128"}},
        IrCase{"QRegionSizeNotHeadsTimesHeadDim",
               [](ir::Model& m) { attn(m).proj.qkv->out_regions = {{"q", 0, 64}, {"k", 64, 128}, {"v", 192, 192}}; },
               {"blocks[0].attn.qkv.out_regions.q", "size 64", "heads*head_dim 128"}},
        IrCase{"OutProjectionInFeatures", [](ir::Model& m) { attn(m).proj.out.in_features = 130; },
               {"blocks[0].attn.out.in_features", "expected 128", "got 130"}},
        IrCase{"RotaryDimOdd", [](ir::Model& m) { attn(m).rope.rotary_dim = 15; },
               {"blocks[0].attn.rope.rotary_dim", "head_dim=32", "got 15"}},
        IrCase{"RotaryDimAboveHeadDim", [](ir::Model& m) { attn(m).rope.rotary_dim = 34; },
               {"blocks[0].attn.rope.rotary_dim", "head_dim=32", "got 34"}},
        IrCase{"GateWithFusedHalves", [](ir::Model& m) { mlp(m).gate = linear("g", 128, 256, "dense"); },
               {"blocks[0].mlp.gate", "fused-halves"}},
        IrCase{"SeparateWithoutGate",
               [](ir::Model& m) { mlp(m).layout = ir::GateUpLayout::Separate, mlp(m).up->out_features = 256; },
               {"blocks[0].mlp.gate", "without a gate"}},
        IrCase{"ModulationIndexOutOfRange", [](ir::Model& m) { m.blocks[0].sublayers[0].mod.gate = 6; },
               {"blocks[0].attn.mod", "index 6", "[0, 6)"}},
        IrCase{"NormEpsZero", [](ir::Model& m) { m.blocks[0].sublayers[1].norm.eps = 0; },
               {"blocks[0].mlp.norm.eps", "got 0"}},
        IrCase{"NormEpsNegative", [](ir::Model& m) { m.blocks[0].sublayers[1].norm.eps = -0.5; },
               {"blocks[0].mlp.norm.eps", "got -0.5"}},
        IrCase{"SegmentLengthZero", [](ir::Model& m) { m.segments[1].length = 0; },
               {"model.segments[1].video", "got 0"}},
        IrCase{"SegmentLengthNegative", [](ir::Model& m) { m.segments[1].length = -3; },
               {"model.segments[1].video", "got -3"}},
        IrCase{"IntegerActivationDtype", [](ir::Model& m) { m.dtype = ir::DType::I8; }, {"model.dtype", "int8"}}),
    [](const ::testing::TestParamInfo<IrCase>& info) { return std::string(info.param.name); });

TEST(IrValidateOk, ValidModelsPass) {
  EXPECT_NO_THROW(ir::validate(build({})));
  EXPECT_NO_THROW(ir::validate(build(gqa_bf16(3))));
}

TEST(IrValidateOk, UnknownActivationNamesField) {
  try {
    ir::parse_act("relu6", "blocks[0].mlp.act");
    ADD_FAILURE() << "parse_act accepted relu6";
  } catch (const ir::IrError& e) {
    EXPECT_TRUE(contains(e.what(), "blocks[0].mlp.act")) << e.what();
    EXPECT_TRUE(contains(e.what(), "'relu6'")) << e.what();
  }
  EXPECT_EQ(ir::parse_act("gelu-tanh", "f"), ir::ActKind::GeluTanh);
}

// ---------------------------------------------------------------------------------------
// 2. Legality: one test per rejection reason

class Legality : public ::testing::Test {
 protected:
  // Verdict for sublayer 0 (attention) or 1 (MLP) of block 0.
  lg::Verdict verdict(const ir::Model& m, size_t sublayer, const ct::DeviceCaps* device = nullptr) const {
    lg::Context ctx{&m, &reg, device ? device : &dev};
    return lg::check_sublayer(ctx, m.blocks.at(0).sublayers.at(sublayer));
  }
  pl::Plan plan(const ir::Model& m, pl::Options opt = {}) const { return pl::make_plan(m, reg, dev, opt); }
  // Small slabs fixed, so that every legal transformation runs on these small models.
  pl::Plan bounded(const ir::Model& m, int64_t feature_slice = 64) const {
    return plan(m, {.token_chunk = 128, .feature_slice = feature_slice});
  }

  ct::Registry reg = registry_with_test_contracts();
  ct::DeviceCaps dev = cpu();
};

TEST_F(Legality, WholeConsumerFailsClosedForStreamedQOnly) {
  const pl::Plan p = bounded(build({.consumer = "whole"}));
  const pl::SublayerPlan& a = p.blocks[0].sublayers[0];
  const Transform t = Transform::GlobalKvStreamedQ;
  const auto& q = decision(a.decisions, t);
  EXPECT_FALSE(q.chosen);
  EXPECT_TRUE(Rejected(q.rejections, {t, Check::ConsumerBoundedQ, by::consumer("whole"), "yes", "undeclared"}));
  EXPECT_TRUE(Rejected(q.rejections, {t, Check::ConsumerDeclaresGlobalK, by::consumer("whole"), "declared (yes or no)",
                                      "undeclared"}));
  EXPECT_TRUE(Rejected(q.rejections, {t, Check::ConsumerDeclaresGlobalV, by::consumer("whole"), "declared (yes or no)",
                                      "undeclared"}));
  EXPECT_TRUE(Rejected(q.rejections, {t, Check::ConsumerSlabOutput, by::consumer("whole"), "yes", "undeclared"}));
  EXPECT_EQ(q.rejections.size(), 4u);

  const auto& o = decision(a.decisions, Transform::StreamedOutProj);
  EXPECT_FALSE(o.chosen);
  EXPECT_TRUE(Rejected(o.rejections, {Transform::StreamedOutProj, Check::Prerequisite,
                                      by::transformation(Transform::GlobalKvStreamedQ), "legal", "rejected"}));
  EXPECT_EQ(o.rejections.size(), 1u);

  // Only those two: bounded QKV and the MLP transformations of the same block still run.
  EXPECT_TRUE(a.chosen(Transform::BoundedQkv));
  EXPECT_LT(a.token_chunk, p.tokens);
  EXPECT_EQ(a.q_chunk, p.tokens);
  EXPECT_TRUE(p.blocks[0].sublayers[1].chosen(Transform::TokenChunkedMlp));
  EXPECT_TRUE(p.blocks[0].sublayers[1].chosen(Transform::FeatureSlicedMlp));
}

TEST_F(Legality, UnregisteredConsumer) {
  const lg::Verdict v = verdict(build({.consumer = "flash-x"}), 0);
  EXPECT_TRUE(Rejected(v.rejections, {Transform::GlobalKvStreamedQ, Check::ConsumerRegistered, by::consumer("flash-x"),
                                      "registered consumer", "unknown name"}));
  EXPECT_TRUE(v.is_legal(Transform::BoundedQkv));
}

TEST_F(Legality, ConsumerKvAlignmentNotMetByTokens) {
  const lg::Verdict v = verdict(build({.consumer = "sdpa-kv128"}), 0);  // 520 tokens
  EXPECT_TRUE(Rejected(v.rejections, {Transform::GlobalKvStreamedQ, Check::ConsumerKvAligned,
                                      by::consumer("sdpa-kv128"), "multiple of 128", "520"}));
  EXPECT_EQ(count_of(v.rejections, Transform::GlobalKvStreamedQ), 1u);
}

TEST_F(Legality, ConsumerWithoutModelDtype) {
  const lg::Verdict v = verdict(build({.dtype = ir::DType::BF16, .consumer = "fp32-only"}), 0);
  EXPECT_TRUE(Rejected(v.rejections, {Transform::GlobalKvStreamedQ, Check::ConsumerDtype, by::consumer("fp32-only"),
                                      "bf16", "not accepted"}));
  EXPECT_EQ(count_of(v.rejections, Transform::GlobalKvStreamedQ), 1u);
  EXPECT_TRUE(verdict(build({.consumer = "fp32-only"}), 0).is_legal(Transform::GlobalKvStreamedQ));
}

TEST_F(Legality, AttnOutRenormPatchBlocksStreamedOutProjOnly) {
  const pl::SublayerPlan a = bounded(build({.attn_patches = {"attn-out-renorm"}})).blocks[0].sublayers[0];
  const auto& o = decision(a.decisions, Transform::StreamedOutProj);
  EXPECT_FALSE(o.chosen);
  EXPECT_TRUE(Rejected(o.rejections, {Transform::StreamedOutProj, Check::PatchRowLocal, by::patch("attn-out-renorm"),
                                      "yes", "no"}));
  EXPECT_TRUE(a.chosen(Transform::GlobalKvStreamedQ));
  EXPECT_TRUE(a.chosen(Transform::BoundedQkv));
}

TEST_F(Legality, MlpHiddenRownormPatchBlocksFeatureSlicingOnly) {
  const pl::SublayerPlan f = plan(build({.mlp_patches = {"mlp-hidden-rownorm"}}), {.token_chunk = 128}).blocks[0].sublayers[1];
  const auto& d = decision(f.decisions, Transform::FeatureSlicedMlp);
  EXPECT_FALSE(d.chosen);
  EXPECT_TRUE(Rejected(d.rejections, {Transform::FeatureSlicedMlp, Check::PatchFeatureLocal,
                                      by::patch("mlp-hidden-rownorm"), "yes", "no"}));
  EXPECT_TRUE(f.chosen(Transform::TokenChunkedMlp));
  EXPECT_EQ(f.feature_slice, 256);  // the whole hidden width
}

TEST_F(Legality, NonRowLocalQPatchBlocksBoundedQkvAndStreamedQ) {
  const lg::Verdict v = verdict(build({.attn_patches = {"q-global-norm"}}), 0);
  EXPECT_TRUE(Rejected(v.rejections, {Transform::BoundedQkv, Check::PatchRowLocal,
                                      by::patch("q-global-norm", ct::TensorRole::Q), "yes", "no"}));
  EXPECT_TRUE(Rejected(v.rejections, {Transform::GlobalKvStreamedQ, Check::Prerequisite,
                                      by::transformation(Transform::BoundedQkv), "legal", "rejected"}));
  EXPECT_TRUE(v.legal.empty());
}

TEST_F(Legality, UndeclaredRowSlicingOnFusedQkv) {
  const lg::Verdict v = verdict(build({.qkv_format = "rows-undeclared"}), 0);
  EXPECT_TRUE(Rejected(v.rejections, {Transform::BoundedQkv, Check::FormatRegionSlicing,
                                      by::weight("blocks.0.attn.qkv.weight", "rows-undeclared"), "yes", "undeclared"}));
  EXPECT_FALSE(v.is_legal(Transform::BoundedQkv));
}

TEST_F(Legality, MisalignedQkvRegionOffset) {
  // 3 heads of 32: q|k|v at rows 0, 96, 192 of a format aligned to 128 rows.
  const lg::Verdict v = verdict(build({.heads = 3, .kv_heads = 3, .qkv_format = "rows128"}), 0);
  EXPECT_TRUE(Rejected(v.rejections, {Transform::BoundedQkv, Check::RegionAligned, by::weight("", "rows128"),
                                      "multiple of 128", "96", "k"}));
  EXPECT_TRUE(Rejected(v.rejections, {Transform::BoundedQkv, Check::RegionAligned, by::weight("", "rows128"),
                                      "multiple of 128", "192", "v"}));
  EXPECT_FALSE(Rejected(v.rejections, {Transform::BoundedQkv, Check::RegionAligned, by::any(), "", "", "q"}));
  // 4 heads of 32: offsets 0, 128, 256.
  EXPECT_TRUE(verdict(build({.qkv_format = "rows128"}), 0).is_legal(Transform::BoundedQkv));
}

TEST_F(Legality, DownWeightWithoutHeldExecution) {
  const lg::Verdict v = verdict(build({.down_format = "no-held"}), 1);
  EXPECT_TRUE(Rejected(v.rejections, {Transform::TokenChunkedMlp, Check::FormatHeld,
                                      by::weight("blocks.0.mlp.fc2.weight", "no-held"), "yes", "no"}));
  EXPECT_TRUE(Rejected(v.rejections, {Transform::FeatureSlicedMlp, Check::Prerequisite,
                                      by::transformation(Transform::TokenChunkedMlp), "legal", "rejected"}));
  EXPECT_EQ(count_of(v.rejections, Transform::FeatureSlicedMlp), 1u);
}

TEST_F(Legality, Int8RowwiseNeedsTwoAlignedFeatureSlices) {
  // int8-rowwise: input (column) slices of the down projection at multiples of 256.
  Knobs k{.hidden = 384, .up_format = "int8-rowwise", .down_format = "int8-rowwise"};
  const lg::Verdict v = verdict(build(k), 1);
  EXPECT_TRUE(Rejected(v.rejections, {Transform::FeatureSlicedMlp, Check::HiddenTooNarrow,
                                      by::model_quantity("mlp.hidden"), ">= 512 (alignment 256)", "384"}));
  EXPECT_TRUE(v.is_legal(Transform::TokenChunkedMlp));

  k.hidden = 1024;
  EXPECT_TRUE(verdict(build(k), 1).is_legal(Transform::FeatureSlicedMlp));
  const pl::SublayerPlan f = bounded(build(k), 256).blocks[0].sublayers[1];
  EXPECT_TRUE(f.chosen(Transform::FeatureSlicedMlp));
  EXPECT_EQ(f.feature_slice % 256, 0);
  EXPECT_LT(f.feature_slice, 1024);
}

TEST_F(Legality, DownWeightWithoutColumnSlicing) {
  const lg::Verdict v = verdict(build({.down_format = "no-col-slice"}), 1);
  EXPECT_TRUE(Rejected(v.rejections, {Transform::FeatureSlicedMlp, Check::FormatColumnSlicing,
                                      by::weight("blocks.0.mlp.fc2.weight"), "yes", "no"}));
  EXPECT_TRUE(v.is_legal(Transform::TokenChunkedMlp));
}

TEST_F(Legality, DeviceWithoutModelDtype) {
  const ct::DeviceCaps no_bf16 = cpu({ir::DType::F32, ir::DType::F16, ir::DType::F64});
  const ir::Model m = build({.dtype = ir::DType::BF16});
  const lg::Verdict a = verdict(m, 0, &no_bf16), f = verdict(m, 1, &no_bf16);
  EXPECT_TRUE(Rejected(a.rejections, {Transform::BoundedQkv, Check::DeviceDtype, by::device("cpu"), "bf16",
                                      "unsupported"}));
  EXPECT_TRUE(Rejected(f.rejections, {Transform::TokenChunkedMlp, Check::DeviceDtype, by::device("cpu"), "bf16",
                                      "unsupported"}));
  EXPECT_TRUE(a.legal.empty());
  EXPECT_TRUE(f.legal.empty());
}

TEST_F(Legality, FinalProjectionWithUndeclaredHeldExecution) {
  const ir::Model m = build({.final_format = "held-undeclared"});
  lg::Context ctx{&m, &reg, &dev};
  const lg::Verdict v = lg::check_final(ctx, *m.final_layer);
  EXPECT_TRUE(Rejected(v.rejections, {Transform::BoundedFinal, Check::FormatHeld,
                                      by::weight("final.proj.weight", "held-undeclared"), "yes", "undeclared"}));
  const pl::Plan p = plan(m);
  EXPECT_FALSE(p.final_layer.chosen(Transform::BoundedFinal));
  EXPECT_EQ(p.final_layer.chunk, p.tokens);
}

TEST_F(Legality, EveryRejectionIsCollected) {
  const ct::DeviceCaps fp32_device = cpu({ir::DType::F32});
  const ir::Model m = build({.dtype = ir::DType::BF16, .consumer = "whole", .qkv_format = "no-held",
                             .attn_patches = {"q-global-norm"}});
  const lg::Verdict v = verdict(m, 0, &fp32_device);
  // Three components reject bounded QKV: the weight format, the patch and the device.
  EXPECT_EQ(count_of(v.rejections, Transform::BoundedQkv), 3u);
  EXPECT_TRUE(
      Rejected(v.rejections, {Transform::BoundedQkv, Check::FormatHeld, by::weight("", "no-held"), "yes", "no"}));
  EXPECT_TRUE(
      Rejected(v.rejections, {Transform::BoundedQkv, Check::PatchRowLocal, by::patch("q-global-norm"), "yes", "no"}));
  EXPECT_TRUE(Rejected(v.rejections, {Transform::BoundedQkv, Check::DeviceDtype, by::device("cpu"), "bf16", ""}));
  // Streamed Q: its prerequisite and four consumer checks.
  EXPECT_EQ(count_of(v.rejections, Transform::GlobalKvStreamedQ), 5u);
  EXPECT_TRUE(Rejected(v.rejections, {Transform::GlobalKvStreamedQ, Check::Prerequisite,
                                      by::transformation(Transform::BoundedQkv), "", ""}));
  EXPECT_TRUE(
      Rejected(v.rejections, {Transform::GlobalKvStreamedQ, Check::ConsumerBoundedQ, by::consumer("whole"), "", ""}));
}

// The up half of a fused [gate | up] weight starts at row `hidden`; with out_align 128 and
// hidden 320 its slices would start at rows 320, 448, ...: feature slicing is rejected.
TEST_F(Legality, FusedHalvesUpSliceOffsetMustRespectRowAlignment) {
  const lg::Verdict v = verdict(build({.hidden = 320, .up_format = "rows128"}), 1);
  EXPECT_FALSE(v.is_legal(Transform::FeatureSlicedMlp));
  EXPECT_TRUE(Rejected(v.rejections, {Transform::FeatureSlicedMlp, Check::UpHalfAligned,
                                      by::weight("blocks.0.mlp.fc1.weight"), "multiple of 128", "320"}));
  EXPECT_TRUE(verdict(build({.hidden = 384, .up_format = "rows128"}), 1).is_legal(Transform::FeatureSlicedMlp));
}

// Codes are what tools match on: each must be present, distinct and come with a text.
TEST(LegalityCodes, EveryCheckHasDistinctCodeAndText) {
  std::set<std::string> codes;
  for (size_t i = 0; i < std::size(lg::kAllChecks); ++i) {
    const Check c = lg::kAllChecks[i];
    EXPECT_EQ(static_cast<size_t>(c), i) << "kAllChecks is not in declaration order at " << i;
    const std::string code = lg::code_name(c);
    EXPECT_FALSE(code.empty()) << i;
    EXPECT_NE(code, "?") << i;
    EXPECT_TRUE(codes.insert(code).second) << "duplicate code " << code;
    const lg::Rejection r{.transform = Transform::BoundedQkv,
                          .check = c,
                          .component_kind = ComponentKind::Weight,
                          .component_name = "w",
                          .format = "dense",
                          .region = "k"};
    EXPECT_FALSE(lg::check_text(r).empty()) << code;
    EXPECT_TRUE(contains(lg::describe(r), "[" + code + "]")) << lg::describe(r);
  }
  // An enumerator appended to Check but missing from kAllChecks would have a code here.
  EXPECT_EQ(std::string(lg::code_name(static_cast<Check>(std::size(lg::kAllChecks)))), "?");
}

// ---------------------------------------------------------------------------------------
// 3. Plans

using Planning = Legality;

TEST_F(Planning, ExplainListsEveryRejection) {
  const pl::Plan p = plan(build({.layers = 2, .consumer = "whole", .final_format = "held-undeclared",
                                 .mlp_patches = {"mlp-hidden-rownorm"}}));
  const std::string text = pl::explain(p);
  std::vector<lg::Rejection> all;
  auto collect = [&all](const std::vector<pl::Decision>& ds) {
    for (const auto& d : ds) all.insert(all.end(), d.rejections.begin(), d.rejections.end());
  };
  for (const auto& b : p.blocks)
    for (const auto& s : b.sublayers) collect(s.decisions);
  collect(p.final_layer.decisions);
  ASSERT_GE(all.size(), 7u);
  for (const auto& r : all) {
    EXPECT_TRUE(contains(text, lg::component_text(r))) << lg::component_text(r) << "\n" << text;
    EXPECT_TRUE(contains(text, lg::check_text(r))) << lg::check_text(r) << "\n" << text;
    EXPECT_TRUE(contains(text, lg::code_name(r.check))) << lg::code_name(r.check) << "\n" << text;
  }
  EXPECT_TRUE(contains(text, "[x] bounded QKV") || contains(text, "[ ] bounded QKV (legal; not chosen")) << text;
}

TEST_F(Planning, ChunkCoveringAllTokensDeclinesWithNote) {
  const ir::Model m = build({});
  const int64_t T = m.tokens();
  for (int64_t chunk : {T, T + 100}) {
    SCOPED_TRACE("token_chunk " + std::to_string(chunk));
    const pl::Plan p = plan(m, {.token_chunk = chunk});
    const pl::SublayerPlan &a = p.blocks[0].sublayers[0], &f = p.blocks[0].sublayers[1];
    for (const pl::Decision* d : {&decision(a.decisions, Transform::BoundedQkv),
                                  &decision(a.decisions, Transform::GlobalKvStreamedQ),
                                  &decision(a.decisions, Transform::StreamedOutProj),
                                  &decision(f.decisions, Transform::TokenChunkedMlp),
                                  &decision(p.final_layer.decisions, Transform::BoundedFinal)}) {
      EXPECT_FALSE(d->chosen) << lg::to_string(d->transform);
      EXPECT_EQ(d->note, "one chunk covers all tokens") << lg::to_string(d->transform);
      EXPECT_TRUE(d->rejections.empty()) << lg::to_string(d->transform);
    }
    EXPECT_EQ(a.token_chunk, T);
    EXPECT_EQ(a.q_chunk, T);
    EXPECT_EQ(f.token_chunk, T);
    EXPECT_EQ(p.final_layer.chunk, T);
  }
}

TEST_F(Planning, FeatureSliceNotMultipleOfAlignmentThrows) {
  const ir::Model m = build({.hidden = 1024, .up_format = "int8-rowwise", .down_format = "int8-rowwise"});
  try {
    plan(m, {.feature_slice = 300});
    ADD_FAILURE() << "feature_slice 300 accepted with alignment 256";
  } catch (const pl::PlanError& e) {
    for (const char* part : {"feature_slice", "300", "256"}) EXPECT_TRUE(contains(e.what(), part)) << e.what();
  }
  EXPECT_EQ(plan(m, {.feature_slice = 512}).blocks[0].sublayers[1].feature_slice, 512);
}

TEST_F(Planning, NegativeTokenChunkThrows) {
  try {
    plan(build({}), {.token_chunk = -5});
    ADD_FAILURE() << "token_chunk -5 accepted";
  } catch (const pl::PlanError& e) {
    for (const char* part : {"token_chunk", "-5"}) EXPECT_TRUE(contains(e.what(), part)) << e.what();
  }
}

TEST_F(Planning, FloorIsResidualPlusGlobalKvWithGqa) {
  const Knobs k = gqa_bf16();
  const ir::Model m = build(k);
  const int64_t T = 520, D = 128, esz = 2;
  const int64_t expected = T * D * esz + 2 * T * k.kv_heads * k.head_dim * esz;  // K and V: kv_heads, not heads
  EXPECT_EQ(pl::floor_bytes(m), expected);
  const pl::Plan p = plan(m);
  EXPECT_EQ(p.floor_bytes, expected);
  EXPECT_EQ(p.residual_bytes, T * D * esz);
}

// The estimate is the residual plus the worst program of any sublayer, the final layer or
// the embedding, each the placement of the same program the executor runs.
TEST_F(Planning, EstimateIsResidualPlusWorstProgram) {
  const std::vector<std::pair<Knobs, pl::Options>> cases = {
      {Knobs{}, {}},
      {gqa_bf16(2), {.token_chunk = 100}},
      {Knobs{.hidden = 1024, .qkv_format = "int8-rowwise", .up_format = "int8-rowwise", .down_format = "int8-rowwise"},
       {.token_chunk = 96, .feature_slice = 512}},
      {Knobs{.consumer = "whole", .attn_patches = {"attn-out-renorm"}}, {}},
      {Knobs{}, {.token_chunk = 520, .feature_slice = -1}},  // nothing bounded
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const ir::Model m = build(cases[i].first);
    const pl::Plan p = plan(m, cases[i].second);
    int64_t worst = pl::place(pl::compile_embed(m, reg, dev), dev).peak_bytes;
    for (size_t b = 0; b < m.blocks.size(); ++b)
      for (size_t s = 0; s < m.blocks[b].sublayers.size(); ++s) {
        const pl::SublayerPlan& sp = p.blocks[b].sublayers[s];
        const int64_t peak =
            pl::place(pl::compile_sublayer(m, m.blocks[b], m.blocks[b].sublayers[s], sp, reg, dev), dev).peak_bytes;
        EXPECT_EQ(sp.estimated_peak, peak) << sp.name;
        worst = std::max(worst, peak);
      }
    const int64_t fin = pl::place(pl::compile_final(m, p.final_layer.chunk, reg, dev), dev).peak_bytes;
    EXPECT_EQ(p.final_layer.estimated_peak, fin);
    worst = std::max(worst, fin);
    EXPECT_EQ(p.estimated_peak_bytes, p.residual_bytes + worst);
    EXPECT_GE(p.estimated_peak_bytes, p.floor_bytes);
  }
}

// Buffers of a role in a program.
std::vector<const pl::Buffer*> of_role(const pl::Program& prog, pl::BufRole r) {
  std::vector<const pl::Buffer*> out;
  for (const auto& b : prog.buffers)
    if (b.role == r) out.push_back(&b);
  return out;
}

TEST_F(Planning, ChunkNotDividingTokensIsPlanned) {
  const ir::Model m = build({});  // 520 tokens
  const pl::Plan p = plan(m, {.token_chunk = 96});
  const pl::SublayerPlan& a = p.blocks[0].sublayers[0];
  for (Transform t : {Transform::BoundedQkv, Transform::GlobalKvStreamedQ, Transform::StreamedOutProj})
    EXPECT_TRUE(a.chosen(t)) << lg::to_string(t);
  EXPECT_EQ(a.token_chunk, 96);
  EXPECT_EQ(a.q_chunk, 96);
  EXPECT_EQ(p.blocks[0].sublayers[1].token_chunk, 96);
  EXPECT_EQ(p.final_layer.chunk, 96);
  const pl::Program prog = pl::compile_sublayer(m, m.blocks[0], m.blocks[0].sublayers[0], a, reg, dev);
  const auto n32 = of_role(prog, pl::BufRole::Normed32);
  ASSERT_FALSE(n32.empty());
  EXPECT_EQ(n32.front()->shape, (std::vector<int64_t>{96, 128}));
  EXPECT_EQ(n32.back()->shape, (std::vector<int64_t>{520 - 5 * 96, 128}));  // the remainder slab

  // A consumer's Q alignment rounds the Q slab up, never past the sequence.
  const ir::Model q64 = build({.consumer = "sdpa-q64"});
  EXPECT_EQ(plan(q64, {.token_chunk = 96}).blocks[0].sublayers[0].q_chunk, 128);
  EXPECT_EQ(plan(q64, {.token_chunk = 500}).blocks[0].sublayers[0].q_chunk, 512);
  EXPECT_EQ(plan(q64, {.token_chunk = 519}).blocks[0].sublayers[0].q_chunk, 520);
}

// A device with fused row kernels: the fp32 staging buffers (N32, Q32, K32, RopeTmp, row
// statistics) leave every program, Q and QF never share bytes (the kernel reads Q while it
// writes QF), the peak drops; a patch on Q keeps the staged Q/K path, and fp64 models keep
// all of it.
TEST_F(Planning, FusedRowKernelsDropStagingBuffers) {
  ct::DeviceCaps fused = dev;
  fused.fused_row_kernels = Cap::Yes;
  const ir::Model m = build(gqa_bf16());
  const pl::Plan staged = pl::make_plan(m, reg, dev, {.token_chunk = 100});
  const pl::Plan one_pass = pl::make_plan(m, reg, fused, {.token_chunk = 100});
  EXPECT_LT(one_pass.estimated_peak_bytes, staged.estimated_peak_bytes);
  const ir::Attention& a = std::get<ir::Attention>(m.blocks[0].sublayers[0].body);
  EXPECT_TRUE(pl::fused_qk(m, a, reg, fused));
  EXPECT_FALSE(pl::fused_qk(m, a, reg, dev));
  for (size_t s = 0; s < 2; ++s) {
    const pl::Program prog =
        pl::compile_sublayer(m, m.blocks[0], m.blocks[0].sublayers[s], one_pass.blocks[0].sublayers[s], reg, fused);
    SCOPED_TRACE(prog.name);
    for (pl::BufRole gone : {pl::BufRole::Normed32, pl::BufRole::Staged32, pl::BufRole::RopeTmp, pl::BufRole::RowStats})
      EXPECT_TRUE(of_role(prog, gone).empty()) << pl::to_string(gone);
    EXPECT_FALSE(of_role(prog, pl::BufRole::Normed).empty());
    const pl::Placement pl = pl::place(prog, fused);
    for (const auto& st : prog.steps)
      if (std::holds_alternative<pl::QkNormRopeStep>(st.body)) {
        ASSERT_EQ(st.reads.size(), 1u);
        const int q = st.reads[0], qf = st.writes[0];
        const int64_t qb = pl.offset[size_t(q)], fb = pl.offset[size_t(qf)];
        if (fb >= 0 && qb >= 0)  // K rows of the global buffer, or the folded Q slab
          EXPECT_TRUE(qb + prog.buffers[size_t(q)].bytes() <= fb || fb + prog.buffers[size_t(qf)].bytes() <= qb);
      }
  }

  Knobs patched = gqa_bf16();
  patched.attn_patches = {"q-temperature"};
  const ir::Model mq = build(patched);
  const ir::Attention& aq = std::get<ir::Attention>(mq.blocks[0].sublayers[0].body);
  EXPECT_FALSE(pl::fused_qk(mq, aq, reg, fused));
  EXPECT_TRUE(pl::fused_norm(mq, fused));
  const pl::Program pq = pl::compile_sublayer(
      mq, mq.blocks[0], mq.blocks[0].sublayers[0],
      pl::make_plan(mq, reg, fused, {.token_chunk = 100}).blocks[0].sublayers[0], reg, fused);
  EXPECT_TRUE(of_role(pq, pl::BufRole::Normed32).empty());
  EXPECT_FALSE(of_role(pq, pl::BufRole::Staged32).empty());

  // --explain says which path runs, and why not the fused one.
  EXPECT_EQ(one_pass.row_kernels, "fused kernels (norm + modulation; Q/K norm + RoPE)");
  EXPECT_TRUE(contains(staged.row_kernels, "declares fused row kernels: undeclared")) << staged.row_kernels;
  const std::string note = pl::make_plan(mq, reg, fused, {}).row_kernels;
  EXPECT_TRUE(contains(note, "Q/K staged in fp32 in 1 sublayer(s)")) << note;
  EXPECT_TRUE(contains(pl::explain(one_pass), "row operations: fused kernels")) << pl::explain(one_pass);

  Knobs f64 = gqa_bf16();
  f64.dtype = ir::DType::F64;
  EXPECT_FALSE(pl::fused_norm(build(f64), fused));
  EXPECT_TRUE(contains(pl::row_kernels_note(build(f64), reg, fused), "not fp64")) << pl::row_kernels_note(build(f64), reg, fused);
}

// ---------------------------------------------------------------------------------------
// 4. Budgets: the cost model and the chooser (no ATen: figures from the model, not measured)

class Budget : public Legality {
 protected:
  pl::Plan plan_b(const ir::Model& m, int64_t budget, pl::Options opt = {}) const {
    opt.budget_bytes = budget;
    return pl::make_plan(m, reg, dev, opt);
  }
  // Smallest budget any plan of `m` fits, from the error of a budget of one byte.
  int64_t smallest(const ir::Model& m, pl::Options opt = {}) const {
    try {
      plan_b(m, 1, opt);
    } catch (const pl::BudgetError& e) {
      return e.smallest_peak_bytes;
    }
    ADD_FAILURE() << "a budget of one byte was accepted";
    return 0;
  }
  // Every sublayer (and the final layer) fits the budget by its estimate.
  static void expect_fits(const pl::Plan& p, int64_t budget) {
    EXPECT_LE(p.estimated_peak_bytes, budget);
    for (const auto& b : p.blocks)
      for (const auto& s : b.sublayers) EXPECT_LE(p.residual_bytes + s.estimated_peak, budget) << s.name;
    EXPECT_LE(p.residual_bytes + p.final_layer.estimated_peak, budget);
  }
};

// Variants with something to choose: GQA bf16, a wide MLP, int8 feature slices, a patch
// that forbids streaming the output, a consumer that forbids streaming Q.
std::vector<Knobs> budget_variants() {
  return {Knobs{},
          gqa_bf16(2),
          Knobs{.hidden = 1024, .up_format = "int8-rowwise", .down_format = "int8-rowwise",
                .segments = {{"text", 40}, {"video", 1500}}},
          Knobs{.attn_patches = {"attn-out-renorm"}, .segments = {{"text", 64}, {"video", 2000}}},
          Knobs{.consumer = "whole"}};
}

// Without a budget: the smallest peak whose whole schedule is within 2% of the fastest
// schedule's estimated time — never slower than that, never a larger peak than the fastest's.
TEST_F(Budget, DefaultIsTheLeanestWithinTwoPercentOfTheFastest) {
  for (const Knobs& k : budget_variants()) {
    const ir::Model m = build(k);
    const pl::Plan lean = plan(m), fastest = plan_b(m, int64_t{1} << 40);
    EXPECT_TRUE(contains(pl::explain(lean), "policy: default")) << pl::explain(lean);
    EXPECT_TRUE(contains(pl::explain(fastest), "policy: budget")) << pl::explain(fastest);
    EXPECT_EQ(lean.budget_bytes, 0);
    EXPECT_LE(lean.estimated_ms, fastest.estimated_ms * (1 + pl::kLeanTolerance) * (1 + 1e-9));
    EXPECT_LE(lean.estimated_peak_bytes, fastest.estimated_peak_bytes);
    // Nothing leaner within the tolerance: a budget a little below the default's peak is slower.
    const int64_t below = lean.estimated_peak_bytes - 4096 - (lean.estimated_peak_bytes - lean.residual_bytes) / 100;
    try {
      const pl::Plan leaner = plan_b(m, below);
      if (leaner.estimated_peak_bytes < lean.estimated_peak_bytes)
        EXPECT_GT(leaner.estimated_ms, fastest.estimated_ms * (1 + pl::kLeanTolerance)) << pl::explain(leaner);
    } catch (const pl::BudgetError&) {
      // nothing fits below: the default is the smallest achievable peak
    }
  }
  // One cap over all parts: a part may be 10% slower where the whole stays within 2%.
  auto cand = [](int64_t peak, double s) { return pl::Candidate{"s", 1, 0, 0, {.peak_bytes = peak, .seconds = s}}; };
  const std::vector<std::vector<pl::Candidate>> parts = {{cand(900, 1.00), cand(500, 1.10), cand(100, 2.0)},
                                                         {cand(600, 10.0), cand(400, 10.05), cand(300, 11.0)}};
  // The fastest: 11.0 s (cap 900). Cap 500: 1.10 + 10.05 = 11.15 s (+1.4%); cap 400:
  // 2.0 + 10.05 = 12.05 s (+9.5%).
  EXPECT_EQ(pl::lean_cap(parts, 0.0, 0.02), 500);
  // With 200 s of fixed work besides, cap 300 costs 213 s against 211 s (+0.9%); cap 100
  // leaves part 2 nothing.
  EXPECT_EQ(pl::lean_cap(parts, 200.0, 0.02), 300);
  EXPECT_EQ(pl::lean_cap({}, 1.0, 0.02), 0);
}

TEST_F(Budget, GenerousBudgetTakesTheFastestCandidate) {
  for (const Knobs& k : budget_variants()) {
    const ir::Model m = build(k);
    const pl::Plan p = plan_b(m, int64_t{1} << 40);
    for (const auto& b : p.blocks)
      for (const auto& s : b.sublayers) {
        ASSERT_FALSE(s.alternatives.empty()) << s.name;
        for (const auto& a : s.alternatives) {
          EXPECT_GE(a.estimated_ms, s.estimated_ms) << s.name << " " << a.strategy;
          EXPECT_TRUE(contains(a.lost, "slower") || contains(a.lost, "same time")) << a.lost;
        }
      }
    // Nothing is faster than the default either.
    EXPECT_LE(p.estimated_ms, plan(m).estimated_ms * (1 + 1e-9));
  }
}

TEST_F(Budget, SweepFitsEveryBudgetAndSlowsDownMonotonically) {
  for (const Knobs& k : budget_variants()) {
    const ir::Model m = build(k);
    // The least need (peak + row statistics) up to the fastest plan's peak.
    const int64_t lo = smallest(m), hi = std::max(lo, plan_b(m, int64_t{1} << 40).estimated_peak_bytes);
    ASSERT_GT(lo, 0);
    ASSERT_LE(lo, plan(m).estimated_peak_bytes + 64 * 1024);  // no plan needs less than the least peak
    double prev_ms = 0;
    for (int i = 24; i >= 0; --i) {  // large to small
      const int64_t budget = lo + (hi - lo) * i / 24;
      SCOPED_TRACE("budget " + std::to_string(budget));
      const pl::Plan p = plan_b(m, budget);
      expect_fits(p, budget);
      EXPECT_GE(p.estimated_ms, prev_ms * (1 - 1e-9));  // a tighter budget is never faster
      prev_ms = p.estimated_ms;
    }
    EXPECT_THROW(plan_b(m, lo - 1), pl::BudgetError);
  }
}

TEST_F(Budget, TooSmallBudgetNamesTheSmallestPeakAndWhatSetsIt) {
  const ir::Model m = build(gqa_bf16());
  const int64_t lo = smallest(m);
  try {
    plan_b(m, lo - 1);
    ADD_FAILURE() << "budget below the smallest peak accepted";
  } catch (const pl::BudgetError& e) {
    const std::string w = e.what();
    EXPECT_EQ(e.smallest_peak_bytes, lo);
    EXPECT_EQ(e.budget_bytes, lo - 1);
    for (const std::string& part : {pl::human_bytes(lo), std::to_string(lo) + " bytes", std::string("residual stream"),
                                    std::string("global K/V for 520 tokens at 2x16 bf16"), std::string("block 0 attn")})
      EXPECT_TRUE(contains(w, part)) << part << "\n" << w;
  }
  expect_fits(plan_b(m, lo), lo);
  // A budget below the residual stream alone fails the same way.
  EXPECT_THROW(plan_b(m, 1000), pl::BudgetError);
}

TEST_F(Budget, OnlyLegalTransformationsAreUsed) {
  for (const Knobs& k : {Knobs{.consumer = "whole"}, Knobs{.mlp_patches = {"mlp-hidden-rownorm"}},
                         Knobs{.attn_patches = {"attn-out-renorm"}}, Knobs{.down_format = "no-held"}}) {
    const ir::Model m = build(k);
    const int64_t lo = smallest(m);
    const pl::Plan unbudgeted = plan(m);
    for (int64_t budget : {lo, lo + (lo >> 2), int64_t{1} << 40}) {
      const pl::Plan p = plan_b(m, budget);
      for (size_t i = 0; i < p.blocks[0].sublayers.size(); ++i)
        for (const auto& d : p.blocks[0].sublayers[i].decisions) {
          if (!d.rejections.empty()) EXPECT_FALSE(d.chosen) << lg::to_string(d.transform);
          // Rejections stay as legality gave them.
          const auto& d0 = decision(unbudgeted.blocks[0].sublayers[i].decisions, d.transform);
          EXPECT_EQ(d.rejections.size(), d0.rejections.size());
        }
      const auto& a = p.blocks[0].sublayers[0];
      if (k.consumer == "whole") EXPECT_EQ(a.q_chunk, p.tokens);
      if (!k.mlp_patches.empty()) EXPECT_EQ(p.blocks[0].sublayers[1].feature_slice, k.hidden);
      if (k.down_format == "no-held") EXPECT_EQ(p.blocks[0].sublayers[1].token_chunk, p.tokens);
    }
  }
}

TEST_F(Budget, ExplicitChunksStayFixed) {
  const ir::Model m = build({.hidden = 1024});
  const pl::Plan p = plan_b(m, int64_t{1} << 40, {.token_chunk = 96});
  EXPECT_EQ(p.blocks[0].sublayers[0].token_chunk, 96);
  EXPECT_EQ(p.blocks[0].sublayers[0].q_chunk, 96);
  EXPECT_EQ(p.blocks[0].sublayers[1].token_chunk, 96);
  EXPECT_EQ(p.final_layer.chunk, 96);
  const pl::Plan q = plan_b(m, int64_t{1} << 40, {.feature_slice = 256});
  EXPECT_EQ(q.blocks[0].sublayers[1].feature_slice, 256);
  EXPECT_THROW(plan_b(build({.hidden = 1024, .up_format = "int8-rowwise", .down_format = "int8-rowwise"}),
                      int64_t{1} << 40, {.feature_slice = 300}),
               pl::PlanError);
  EXPECT_THROW(plan_b(m, -1), pl::PlanError);
  EXPECT_THROW(plan_b(m, int64_t{1} << 40, {.token_chunk = -5}), pl::PlanError);
}

TEST_F(Budget, ExplainShowsStrategyAndAlternatives) {
  const ir::Model m = build({.segments = {{"text", 64}, {"video", 2000}}});
  const int64_t lo = smallest(m), hi = plan_b(m, int64_t{1} << 40).estimated_peak_bytes;
  const pl::Plan p = plan_b(m, (lo + hi) / 2);
  const std::string text = pl::explain(p);
  for (const char* part : {"budget ", "alternatives:", "over budget by", "slower: ", "estimated time"})
    EXPECT_TRUE(contains(text, part)) << part << "\n" << text;
  for (const auto& s : p.blocks[0].sublayers) EXPECT_TRUE(contains(text, s.name + ": " + s.strategy)) << text;
}

TEST(BudgetCandidates, ChunkSizes) {
  for (int64_t rows : {1, 63, 64, 65, 127, 128, 520, 2000, 3200, 38184, 74304}) {
    for (int64_t align : {1, 8, 64, 100, 256}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + ", align " + std::to_string(align));
      const auto cs = pl::chunk_candidates(rows, align);
      EXPECT_TRUE(std::is_sorted(cs.begin(), cs.end()));
      EXPECT_EQ(std::adjacent_find(cs.begin(), cs.end()), cs.end());
      for (int64_t c : cs) {
        EXPECT_EQ(c % align, 0) << c;
        EXPECT_GE(c, 64) << c;
        EXPECT_LT(c, rows) << c;
      }
      if (rows <= 64) EXPECT_TRUE(cs.empty());
      if (align == 1 && rows > 1024) {
        EXPECT_NE(std::find(cs.begin(), cs.end(), 1024), cs.end());  // powers of two
        const int64_t third = ((rows + 2) / 3 + 7) / 8 * 8;          // three near-equal slabs
        EXPECT_NE(std::find(cs.begin(), cs.end(), third), cs.end()) << third;
      }
    }
  }
}

TEST(BudgetCandidates, FeatureSlices) {
  EXPECT_EQ(pl::feature_slice_candidates(1024, 1), (std::vector<int64_t>{128, 256, 512}));
  EXPECT_EQ(pl::feature_slice_candidates(1024, 256), (std::vector<int64_t>{256, 512}));
  EXPECT_EQ(pl::feature_slice_candidates(14336, 128), (std::vector<int64_t>{1792, 3584, 7168}));
  EXPECT_EQ(pl::feature_slice_candidates(600, 256), (std::vector<int64_t>{256, 512}));
  EXPECT_TRUE(pl::feature_slice_candidates(1, 1).empty());
}

// The error's terms: K and V together, then the largest buffers live at the peak step and
// the step's transient, the largest first.
TEST(BudgetCandidates, DominantTermsNameTheBuffersLiveAtThePeak) {
  const ct::DeviceCaps dev = cpu();
  pl::Program p;
  p.name = "t";
  p.buffers = {{pl::BufRole::GlobalK, "K", {2, 100, 8}, ir::DType::F32},
               {pl::BufRole::GlobalV, "V", {2, 100, 8}, ir::DType::F32},
               {pl::BufRole::Normed32, "N32", {10, 64}, ir::DType::F32},
               {pl::BufRole::Staged32, "Q32", {10, 128}, ir::DType::F32}};
  pl::Step w{pl::ZeroStep{}, "write", {}, {0, 1, 2}, {}, 0, 0};
  pl::Step last{pl::ZeroStep{}, "attend", {0, 1, 3}, {3}, {}, 3000, 0};
  p.steps = {w, last};
  const pl::Placement pl = pl::place(p, dev);
  EXPECT_EQ(pl.peak_step, 1);
  const std::string t = pl::dominant_terms(p, pl);
  EXPECT_EQ(t.rfind("global K/V for 100 tokens at 2x8 fp32 (2 x 0.01 MiB) + Q/K slab for norm and RoPE [10, 128] fp32", 0),
            0u)
      << t;
  EXPECT_TRUE(contains(t, "attend (0.00 MiB)")) << t;
  EXPECT_FALSE(contains(t, "normalized rows")) << t;  // N32 is dead at the peak step
}

TEST(BudgetCost, MoreSmallerSlabsCostMoreLaunchesAndTime) {
  const ir::Model m = build({.hidden = 1024, .segments = {{"text", 64}, {"video", 4000}}});
  const ct::Registry reg = sp::exec::builtin_registry();
  const ct::DeviceCaps dev = cpu();
  const ir::Block& b = m.blocks[0];
  auto cost = [&](size_t sub, pl::Options o) {
    const pl::Plan p = pl::make_plan(m, reg, dev, o);
    return pl::sublayer_cost(m, b, b.sublayers[sub], p.blocks[0].sublayers[sub], reg, dev);
  };
  for (size_t sub : {0u, 1u}) {
    pl::Cost prev = cost(sub, {.token_chunk = 4064, .feature_slice = -1});
    for (int64_t c : {2048, 1000, 512, 256, 128, 64}) {
      const pl::Cost k = cost(sub, {.token_chunk = c, .feature_slice = -1});
      EXPECT_GT(k.launches, prev.launches) << c;
      EXPECT_GT(k.seconds, prev.seconds) << c;
      prev = k;
    }
  }
  // Narrower feature slices: more launches and time, less memory.
  pl::Cost prev = cost(1, {.token_chunk = 512, .feature_slice = -1});
  for (int64_t f : {512, 256, 128}) {
    const pl::Cost k = cost(1, {.token_chunk = 512, .feature_slice = f});
    EXPECT_GT(k.launches, prev.launches) << f;
    EXPECT_GT(k.seconds, prev.seconds) << f;
    EXPECT_LT(k.peak_bytes, prev.peak_bytes) << f;
    prev = k;
  }
}

TEST(BudgetCost, RatesEfficiencyAndDefaults) {
  EXPECT_DOUBLE_EQ(pl::gemm_efficiency(256, 256), 0.5);
  EXPECT_DOUBLE_EQ(pl::gemm_efficiency(100, 0), 1.0);
  EXPECT_LT(pl::gemm_efficiency(64, 32), pl::gemm_efficiency(128, 32));
  ct::DeviceCaps d = cpu();
  const pl::Rates def = pl::rates_of(d);
  EXPECT_DOUBLE_EQ(def.flops_f32, pl::default_rates(ct::DeviceKind::CPU).flops_f32);
  d.bytes_per_s = 123e9;
  d.gemm_half_rows = 7;
  const pl::Rates r = pl::rates_of(d);
  EXPECT_DOUBLE_EQ(r.bytes_per_s, 123e9);
  EXPECT_DOUBLE_EQ(r.gemm_half_rows, 7);
  EXPECT_DOUBLE_EQ(r.launch_s, def.launch_s);  // unmeasured: the default
  const pl::Rates gpu = pl::default_rates(ct::DeviceKind::CUDA);
  EXPECT_GT(gpu.flops(ir::DType::BF16), gpu.flops(ir::DType::F32));
  EXPECT_DOUBLE_EQ(gpu.flops(ir::DType::F64), gpu.flops(ir::DType::F32) / 2);
}

TEST(BudgetCost, WaveChunksFillWholeWaves) {
  // 40 K/V heads on 132 units: 33 tiles per head fill a wave set; rep 2 halves the rows.
  for (int64_t rep : {1, 2, 3}) {
    const auto qs = pl::wave_chunk_candidates(75600, rep, 40, 132, 1);
    ASSERT_FALSE(qs.empty()) << rep;
    for (int64_t q : qs) {
      EXPECT_LT(q, 75600);
      EXPECT_DOUBLE_EQ(pl::attention_efficiency(rep * q, 40, 132), 1.0) << rep << " " << q;
    }
  }
  EXPECT_TRUE(pl::wave_chunk_candidates(75600, 1, 40, 0, 1).empty());  // no GPU
  for (int64_t q : pl::wave_chunk_candidates(20000, 1, 24, 132, 96)) EXPECT_EQ(q % 96, 0) << q;
}

TEST(BudgetCost, AttentionEfficiencyIsTheFillOfTheLastWave) {
  // 40 heads x 33 tiles of 128 rows = 1320 tiles = 10 full waves of 132.
  EXPECT_DOUBLE_EQ(pl::attention_efficiency(33 * 128, 40, 132), 1.0);
  // One row more opens an 11th wave for 40 tiles: 1360 / (11 x 132).
  EXPECT_DOUBLE_EQ(pl::attention_efficiency(33 * 128 + 1, 40, 132), 1360.0 / (11 * 132));
  // A partial tile costs a whole one.
  EXPECT_DOUBLE_EQ(pl::attention_efficiency(1, 132, 132), pl::attention_efficiency(128, 132, 132));
  EXPECT_DOUBLE_EQ(pl::attention_efficiency(1000, 8, 0), 1.0);  // no GPU: no waves
  // The cost model charges the Q slabs of one attention by their waves: splitting 33 x 128
  // rows per head into 2 slabs fills fewer waves than one call, and costs more.
  ct::DeviceCaps d = cpu();
  d.kind = ct::DeviceKind::CUDA;
  d.compute_units = 132;
  const pl::Rates r = pl::rates_of(d);
  pl::Terms whole{4.0 * 4224 * 8192 * 40 * 128, 0, 2, 4224, ir::DType::BF16, true, 40};
  pl::Terms half = whole;
  half.flops /= 2;
  half.gemm_rows = 4224 / 2;
  EXPECT_GT(2 * pl::step_seconds(half, r), 1.05 * pl::step_seconds(whole, r));
}

TEST(BudgetAuto, MarginOfTheDevice) {
  constexpr int64_t GiB = int64_t{1} << 30;
  ct::DeviceCaps gpu{.name = "cuda:0 (test)", .kind = ct::DeviceKind::CUDA, .memory_total = 140 * GiB,
                     .memory_free = 100 * GiB};
  EXPECT_EQ(pl::budget_auto(gpu), 99 * GiB);  // 1 GiB is less than 10% of 140 GiB
  gpu.memory_total = gpu.memory_free = 8 * GiB;
  EXPECT_EQ(pl::budget_auto(gpu), 8 * GiB - 8 * GiB / 10);
  ct::DeviceCaps host = cpu();
  host.memory_free = 20 * GiB;
  EXPECT_EQ(pl::budget_auto(host), 20 * GiB - 2 * GiB);
  EXPECT_EQ(pl::budget_from_option("auto", host), pl::budget_auto(host));
  EXPECT_EQ(pl::budget_from_option("1GiB", host), GiB);
  host.memory_free = 0;
  EXPECT_THROW(pl::budget_auto(host), pl::BudgetError);
}

// A model of the size budgets are for plans quickly: 50 blocks of a single-stream DiT at
// MiniMax H3's widths (dim 5376, 56 heads of 128, SwiGLU 14336) and 38,184 video tokens on a
// CUDA-like device; a budget between the smallest peak and the fastest plan's streams Q and
// chunks the MLP.
TEST(BudgetScale, FiftyBlockDitPlansQuickly) {
  const ir::Model m = build({.dtype = ir::DType::BF16, .heads = 56, .kv_heads = 56, .head_dim = 128,
                             .rotary_dim = 96, .hidden = 14336, .layers = 50, .dim = 5376, .out_features = 96,
                             .segments = {{"text", 512}, {"video", 38184}}});
  const ct::Registry reg = sp::exec::builtin_registry();
  ct::DeviceCaps h200 = cpu();
  h200.name = "cuda:0 (H200-like)";
  h200.kind = ct::DeviceKind::CUDA;
  h200.alloc_round = 512;
  constexpr int64_t MiB = int64_t{1} << 20;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t budget : {8192 * MiB, 3072 * MiB, 1500 * MiB}) {
    const pl::Plan p = pl::make_plan(m, reg, h200, {.budget_bytes = budget});
    const pl::SublayerPlan &a = p.blocks[0].sublayers[0], &f = p.blocks[0].sublayers[1];
    std::cout << "budget " << pl::human_bytes(budget) << ": attn " << a.strategy << " " << a.token_chunk << "/"
              << a.q_chunk << ", mlp " << f.strategy << " " << f.token_chunk << "/" << f.feature_slice << ", peak "
              << pl::human_bytes(p.estimated_peak_bytes) << ", " << pl::human_ms(p.estimated_ms) << "\n";
    EXPECT_LE(p.estimated_peak_bytes, budget);
    if (budget < 4096 * MiB) EXPECT_EQ(a.strategy, "streamed-q");
  }
  std::cout << "planned three budgets in "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s\n";
  try {
    pl::make_plan(m, reg, h200, {.budget_bytes = 1024 * MiB});
    ADD_FAILURE() << "1 GiB accepted";
  } catch (const pl::BudgetError& e) {
    EXPECT_TRUE(contains(e.what(), "global K/V for 38696 tokens at 56x128 bf16 (2 x 529.0 MiB)")) << e.what();
  }
}

}  // namespace
