// Planning tests, budgets: the cost model's terms and the chooser's policies on the models of
// planning_common.hpp (no ATen: figures from the model, not measured).

#include "planning_common.hpp"

namespace {

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

// Without a budget: the smallest peak whose whole schedule is within kLeanTolerance (0.5%) of the fastest
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
  // One cap over all parts: a part may be 10% slower where the whole stays within the tolerance.
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
    // The smallest peak as the message prints it beside the budget: with the digits that tell them apart.
    for (const std::string& part : {pl::distinct_bytes(lo - 1, lo).second, std::to_string(lo) + " bytes",
                                    std::string("residual stream"), std::string("global K/V for 520 tokens at 2x16 bf16"),
                                    std::string("block 0 attn")})
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
          if (!d.rejections.empty()) EXPECT_FALSE(p.blocks[0].sublayers[i].chosen(d.transform)) << lg::to_string(d.transform);
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
  EXPECT_EQ(t.rfind("global K/V for 100 tokens at 2x8 fp32 (2 x 6.25 KiB) + Q/K slab for norm and RoPE [10, 128] fp32", 0),
            0u)
      << t;
  EXPECT_TRUE(contains(t, "attend (2.93 KiB)")) << t;
  EXPECT_FALSE(contains(t, "normalized rows")) << t;  // N32 is dead at the peak step
}

TEST(BudgetCost, MoreSmallerSlabsCostMoreLaunchesAndTime) {
  const ir::Model m = build({.hidden = 1024, .segments = {{"text", 64}, {"video", 4000}}});
  const ct::Registry reg = sp::test::example_registry();
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
  pl::Rates k256;
  k256.gemm_half_rows = 256;
  EXPECT_DOUBLE_EQ(pl::gemm_efficiency(256, 4096, k256), 0.5);  // no probe width: rows alone
  EXPECT_DOUBLE_EQ(pl::gemm_efficiency(100, 4096, pl::Rates{}), 1.0);
  pl::Rates k32;
  k32.gemm_half_rows = 32;
  EXPECT_LT(pl::gemm_efficiency(64, 512, k32), pl::gemm_efficiency(128, 512, k32));
  // Measured at 4096 outputs: 256 rows of 12,288 outputs fill the device as 768 rows of 4096,
  // 256 rows of 1024 outputs as 64 rows.
  k256.gemm_probe_cols = 4096;
  EXPECT_DOUBLE_EQ(pl::gemm_efficiency(256, 4096, k256), 0.5);
  EXPECT_DOUBLE_EQ(pl::gemm_efficiency(256, 12288, k256), 0.75);
  EXPECT_DOUBLE_EQ(pl::gemm_efficiency(256, 1024, k256), 0.2);
  EXPECT_DOUBLE_EQ(pl::gemm_efficiency(256, 0, k256), 0.5);  // width unknown: rows alone
  ct::DeviceCaps d = cpu();
  const pl::Rates def = pl::rates_of(d);
  EXPECT_DOUBLE_EQ(def.flops_per_s_f32, pl::default_rates(ct::DeviceKind::CPU).flops_per_s_f32);
  d.rates.bytes_per_s = 123e9;
  d.rates.gemm_half_rows = 7;
  const pl::Rates r = pl::rates_of(d);
  EXPECT_DOUBLE_EQ(r.bytes_per_s, 123e9);
  EXPECT_DOUBLE_EQ(r.gemm_half_rows, 7);
  EXPECT_DOUBLE_EQ(r.launch_s, def.launch_s);  // unmeasured: the default
  const pl::Rates gpu = pl::default_rates(ct::DeviceKind::CUDA);
  EXPECT_GT(gpu.flops(ir::DType::BF16), gpu.flops(ir::DType::F32));
  EXPECT_DOUBLE_EQ(gpu.flops(ir::DType::F64), gpu.flops(ir::DType::F32) / 2);
}

TEST(BudgetCost, ProgramTimeIsTheLargerOfDeviceAndHost) {
  // One step of 100 launches and 1 ms of bandwidth-bound work, run 10 times.
  pl::Program p;
  pl::LoopStep loop;
  loop.count = 10;
  pl::Step open, work, close;
  open.body = loop;
  work.body = pl::ResidualAddStep{};
  work.terms.bytes = 1e9 * 1e-3;
  work.terms.launches = 100;
  close.body = pl::EndLoopStep{};
  p.steps = {open, work, close};
  ct::DeviceCaps d = cpu();
  d.kind = ct::DeviceKind::CUDA;
  d.rates.bytes_per_s = 1e9;
  d.rates.launch_gap_s = 1e-6;
  d.rates.launch_s = 5e-6;  // host: 10 x 0.5 ms, under the device's 10 x 1.1 ms
  EXPECT_NEAR(pl::program_cost(p, d).seconds, 10 * (1e-3 + 100 * 1e-6), 1e-12);
  d.rates.launch_s = 20e-6;  // host: 10 x 2 ms, over the device's
  EXPECT_NEAR(pl::program_cost(p, d).seconds, 10 * 100 * 20e-6, 1e-12);
  EXPECT_EQ(pl::program_cost(p, d).launches, 1000);
  const pl::Rates cpu_rates = pl::default_rates(ct::DeviceKind::CPU);
  EXPECT_DOUBLE_EQ(cpu_rates.launch_gap_s, cpu_rates.launch_s);  // the host is the device
}

