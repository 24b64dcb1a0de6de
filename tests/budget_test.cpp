// Memory budgets, measured on the CPU: for several models, a sweep of budgets from the
// smallest achievable peak to the naive schedule's peak. For every budget the planned run's
// measured activation peak stays within the budget and within 5% of the estimate, and the
// output matches the naive schedule (within 1e-5 relative L2; where features are sliced or
// the dtype is reduced, within twice the naive error against a float64 reference). Budgets
// below the smallest peak throw BudgetError naming it; a generous budget takes the fastest
// plan by the estimate. Also: parse_budget, budget_auto, and the device probe and its cache.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sys/stat.h>
#include <unistd.h>

#include "exec/device/device.hpp"
#include "exec/registry.hpp"
#include "exec/device/probe.hpp"
#include "models/builder.hpp"
#include "plan/budget.hpp"
#include "report/report.hpp"
#include "test_util.hpp"

namespace {

using namespace sp;
using legality::Transform;

struct SweepModel {
  std::string label;
  models::ModelConfig cfg;
};

std::vector<SweepModel> sweep_models() {
  auto demo = models::demo_config();
  demo.layers = 1;
  models::set_total_tokens(demo, 2000);
  auto gqa = demo;
  gqa.heads = 8;
  gqa.kv_heads = 2;
  gqa.head_dim = 48;
  gqa.rotary_dim = 32;
  gqa.fused_qkv = false;
  gqa.qkv_bias = gqa.out_bias = gqa.mlp_bias = true;
  models::set_total_tokens(gqa, 1500);
  auto bf16 = demo;
  bf16.dtype = ir::DType::BF16;
  models::set_total_tokens(bf16, 1500);
  auto cross = demo;  // cross-attention on a context, parallel MLP in the attention (no MLP sublayer)
  cross.context_tokens = 300;
  cross.context_dim = 256;
  cross.parallel_hidden = 1024;
  models::set_total_tokens(cross, 1600);
  return {{"demo 2000 tokens fp32", demo},
          {"gqa 8/2 heads, separate qkv with biases", gqa},
          {"demo bf16", bf16},
          {"cross-attention context + parallel MLP", cross}};
}

bool any_feature_sliced(const plan::Plan& p) {
  for (const auto& b : p.blocks)
    for (const auto& s : b.sublayers)
      if (s.chosen(Transform::FeatureSlicedMlp)) return true;
  return false;
}

// What the executor runs: the chunks and the streamed output of every sublayer.
std::string schedule_key(const plan::Plan& p) {
  std::string k;
  for (const auto& b : p.blocks)
    for (const auto& s : b.sublayers)
      k += std::to_string(s.token_chunk) + "/" + std::to_string(s.q_chunk) + "/" + std::to_string(s.feature_slice) +
           (s.chosen(Transform::StreamedOutProj) ? "s" : "") + ";";
  return k + std::to_string(p.final_layer.chunk);
}

std::string summary(const plan::Plan& p) {
  std::string out;
  for (const auto& s : p.blocks[0].sublayers)
    out += s.name + " " + s.strategy + " " + std::to_string(s.token_chunk) + "/" +
           std::to_string(s.attention ? s.q_chunk : s.feature_slice) + ", ";
  return out + "final " + std::to_string(p.final_layer.chunk);
}

int64_t smallest_budget(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev) {
  try {
    plan::make_plan(m, reg, dev, {.budget_bytes = 1});
  } catch (const plan::BudgetError& e) {
    return e.smallest_peak_bytes;
  }
  ADD_FAILURE() << "a budget of one byte was accepted";
  return 0;
}

TEST(MeasuredBudget, CpuSweepFitsMeasuredPeakAndMatchesNaive) {
  const auto reg = exec::builtin_registry();
  const auto dev = exec::describe_device(at::Device(at::kCPU));
  for (const auto& sm : sweep_models()) {
    SCOPED_TRACE(sm.label);
    const bool exact_memory = !test::cpu_gemm_allocates(exec::to_aten(sm.cfg.dtype));
    if (!exact_memory)
      std::cout << sm.label << ": this CPU's GEMMs allocate scratch the contracts do not model; memory unchecked\n";
    const auto inst = models::instantiate(sm.cfg, reg, at::kCPU);
    const auto ref_inst = models::upcast_f64(inst, reg);
    const at::Tensor ref = exec::run_naive(ref_inst.model, *ref_inst.weights, ref_inst.inputs, reg);
    const auto base = report::compare(inst, plan::make_plan(inst.model, reg, dev, {}), reg, dev, {true, false, true});
    const at::Tensor naive = base.naive_out;
    const double naive_err = test::rel_l2(naive, ref);
    const int64_t lo = smallest_budget(inst.model, reg, dev), hi = base.naive->peak_bytes;
    ASSERT_GT(lo, 0);
    ASSERT_LT(lo, hi);
    std::cout << sm.label << ": smallest " << plan::human_bytes(lo) << ", naive " << plan::human_bytes(hi)
              << ", floor " << plan::human_bytes(base.floor_bytes) << "\n";

    // Below the smallest peak: an error that states it.
    for (int64_t b : {lo - 1, lo / 2}) {
      try {
        plan::make_plan(inst.model, reg, dev, {.budget_bytes = b});
        ADD_FAILURE() << "budget " << b << " below " << lo << " accepted";
      } catch (const plan::BudgetError& e) {
        EXPECT_EQ(e.smallest_peak_bytes, lo);
        EXPECT_NE(std::string(e.what()).find(plan::distinct_bytes(b, lo).second), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(std::to_string(lo) + " bytes"), std::string::npos) << e.what();
      }
    }

    // 24 budgets from the smallest peak to the naive peak; each distinct schedule measured once.
    struct Run {
      int64_t measured;
      double ms;
      at::Tensor out;
    };
    std::map<std::string, Run> runs;
    constexpr int kBudgets = 24;
    for (int i = 0; i < kBudgets; ++i) {
      const int64_t budget = lo + (hi - lo) * i / (kBudgets - 1);
      SCOPED_TRACE("budget " + std::to_string(budget));
      const plan::Plan p = plan::make_plan(inst.model, reg, dev, {.budget_bytes = budget});
      EXPECT_LE(p.estimated_peak_bytes, budget);
      const std::string key = schedule_key(p);
      if (!runs.count(key)) {
        const auto r = report::compare(inst, p, reg, dev, {false, false, true});
        runs[key] = {r.planned.peak_bytes, r.planned.ms, r.planned_out};
      }
      const Run& run = runs[key];
      if (exact_memory) {
        EXPECT_LE(run.measured, budget);
        EXPECT_LE(std::abs(double(run.measured - p.estimated_peak_bytes)), 0.05 * double(run.measured))
            << "estimated " << p.estimated_peak_bytes << " measured " << run.measured;
      }
      if (any_feature_sliced(p) || sm.cfg.dtype != ir::DType::F32) {
        EXPECT_LE(test::rel_l2(run.out, ref), 2.0 * naive_err) << "naive error " << naive_err;
      } else {
        EXPECT_LE(test::rel_l2(run.out, naive), 1e-5);
      }
      if (i % 4 == 0 || i == kBudgets - 1)
        std::printf("  budget %9.2f MiB  measured %9.2f MiB  estimate %9.2f MiB  est %8.1f ms  ran %8.1f ms  %s\n",
                    budget / 1048576.0, run.measured / 1048576.0, p.estimated_peak_bytes / 1048576.0,
                    p.estimated_ms, run.ms, summary(p).c_str());
    }
    EXPECT_GE(runs.size(), 3u) << "the sweep should visit several schedules";
  }
}

// Under a generous budget the plan is the fastest by the estimate: no plan with explicit
// chunk sizes and feature slices is estimated faster, and every recorded alternative is slower.
TEST(MeasuredBudget, GenerousBudgetIsTheFastestEstimate) {
  const auto reg = exec::builtin_registry();
  const auto dev = exec::describe_device(at::Device(at::kCPU));
  for (const auto& sm : sweep_models()) {
    SCOPED_TRACE(sm.label);
    const ir::Model m = models::build_ir(sm.cfg);
    const plan::Plan p = plan::make_plan(m, reg, dev, {.budget_bytes = int64_t{1} << 40});
    for (const auto& s : p.blocks[0].sublayers)
      for (const auto& a : s.alternatives) EXPECT_GE(a.estimated_ms, s.estimated_ms) << s.name << ": " << a.lost;
    std::vector<int64_t> chunks = plan::chunk_candidates(m.tokens(), 1);
    chunks.push_back(m.tokens());
    for (int64_t c : chunks)
      for (int64_t f : {int64_t{-1}, int64_t{256}, int64_t{512}}) {
        const plan::Plan q = plan::make_plan(m, reg, dev, {.token_chunk = c, .feature_slice = f});
        EXPECT_GE(q.estimated_ms, p.estimated_ms * (1 - 1e-9)) << "chunk " << c << ", slice " << f;
      }
  }
}

TEST(MeasuredBudget, ParseBudget) {
  constexpr int64_t KiB = 1024, MiB = KiB << 10, GiB = MiB << 10;
  const std::vector<std::pair<std::string, int64_t>> ok = {
      {"123456", 123456},     {"512MiB", 512 * MiB},  {"2.5GiB", 5 * GiB / 2}, {"300MB", 300000000},
      {"1.5GB", 1500000000},  {"64KiB", 64 * KiB},    {"64KB", 64000},         {"1TiB", GiB << 10},
      {" 512 MiB ", 512 * MiB}, {"512mib", 512 * MiB}, {"100B", 100},           {"0.5KiB", 512},
      {"2.0GiB", 2 * GiB},    {".5MiB", MiB / 2}};
  for (const auto& [text, bytes] : ok) EXPECT_EQ(plan::parse_budget(text), bytes) << text;
  for (const std::string bad : {"", "abc", "12 parsecs", "512M", "-5GiB", "1.5", "0", "0MiB", "1e9", "5GiB extra",
                                "99999999999999999999", "9999999TiB", "GiB", "1..5GiB"}) {
    try {
      plan::parse_budget(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const plan::PlanError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(MeasuredBudget, AutoLeavesTheStatedMarginOfThisDevice) {
  const auto dev = exec::describe_device(at::Device(at::kCPU));
  ASSERT_GT(dev.memory_free, 0);
  const int64_t b = plan::budget_auto(dev);
  EXPECT_EQ(b, dev.memory_free - dev.memory_free / 10);
  EXPECT_EQ(plan::budget_from_option("auto", dev), b);
}

// The probe measures in well under a second, writes its cache, and the next call reads it.
TEST(MeasuredBudget, ProbeMeasuresAndCachesPerDevice) {
  char tmpl[] = "/tmp/streamplan-probe-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const test::ScopedEnv cache_home("XDG_CACHE_HOME", dir);
  const at::Device d(at::kCPU);
  auto caps = exec::describe_device(d);
  const std::string path = exec::probe_cache_path(caps);
  EXPECT_EQ(path.rfind(dir + "/streamplan/probe-cpu-", 0), 0u) << path;
  EXPECT_EQ(path.find(' '), std::string::npos) << path;

  const exec::ProbeResult a = exec::probe_device(d, caps);
  std::cout << "probe " << a.key << ": " << a.rates.flops_per_s_f32 / 1e9 << " GFLOP/s fp32, " << a.rates.flops_per_s / 1e9
            << " GFLOP/s 16-bit, " << a.rates.bytes_per_s / 1e9 << " GB/s, " << a.rates.launch_s * 1e6 << " us/op, k "
            << a.rates.gemm_half_rows << " rows; " << a.probe_ms << " ms\n";
  EXPECT_FALSE(a.from_cache);
  EXPECT_EQ(a.cache_path, path);
  for (double v : {a.rates.flops_per_s, a.rates.flops_per_s_f32, a.rates.bytes_per_s, a.rates.launch_s}) EXPECT_GT(v, 0);
  EXPECT_DOUBLE_EQ(a.rates.launch_gap_s, a.rates.launch_s);  // a CPU's operations run as they are dispatched
  EXPECT_GE(a.rates.gemm_half_rows, 0);

  // Cached only where trusted: sane figures, and no other process busy on a quarter of a core
  // or more while it measured (a parallel test run may be); then the next call reads it back.
  EXPECT_EQ(a.cached, a.untrusted.empty()) << a.untrusted;
  EXPECT_GE(a.attempts, 1);
  EXPECT_TRUE(exec::sanity_problems(a, false).empty() || !a.cached);
  if (!a.cached) {  // written as a trusted probe writes it
    ::mkdir((dir + "/streamplan").c_str(), 0755);
    std::ofstream(path) << exec::probe_json(a).dump() << "\n";
  }
  const exec::ProbeResult b = exec::probe_device(d, caps);
  EXPECT_TRUE(b.from_cache);
  EXPECT_DOUBLE_EQ(b.rates.flops_per_s_f32, a.rates.flops_per_s_f32);
  EXPECT_DOUBLE_EQ(b.rates.launch_s, a.rates.launch_s);
  EXPECT_DOUBLE_EQ(b.rates.launch_gap_s, a.rates.launch_gap_s);
  caps.rates = b.rates;
  EXPECT_DOUBLE_EQ(caps.rates.bytes_per_s, a.rates.bytes_per_s);
  EXPECT_DOUBLE_EQ(plan::rates_of(caps).gemm_half_rows, a.rates.gemm_half_rows);
  EXPECT_GT(a.rates.gemm_probe_cols, 0);
  EXPECT_DOUBLE_EQ(b.rates.gemm_probe_cols, a.rates.gemm_probe_cols);
  EXPECT_DOUBLE_EQ(plan::rates_of(caps).gemm_probe_cols, a.rates.gemm_probe_cols);
  EXPECT_EQ(a.rates.attention_call_tiles, 0);  // measured on a GPU's waves only
  EXPECT_DOUBLE_EQ(b.rates.attention_call_tiles, a.rates.attention_call_tiles);
  EXPECT_EQ(a.rates.attention_unit_tiles, 1);  // a CPU runs no tiles of waves
  EXPECT_EQ(a.rates.attention_lone_wave, 1);

  // A damaged cache is measured again.
  std::ofstream(path) << "{\"version\": 1, \"key\": ";
  EXPECT_FALSE(exec::probe_device(d, caps).from_cache);

  // The key names the torch version; --show reads without measuring; --reset removes.
  EXPECT_NE(exec::probe_key(caps).find("torch"), std::string::npos) << exec::probe_key(caps);
  std::ofstream(path) << exec::probe_json(a).dump() << "\n";
  ASSERT_TRUE(exec::cached_probe(caps).has_value());
  EXPECT_DOUBLE_EQ(exec::cached_probe(caps)->rates.flops_per_s, a.rates.flops_per_s);
  // A run within 2x of its estimate keeps the cache; one off by more drops it.
  EXPECT_EQ(exec::forget_if_off(caps, 150.0, 100.0), "");
  EXPECT_EQ(exec::forget_if_off(caps, 60.0, 100.0), "");
  EXPECT_TRUE(exec::cached_probe(caps).has_value());
  const std::string note = exec::forget_if_off(caps, 2000.0, 831.0);
  EXPECT_NE(note.find("dropped"), std::string::npos) << note;
  EXPECT_FALSE(exec::cached_probe(caps).has_value());
  EXPECT_FALSE(exec::forget_probe(caps));

  std::remove(path.c_str());
  ::rmdir((dir + "/streamplan").c_str());
  ::rmdir(dir.c_str());
}

// The sanity bounds reject the figures of the noisy probes seen on the CPU machine (SDPA at
// 7% of the matmul peak), and accept this machine's own.
TEST(MeasuredBudget, ProbeSanityBounds) {
  exec::ProbeResult r;
  r.rates.flops_per_s = 3.4e9;
  r.rates.flops_per_s_f32 = 2.0e11;
  r.rates.bytes_per_s = 2.7e10;
  r.rates.host_bytes_per_s = 1.5e10;
  r.rates.launch_s = r.rates.launch_gap_s = 1.8e-6;
  r.rates.attention_ratio = 0.72;
  r.rates.attention_ratio_ragged = 0.74;
  r.rates.attention_unit_tiles = r.rates.attention_lone_wave = 1;
  EXPECT_TRUE(exec::sanity_problems(r, false).empty());
  r.rates.attention_unit_tiles = 0;  // never measured
  EXPECT_FALSE(exec::sanity_problems(r, false).empty());
  r.rates.attention_unit_tiles = 2;
  r.rates.attention_lone_wave = 1.3;  // a wave of one tile per unit longer than a full one
  EXPECT_FALSE(exec::sanity_problems(r, false).empty());
  r.rates.attention_unit_tiles = r.rates.attention_lone_wave = 1;
  r.rates.attention_ratio = 0.068;
  const auto bad = exec::sanity_problems(r, false);
  ASSERT_FALSE(bad.empty());
  EXPECT_NE(bad.front().find("attention_ratio 0.068"), std::string::npos) << bad.front();
  r.rates.attention_ratio = 0.72;
  r.rates.launch_s = 5e-3;  // 5 ms per one-element addition
  EXPECT_FALSE(exec::sanity_problems(r, false).empty());
  r.rates.launch_s = 1.8e-6;
  r.rates.flops_per_s_f32 = 1e12;  // fp32 300x the 16-bit rate
  EXPECT_FALSE(exec::sanity_problems(r, false).empty());
  EXPECT_FALSE(exec::sanity_problems(r, true).empty());  // and far below any GPU
}

// On a GPU (skipped without one): the probe, and budgets from the smallest peak to the naive
// peak against the caching allocator's measured peak; estimated and measured times side by side.
TEST(MeasuredBudget, CudaSweepWithProbedRates) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device("cuda");
  auto dev = exec::describe_device(d);
  const exec::ProbeResult pr = exec::probe_device(d, dev, false);
  std::cout << "probe " << pr.key << ": " << pr.rates.flops_per_s / 1e12 << " TFLOP/s 16-bit, " << pr.rates.flops_per_s_f32 / 1e12
            << " TFLOP/s fp32, " << pr.rates.bytes_per_s / 1e12 << " TB/s, " << pr.rates.launch_s * 1e6 << " us/op, k "
            << pr.rates.gemm_half_rows << " rows; " << pr.probe_ms << " ms\n";
  for (double v : {pr.rates.flops_per_s, pr.rates.flops_per_s_f32, pr.rates.bytes_per_s, pr.rates.launch_s}) EXPECT_GT(v, 0);
  dev.rates = pr.rates;

  auto cfg = models::demo_config();
  cfg.dtype = ir::DType::BF16;
  cfg.layers = 1;
  cfg.dim = 1536;
  cfg.heads = cfg.kv_heads = 12;
  cfg.head_dim = 128;
  cfg.rotary_dim = 96;
  cfg.hidden = 4096;
  models::set_total_tokens(cfg, 16384);
  const auto inst = models::instantiate(cfg, reg, d);
  const auto base = report::compare(inst, plan::make_plan(inst.model, reg, dev, {}), reg, dev, {true, false, true});
  const int64_t lo = smallest_budget(inst.model, reg, dev), hi = base.naive->peak_bytes;
  std::cout << "smallest " << plan::human_bytes(lo) << ", naive " << plan::human_bytes(hi) << " in "
            << base.naive->ms << " ms, default plan " << plan::human_bytes(base.planned.peak_bytes) << " in "
            << base.planned.ms << " ms\n";
  ASSERT_LT(lo, hi);
  std::map<std::string, report::Measurement> runs;
  constexpr int kBudgets = 12;
  for (int i = 0; i < kBudgets; ++i) {
    const int64_t budget = lo + (hi - lo) * i / (kBudgets - 1);
    SCOPED_TRACE("budget " + std::to_string(budget));
    const plan::Plan p = plan::make_plan(inst.model, reg, dev, {.budget_bytes = budget});
    const std::string key = schedule_key(p);
    if (!runs.count(key)) {
      const auto r = report::compare(inst, p, reg, dev, {false, false, true});
      runs[key] = r.planned;
      EXPECT_LE(test::rel_l2(r.planned_out, base.naive_out), 2e-2);
    }
    const report::Measurement& m = runs[key];
    EXPECT_LE(m.peak_bytes, budget);
    EXPECT_LE(std::abs(double(p.estimated_peak_bytes - m.peak_bytes)), 0.05 * double(m.peak_bytes))
        << "estimated " << p.estimated_peak_bytes << " measured " << m.peak_bytes;
    std::printf("  budget %9.1f MiB  measured %9.1f MiB  estimate %9.1f MiB  est %7.2f ms  ran %7.2f ms  %s\n",
                budget / 1048576.0, m.peak_bytes / 1048576.0, p.estimated_peak_bytes / 1048576.0, p.estimated_ms,
                m.ms, summary(p).c_str());
  }
}

}  // namespace
