// Benchmarks: naive vs planned on real-dimension models, in one process, on the same
// weights and inputs.
//
// Design note. Each case builds a family preset with random weights generated on the
// device, prepares random inputs of the case's geometry, plans once, then runs the two
// schedules alternately: one untimed warm-up each, then `reps` timed repetitions each
// (device events), reporting the median time and the largest activation peak. A naive
// schedule that runs out of memory is reported as not fitting; the planned one still runs.
//
// Example:
//     for (const auto& c : sp::report::bench_cases(false))
//       results.push_back(sp::report::run_bench_case(c, reg, caps, device, {}));
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "exec/run/executor.hpp"
#include "models/families.hpp"
#include "plan/plan.hpp"

namespace sp::report {

struct BenchCase {
  std::string name;
  std::string variant;  // recognize::preset name
  int layers = -1;      // -1: the preset's
  models::Geometry geom;
};

struct BenchOptions {
  int reps = 3;
  bool tiny = false;  // tiny presets (tests on the CPU)
  ir::DType dtype = ir::DType::BF16;
  plan::Options plan;
  double budget_floor = 0;  // > 0: each case's budget is this multiple of its floor
  double sweep_min_floor = 0;  // > 0: a sweep's lowest budget is this multiple of the floor
  bool progress = false;  // progress lines on stderr ("[bench] ...") once a case passes 2 s
  bool profile_steps = false;  // one more planned run, every step timed (BenchResult::steps)
  int64_t lora_rank = 0;  // > 0: a random LoRA of this rank on every linear (models/lora_file.hpp)
  std::string format;     // non-empty: the block linears stored in this weight format
  std::string consumer = "sdpa";  // attention consumer (sparse: routed by each case's video rows)
};

struct BenchResult {
  std::string name, variant, device, dtype;
  std::string format = "dense";  // of the block linears (BenchOptions::format)
  std::string consumer = "sdpa";
  int64_t tokens = 0, layers = 0;
  std::optional<int64_t> naive_peak;
  std::optional<double> naive_ms, rel_l2;
  int64_t planned_peak = 0, floor = 0, estimated = 0, budget = 0;
  double planned_ms = 0;
  double estimated_ms = 0;  // the plan's time estimate (cost model)
  // With a weight format: the same case with bf16/fp16 linears and exact attention (the sdpa
  // consumer), planned and timed in the same process before the conversion, and the planned
  // output's rel L2 against it: the dense plan the format and the consumer are compared with.
  std::optional<double> bf16_ms, rel_l2_vs_bf16;
  std::string note;  // e.g. why the naive schedule has no figures
  std::optional<exec::StepProfile> steps;  // BenchOptions::profile_steps
};

// The benchmark cases of the project (MiniMax H3, Wan 2.1 14B, Flux.1-dev); tiny: the same
// structures at test sizes.
std::vector<BenchCase> bench_cases(bool tiny);
BenchResult run_bench_case(const BenchCase& c, const contracts::Registry& reg, const contracts::DeviceCaps& caps,
                           const at::Device& device, const BenchOptions& opt);

// The cost model's time for a case's runs, before running it: the plan's estimate for the
// planned schedule, the naive one taken as about as long, each run once as a warm-up and
// `reps` times timed. Generating the weights is not included. The case is built on the meta
// device, so no weights are allocated.
double estimate_case_ms(const BenchCase& c, const contracts::Registry& reg, const contracts::DeviceCaps& caps,
                        const BenchOptions& opt);

// Budget sweep of one case (planned schedule only): `points` budgets from the smallest
// achievable peak (or opt.sweep_min_floor x floor, when larger) to the full-size peak, each
// planned, run and measured; then the fixed token chunks of `fixed_chunks` without a budget, to
// compare the chooser's pick under the largest budget with the fastest fixed chunk.
nlohmann::json run_budget_sweep(const BenchCase& c, const contracts::Registry& reg, const contracts::DeviceCaps& caps,
                                const at::Device& device, const BenchOptions& opt, int points,
                                const std::vector<int64_t>& fixed_chunks);

// The planner's policies on one case, in one process on the same weights and inputs: the
// default (no budget), `--budget auto` (the fastest plan that fits what is free), and, with
// opt.budget_floor, that multiple of the floor. Each is run once as a warm-up, then `reps`
// rounds of one run of each in turn (so that the device's clocks and temperature treat them
// alike); median time, largest peak, the plans' estimates. One JSON object per case.
nlohmann::json run_policy_case(const BenchCase& c, const contracts::Registry& reg, const contracts::DeviceCaps& caps,
                               const at::Device& device, const BenchOptions& opt);
std::string policy_table(const nlohmann::json& cases);

// Weights streamed from host memory (report/bench_residency.cpp): per device memory of
// `device_memories`, the residency planned with the case's activation plan (resident_blocks:
// 0 auto, else that many blocks on the device), run with every weight resident (warm-up, then
// `reps` timed runs), then with the streamed blocks moved to host memory under the device
// memory as a cap of the caching allocator (the same runs); the weights go back afterwards.
// One JSON row per device memory.
nlohmann::json run_residency_case(const BenchCase& c, const contracts::Registry& reg, const contracts::DeviceCaps& caps,
                                  const at::Device& device, const BenchOptions& opt,
                                  const std::vector<int64_t>& device_memories, int resident_blocks);
std::string residency_table(const nlohmann::json& rows);
// The residency plans of a case under each device memory, without running (the case built
// on the meta device): plan::explain of each, or why none fits.
std::string estimate_residency(const BenchCase& c, const contracts::Registry& reg, const contracts::DeviceCaps& caps,
                               const BenchOptions& opt, const std::vector<int64_t>& device_memories,
                               int resident_blocks);

nlohmann::json to_json(const std::vector<BenchResult>& rs);
std::string bench_table(const std::vector<BenchResult>& rs);
// Per step kind of each profiled case: count, device ms, host ms, estimated ms and their ratio.
std::string step_profile_table(const std::vector<BenchResult>& rs);

}  // namespace sp::report