TEST(BudgetCost, AnAttentionCallCostsItsTilesPerCall) {
  // 1,024 query rows of 8 heads (64 tiles) on 64 units: one full wave of 1 ms tiles.
  ct::DeviceCaps d = cpu();
  d.kind = ct::DeviceKind::CUDA;
  d.compute_units = 64;
  d.rates.flops_per_s = 64e12;
  d.rates.attention_ratio = 1.0;
  d.rates.bytes_per_s = 1e15;
  d.rates.launch_gap_s = 1e-9;
  pl::Terms t;
  t.attention = true;
  t.dtype = ir::DType::BF16;
  t.gemm_rows = 1024;
  t.attention_heads = 8;
  t.attention_kv = 4096;
  t.flops = 64e9;  // 1 GFLOP per tile at 1 TFLOP/s per unit
  t.launches = 1;
  const double base = pl::step_seconds(t, pl::rates_of(d));
  EXPECT_NEAR(base, 1e-3, 1e-8);
  d.rates.attention_call_tiles = 0.4;
  EXPECT_NEAR(pl::step_seconds(t, pl::rates_of(d)), base + 0.4e-3, 1e-8);
  // Half the rows in one call: half a wave, still one tile's time, and the same tail.
  t.gemm_rows = 512;
  t.flops = 32e9;
  EXPECT_NEAR(pl::step_seconds(t, pl::rates_of(d)), base + 0.4e-3, 1e-8);
}

TEST(BudgetCost, WaveChunksFillWholeWaves) {
  // 40 K/V heads on 132 units: 33 tiles per head fill a wave set; rep 2 halves the rows.
  for (int64_t rep : {1, 2, 3}) {
    const auto qs = pl::wave_chunk_candidates(75600, rep, 40, 132, 1);
    ASSERT_FALSE(qs.empty()) << rep;
    for (int64_t q : qs) {
      EXPECT_LT(q, 75600);
      EXPECT_DOUBLE_EQ(pl::attention_efficiency(rep * q, 40, {132}), 1.0) << rep << " " << q;
    }
  }
  EXPECT_TRUE(pl::wave_chunk_candidates(75600, 1, 40, 0, 1).empty());  // no GPU
  for (int64_t q : pl::wave_chunk_candidates(20000, 1, 24, 132, 96)) EXPECT_EQ(q % 96, 0) << q;
}

TEST(BudgetCost, CallChunksRunWholeTilesPerCall) {
  // Wan 14B on 2 ranks: a Q slab of 3,152 rows is two calls of 1,576 rows of a rank's 20 heads;
  // offered beside it: the slabs of 2 x 1,536 and 2 x 1,664 rows, and those whose calls of 20
  // heads fill whole waves of 132 tiles (33 tiles per head: 4,224 rows per call).
  const auto qs = pl::call_chunk_candidates({3152}, 75600, 37800, 2, 1, 20, 132, 16);
  EXPECT_NE(std::find(qs.begin(), qs.end(), 3072), qs.end());
  EXPECT_NE(std::find(qs.begin(), qs.end(), 3328), qs.end());
  EXPECT_NE(std::find(qs.begin(), qs.end(), 8448), qs.end());
  for (int64_t q : qs) EXPECT_TRUE(q < 75600 && q / 2 % 128 == 0 && q % 16 == 0) << q;  // whole tiles per call
  size_t whole_waves = 0;
  for (int64_t q : qs) whole_waves += pl::attention_efficiency(q / 2, 20, {132}) == 1.0;
  EXPECT_GE(whole_waves, 3u) << "the slabs whose calls fill whole waves";
  // One process: the slab's own rows per call, the wave chunks of all 40 heads among them.
  const auto one = pl::call_chunk_candidates({3152}, 75600, 75600, 1, 1, 40, 132, 16);
  EXPECT_NE(std::find(one.begin(), one.end(), 3200), one.end());
  for (int64_t q : pl::wave_chunk_candidates(75600, 1, 40, 132, 16))
    EXPECT_NE(std::find(one.begin(), one.end(), q), one.end()) << q;
  EXPECT_TRUE(pl::call_chunk_candidates({3152}, 75600, 37800, 2, 1, 20, 0, 16).empty());  // no GPU
}

