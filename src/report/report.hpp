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

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "models/builder.hpp"
#include "plan/plan.hpp"
#include "plan/residency.hpp"
#include "plan/program.hpp"

namespace sp::report {

struct Measurement {
  int64_t peak_bytes = 0;
  double ms = 0;
};

struct RunReport {
  std::string model, device, dtype;
  int64_t tokens = 0;
  std::vector<ir::Segment> segments;  // the rows of `tokens`, in order (e.g. text, then video)
  std::optional<Measurement> naive;
  Measurement planned;
  int64_t estimated_peak_bytes = 0, floor_bytes = 0;
  std::optional<double> max_abs, rel_l2;
  nlohmann::json plan;
  std::string retry;  // set when the planned run ran out of memory and ran again (exec/run/retry.hpp)
  at::Tensor naive_out, planned_out;  // kept when CompareOptions::keep_outputs
};

// Progress lines on stderr for long work, "[run] planned schedule: sublayer 37/80 (block 19/40),
// 6.1 s" (the time since the object was made): nothing during the first 2 s, then at most one
// line every 2 s, so that short work stays silent and long work shows it is alive. A disabled
// one prints nothing.
class Progress {
 public:
  class Phase;

  Progress(std::string label, bool enabled);
  bool enabled() const { return enabled_; }
  // Reports `what` now ("[run] estimated 3 min 20 s ..."), without the time so far.
  void note(const std::string& what) const;
  // A callback for exec::run_naive / run_planned that follows the sublayers of m. While any
  // copy of it lives, a helper thread reports the sublayer running when due, "<what>:
  // sublayer i/n (block j/k)", so a sublayer that takes minutes still shows a line about
  // every 2 s. Refers to this object, which must outlive it.
  exec::Progress sublayers(const ir::Model& m, const std::string& what);
  // While the returned object lives, a helper thread reports `what` when due: for work that
  // calls no progress callback (reading weights, planning).
  [[nodiscard]] Phase phase(std::string what);

 private:
  using Clock = std::chrono::steady_clock;
  bool due();  // true at most once every 2 s, and not before 2 s
  void print(const std::string& what) const;
  std::string label_;
  bool enabled_;
  Clock::time_point start_, next_;
  std::mutex mutex_;  // next_, for phases' threads
};

class Progress::Phase {
 public:
  // Reports text() when due (evaluated then, on the helper thread).
  Phase(Progress& p, std::function<std::string()> text);
  ~Phase();
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

struct CompareOptions {
  bool run_naive = true;
  bool progress = true;  // progress lines on stderr once a run passes 2 s
  bool keep_outputs = false;
  Progress* reporter = nullptr;  // where progress lines go (its label and clock); null: "[run]" from the start of compare
  // The weights to run with instead of the instance's (weights streamed from host memory).
  const exec::WeightSource* weights = nullptr;
  // Non-empty: the run is capped (--device-memory); out of memory is an error that says so,
  // without the retry under a smaller plan.
  std::string memory_cap;
};

// One metered call on the device: its output, time (device events on a GPU) and the
// activation peak above what was live when it started.
std::pair<at::Tensor, Measurement> measure(const at::Device& d, const std::function<at::Tensor()>& f);
// f(), where an out-of-memory error leaves with `context` added ("while running the naive schedule").
at::Tensor noting_out_of_memory(const std::string& context, const std::function<at::Tensor()>& f);
// ||out - ref|| / ||ref|| in float64.
double rel_l2(const at::Tensor& out, const at::Tensor& ref);

RunReport compare(const models::Instance& inst, const plan::Plan& p, const contracts::Registry& reg,
                  const contracts::DeviceCaps& dev, const CompareOptions& opt);

nlohmann::json to_json(const plan::Plan& p);
nlohmann::json to_json(const RunReport& r);
// Which blocks stream, the slots, the byte counts and the predicted times.
nlohmann::json to_json(const plan::Residency& r);
// A part's program with its placement and cost (the program of `plan --program`).
nlohmann::json to_json(const plan::Part& part, const contracts::DeviceCaps& dev);
// The document `streamplan plan --json` prints: model, tokens, device, dtype, the estimated
// peak, the floor and the plan; with `with_programs` (`--explain`, `--program`) also the
// schedule programs.
nlohmann::json plan_document(const ir::Model& m, const plan::Plan& p, const contracts::Registry& reg,
                             const contracts::DeviceCaps& dev, bool with_programs);
// "estimated 3 min 20 s (naive 1 min 40 s, taken as long as the planned one; planned
// 1 min 40 s)" for compare() with these options on a GPU (warm-ups) or not: the cost model has
// no estimate of the naive schedule.
std::string estimate_text(const plan::Plan& p, const CompareOptions& opt, bool gpu);

// Short human-readable table of a report.
std::string to_table(const RunReport& r);
// printf's text of `format` and the arguments, whole: the tables' rows.
[[gnu::format(printf, 1, 2)]] std::string printf_text(const char* format, ...);

}  // namespace sp::report
