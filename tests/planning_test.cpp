// Planning tests: IR validation, legality rejections as data, and plan sizing.
//
// Pure C++ against streamplan_core (no ATen). Models come from the compact avdit-like builder
// of planning_common.hpp (fused QKV with q|k|v regions, per-head Q/K RMSNorm, split-half RoPE,
// SwiGLU as fused [gate | up] halves, per-segment 6-vector modulation, fp32 final projection)
// whose knobs each test turns. The default has 520 tokens, which no default chunk divides.
// Budgets and the cost model: budget_planning_test.cpp.

#include <numeric>

#include "planning_common.hpp"

namespace {

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

TEST_F(Legality, WholeConsumerFailsClosedForStreamedQOnly) {
  const pl::Plan p = bounded(build({.consumer = "whole"}));
  const pl::SublayerPlan& a = p.blocks[0].sublayers[0];
  const Transform t = Transform::GlobalKvStreamedQ;
  const auto& q = decision(a.decisions, t);
  EXPECT_FALSE(a.chosen(t));
  EXPECT_TRUE(Rejected(q.rejections, {t, Check::ConsumerBoundedQ, by::consumer("whole"), "yes", "undeclared"}));
  EXPECT_TRUE(Rejected(q.rejections, {t, Check::ConsumerDeclaresGlobalK, by::consumer("whole"), "declared (yes or no)",
                                      "undeclared"}));
  EXPECT_TRUE(Rejected(q.rejections, {t, Check::ConsumerDeclaresGlobalV, by::consumer("whole"), "declared (yes or no)",
                                      "undeclared"}));
  EXPECT_TRUE(Rejected(q.rejections, {t, Check::ConsumerSlabOutput, by::consumer("whole"), "yes", "undeclared"}));
  EXPECT_EQ(q.rejections.size(), 4u);

  const auto& o = decision(a.decisions, Transform::StreamedOutProj);
  EXPECT_FALSE(a.chosen(Transform::StreamedOutProj));
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
  EXPECT_FALSE(a.chosen(Transform::StreamedOutProj));
  EXPECT_TRUE(Rejected(o.rejections, {Transform::StreamedOutProj, Check::PatchRowLocal, by::patch("attn-out-renorm"),
                                      "yes", "no"}));
  EXPECT_TRUE(a.chosen(Transform::GlobalKvStreamedQ));
  EXPECT_TRUE(a.chosen(Transform::BoundedQkv));
}

TEST_F(Legality, MlpHiddenRownormPatchBlocksFeatureSlicingOnly) {
  const pl::SublayerPlan f = plan(build({.mlp_patches = {"mlp-hidden-rownorm"}}), {.token_chunk = 128}).blocks[0].sublayers[1];
  const auto& d = decision(f.decisions, Transform::FeatureSlicedMlp);
  EXPECT_FALSE(f.chosen(Transform::FeatureSlicedMlp));
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
      EXPECT_EQ(d->note, "one chunk covers all tokens") << lg::to_string(d->transform);
      EXPECT_TRUE(d->rejections.empty()) << lg::to_string(d->transform);
    }
    for (Transform t : {Transform::BoundedQkv, Transform::GlobalKvStreamedQ, Transform::StreamedOutProj})
      EXPECT_FALSE(a.chosen(t)) << lg::to_string(t);
    EXPECT_FALSE(f.chosen(Transform::TokenChunkedMlp));
    EXPECT_FALSE(p.final_layer.chosen(Transform::BoundedFinal));
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

// A sequence-parallel plan per rank: each holds its own rows of the residual stream, runs the
// same exchanges in the same order as every other rank (so that no rank waits on one that runs
// another, whatever rows each holds) and says so in its explain text; the ring refuses the
// output projection streamed with the Q slabs (sequence.split); Ulysses estimates a lower peak
// than one rank's.
TEST_F(Planning, SequenceSplitPlansEachRanksRowsWithTheSameExchanges) {
  const Knobs k = gqa_bf16(2);
  const ir::Model m = build(k);
  const pl::Plan one = plan(m, {.token_chunk = 64});
  for (const pl::SeqMode mode : {pl::SeqMode::Ulysses, pl::SeqMode::Ring})
    for (int64_t ranks : {2, 3}) {
      SCOPED_TRACE(std::string(pl::to_string(mode)) + " over " + std::to_string(ranks));
      std::vector<std::vector<std::string>> exchanges;
      int64_t rows = 0;
      for (int64_t r = 0; r < ranks; ++r) {
        const pl::Plan p = plan(m, {.token_chunk = 64, .sequence = {r, ranks, mode}});
        const int64_t own = pl::own_rows(p.sequence, m.tokens()).size();
        rows += own;
        EXPECT_EQ(p.residual_bytes, own * k.dim * 2);
        // Ulysses holds about 1/ranks of every activation; the ring attends in fp32 blocks.
        if (mode == pl::SeqMode::Ulysses) EXPECT_LT(p.estimated_peak_bytes, one.estimated_peak_bytes);
        // Every exchange in the order it runs (a loop's body as many times as its count), with
        // the rows each rank sends: the same on every rank.
        std::vector<std::string> seen;
        for (const pl::Part* part : pl::parts(p)) {
          const auto& steps = part->program.steps;
          std::function<void(size_t, size_t)> walk = [&](size_t from, size_t to) {
            for (size_t i = from; i < to; ++i) {
              if (const auto* l = std::get_if<pl::LoopStep>(&steps[i].body)) {
                for (int64_t j = 0; j < l->count; ++j) walk(i + 1, size_t(l->end));
                i = size_t(l->end);
              } else if (const auto* x = std::get_if<pl::ExchangeStep>(&steps[i].body)) {
                EXPECT_EQ(steps[i].terms.link_bytes > 0, x->kind != pl::Exchange::Complete) << steps[i].what;
                std::string rows;
                for (int64_t n : x->rows) rows += " " + std::to_string(n);
                seen.push_back(part->program.name + " " + std::to_string(int(x->kind)) + rows);
              }
            }
          };
          walk(0, steps.size());
        }
        if (mode == pl::SeqMode::Ring) EXPECT_EQ(seen.size(), m.blocks.size());
        else EXPECT_GE(seen.size(), 4 * m.blocks.size());
        exchanges.push_back(seen);
        const std::string text = pl::explain(p);
        EXPECT_TRUE(contains(text, "sequence parallel: " + std::string(pl::to_string(mode)) + " over " +
                                       std::to_string(ranks) + " ranks, rank " + std::to_string(r)))
            << text;
        // Ulysses projects each Q slab's output as it comes back; the ring returns all at once.
        EXPECT_EQ(contains(text, "[sequence.split]"), mode == pl::SeqMode::Ring) << text;
        EXPECT_EQ(p.blocks[0].sublayers[0].streamed_out, mode == pl::SeqMode::Ulysses);
      }
      EXPECT_EQ(rows, m.tokens());
      for (const auto& e : exchanges) EXPECT_EQ(e, exchanges.front());
    }
  EXPECT_THROW(plan(m, {.sequence = {2, 2, pl::SeqMode::Ulysses}}), std::invalid_argument);

  // The ring attends each K/V block through the sublayer's consumer where it returns the
  // log-sum-exp; one that does not leaves them to 'math', and the plan says so (consumer.lse).
  Knobs nk = k;
  nk.consumer = "sdpa-no-lse";
  const ir::Model nm = build(nk);
  for (const auto& [model, consumer] : {std::pair<const ir::Model*, std::string>{&m, "sdpa"}, {&nm, "math"}}) {
    const pl::Plan p = plan(*model, {.token_chunk = 64, .sequence = {1, 2, pl::SeqMode::Ring}});
    const auto rings = exchange_steps(p, pl::Exchange::Ring);
    for (const auto& [st, x] : rings) EXPECT_EQ(x->consumer, consumer) << st->what;
    EXPECT_EQ(int(rings.size()), int(model->blocks.size()));
    const std::string text = pl::explain(p);
    EXPECT_EQ(contains(text, "[consumer.lse]"), consumer == "math") << text;
  }
}

// Under a ulysses split each rank holds every key row of its heads once the K exchanges complete:
// a consumer that keeps a K carrier (int8) gets it filled from them there, in one step, and
// attends through it. A consumer that reads its rows' places (sparse) attends the Q slab one
// rank's rows at a time, each at its place: the attend step names every rank's rows of the
// sublayer and the slab's rows per rank, at the consumer's Q alignment. A ring cannot route.
TEST_F(Planning, UlyssesFillsACarrierOnceAndAttendsEachRanksRowsAtTheirPlace) {
  for (const std::string consumer : {"int8", "sparse"}) {
    Knobs k = gqa_bf16(1);
    k.consumer = consumer;
    const ir::Model m = build(k);
    for (int64_t r = 0; r < 3; ++r) {
      SCOPED_TRACE(consumer + ", rank " + std::to_string(r) + " of 3");
      const pl::Sequence seq{r, 3, pl::SeqMode::Ulysses};
      const pl::Plan p = plan(m, {.token_chunk = 64, .kv_budget = 0.3, .sequence = seq});
      int carries = 0, attends = 0, completes = 0;
      for (const pl::Part* part : pl::parts(p))
        for (const pl::Step& st : part->program.steps) {
          if (const auto* x = std::get_if<pl::ExchangeStep>(&st.body); x && x->kind == pl::Exchange::Complete)
            ++completes;
          if (const auto* c = std::get_if<pl::CarryKStep>(&st.body)) {
            EXPECT_EQ(st.depth, 0) << st.what;
            EXPECT_EQ(completes % 2, 0) << "the carrier is filled once K and V are complete";
            EXPECT_EQ(c->kv_rows, m.tokens());
            ++carries;
          }
          const pl::AttendStep* a = pl::attend_of(st.body);
          if (!a || a->kv_rows != m.tokens()) continue;
          ++attends;
          EXPECT_TRUE(a->carried) << st.what;
          if (consumer == "int8") {
            EXPECT_TRUE(a->pieces.ranks.empty()) << st.what;
            continue;
          }
          EXPECT_TRUE(a->call.routed(a->kv_rows)) << st.what;
          const ir::RowRange all{0, m.tokens()};
          ASSERT_EQ(a->pieces.ranks.size(), 3u) << st.what;
          int64_t begin = 0;
          for (size_t i = 0; i < 3; ++i) {
            EXPECT_EQ(a->pieces.ranks[i].begin, begin);
            EXPECT_EQ(a->pieces.ranks[i].size(), pl::rows_per_rank(seq, m.tokens(), all)[i]);
            begin = a->pieces.ranks[i].end;
          }
          EXPECT_EQ(begin, m.tokens());
          EXPECT_EQ(a->pieces.me, r);
          EXPECT_EQ(a->pieces.rows % 64, 0) << "the sparse consumer's Q alignment";
          EXPECT_TRUE(contains(st.what, "one call per rank's rows")) << st.what;
        }
      // 2 K/V head groups over 3 ranks: the last attends none, and takes part in the exchanges only.
      const bool heads = pl::shares(k.kv_heads, 3)[size_t(r)] > 0;
      EXPECT_EQ(attends > 0, heads);
      EXPECT_EQ(carries, heads ? int(m.blocks.size()) : 0);
    }
  }
  Knobs k = gqa_bf16(1);
  k.consumer = "sparse";
  const ir::Model m = build(k);
  try {
    plan(m, {.kv_budget = 0.3, .sequence = {0, 2, pl::SeqMode::Ring}});
    ADD_FAILURE() << "a ring split of routed attention planned";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "use the ulysses split")) << e.what();
  }
}