TEST(BudgetCost, AttentionEfficiencyIsTheFillOfTheLastWave) {
  // 40 heads x 33 tiles of 128 rows = 1320 tiles = 10 full waves of 132.
  EXPECT_DOUBLE_EQ(pl::attention_efficiency(33 * 128, 40, {132}), 1.0);
  // One row more opens an 11th wave for 40 tiles: 1360 / (11 x 132), of which each head's last
  // tile holds one row of 128.
  EXPECT_DOUBLE_EQ(pl::attention_efficiency(33 * 128 + 1, 40, {132}), 4225.0 / 4352 * 1360.0 / (11 * 132));
  // A partial tile costs a whole one: a row does 1/128 of a tile's work in the same time.
  EXPECT_DOUBLE_EQ(pl::attention_efficiency(1, 132, {132}), pl::attention_efficiency(128, 132, {132}) / 128);
  // A ulysses piece of 1,576 rows of 20 heads (Wan 14B's Q slab of 3,152 rows on 2 ranks): 13
  // tiles per head, the last holding 40 rows, 260 tiles in 2 waves of 132.
  EXPECT_DOUBLE_EQ(pl::attention_efficiency(1576, 20, {132}), 1576.0 / 1664 * 260.0 / 264);
  EXPECT_DOUBLE_EQ(pl::attention_efficiency(1000, 8, {0}), 1.0);  // no GPU: no waves
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
  // The rows up to a head's next whole tile take no more time: 1,576 and 1,664 rows of 20 heads
  // both run 13 tiles per head, and the call's tail is charged whole tiles either way.
  ct::DeviceCaps tail = d;
  tail.rates.attention_call_tiles = 0.4;
  pl::Terms ragged{4.0 * 1576 * 8192 * 20 * 128, 0, 2, 1576, ir::DType::BF16, true, 20};
  pl::Terms tiled = ragged;
  tiled.flops *= 1664.0 / 1576;
  tiled.gemm_rows = 1664;
  for (const ct::DeviceCaps& dc : {d, tail})
    EXPECT_NEAR(pl::step_seconds(ragged, pl::rates_of(dc)), pl::step_seconds(tiled, pl::rates_of(dc)), 1e-12);
}

TEST(BudgetCost, TwoTilesPerUnitMakeWavesOfTwiceTheUnits) {
  // 132 units of 2 tiles: waves of 264. 40 heads x 148 tiles = 5920 = 22 waves + 112 tiles,
  // at most one on each unit: the last wave takes the lone share of a full one.
  const pl::TileWaves w{132, 2, 0.7};
  EXPECT_EQ(w.slots(), 264);
  EXPECT_DOUBLE_EQ(pl::attention_efficiency(148 * 128, 40, w), 5920.0 / ((22 + 0.7) * 264));
  // 40 x 149 tiles = 5960 = 22 waves + 152: some unit runs 2 of them, a whole wave.
  EXPECT_DOUBLE_EQ(pl::attention_efficiency(149 * 128, 40, w), 5960.0 / (23 * 264));
  EXPECT_DOUBLE_EQ(pl::attention_efficiency(33 * 128 * 2, 40, w), 1.0);  // 2640 = 10 waves
  // One tile per unit at once: the lone share does not apply.
  EXPECT_DOUBLE_EQ(pl::attention_efficiency(148 * 128, 40, {132, 1, 0.7}), 5920.0 / (45 * 132));
  // From the rates: the measured tiles per unit, rounded, and the lone share where above 1.
  pl::Rates r = pl::default_rates(ct::DeviceKind::CUDA);
  r.compute_units = 132;
  r.attention_unit_tiles = 2.0;
  r.attention_lone_wave = 0.7;
  const pl::TileWaves got = pl::tile_waves(r);
  EXPECT_EQ(got.units, 132);
  EXPECT_EQ(got.per_unit, 2);
  EXPECT_DOUBLE_EQ(got.lone, 0.7);
  r.attention_unit_tiles = 1.0;
  EXPECT_DOUBLE_EQ(pl::tile_waves(r).lone, 1.0);
  r.compute_units = 0;
  EXPECT_EQ(pl::tile_waves(r).slots(), 0);
  // The wave chunks fill waves of the slots: 2 x 132 over 40 heads.
  for (int64_t q : pl::wave_chunk_candidates(75600, 1, 40, w.slots(), 1))
    EXPECT_DOUBLE_EQ(pl::attention_efficiency(q, 40, w), 1.0) << q;
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
  const ct::Registry reg = sp::test::example_registry();
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
