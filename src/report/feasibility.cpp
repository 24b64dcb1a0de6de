#include "report/feasibility.hpp"

#include <algorithm>

#include "plan/budget.hpp"

namespace sp::report {

int64_t smallest_peak(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
                      plan::Options po) {
  po.budget_bytes = 1;
  try {
    plan::make_plan(m, reg, dev, po);
  } catch (const plan::BudgetError& e) {
    return e.smallest_peak_bytes;
  }
  return 1;  // a one-byte budget met: nothing to hold
}

namespace {

// The schedule of every part at full size (no chunk, no slice): what the naive schedule
// computes, as the planner estimates it.
int64_t full_size_peak(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev) {
  int64_t rows = m.tokens();
  for (const auto& c : m.contexts) rows = std::max(rows, c.length);
  return plan::make_plan(m, reg, dev, {.token_chunk = rows, .feature_slice = -1}).estimated_peak_bytes;
}

}  // namespace

Fit check_fit(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
              const plan::Options& po, const FitRequest& rq) {
  Fit f;
  const int64_t available = dev.memory_free;  // CPU: available host memory
  if (available <= 0) return f;  // the device does not say: nothing to check against
  const bool cpu = dev.kind == contracts::DeviceKind::CPU;
  const std::string against = plan::human_bytes(available) +
                              (cpu ? " of host memory available" : " free on device '" + dev.name + "'");
  const std::string kept = rq.kept_text.empty() ? "" : " + " + rq.kept_text;
  auto fits = [&](int64_t activations) { return rq.kept_bytes + activations <= available; };
  const plan::Plan p = plan::make_plan(m, reg, dev, po);
  if (!fits(p.estimated_peak_bytes)) {
    plan::Options lean = po;
    lean.budget_bytes = 0;
    const int64_t least = smallest_peak(m, reg, dev, lean);
    if (!fits(least)) {
      std::string msg = rq.command + ": " + m.name + " at " + std::to_string(m.tokens()) +
                        " tokens cannot fit: the smallest achievable peak " + plan::human_bytes(least) + " (floor " +
                        plan::human_bytes(p.floor_bytes) + ")" + kept + " = " +
                        plan::human_bytes(least + rq.kept_bytes) + ", against " + against;
      if (!cpu && !rq.streams_weights && least + rq.kept_bytes - rq.weight_bytes <= available)
        msg += "; --device-memory " + plan::human_bytes(available) + " streams the weights from host memory";
      else
        msg += "; no option fits it, only fewer tokens (a smaller geometry) do";
      throw FitError(msg, available - rq.kept_bytes, least);
    }
    if (rq.budget_given)
      throw FitError(rq.command + ": the plan under --budget " + plan::human_bytes(po.budget_bytes) +
                         " estimates a peak of " + plan::human_bytes(p.estimated_peak_bytes) + kept + ", more than " +
                         against + "; --budget auto plans into what is free (the smallest achievable peak is " +
                         plan::human_bytes(least) + ")",
                     available - rq.kept_bytes, least);
    f.auto_budget = true;
    f.note = "the default plan's estimated peak " + plan::human_bytes(p.estimated_peak_bytes) + kept +
             " does not fit in " + against + ": planning under --budget auto instead (the smallest achievable peak is " +
             plan::human_bytes(least) + ")";
  }
  if (rq.naive) {
    const int64_t full = full_size_peak(m, reg, dev);
    if (!fits(full))
      throw FitError(rq.command + ": the naive schedule cannot fit: the full-size schedule's estimated peak " +
                         plan::human_bytes(full) + kept + " is more than " + against +
                         " (the planned one fits); --planned-only runs the planned schedule alone",
                     available - rq.kept_bytes, full);
  }
  return f;
}

}  // namespace sp::report