// Under a ulysses split a consumer to which the order of its key rows is nothing (sdpa:
// ConsumerCaps::positions No) takes K and V in the order each slab's rows arrive: they are
// received straight into K and V, with no buffers of their own and no copy into place, so that
// each rank's peak and bytes fall. One that does not declare it gets them placed at their rows.
TEST_F(Planning, UlyssesReceivesKvInPlaceWhereTheirOrderIsNothingToTheConsumer) {
  for (int64_t r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + " of 3");
    std::map<std::string, pl::Plan> plans;
    for (const std::string consumer : {"sdpa", "sdpa-keyed"}) {
      Knobs k = gqa_bf16(1);
      k.consumer = consumer;
      const ir::Model m = build(k);
      const pl::Plan p = plan(m, {.token_chunk = 40, .sequence = {r, 3, pl::SeqMode::Ulysses}});
      const bool arrival = consumer == "sdpa";
      const auto kv = exchange_steps(p, pl::Exchange::RowsToHeads);
      for (const auto& [st, x] : kv) {
        EXPECT_EQ(x->arrival, arrival) << st->what;
        EXPECT_EQ(x->received.buf == x->out.buf, arrival) << st->what;
        EXPECT_EQ(contains(st->what, "in the order they arrive"), arrival) << st->what;
        EXPECT_EQ(st->terms.launches, arrival ? 1 : 2) << st->what;
      }
      EXPECT_GE(int(kv.size()), 2 * int(m.blocks.size()));  // K and V, in the slab loop and its padding
      int received = 0;  // buffers the exchanges receive through
      for (const pl::Part* part : pl::parts(p))
        for (const pl::Buffer& b : part->program.buffers) received += contains(b.label, "received");
      EXPECT_EQ(received > 0, !arrival);
      plans.emplace(consumer, p);
    }
    // A rank without heads (2 K/V heads over 3 ranks) receives nothing either way.
    if (pl::shares(gqa_bf16().kv_heads, 3)[size_t(r)] > 0)
      EXPECT_LT(plans.at("sdpa").estimated_peak_bytes, plans.at("sdpa-keyed").estimated_peak_bytes);
    else
      EXPECT_EQ(plans.at("sdpa").estimated_peak_bytes, plans.at("sdpa-keyed").estimated_peak_bytes);
  }
}

