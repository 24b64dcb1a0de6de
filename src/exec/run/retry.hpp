// Out of memory in the middle of a planned run: one retry with a smaller plan (the execution
// policy of the commands, bench and the host).
//
// Design note. The plan's estimate covers what the schedule allocates, but the device may
// have less free memory than the plan assumed (another process, fragmentation, a budget of
// "none" on a small card). When the planned run runs out of memory (is_out_of_memory), the
// cached blocks go back to the device, the planner is asked for the fastest schedule that
// fits what is free now (less a twentieth), and the run is repeated once.
// Where no schedule fits — or the retry runs out of memory too — an OutOfMemory error says
// what was needed and what was free; the caller's buffers are untouched either way (a run
// writes only into memory it allocates, and the CLI writes its outputs after success).
//
// Example:
//     sp::exec::Retried r = sp::exec::run_planned_retrying(model, weights, inputs, plan, reg, caps, device);
//     if (r.retried) std::cerr << r.note << "\n";
#pragma once

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#include "exec/run/executor.hpp"
#include "models/builder.hpp"
#include "plan/plan.hpp"

namespace sp::exec {

// The run needed more device memory than there is, even with the leanest schedule that the
// free memory allowed.
class OutOfMemory : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Out of device or host memory: c10::OutOfMemoryError, and the failure of c10's CPU
// allocator, which comes as a plain c10::Error.
bool is_out_of_memory(const std::exception& e);

struct Retried {
  at::Tensor out;
  plan::Plan plan;       // the plan that ran
  bool retried = false;
  std::string note;      // why and how the retry planned, when retried
};

// run_planned with `p` (on `group` for a sequence-parallel plan); on out of memory, one retry
// as described above. Throws OutOfMemory.
Retried run_planned_retrying(const ir::Model& m, const WeightSource& w, const Inputs& in,
                             const plan::Plan& p, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
                             const at::Device& device, const Progress& progress = {},
                             c10d::ProcessGroup* group = nullptr);

}  // namespace sp::exec
