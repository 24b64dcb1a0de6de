// Run reports: naive vs planned on the same weights and inputs, and their JSON form.
//
// Design note. compare() is the one measurement routine behind `demo`, `run` and
// `bench`: it runs the naive schedule (unless skipped) and the planned one, each under
// its own PeakMeter, and computes the error of planned against naive. The JSON keys are
// the run report of DESIGN.md.
//
// Example:
//     sp::report::RunReport r = sp::report::compare(inst, plan, reg, caps, {});
//     std::cout << sp::report::to_json(r).dump(2);
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <string>

#include "models/builder.hpp"
#include "plan/plan.hpp"
#include "plan/program.hpp"

namespace sp::report {

struct Measurement {
  int64_t peak_bytes = 0;
  double ms = 0;
};

struct RunReport {
  std::string model, device, dtype;
  int64_t tokens = 0;
  std::optional<Measurement> naive;
  Measurement planned;
  int64_t estimated_peak_bytes = 0, floor_bytes = 0;
  std::optional<double> max_abs, rel_l2;
  nlohmann::json plan;
  at::Tensor naive_out, planned_out;  // kept when CompareOptions::keep_outputs
};

struct CompareOptions {
  bool run_naive = true;
  bool progress = true;  // progress lines on stderr once a run passes a few seconds
  bool keep_outputs = false;
};

// One metered call on the device: its output, time (device events on a GPU) and the
// activation peak above what was live when it started.
std::pair<at::Tensor, Measurement> measure(const at::Device& d, const std::function<at::Tensor()>& f);
// ||out - ref|| / ||ref|| in float64.
double rel_l2(const at::Tensor& out, const at::Tensor& ref);

RunReport compare(const models::Instance& inst, const plan::Plan& p, const contracts::Registry& reg,
                  const contracts::DeviceCaps& dev, const CompareOptions& opt);

nlohmann::json to_json(const plan::Plan& p);
nlohmann::json to_json(const RunReport& r);
// A program with its placement and cost (the program of `plan --program`).
nlohmann::json to_json(const plan::Program& prog, const contracts::DeviceCaps& dev);
// The programs a planned run executes, in order: embedding, every sublayer, final layer.
std::vector<plan::Program> programs(const ir::Model& m, const plan::Plan& p, const contracts::Registry& reg,
                                    const contracts::DeviceCaps& dev);
// Short human-readable table of a report.
std::string to_table(const RunReport& r);

}  // namespace sp::report
