#include "report/bench.hpp"
#include "report/bench_common.hpp"

#include <algorithm>
#include <iostream>
#include <sstream>

#include "exec/device/device.hpp"
#include "exec/device/memory.hpp"
#include "models/builder.hpp"
#include "models/checkpoint.hpp"
#include "models/quant_load.hpp"
#include "models/lora_file.hpp"
#include "plan/budget.hpp"
#include "exec/run/retry.hpp"
#include "report/feasibility.hpp"
#include "report/report.hpp"

namespace sp::report {

std::vector<BenchCase> bench_cases(bool tiny) {
  if (tiny)
    return {{"minimax-h3-block-tiny", "minimax-h3", 1, {.frames = 3, .height = 96, .width = 128, .text_tokens = 9}},
            {"minimax-h3-model-tiny", "minimax-h3", 3, {.frames = 3, .height = 96, .width = 128, .text_tokens = 9}},
            {"wan-block-tiny", "wan2.1-14b", 1, {.frames = 5, .height = 64, .width = 96, .text_tokens = 12}},
            {"flux-model-tiny", "flux1-dev", 1, {.height = 128, .width = 128, .text_tokens = 12}}};
  // MiniMax H3 at 1376x768: 72 latent frames (10 s, 74,304 video tokens, 810 audio rows) and 37
  // (5 s), 512 text tokens.
  const models::Geometry mm_5s{.frames = 37, .height = 768, .width = 1376, .text_tokens = 512};
  const models::Geometry mm_10s{.frames = 72, .height = 768, .width = 1376, .text_tokens = 512};
  const models::Geometry wan{.frames = 81, .height = 720, .width = 1280, .text_tokens = 512};
  return {{"minimax-h3-block-5s", "minimax-h3", 1, mm_5s},
          {"minimax-h3-block-10s", "minimax-h3", 1, mm_10s},
          {"wan14b-block-81f", "wan2.1-14b", 1, wan},
          {"flux-dev-1024", "flux1-dev", -1, {.height = 1024, .width = 1024, .text_tokens = 512}},
          {"flux-dev-2048", "flux1-dev", -1, {.height = 2048, .width = 2048, .text_tokens = 512}},
          {"minimax-h3-model-5s", "minimax-h3", -1, mm_5s},
          {"minimax-h3-model-10s", "minimax-h3", -1, mm_10s},
          {"wan14b-model-81f", "wan2.1-14b", -1, wan}};
}

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

plan::Options case_plan_options(const models::Instance& inst, const BenchOptions& opt) {
  plan::Options po = opt.plan;
  if (opt.budget_floor > 0) po.budget_bytes = static_cast<int64_t>(opt.budget_floor * double(plan::floor_bytes(inst.model)));
  return po;
}

}  // namespace

CaseModel build_case(const BenchCase& c, const contracts::Registry& reg, const at::Device& device,
                     const BenchOptions& opt, Progress* progress) {
  Progress silent("bench", false);
  const auto phase = (progress ? *progress : silent).phase(c.name + ": generating weights and inputs");
  CaseModel cm{recognize::preset(c.variant, c.layers, opt.tiny), {}};
  auto weights = models::random_weights_on(cm.cfg, device, exec::to_aten(opt.dtype), /*seed=*/0, reg);
  const models::FamilyRun fr =
      models::prepare(cm.cfg, *weights, models::random_raw_inputs(cm.cfg, c.geom, /*seed=*/0), opt.dtype, opt.consumer);
  cm.inst = {fr.model, weights, fr.inputs};
  if (!opt.format.empty() && device.type() != at::kMeta)
    models::convert_block_linears(cm.inst.model, *weights, opt.format, "bench --format " + opt.format);
  if (opt.lora_rank > 0)
    models::add_random_loras(cm.inst.model, *weights, opt.lora_rank, exec::to_aten(opt.dtype), device, /*seed=*/1);
  return cm;
}

Repeated repeat(const at::Device& device, int reps, const std::function<at::Tensor()>& f) {
  std::vector<double> ms;
  Repeated r;
  for (int i = 0; i < reps; ++i) {
    auto [out, m] = measure(device, f);
    r.out = out;
    ms.push_back(m.ms);
    r.peak = std::max(r.peak, m.peak_bytes);
  }
  r.ms = median(ms);
  return r;
}

