// Executor pieces: input validation, weight acquisition, consumers, patches, workspaces.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include "example_patches.hpp"
#include "exec/consumers/consumer.hpp"
#include "exec/device/device.hpp"
#include "exec/registry.hpp"
#include "exec/device/memory.hpp"
#include "exec/patches/patch.hpp"
#include "models/builder.hpp"
#include "test_util.hpp"

namespace {

using namespace sp;

using test::error_of;

struct Small {
  contracts::Registry reg = test::example_registry();
  contracts::DeviceCaps dev = exec::describe_device(at::Device(at::kCPU));
  models::Instance inst;
  Small() {
    auto c = models::demo_config();
    c.layers = 1;
    models::set_total_tokens(c, 300);
    inst = models::instantiate(c, reg, at::kCPU);
  }
};

TEST(Inputs, WrongInputShapeNamesTheInputAndShapes) {
  Small s;
  s.inst.inputs.tokens["video"] = at::randn({171, 64});
  const auto p = plan::make_plan(s.inst.model, s.reg, s.dev, {});
  const std::string e = error_of([&] { exec::run_planned(s.inst.model, p, *s.inst.weights, s.inst.inputs, s.reg, s.dev); });
  EXPECT_NE(e.find("input tokens of segment 'video'"), std::string::npos) << e;
  EXPECT_NE(e.find("[172, 64]"), std::string::npos) << e;
  EXPECT_NE(e.find("[171, 64]"), std::string::npos) << e;
}

TEST(Inputs, MissingOrMisshapenTablesAreNamed) {
  Small s;
  auto in = s.inst.inputs;
  in.tables.erase("rope.sin");
  EXPECT_NE(error_of([&] { exec::run_naive(s.inst.model, *s.inst.weights, in, s.reg); }).find("'rope.sin' is missing"),
            std::string::npos);
  in = s.inst.inputs;
  in.tables["blocks.0.mod"] = at::zeros({2, 5, 384});
  const std::string e = error_of([&] { exec::run_naive(s.inst.model, *s.inst.weights, in, s.reg); });
  EXPECT_NE(e.find("blocks.0.mod"), std::string::npos) << e;
  EXPECT_NE(e.find("[2, 6, 384]"), std::string::npos) << e;
}

TEST(Inputs, DtypeMismatchIsNamed) {
  Small s;
  s.inst.inputs.tokens["text"] = s.inst.inputs.tokens["text"].to(at::kDouble);
  const std::string e = error_of([&] { exec::run_naive(s.inst.model, *s.inst.weights, s.inst.inputs, s.reg); });
  EXPECT_NE(e.find("does not match the model dtype fp32"), std::string::npos) << e;
}

// The code of the PlanMismatch a planned run of `p` throws ("" when it runs).
std::string mismatch_of(const Small& s, const plan::Plan& p, const ir::Model& m, const contracts::Registry& reg,
                        const contracts::DeviceCaps& dev) {
  try {
    exec::run_planned(m, p, *s.inst.weights, s.inst.inputs, reg, dev);
  } catch (const plan::PlanMismatch& e) {
    return plan::code_name(e.check) + std::string(" ") + e.what();
  }
  return "";
}

TEST(Inputs, PlanOfAnotherModelRegistryOrDeviceIsRefused) {
  Small s;
  auto other = models::demo_config();
  other.layers = 3;
  const auto p = plan::make_plan(models::build_ir(other), s.reg, s.dev, {});
  const auto own = plan::make_plan(s.inst.model, s.reg, s.dev, {});
  EXPECT_TRUE(mismatch_of(s, p, s.inst.model, s.reg, s.dev).starts_with("plan.model"));
  ir::Model scaled = s.inst.model;
  scaled.blocks[0].sublayers[1].norm.eps *= 2;
  EXPECT_TRUE(mismatch_of(s, own, scaled, s.reg, s.dev).starts_with("plan.model")) << "a field of a block";
  EXPECT_TRUE(mismatch_of(s, own, s.inst.model, exec::builtin_registry(), s.dev).starts_with("plan.registry_entry"));
  contracts::DeviceCaps fewer = s.dev;
  fewer.threads += 1;
  EXPECT_TRUE(mismatch_of(s, own, s.inst.model, s.reg, fewer).starts_with("plan.device"));
  contracts::DeviceCaps emptier = s.dev;
  emptier.memory_free /= 2;
  EXPECT_EQ(mismatch_of(s, own, s.inst.model, s.reg, emptier), "") << "free memory is no part of the match";
}

// A plan of one rank's rows of a sequence-parallel run needs its process group: without one
// it is refused by its code, naming the split.
TEST(Inputs, SplitPlanWithoutItsProcessGroupIsRefused) {
  Small s;
  const auto p = plan::make_plan(s.inst.model, s.reg, s.dev, {.sequence = {1, 2, plan::SeqMode::Ulysses}});
  const std::string e = mismatch_of(s, p, s.inst.model, s.reg, s.dev);
  EXPECT_TRUE(e.starts_with("plan.sequence")) << e;
  EXPECT_NE(e.find("ulysses over 2 ranks, rank 1"), std::string::npos) << e;
}

// The plan holds its compiled parts: a forward compiles nothing, and planning compiles each
// candidate once per form of block, so three more blocks of the same form add only their
// chosen programs.
TEST(Planned, AForwardCompilesNothingAndBlocksOfOneFormShareCandidates) {
  Small s;
  const auto p = plan::make_plan(s.inst.model, s.reg, s.dev, {});
  const int64_t before = plan::programs_compiled();
  exec::run_planned(s.inst.model, p, *s.inst.weights, s.inst.inputs, s.reg, s.dev);
  EXPECT_EQ(plan::programs_compiled(), before);
  auto compiled_by_plan = [&](int layers) {
    auto c = models::demo_config();
    c.layers = layers;
    models::set_total_tokens(c, 300);
    const ir::Model m = models::build_ir(c);
    const int64_t at = plan::programs_compiled();
    plan::make_plan(m, s.reg, s.dev, {});
    return plan::programs_compiled() - at;
  };
  EXPECT_EQ(compiled_by_plan(4) - compiled_by_plan(1), 3 * int64_t(s.inst.model.blocks[0].sublayers.size()));
}

TEST(Weights, Int8SliceEqualsSliceOfDequantizedWhole) {
  const auto reg = test::example_registry();
  exec::TensorWeights w(&reg);
  at::Tensor q = at::randint(-127, 128, {40, 600}, at::kChar), sc = at::rand({40}) + 0.1;
  w.add("l.weight", q);
  w.add("l.weight.scale", sc);
  ir::Linear l;
  l.weight = "l.weight";
  l.in_features = 600;
  l.out_features = 40;
  l.format = "int8-rowwise";
  const at::Tensor whole = w.acquire(l, {}, {}, at::kFloat);
  EXPECT_TRUE(at::allclose(whole, q.to(at::kFloat) * sc.unsqueeze(1)));
  const at::Tensor part = w.acquire(l, {3, 10, 2}, {256, 300}, at::kFloat);
  EXPECT_TRUE(at::equal(part, whole.slice(0, 3, 22, 2).slice(1, 256, 556)));
}

TEST(Weights, DenseWeightOfWrongDtypeOrShapeIsRefused) {
  const auto reg = test::example_registry();
  exec::TensorWeights w(&reg);
  w.add("l.weight", at::randn({4, 6}));
  ir::Linear l;
  l.weight = "l.weight";
  l.in_features = 6;
  l.out_features = 4;
  EXPECT_NE(error_of([&] { w.acquire(l, {}, {}, at::kBFloat16); }).find("compute dtype is BFloat16"), std::string::npos);
  l.in_features = 7;
  EXPECT_NE(error_of([&] { w.acquire(l, {}, {}, at::kFloat); }).find("does not match the IR's [4, 7]"), std::string::npos);
  EXPECT_NE(error_of([&] { w.tensor("nope"); }).find("'nope'"), std::string::npos);
}

TEST(Consumers, MathAndSdpaAgreeOnBoundedQAgainstGlobalKv) {
  at::Tensor q = at::randn({1, 3, 37, 16}), k = at::randn({1, 3, 101, 16}), v = at::randn({1, 3, 101, 16});
  const auto reg = test::example_registry();
  const at::Tensor a = exec::impl_of<exec::ConsumerImpl>(reg.consumer("sdpa")).attend(q, k, v, 0.25);
  const at::Tensor b = exec::impl_of<exec::ConsumerImpl>(reg.consumer("math")).attend(q, k, v, 0.25);
  EXPECT_LT(test::rel_l2(a, b), 1e-5);
  EXPECT_NE(error_of([&] { reg.consumer("flash9"); }).find("known: "), std::string::npos);
  contracts::ConsumerCaps bare = reg.consumer("sdpa");
  bare.name = "bare";
  bare.impl = nullptr;
  EXPECT_NE(error_of([&] { exec::impl_of<exec::ConsumerImpl>(bare); }).find("'bare' has capabilities but no implementation"),
            std::string::npos);
}

// What each call of a consumer allocates, against what its contract declares.
void expect_declared_call_bytes(at::ScalarType dt) {
  const auto reg = test::example_registry();
  exec::install_cpu_meter();
  for (const std::string name : {"sdpa", "math"}) {
    {
      for (int64_t rows : {5, 37, 200, 800}) {
        at::Tensor q = at::randn({1, 2, rows, 32}).to(dt), k = at::randn({1, 2, 611, 32}).to(dt), v = k.clone();
        exec::PeakMeter m(at::Device(at::kCPU));
        exec::impl_of<exec::ConsumerImpl>(reg.consumer(name)).attend(q, k, v, 0.2);
        contracts::AttnShape s{rows, 611, 2, 2, 32, dt == at::kFloat ? ir::DType::F32 : ir::DType::BF16,
                               contracts::DeviceKind::CPU, at::get_num_threads()};
        const int64_t declared = reg.consumer(name).call_bytes(s), measured = m.peak_above_start();
        if (name == "sdpa" && dt != at::kFloat) {
          // The reduced-dtype CPU kernel's packing tiles depend on the processor: the contract
          // declares an upper bound of 64 KiB a thread for them.
          EXPECT_LE(measured, declared) << name << " " << dt << " rows " << rows;
          EXPECT_GE(measured + s.threads * (64 << 10), declared) << name << " " << dt << " rows " << rows;
        } else {
          EXPECT_EQ(measured, declared) << name << " " << dt << " rows " << rows;
        }
      }
    }
  }
}

TEST(Consumers, DeclaredCallBytesMatchWhatTheCallAllocates) { expect_declared_call_bytes(at::kFloat); }

TEST(Consumers, DeclaredCallBytesMatchWhatTheCallAllocatesInBf16) {
  if (test::cpu_gemm_allocates(at::kBFloat16))
    GTEST_SKIP() << "this CPU's bf16 GEMMs allocate packing scratch that no contract declares";
  expect_declared_call_bytes(at::kBFloat16);
}

TEST(Patches, ImplementationsDoWhatTheyDeclare) {
  const auto reg = test::example_registry();
  auto apply = [&](const char* name, at::Tensor t) {
    exec::impl_of<exec::PatchImpl>(reg.patch(name)).apply(t);
    return t;
  };
  const at::Tensor t = at::randn({8, 32});
  EXPECT_TRUE(at::allclose(apply("q-temperature", t.clone()), t * 1.25));
  EXPECT_LE(apply("mlp-hidden-clamp", t.clone()).abs().max().item<float>(), 0.5f);
  EXPECT_NEAR(apply("attn-out-renorm", t.clone()).pow(2).mean().sqrt().item<double>(), 1.0, 1e-4);
  EXPECT_TRUE(at::allclose(apply("mlp-hidden-rownorm", t.clone()).pow(2).mean(-1).sqrt(), at::ones({8}), 1e-4, 1e-4));
  // Each declares what it allocates: measured on the CPU, exactly.
  exec::install_cpu_meter();
  for (const char* name : {"q-temperature", "mlp-hidden-clamp", "attn-out-renorm", "mlp-hidden-rownorm"}) {
    at::Tensor x = t.clone();
    exec::PeakMeter m(at::Device(at::kCPU));
    exec::impl_of<exec::PatchImpl>(reg.patch(name)).apply(x);
    const auto& caps = reg.patch(name);
    const int64_t declared = caps.scratch_bytes ? caps.scratch_bytes(8, 32, ir::DType::F32, contracts::DeviceKind::CPU) : 0;
    EXPECT_EQ(m.peak_above_start(), declared) << name;
  }
  contracts::PatchCaps bogus = reg.patch("q-temperature");
  bogus.name = "x";
  bogus.impl = nullptr;
  at::Tensor x = t.clone();
  EXPECT_NE(error_of([&] { exec::impl_of<exec::PatchImpl>(bogus).apply(x); }).find("'x' has capabilities but no implementation"),
            std::string::npos);
}

}  // namespace
