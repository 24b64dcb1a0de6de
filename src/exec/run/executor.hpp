// Executors: the naive reference schedule and the planned schedule (exec/run/README.md).
//
// Design note. run_naive computes every op of the IR on full tensors and shares no chunking
// code with run_planned, which interprets each part's program in one arena at the placement
// the plan holds (plan/arena.hpp). Both return the [T, out] rows of the final layer's
// segments in fp32 (fp64 for an fp64 model) and never modify their inputs.
//
// Example:
//     sp::exec::Inputs in = ...;                      // tokens per segment + tables
//     at::Tensor ref = sp::exec::run_naive(model, weights, in, reg);
//     at::Tensor out = sp::exec::run_planned(model, plan, weights, in, reg, device);
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <string>

#include "contracts/contracts.hpp"
#include "exec/formats/weights.hpp"
#include "ir/model.hpp"
#include "plan/plan.hpp"

namespace c10d {
class ProcessGroup;
}

namespace sp::exec {

struct Inputs {
  // Per segment: its tokens [length, input features of the segment], activation dtype.
  std::map<std::string, at::Tensor> tokens;
  // Modulation tables [1|S|T, count, dim]; RoPE "<table>.cos"/".sin" [T, rot/2] fp32;
  // contexts [length, dim] in the activation dtype.
  std::map<std::string, at::Tensor> tables;
  const at::Tensor& table(const std::string& name) const;
  const at::Tensor& segment_tokens(const std::string& segment) const;
  at::Device device() const;
};

// Throws std::invalid_argument naming the input and the shapes on any mismatch.
void validate_inputs(const ir::Model& m, const Inputs& in);

// Called once per finished sublayer (progress reporting); may be empty.
using Progress = std::function<void(int64_t done, int64_t total)>;

// Where a planned run's time goes, per step kind (plan::step_name): steps run, device time
// between events around each (CPU: wall time), host time issuing them, and the cost model's
// estimate. `between_ms`: device time outside any step. `transient_over`: the most bytes one
// step allocated beyond the transient its program declares (where a measured peak exceeds the
// estimate, the step that did it). Profiling slows the run, and on CUDA resets the caching
// allocator's peak statistics at every step.
struct StepProfile {
  struct Kind {
    int64_t count = 0;
    double device_ms = 0, host_ms = 0, estimated_ms = 0;
    int64_t transient_over = 0;
  };
  std::map<std::string, Kind> kinds;
  double between_ms = 0;
  int64_t runs = 0;  // profiled run_planned calls summed here
};

// Why the registered consumer `name` cannot run on `device` in `dtype`, or "" where it can
// (its kernels' requirements and their self-test there: ConsumerImpl::unusable). Throws
// contracts::ContractError for a name not registered.
std::string consumer_unusable(const contracts::Registry& reg, const std::string& name, const at::Device& device,
                              ir::DType dtype);

// kv_budget: routed attention's, as plan::Options::kv_budget (the plan's for run_planned).
at::Tensor run_naive(const ir::Model& m, const WeightSource& w, const Inputs& in, const contracts::Registry& reg,
                     const Progress& progress = {}, double kv_budget = 1.0);
// profile: where not null, every step is timed into it (a slower run). group: the process group
// of a sequence-parallel plan (plan::Options::sequence), its rank and size the plan's; every
// rank gets the whole output.
// Throws plan::PlanMismatch for a plan of another model, registry entry or device, or made for
// another rank or rank count than the group's.
at::Tensor run_planned(const ir::Model& m, const plan::Plan& p, const WeightSource& w, const Inputs& in,
                       const contracts::Registry& reg, const contracts::DeviceCaps& dev,
                       const Progress& progress = {}, StepProfile* profile = nullptr,
                       c10d::ProcessGroup* group = nullptr);

}  // namespace sp::exec