double estimate_case_ms(const BenchCase& c, const contracts::Registry& reg, const contracts::DeviceCaps& caps,
                        const BenchOptions& opt) {
  const CaseModel cm = build_case(c, reg, at::Device(at::kMeta), opt);
  const plan::Plan p = plan::make_plan(cm.inst.model, reg, caps, case_plan_options(cm.inst, opt));
  return 2.0 * (1 + opt.reps) * p.estimated_ms;  // naive and planned, a warm-up and `reps` runs each
}

BenchResult run_bench_case(const BenchCase& c, const contracts::Registry& reg, const contracts::DeviceCaps& caps,
                           const at::Device& device, const BenchOptions& opt) {
  Progress progress("bench", opt.progress);
  // With a weight format the case runs in the model's dtype first, on the same weights.
  BenchOptions dense = opt;
  dense.format.clear();
  CaseModel cm = build_case(c, reg, device, dense, &progress);
  const models::Instance& inst = cm.inst;
  const plan::Options po = case_plan_options(inst, opt);
  std::optional<Repeated> reference;
  if (!opt.format.empty()) {
    // The dense plan: 16-bit linears and exact attention (the sdpa consumer, every key).
    ir::Model exact = inst.model;
    for (ir::Block& b : exact.blocks)
      for (ir::Sublayer& s : b.sublayers)
        if (auto* a = std::get_if<ir::Attention>(&s.body)) a->consumer = "sdpa";
    plan::Options dense_po = po;
    dense_po.kv_budget = 1.0;
    const plan::Plan dp = plan::make_plan(exact, reg, caps, dense_po);
    auto run = [&] {
      return exec::run_planned(exact, dp, *inst.weights, inst.inputs, reg, caps,
                               progress.sublayers(exact, c.name + ": " + ir::to_string(opt.dtype) + " run"));
    };
    run();
    reference = repeat(device, opt.reps, run);
    models::convert_block_linears(cm.inst.model, *inst.weights, opt.format, "bench --format " + opt.format);
  }
  const plan::Plan p = [&] {
    const auto phase = progress.phase(c.name + ": planning");
    return plan::make_plan(inst.model, reg, caps, po);
  }();

  BenchResult r;
  r.name = c.name;
  r.variant = cm.cfg.variant;
  r.device = caps.name;
  r.dtype = ir::to_string(opt.dtype);
  if (!opt.format.empty()) r.format = opt.format;
  r.consumer = opt.consumer;
  r.tokens = inst.model.tokens();
  r.layers = int64_t(inst.model.blocks.size());
  r.floor = p.floor_bytes;
  r.estimated = p.estimated_peak_bytes;
  r.budget = po.budget_bytes;
  r.estimated_ms = p.estimated_ms;

  auto naive = [&](const std::string& what) {
    return exec::run_naive(inst.model, *inst.weights, inst.inputs, reg, progress.sublayers(inst.model, c.name + ": " + what),
                           p.kv_budget);
  };
  auto planned = [&](const std::string& what) {
    return noting_out_of_memory("while running the planned schedule of bench case " + c.name, [&] {
      return exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, caps,
                               progress.sublayers(inst.model, c.name + ": " + what));
    });
  };
  bool naive_fits = true;
  try {
    naive("naive warm-up");
  } catch (const std::exception& e) {
    if (!exec::is_out_of_memory(e)) throw;
    naive_fits = false;
    r.note = "naive schedule does not fit in device memory";
    exec::release_cached(device);
  }
  planned("planned warm-up");
  // Alternating: naive, planned, naive, planned, ...
  std::vector<double> nms, pms;
  int64_t npeak = 0;
  at::Tensor nout, pout;
  for (int i = 0; i < opt.reps; ++i) {
    const std::string rep = " " + std::to_string(i + 1) + "/" + std::to_string(opt.reps);
    if (naive_fits) {
      const Repeated n = repeat(device, 1, [&] { return naive("naive run" + rep); });
      nms.push_back(n.ms);
      npeak = std::max(npeak, n.peak);
      nout = n.out;
    }
    const Repeated pl = repeat(device, 1, [&] { return planned("planned run" + rep); });
    pms.push_back(pl.ms);
    r.planned_peak = std::max(r.planned_peak, pl.peak);
    pout = pl.out;
  }
  r.planned_ms = median(pms);
  if (opt.profile_steps) {
    exec::StepProfile prof;
    exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, caps, {}, &prof);
    r.steps = prof;
  }
  if (naive_fits) {
    r.naive_ms = median(nms);
    r.naive_peak = npeak;
    r.rel_l2 = rel_l2(pout, nout);
  }
  if (reference) {
    r.bf16_ms = reference->ms;
    r.rel_l2_vs_bf16 = rel_l2(pout, reference->out);
  }
  return r;
}