// Ulysses leaves each K/V slab's exchanges in flight through buffers that live across the slab
// loop, and completes them after it: the cost model hides their link time behind the next
// slabs' work (all but the last pass's), never more than that work, and never below the steps'
// own time. The placement keeps the buffers apart while the exchanges travel.
TEST_F(Planning, ExchangesInFlightHideBehindTheNextSlabsWork) {
  const ir::Model m = build(gqa_bf16(1));
  for (double link : {1e12, 1e6}) {
    SCOPED_TRACE("link " + std::to_string(link) + " B/s");
    ct::DeviceCaps d = dev;
    d.rates.link_bytes_per_s = link;
    const pl::Plan p = pl::make_plan(m, reg, d, {.token_chunk = 64, .sequence = {0, 2, pl::SeqMode::Ulysses}});
    const pl::Part* attn = nullptr;  // the self-attention sublayer's: the one with exchanges
    for (const pl::Part* part : pl::parts(p))
      for (const pl::Step& st : part->program.steps)
        if (std::holds_alternative<pl::ExchangeStep>(st.body)) attn = part;
    ASSERT_NE(attn, nullptr);
    const pl::Program& prog = attn->program;
    pl::check_placement(prog, attn->placement);
    const pl::Rates r = pl::rates_of(d);
    double serial = 0, own = 0, in_flight = 0;
    int staged = 0, completes = 0;
    pl::for_each_run(prog, [&](const pl::Step& st, int64_t runs) {
      pl::Terms t = st.terms;
      serial += double(runs) * pl::step_seconds(t, r);
      if (const auto* x = std::get_if<pl::ExchangeStep>(&st.body)) {
        staged += x->received.buf >= 0 && x->kind == pl::Exchange::RowsToHeads;
        completes += x->kind == pl::Exchange::Complete;
      }
      if (t.overlapped) in_flight += double(runs) * t.link_bytes / r.link_bytes_per_s, t.link_bytes = 0;
      own += double(runs) * pl::step_seconds(t, r);
    });
    EXPECT_TRUE(staged >= 2 && staged % 2 == 0) << staged << ": a K and a V exchange in each slab loop";
    EXPECT_EQ(completes, 2);
    ASSERT_GT(in_flight, 0);
    const double cost = pl::program_cost(prog, d).seconds;
    EXPECT_LT(cost, serial);
    EXPECT_GE(cost, own);
    EXPECT_GE(cost, std::max(own, in_flight)) << "hidden beyond the work beside it";
  }
}

