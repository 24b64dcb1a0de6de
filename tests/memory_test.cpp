// Memory accounting: the plan's estimate against the measured activation peak, the demo's
// acceptance figures, and that runs leave their inputs untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "example_patches.hpp"
#include "exec/device/device.hpp"
#include "exec/registry.hpp"
#include "exec/device/memory.hpp"
#include "models/builder.hpp"
#include "report/report.hpp"
#include "test_util.hpp"

namespace {

using namespace sp;

struct Variant {
  std::string label;
  models::ModelConfig cfg;
  plan::Options opt;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  auto base = models::demo_config();
  base.layers = 1;
  models::set_total_tokens(base, 1501);
  for (int64_t chunk : {97, 256, 1000, 1501}) v.push_back({"demo chunk " + std::to_string(chunk), base, {chunk, 0}});
  auto gqa = base;
  gqa.heads = 8;
  gqa.kv_heads = 2;
  gqa.head_dim = 48;
  gqa.rotary_dim = 32;
  gqa.fused_qkv = false;
  gqa.qkv_bias = gqa.out_bias = true;
  v.push_back({"gqa separate qkv", gqa, {333, 0}});
  auto i8 = base;
  i8.format = "int8-rowwise";
  v.push_back({"int8 weights", i8, {300, 256}});
  auto whole = base;
  whole.consumer = "whole";
  v.push_back({"whole consumer", whole, {300, 0}});
  auto math = base;
  math.consumer = "math";
  v.push_back({"math consumer", math, {128, 0}});
  auto renorm = base;
  renorm.attn_patches = {"attn-out-renorm"};
  renorm.layout = ir::GateUpLayout::Interleaved;
  v.push_back({"renorm patch, interleaved", renorm, {300, 300}});
  auto bf = base;
  bf.dtype = ir::DType::BF16;
  bf.mod_scope = ir::ModScope::PerToken;
  bf.norm = ir::NormKind::LayerNorm;
  bf.norm_affine = true;
  v.push_back({"bf16 per-token layernorm", bf, {200, 0}});
  return v;
}

// The estimate is the arena the executor allocates plus the transients its steps declare:
// on the CPU it equals the measured peak to the byte.
void expect_exact(const Variant& v) {
  const auto reg = test::example_registry();
  const auto dev = exec::describe_device(at::Device(at::kCPU));
  const auto inst = models::instantiate(v.cfg, reg, at::kCPU);
  const auto p = plan::make_plan(inst.model, reg, dev, v.opt);
  const auto r = report::compare(inst, p, reg, dev, {false, false});
  std::cout << v.label << ": measured " << r.planned.peak_bytes << " estimated " << r.estimated_peak_bytes << "\n";
  EXPECT_EQ(r.estimated_peak_bytes, r.planned.peak_bytes);
  EXPECT_GE(r.planned.peak_bytes, p.floor_bytes);
}

TEST(Memory, EstimateEqualsMeasuredPeak) {
  for (const auto& v : variants()) {
    SCOPED_TRACE(v.label);
    if (v.cfg.dtype == ir::DType::F32) expect_exact(v);
  }
}

TEST(Memory, EstimateEqualsMeasuredPeakInReducedPrecision) {
  if (test::cpu_gemm_allocates(at::kBFloat16))
    GTEST_SKIP() << "this CPU's bf16 GEMMs allocate packing scratch that no contract declares";
  for (const auto& v : variants()) {
    SCOPED_TRACE(v.label);
    if (v.cfg.dtype != ir::DType::F32) expect_exact(v);
  }
}

// The demo's figures: the default plan (as fast as the fastest by the estimate, lean within
// that) needs at most 60% of the naive peak; the leanest plan a third.
TEST(Memory, DemoMeetsItsTargets) {
  const auto reg = test::example_registry();
  const auto dev = exec::describe_device(at::Device(at::kCPU));
  const auto inst = models::instantiate(models::demo_config(), reg, at::kCPU);
  const auto p = plan::make_plan(inst.model, reg, dev, {});
  const auto r = report::compare(inst, p, reg, dev, {true, false});
  ASSERT_TRUE(r.naive.has_value());
  EXPECT_LE(10 * r.planned.peak_bytes, 6 * r.naive->peak_bytes);
  EXPECT_LE(*r.rel_l2, 1e-5);
  EXPECT_EQ(r.estimated_peak_bytes, r.planned.peak_bytes);
  int64_t least = 0;
  try {
    plan::make_plan(inst.model, reg, dev, {.budget_bytes = 1});
  } catch (const plan::BudgetError& e) {
    least = e.smallest_peak_bytes;
  }
  const auto lean = plan::make_plan(inst.model, reg, dev, {.budget_bytes = least});
  const auto rl = report::compare(inst, lean, reg, dev, {false, false});
  EXPECT_LE(3 * rl.planned.peak_bytes, r.naive->peak_bytes);
  EXPECT_EQ(rl.estimated_peak_bytes, rl.planned.peak_bytes);
}

TEST(Memory, RunsLeaveInputsAndWeightsUntouched) {
  const auto reg = test::example_registry();
  const auto dev = exec::describe_device(at::Device(at::kCPU));
  auto cfg = models::demo_config();
  models::set_total_tokens(cfg, 700);
  cfg.embed = false;
  cfg.in_features = cfg.dim;
  const auto inst = models::instantiate(cfg, reg, at::kCPU);
  std::map<std::string, at::Tensor> x0;
  for (const auto& [k, v] : inst.inputs.tokens) x0[k] = v.clone();
  std::map<std::string, at::Tensor> w0;
  for (const auto& [k, v] : inst.weights->all()) w0[k] = v.clone();
  const auto p = plan::make_plan(inst.model, reg, dev, {64, 0});
  exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, dev);
  exec::run_naive(inst.model, *inst.weights, inst.inputs, reg);
  for (const auto& [k, v] : inst.inputs.tokens) EXPECT_TRUE(at::equal(v, x0[k])) << k;
  for (const auto& [k, v] : inst.weights->all()) EXPECT_TRUE(at::equal(v, w0[k])) << k;
}