nlohmann::json run_budget_sweep(const BenchCase& c, const contracts::Registry& reg, const contracts::DeviceCaps& caps,
                                const at::Device& device, const BenchOptions& opt, int points,
                                const std::vector<int64_t>& fixed_chunks) {
  const CaseModel cm = build_case(c, reg, device, opt);
  const models::Instance& inst = cm.inst;
  // Median of `reps` timed runs after one warm-up, and the largest peak.
  auto run = [&](const plan::Plan& p) {
    auto f = [&] { return exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, caps); };
    f();
    const Repeated rp = repeat(device, opt.reps, f);
    return std::make_pair(rp.ms, rp.peak);
  };
  const int64_t smallest = smallest_peak(inst.model, reg, caps, {});
  const int64_t lowest =
      std::max(smallest, int64_t(opt.sweep_min_floor * double(plan::floor_bytes(inst.model))));
  // The full-size schedule's peak, with the room the chooser keeps for row statistics.
  const int64_t full = plan::make_plan(inst.model, reg, caps, {.token_chunk = inst.model.tokens()}).estimated_peak_bytes;
  const int64_t largest = std::max<int64_t>(int64_t(1.05 * double(full)), int64_t(1.2 * double(lowest)));
  nlohmann::json j{{"case", c.name}, {"tokens", inst.model.tokens()}, {"floor_bytes", plan::floor_bytes(inst.model)},
                   {"smallest_peak_bytes", smallest}, {"lowest_budget_bytes", lowest},
                   {"full_peak_bytes", largest}};
  nlohmann::json sweep = nlohmann::json::array();
  double chosen_ms = 0;
  for (int i = 0; i < points; ++i) {
    const int64_t budget = lowest + (largest - lowest) * i / std::max(1, points - 1);
    const plan::Plan p = plan::make_plan(inst.model, reg, caps, {.budget_bytes = budget, .kv_budget = opt.plan.kv_budget});
    const auto [ms, peak] = run(p);
    chosen_ms = ms;
    sweep.push_back({{"budget_bytes", budget}, {"measured_peak_bytes", peak}, {"estimated_peak_bytes", p.estimated_peak_bytes},
                     {"estimated_ms", p.estimated_ms}, {"ms", ms}, {"within_budget", peak <= budget},
                     {"estimate_error", double(p.estimated_peak_bytes - peak) / double(peak)}});
    if (opt.progress)
      std::cerr << "[sweep] " << c.name << " budget " << budget << " peak " << peak << " est " << p.estimated_peak_bytes
                << " ms " << ms << std::endl;
  }
  j["sweep"] = sweep;
  nlohmann::json fixed = nlohmann::json::array();
  double best = 0;
  for (int64_t chunk : fixed_chunks) {
    const plan::Plan p = plan::make_plan(inst.model, reg, caps, {.token_chunk = chunk, .kv_budget = opt.plan.kv_budget});
    const auto [ms, peak] = run(p);
    if (best == 0 || ms < best) best = ms;
    fixed.push_back({{"token_chunk", chunk}, {"ms", ms}, {"measured_peak_bytes", peak}});
    if (opt.progress) std::cerr << "[sweep] " << c.name << " fixed chunk " << chunk << " ms " << ms << std::endl;
  }
  j["fixed_chunks"] = fixed;
  j["chosen_ms_at_largest_budget"] = chosen_ms;
  j["fastest_fixed_ms"] = best;
  j["chosen_over_fastest_fixed"] = best > 0 ? chosen_ms / best : 0.0;
  return j;
}