// Under ulysses each Q slab goes out to the ranks piece by piece and every piece is attended
// as it arrives, its output sent straight back: one Ulysses exchange per slab carries the
// attention, and its link time runs beside that attention but for the last piece's way back.
TEST_F(Planning, UlyssesQPiecesTravelBesideTheirAttention) {
  const ir::Model m = build(gqa_bf16(1));
  for (int64_t ranks : {2, 3}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    ct::DeviceCaps d = dev;
    d.rates.link_bytes_per_s = 1e6;  // slow enough that the link outweighs the attention
    const pl::Plan p = pl::make_plan(m, reg, d, {.token_chunk = 64, .sequence = {0, ranks, pl::SeqMode::Ulysses}});
    const pl::Rates r = pl::rates_of(d);
    const auto found = exchange_steps(p, pl::Exchange::Ulysses);
    for (const auto& [st, x] : found) {
      ASSERT_TRUE(x->attend.has_value()) << st->what;
      EXPECT_TRUE(contains(st->what, "piece by piece")) << st->what;
      EXPECT_GT(st->terms.link_bytes, 0) << st->what;
      EXPECT_DOUBLE_EQ(st->terms.link_beside, 1.0 - 1.0 / double(2 * (ranks - 1)));
      pl::Terms serial = st->terms;
      serial.link_beside = 0;
      const double link = st->terms.link_bytes / r.link_bytes_per_s;
      EXPECT_LT(pl::step_seconds(st->terms, r), pl::step_seconds(serial, r)) << st->what;
      EXPECT_GE(pl::step_seconds(st->terms, r), link) << "never below the link time itself";
      EXPECT_GE(pl::step_seconds(st->terms, r), pl::step_seconds(serial, r) - link * st->terms.link_beside);
    }
    EXPECT_GT(found.size(), 0u) << "a Ulysses exchange per Q slab";
    for (const pl::Part* part : pl::parts(p)) EXPECT_NO_THROW(pl::check_placement(part->program, part->placement));
  }
}