TEST(Memory, PeakMeterCountsOnlyWhatWasAllocatedAfterItStarted) {
  exec::install_cpu_meter();
  at::Tensor before = at::empty({1 << 20}, at::kFloat);
  exec::PeakMeter m(at::Device(at::kCPU));
  {
    at::Tensor a = at::empty({1000}, at::kFloat);
    at::Tensor b = at::empty({500}, at::kDouble);
  }
  at::Tensor c = at::empty({10}, at::kFloat);
  EXPECT_EQ(m.peak_above_start(), 4000 + 4000);
}

// cpu_peak_of measures a call's own peak and leaves a meter around it with its larger peak.
TEST(Memory, PeakOfACallLeavesAnOuterMeterItsPeak) {
  exec::PeakMeter outer(at::Device(at::kCPU));
  { at::Tensor big = at::empty({1 << 20}, at::kFloat); }
  const int64_t inner = exec::cpu_peak_of([] {
    at::Tensor a = at::empty({1000}, at::kFloat);
    at::Tensor b = at::empty({10}, at::kFloat);
  });
  EXPECT_EQ(inner, 4000 + 40);
  EXPECT_EQ(outer.peak_above_start(), int64_t{4} << 20);
  // A call that allocates more than the outer peak raises it.
  const int64_t larger = exec::cpu_peak_of([] { at::Tensor t = at::empty({2 << 20}, at::kFloat); });
  EXPECT_EQ(larger, int64_t{8} << 20);
  EXPECT_EQ(outer.peak_above_start(), int64_t{8} << 20);
}

}  // namespace

// Progress of a schedule: a line about every 2 s naming the sublayer being computed, also while
// no sublayer finishes (a sublayer that takes minutes), and none once the run is over.
TEST(Progress, ReportsTheRunningSublayerWhileItRuns) {
  const ir::Model m = models::build_ir(models::demo_config());  // 2 blocks of 2 sublayers
  report::Progress progress("test", true);
  testing::internal::CaptureStderr();
  {
    const exec::Progress step = progress.sublayers(m, "planned schedule");
    step(2, 4);  // two sublayers done, the third one running for a while
    std::this_thread::sleep_for(std::chrono::milliseconds(4500));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(2200));  // the run is over: silent
  const std::string err = testing::internal::GetCapturedStderr();
  size_t lines = 0;
  for (size_t at = err.find("[test] planned schedule: sublayer 3/4 (block 2/2), "); at != std::string::npos;
       at = err.find("[test] planned schedule: sublayer 3/4 (block 2/2), ", at + 1))
    ++lines;
  EXPECT_EQ(lines, 2u) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 2) << err;
}