nlohmann::json run_policy_case(const BenchCase& c, const contracts::Registry& reg, const contracts::DeviceCaps& caps,
                               const at::Device& device, const BenchOptions& opt) {
  Progress progress("bench", opt.progress);
  const CaseModel cm = build_case(c, reg, device, opt, &progress);
  const models::Instance& inst = cm.inst;
  const int64_t floor = plan::floor_bytes(inst.model);
  std::vector<std::pair<std::string, plan::Plan>> plans;
  {
    const auto phase = progress.phase(c.name + ": planning");
    plan::Options po = opt.plan;
    po.budget_bytes = 0;
    plans.emplace_back("default", plan::make_plan(inst.model, reg, caps, po));
    // What is free now, with the weights and inputs resident.
    po.budget_bytes = plan::budget_from_option("auto", exec::describe_device(device));
    plans.emplace_back("auto", plan::make_plan(inst.model, reg, caps, po));
    if (opt.budget_floor > 0) {
      po.budget_bytes = static_cast<int64_t>(opt.budget_floor * double(floor));
      plans.emplace_back(printf_text("floor x %.2f", opt.budget_floor), plan::make_plan(inst.model, reg, caps, po));
    }
  }
  auto run = [&](const plan::Plan& p) {
    return exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, caps);
  };
  for (const auto& [name, p] : plans) {
    const auto phase = progress.phase(c.name + ": warm-up of the " + name + " plan");
    run(p);
  }
  std::vector<std::vector<double>> ms(plans.size());
  std::vector<int64_t> peak(plans.size(), 0);
  for (int i = 0; i < opt.reps; ++i)
    for (size_t k = 0; k < plans.size(); ++k) {
      const auto phase = progress.phase(c.name + ": " + plans[k].first + " plan, run " + std::to_string(i + 1) + "/" +
                                        std::to_string(opt.reps));
      const Repeated r = repeat(device, 1, [&] { return run(plans[k].second); });
      ms[k].push_back(r.ms);
      peak[k] = std::max(peak[k], r.peak);
    }
  nlohmann::json pol = nlohmann::json::object();
  for (size_t k = 0; k < plans.size(); ++k) {
    const plan::Plan& p = plans[k].second;
    pol[plans[k].first] = {{"ms", median(ms[k])},
                           {"peak_bytes", peak[k]},
                           {"estimated_ms", p.estimated_ms},
                           {"estimated_peak_bytes", p.estimated_peak_bytes},
                           {"budget_bytes", p.budget_bytes ? nlohmann::json(p.budget_bytes) : nlohmann::json(nullptr)}};
  }
  return {{"case", c.name}, {"device", caps.name}, {"dtype", ir::to_string(opt.dtype)}, {"tokens", inst.model.tokens()},
          {"floor_bytes", floor}, {"reps", opt.reps}, {"policies", pol}};
}

std::string policy_table(const nlohmann::json& cases) {
  std::ostringstream os;
  os << printf_text("%-21s %-13s %8s %9s %9s %9s %9s\n", "case", "policy", "p/floor", "pk est/m", "ms", "vs auto",
                    "t est/m");
  for (const auto& c : cases) {
    const double floor = c["floor_bytes"].get<double>(), auto_ms = c["policies"]["auto"]["ms"].get<double>();
    for (const auto& [name, p] : c["policies"].items()) {
      const double ms = p["ms"].get<double>(), peak = p["peak_bytes"].get<double>();
      os << printf_text("%-21s %-13s %8.3f %9.4f %9.1f %9.3f %9.3f\n", c["case"].get<std::string>().c_str(),
                        name.c_str(), peak / floor, p["estimated_peak_bytes"].get<double>() / peak, ms, ms / auto_ms,
                        p["estimated_ms"].get<double>() / ms);
    }
  }
  return os.str();
}

nlohmann::json to_json(const std::vector<BenchResult>& rs) {
  nlohmann::json a = nlohmann::json::array();
  auto opt = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  for (const auto& r : rs)
    a.push_back({{"case", r.name},
                 {"variant", r.variant},
                 {"device", r.device},
                 {"dtype", r.dtype},
                 {"format", r.format},
                 {"consumer", r.consumer},
                 {"tokens", r.tokens},
                 {"layers", r.layers},
                 {"naive_peak_bytes", opt(r.naive_peak)},
                 {"planned_peak_bytes", r.planned_peak},
                 {"floor_bytes", r.floor},
                 {"estimated_peak_bytes", r.estimated},
                 {"naive_ms", opt(r.naive_ms)},
                 {"planned_ms", r.planned_ms},
                 {"estimated_ms", r.estimated_ms},
                 {"rel_l2", opt(r.rel_l2)},
                 {"bf16_ms", opt(r.bf16_ms)},
                 {"rel_l2_vs_bf16", opt(r.rel_l2_vs_bf16)},
                 {"budget_bytes", r.budget ? nlohmann::json(r.budget) : nlohmann::json(nullptr)},
                 {"note", r.note}});
  for (size_t i = 0; i < rs.size(); ++i) {
    if (!rs[i].steps) continue;
    nlohmann::json k = nlohmann::json::object();
    for (const auto& [name, e] : rs[i].steps->kinds)
      k[name] = {{"count", e.count}, {"device_ms", e.device_ms}, {"host_ms", e.host_ms}, {"estimated_ms", e.estimated_ms},
                 {"transient_over_bytes", e.transient_over}};
    a[i]["step_profile"] = {{"kinds", k}, {"between_ms", rs[i].steps->between_ms}};
  }
  return a;
}