// A ulysses Q slab holds two buffers of its size while it is attended: each piece's output
// takes the place of its Q in the Q heads, and the output rows come back into the Q slab (whose
// rows have gone out by then). No attention output buffer of its own is alive beside them; the
// pieces out and back share one program buffer, placed with the rest.
TEST_F(Planning, UlyssesOutputsTakeThePlaceOfTheirQ) {
  const ir::Model m = build(gqa_bf16(1));
  for (int64_t ranks : {2, 3}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const pl::Plan p = plan(m, {.token_chunk = 64, .sequence = {0, ranks, pl::SeqMode::Ulysses}});
    int found = 0;
    for (const pl::Part* part : pl::parts(p)) {
      const pl::Program& prog = part->program;
      for (size_t i = 0; i < prog.steps.size(); ++i) {
        const auto* x = std::get_if<pl::ExchangeStep>(&prog.steps[i].body);
        if (!x || x->kind != pl::Exchange::Ulysses) continue;
        ++found;
        EXPECT_EQ(x->out.buf, x->in.buf) << "the output rows back into the Q slab";
        ASSERT_TRUE(x->attend.has_value());
        EXPECT_EQ(x->attend->out.buf, x->q_heads.buf) << "each piece's output in place of its Q";
        int64_t slab = 0, heads = 0;
        for (size_t b = 0; b < prog.buffers.size(); ++b) {
          const auto [first, last] = part->placement.live[b];
          if (first > int(i) || last < int(i)) continue;
          const pl::Buffer& buf = prog.buffers[b];
          EXPECT_NE(buf.role, pl::BufRole::AttnOut) << pl::buffer_text(buf);
          slab += buf.role == pl::BufRole::SeqRows ? buf.bytes() : 0;
          heads += buf.role == pl::BufRole::SeqHeads ? buf.bytes() : 0;
        }
        EXPECT_LT(x->received.buf, 0) << "each output piece back in the place of its Q piece, in `sent`";
        const int64_t packed = prog.buffers[size_t(x->sent.buf)].bytes();
        EXPECT_EQ(slab, prog.buffers[size_t(x->in.buf)].bytes() + packed)
            << "one Q slab alive while it is attended, beside the pieces out and back";
        // The pieces that travel: this rank's rows of the other ranks' heads.
        EXPECT_EQ(packed, x->rows[0] * (std::accumulate(x->heads.begin(), x->heads.end(), int64_t{0}) - x->heads[0]) *
                              x->unit * 2);
        EXPECT_EQ(heads, prog.buffers[size_t(x->q_heads.buf)].bytes()) << "one Q heads buffer alive";
      }
      EXPECT_NO_THROW(pl::check_placement(prog, part->placement));
    }
    EXPECT_GT(found, 0);
  }
}

