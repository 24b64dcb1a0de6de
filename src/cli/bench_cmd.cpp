// streamplan bench: naive vs planned on real-dimension models (JSON + table).
#include <fstream>
#include <iostream>
#include <numeric>
#include <sstream>

#include "cli/commands.hpp"
#include "cli/kv_options.hpp"
#include "cli/options.hpp"
#include "cli/output_check.hpp"
#include "cli/sparse_run.hpp"
#include "exec/registry.hpp"
#include "exec/device/device.hpp"
#include "exec/device/memory.hpp"
#include "exec/device/probe.hpp"
#include "plan/budget.hpp"
#include "report/bench.hpp"

namespace sp::cli {

namespace {

struct Args {
  std::vector<std::string> cases;
  std::string device = "auto", dtype = "bf16", out;
  int reps = 3;
  int64_t chunk = 0, lora_rank = 0;
  std::string budget;
  double budget_floor = 0, sweep_min_floor = 0;
  int sweep = 0;
  std::vector<int64_t> fixed = {512, 1024, 2048, 4096, 8192, 16384};
  bool tiny = false, list = false, estimate = false, quiet = false, profile_steps = false, policies = false;
  std::string row_kernels = "fused";
  std::string device_memory, resident_blocks, format;
  std::string consumer = "sdpa";
  KvArgs kv;
  const CLI::App* cmd = nullptr;
};

int bench(const Args& a) {
  const auto all = report::bench_cases(a.tiny);
  if (a.list) {
    for (const auto& c : all) std::cout << c.name << "\n";
    return 0;
  }
  std::vector<report::BenchCase> chosen;
  for (const auto& c : all)
    if (a.cases.empty() || std::find(a.cases.begin(), a.cases.end(), c.name) != a.cases.end()) chosen.push_back(c);
  for (const auto& n : a.cases)
    if (std::none_of(all.begin(), all.end(), [&](const auto& c) { return c.name == n; }))
      throw std::invalid_argument("--cases: unknown case '" + n + "' (see bench --list)");
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device(a.device);
  auto caps = exec::run_device(d);
  if (a.row_kernels == "aten") caps.fused_row_kernels = contracts::Cap::No;
  exec::install_cpu_meter();
  report::BenchOptions opt;
  opt.reps = a.reps;
  opt.tiny = a.tiny;
  opt.dtype = ir::parse_dtype(a.dtype, "--dtype");
  opt.plan = exec::plan_options({a.chunk, 0, a.budget}, d);
  opt.budget_floor = a.budget_floor;
  opt.sweep_min_floor = a.sweep_min_floor;
  opt.progress = !a.quiet;
  opt.profile_steps = a.profile_steps;
  opt.lora_rank = a.lora_rank;
  if (!a.format.empty()) reg.format(a.format);  // an unknown name is an error listing the known ones
  opt.format = a.format;
  opt.consumer = resolve_consumer(a.consumer);
  reg.consumer(opt.consumer);  // an unknown name is an error listing the known ones
  check_kv_options(*a.cmd, a.kv, opt.consumer);
  require_consumer_device(reg, opt.consumer, d, opt.dtype);
  if (opt.consumer == "sparse") opt.plan.kv_budget = plan::kv_budget_at(a.kv.schedule, a.kv.step, a.kv.steps);
  std::vector<int64_t> memories;
  std::stringstream list(a.device_memory);
  for (std::string item; std::getline(list, item, ',');) memories.push_back(plan::parse_budget(item));
  const int resident_blocks = memories.empty() ? 0 : parse_resident_blocks(a.resident_blocks);
  if (!memories.empty() && a.estimate) {
    for (const auto& c : chosen) std::cout << report::estimate_residency(c, reg, caps, opt, memories, resident_blocks);
    return 0;
  }
  // The real-dimension cases take hours on a CPU; say so before starting, with the cost
  // model's estimate (the tiny cases are the ones meant for CPUs).
  const bool on_cpu = d.is_cpu() && !a.tiny;
  std::vector<double> estimates;
  if (a.estimate || (on_cpu && a.sweep == 0))
    for (const auto& c : chosen) estimates.push_back(report::estimate_case_ms(c, reg, caps, opt));
  const double total_ms = std::accumulate(estimates.begin(), estimates.end(), 0.0);
  const std::string runs = " (an estimate of the cost model: " + std::to_string(1 + a.reps) +
                           " runs of each schedule, the naive one taken as long as the planned one, weights not included)";
  if (on_cpu) {
    std::cerr << "streamplan: warning: bench is meant for a GPU; on the CPU";
    if (a.sweep == 0)
      std::cerr << (chosen.size() == 1 ? " this case" : " these " + std::to_string(chosen.size()) + " cases")
                << " would take about " << plan::human_ms(total_ms) << runs;
    std::cerr << ". --tiny runs the same structures at test sizes." << std::endl;
  }
  if (a.estimate) {
    for (size_t i = 0; i < chosen.size(); ++i) std::cout << chosen[i].name << ": " << plan::human_ms(estimates[i]) << "\n";
    std::cout << "total: about " << plan::human_ms(total_ms) << " on " << (d.is_cpu() ? "the CPU" : caps.name) << runs
              << "\n";
    return 0;
  }
  // The JSON of every case run so far, in one array that --out rewrites after each case.
  auto run_cases = [&](const auto& add) {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& c : chosen) {
      add(c, all);
      if (!a.out.empty()) std::ofstream(a.out) << all.dump(2) << "\n";
    }
    return all;
  };
  if (!memories.empty()) {
    const nlohmann::json rows = run_cases([&](const auto& c, auto& into) {
      for (auto& row : report::run_residency_case(c, reg, caps, d, opt, memories, resident_blocks)) into.push_back(row);
    });
    std::cout << "device: " << caps.name << ", dtype " << a.dtype << ", " << a.reps
              << " timed runs each (median); weights streamed from host memory under each device memory\n"
              << report::residency_table(rows);
    return 0;
  }
  if (!a.resident_blocks.empty()) throw std::invalid_argument("--resident-blocks: give --device-memory with it");
  if (a.policies) {
    const nlohmann::json all =
        run_cases([&](const auto& c, auto& into) { into.push_back(report::run_policy_case(c, reg, caps, d, opt)); });
    std::cout << "device: " << caps.name << ", dtype " << a.dtype << ", " << a.reps
              << " rounds of the policies in turn (median)\n"
              << report::policy_table(all);
    return 0;
  }
  if (a.sweep > 0) {
    const nlohmann::json all_sweeps = run_cases([&](const auto& c, auto& into) {
      into.push_back(report::run_budget_sweep(c, reg, caps, d, opt, a.sweep, a.fixed));
    });
    for (const auto& s : all_sweeps) {
      int within = 0, close = 0;
      for (const auto& p : s["sweep"]) {
        within += p["within_budget"].get<bool>();
        close += std::abs(p["estimate_error"].get<double>()) <= 0.05;
      }
      std::cout << s["case"].get<std::string>() << ": " << s["sweep"].size() << " budgets, " << within
                << " within budget, " << close << " estimates within 5%; chosen/fastest fixed chunk time "
                << s["chosen_over_fastest_fixed"].get<double>() << "\n";
    }
    return 0;
  }
  std::vector<report::BenchResult> results;
  for (size_t i = 0; i < chosen.size(); ++i) {
    const auto& c = chosen[i];
    if (opt.progress) {
      std::cerr << "[bench] " << c.name << " (" << i + 1 << "/" << chosen.size() << ")";
      if (!estimates.empty()) std::cerr << ", estimated " << plan::human_ms(estimates[i]);
      std::cerr << " ..." << std::endl;
    }
    results.push_back(report::run_bench_case(c, reg, caps, d, opt));
    if (opt.progress) std::cerr << report::bench_table({results.back()});
    if (!a.out.empty()) std::ofstream(a.out) << report::to_json(results).dump(2) << "\n";
  }
  std::cout << "device: " << caps.name << ", dtype " << a.dtype << ", " << a.reps << " timed repetitions (median)\n"
            << report::bench_table(results) << report::step_profile_table(results);
  return 0;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("bench", "naive vs planned on real-dimension models (MiniMax H3, Wan 2.1 14B, Flux.1-dev)");
  cmd->add_option("--cases", a->cases, "cases to run (default: all; see --list)")->delimiter(',');
  cmd->add_flag("--list", a->list, "list the cases");
  cmd->add_flag("--estimate", a->estimate, "print the cost model's time estimate of the cases and exit");
  cmd->add_flag("--quiet", a->quiet, "no progress lines on stderr");
  cmd->add_flag("--tiny", a->tiny, "tiny widths and shapes (tests)");
  cmd->add_option("--format", a->format,
                  "store the block linears in this weight format (fp8-e4m3, int8, convrot-int8, ...) before running");
  cmd->add_option("--consumer", a->consumer,
                  "attention consumer: sdpa, math, int8, sparse (CUDA; sparse follows --kv-budget and its step options), auto")
      ->capture_default_str();
  add_kv_options(cmd, a->kv);
  cmd->add_option("--lora-rank", a->lora_rank, "a random LoRA of this rank on every linear (its overhead)")
      ->check(at_least(1));
  cmd->add_option("--reps", a->reps, "timed repetitions of each schedule")
      ->check(between(1, 100))
      ->capture_default_str();
  cmd->add_option("--device", a->device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  cmd->add_option("--dtype", a->dtype, "activation dtype")
      ->check(CLI::IsMember(ir::activation_dtype_names()))
      ->capture_default_str();
  cmd->add_option("--chunk", a->chunk, "token chunk (default: automatic)")->check(at_least(1));
  cmd->add_option("--budget", a->budget, "activation memory budget for every case: bytes, 2.5GiB, ... or auto");
  cmd->add_option("--budget-floor", a->budget_floor, "budget of each case as a multiple of its floor (e.g. 1.1)")
      ->check(between(1, 100));
  cmd->add_option("--sweep", a->sweep, "budget sweep with this many budgets per case (planned only) instead")
      ->check(between(2, 100));
  cmd->add_option("--sweep-min-floor", a->sweep_min_floor,
                 "lowest budget of the sweep as a multiple of the floor (default: the smallest achievable peak)")
      ->check(between(1, 100));
  std::string fixed_default;
  for (int64_t c : a->fixed) fixed_default += (fixed_default.empty() ? "" : ",") + std::to_string(c);
  cmd->add_option("--fixed-chunks", a->fixed, "fixed token chunks the sweep compares with")
      ->delimiter(',')
      ->default_str(fixed_default);
  cmd->add_option("--row-kernels", a->row_kernels,
                 "planned schedule's norm / Q-K rows: fused kernels where the device has them, or aten ops")
      ->check(CLI::IsMember({"fused", "aten"}))
      ->capture_default_str();
  cmd->add_flag("--policies", a->policies,
               "compare the planner's policies instead (planned only, in turn in one process): the default, "
               "--budget auto and, with --budget-floor, that budget");
  cmd->add_option("--device-memory", a->device_memory,
                  "device memories (comma-separated: 8GiB,16GiB): the cases' planned runs with weights streamed from host "
                  "memory under each, against every weight resident (planned only)");
  cmd->add_option("--resident-blocks", a->resident_blocks,
                  "with --device-memory: blocks whose weights are on the device at once (N or auto)");
  cmd->add_flag("--profile-steps", a->profile_steps,
               "after the timed runs, one planned run with every step timed: device, host and estimated ms per step kind, "
               "and the bytes a step allocated beyond its declared transient");
  cmd->add_option("--out", a->out, "write the results as JSON (updated after every case)")->check(output_file());
  a->cmd = cmd;
  return [cmd, a]() { return cmd->parsed() ? bench(*a) : -1; };
}

}  // namespace sp::cli
