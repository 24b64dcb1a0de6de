// Whether a run can fit on its device, decided before any weight is read or input made.
//
// Design note. `demo` and `run` plan the model first (a checkpoint's on the meta device, so
// nothing is allocated) and compare with the memory the device has free (the CPU: the host's
// available memory): what the run keeps there (weights, inputs) plus the plan's estimated
// activation peak. Three outcomes:
//   - even the smallest achievable peak (the least any schedule reaches, at least the floor)
//     does not fit: FitError (exit 2) naming the floor, the smallest peak, what is kept and
//     what is available; the only option it suggests is one that would change the outcome
//     (weights streamed from host memory on a GPU, where they are what does not fit);
//   - the default plan does not fit but a leaner one does: the run plans under the memory
//     left (`--budget auto`) and says so (Fit::note);
//   - the naive schedule (its stand-in: the full-size schedule's estimate, which it does not
//     undercut at real sizes) does not fit but the planned one does: FitError suggesting
//     --planned-only.
//
// Example:
//     sp::report::FitRequest rq{.kept_bytes = weights + inputs, .naive = true, .command = "run"};
//     sp::report::Fit f = sp::report::check_fit(model, reg, dev, po, rq);   // or throws FitError
//     if (f.auto_budget) po.budget_bytes = sp::plan::budget_auto(dev_now);
#pragma once

#include <cstdint>
#include <string>

#include "contracts/contracts.hpp"
#include "ir/model.hpp"
#include "plan/plan.hpp"

namespace sp::report {

// Nothing fits: a budget error of the device (exit 2).
class FitError : public plan::BudgetError {
 public:
  using plan::BudgetError::BudgetError;
};

struct FitRequest {
  int64_t kept_bytes = 0;      // what the run keeps on the device besides activations (weights, inputs)
  std::string kept_text;       // what that is, e.g. "weights 33.1 GiB + inputs 1.2 GiB"
  int64_t weight_bytes = 0;    // the weights' part of kept_bytes
  bool naive = false;          // the naive schedule runs too
  bool streams_weights = false;  // weights already stream from host memory (--device-memory)
  bool budget_given = false;   // --budget was given: no automatic budget in its place
  std::string command;         // "run", "demo": names the messages
};

struct Fit {
  bool auto_budget = false;  // plan under --budget auto instead of the default
  std::string note;          // why, when auto_budget
};

Fit check_fit(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
              const plan::Options& po, const FitRequest& rq);

// The smallest achievable peak of m under po's fixed sizes (the budget's error, asked with a
// budget of one byte).
int64_t smallest_peak(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
                      plan::Options po);

}  // namespace sp::report