// Each rank's piece of a ulysses Q slab is attended in a call of its own, so each piece fills
// the device's waves on its own: a piece of one tile on two multiprocessors leaves half of its
// wave idle, however many pieces the slab has.
TEST_F(Planning, UlyssesPiecesFillTheWavesCallByCall) {
  const Knobs k = gqa_bf16(1);  // 4 query heads per K/V head: a piece of 32 rows folds to one tile
  const ir::Model m = build(k);
  ct::DeviceCaps d = dev;
  d.kind = ct::DeviceKind::CUDA;
  d.compute_units = 2;
  std::map<int64_t, double> per_flop;
  for (int64_t each : {32, 64}) {
    const pl::Plan p = pl::make_plan(m, reg, d, {.sequence = {0, 2, pl::SeqMode::Ulysses}, .slabs = {64, each}});
    for (const auto& [st, x] : exchange_steps(p, pl::Exchange::Ulysses)) {
      if (per_flop.count(each)) continue;
      EXPECT_EQ(st->terms.gemm_rows, (k.heads / k.kv_heads) * each) << "one piece's rows";
      pl::Terms compute = st->terms;
      compute.bytes = compute.link_bytes = 0;
      compute.launches = 0;
      per_flop[each] = pl::step_seconds(compute, pl::rates_of(d)) / st->terms.flops;
    }
  }
  ASSERT_EQ(per_flop.size(), 2u);
  EXPECT_NEAR(per_flop[32] / per_flop[64], 2.0, 1e-9) << "one tile per call on two multiprocessors: half a wave";
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

// check_placement refuses two buffers alive together on the same bytes, and a buffer past the
// arena's end; every chosen program of a plan passes.
TEST_F(Planning, CheckPlacementFindsSharedBytes) {
  const ir::Model m = build(gqa_bf16());
  const pl::Plan p = plan(m, {.token_chunk = 100});
  for (const pl::Part* part : pl::parts(p)) EXPECT_NO_THROW(pl::check_placement(part->program, part->placement));
  const pl::Part& a = p.blocks[0].sublayers[0].part;
  int k = -1, v = -1;
  for (int i = 0; i < int(a.program.buffers.size()); ++i) {
    if (a.program.buffers[size_t(i)].role == pl::BufRole::GlobalK) k = i;
    if (a.program.buffers[size_t(i)].role == pl::BufRole::GlobalV) v = i;
  }
  ASSERT_GE(k, 0);
  ASSERT_GE(v, 0);
  pl::Placement bad = a.placement;
  bad.offset[size_t(v)] = bad.offset[size_t(k)];
  EXPECT_THROW(pl::check_placement(a.program, bad), std::logic_error);
  bad = a.placement;
  bad.arena_bytes = bad.offset[size_t(k)];
  EXPECT_THROW(pl::check_placement(a.program, bad), std::logic_error);
}

}  // namespace

// What the caching allocator may count for a request: small ones rounded to 512 bytes; a
// large one (over 1 MiB) up to 1 MiB more (a cached block handed out whole, or a new segment's
// rounding), for each separate large allocation; nothing added on the CPU.
TEST(DeviceCapsHeld, RoundsSmallRequestsAndAllowsTheReuseSlackOfLargeOnes) {
  sp::contracts::DeviceCaps cuda;
  cuda.kind = sp::contracts::DeviceKind::CUDA;
  cuda.alloc_round = 512;
  cuda.reuse_slack = int64_t{1} << 20;
  const int64_t MiB = int64_t{1} << 20;
  EXPECT_EQ(cuda.held(0), 0);
  EXPECT_EQ(cuda.held(1000), 1024);
  EXPECT_EQ(cuda.held(MiB - 1), MiB);
  EXPECT_EQ(cuda.held(3 * MiB + 1), 3 * MiB + 512 + MiB);
  EXPECT_EQ(cuda.held(30 * MiB), 31 * MiB);  // covers the 2 MiB segment rounding (here none)
  EXPECT_GE(cuda.held(11 * MiB - 4096), cuda.round_alloc(11 * MiB - 4096));
  // Four allocations of 5 MiB in all: at most four large ones, each rounded on its own.
  EXPECT_EQ(cuda.held(5 * MiB, 4), 5 * MiB + 3 * 511 + 4 * MiB);
  // Three allocations of 2 MiB in all: at most two of them are large.
  EXPECT_EQ(cuda.held(2 * MiB, 3), 2 * MiB + 2 * 511 + 2 * MiB);
  sp::contracts::DeviceCaps host;
  EXPECT_EQ(host.held(3 * MiB + 1, 4), 3 * MiB + 1);
}