std::string bench_table(const std::vector<BenchResult>& rs) {
  std::ostringstream os;
  os << printf_text("%-21s %7s %10s %11s %9s %8s %8s %9s %10s %10s %8s %8s %9s\n", "case", "tokens", "naive GiB",
                    "planned GiB", "floor GiB", "p/floor", "est/meas", "p/n peak", "naive ms", "planned ms", "p/n time",
                    "t est/m", "rel_l2");
  const double G = double(int64_t{1} << 30);
  auto fmt = [](const char* f, std::optional<double> v) { return v ? printf_text(f, *v) : std::string("n/a"); };
  for (const auto& r : rs) {
    const std::optional<double> np = r.naive_peak ? std::optional<double>(double(*r.naive_peak)) : std::nullopt;
    os << printf_text("%-21s %7lld %10s %11.3f %9.3f %8.3f %8.4f %9s %10s %10.1f %8s %8.3f %9s\n", r.name.c_str(),
                      static_cast<long long>(r.tokens), fmt("%.3f", np ? std::optional(*np / G) : np).c_str(),
                      double(r.planned_peak) / G, double(r.floor) / G, double(r.planned_peak) / double(r.floor),
                      double(r.estimated) / double(r.planned_peak),
                      fmt("%.3f", np ? std::optional(double(r.planned_peak) / *np) : np).c_str(),
                      fmt("%.1f", r.naive_ms).c_str(), r.planned_ms,
                      fmt("%.3f", r.naive_ms ? std::optional(r.planned_ms / *r.naive_ms) : r.naive_ms).c_str(),
                      r.planned_ms > 0 ? r.estimated_ms / r.planned_ms : 0.0, fmt("%.2e", r.rel_l2).c_str());
  }
  for (const auto& r : rs) {
    if (!r.bf16_ms) continue;
    os << printf_text("%-21s %s + %s %.1f ms vs %s dense %.1f ms (%.3fx), rel_l2 vs %s dense %.2e\n", r.name.c_str(),
                      r.format.c_str(), r.consumer.c_str(), r.planned_ms, r.dtype.c_str(), *r.bf16_ms,
                      *r.bf16_ms / r.planned_ms, r.dtype.c_str(), r.rel_l2_vs_bf16.value_or(0.0));
  }
  return os.str();
}

std::string step_profile_table(const std::vector<BenchResult>& rs) {
  std::ostringstream os;
  for (const auto& r : rs) {
    if (!r.steps) continue;
    os << r.name << ": where a profiled planned run's time goes (device ms: between events around each step; over: the most\n"
       << "  a step allocated beyond the transient its program declares)\n";
    os << printf_text("  %-13s %8s %11s %9s %12s %9s %10s\n", "step", "count", "device ms", "host ms", "estimated ms",
                      "est/dev", "over KiB");
    double dev = 0, host = 0, est = 0;
    for (const auto& [name, e] : r.steps->kinds) {
      os << printf_text("  %-13s %8lld %11.2f %9.2f %12.2f %9.3f %10.1f\n", name.c_str(),
                        static_cast<long long>(e.count), e.device_ms, e.host_ms, e.estimated_ms,
                        e.device_ms > 0 ? e.estimated_ms / e.device_ms : 0.0, double(e.transient_over) / 1024.0);
      dev += e.device_ms;
      host += e.host_ms;
      est += e.estimated_ms;
    }
    os << printf_text("  %-13s %8s %11.2f %9.2f %12.2f %9.3f\n", "all steps", "", dev, host, est,
                      dev > 0 ? est / dev : 0.0)
       << printf_text("  %-13s %8s %11.2f\n", "between steps", "", r.steps->between_ms);
  }
  return os.str();
}

}  // namespace sp::report
