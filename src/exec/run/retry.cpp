#include "exec/run/retry.hpp"

#include "exec/device/device.hpp"
#include "plan/budget.hpp"

namespace sp::exec {

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return true;
  const auto* c = dynamic_cast<const c10::Error*>(&e);
  return c && c->msg().find("DefaultCPUAllocator: can't allocate memory") != std::string::npos;
}

Retried run_planned_retrying(const ir::Model& m, const WeightSource& w, const Inputs& in,
                             const plan::Plan& p, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
                             const at::Device& device, const exec::Progress& progress, c10d::ProcessGroup* group) {
  Retried r;
  r.plan = p;
  try {
    r.out = run_planned(m, p, w, in, reg, dev, progress, nullptr, group);
    return r;
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) throw;
  }
  release_cached(device);
  contracts::DeviceCaps now = dev;  // the same rates, the memory free now
  now.memory_free = describe_device(device).memory_free;
  // What is free now, less a twentieth for what a run allocates besides its schedule (library
  // workspaces); the chooser keeps the allocator's reserve on top.
  const int64_t budget = now.memory_free - now.memory_free / 20;
  const std::string failed = "the plan's estimated peak " + plan::human_bytes(p.estimated_peak_bytes) +
                             " did not fit: out of memory with " + plan::human_bytes(now.memory_free) +
                             " free after releasing the cache";
  if (budget <= 0 || budget >= p.estimated_peak_bytes)
    throw OutOfMemory("out of memory: " + failed + ", and the plan already asked for no more than that");
  plan::Options o;
  o.budget_bytes = budget;
  o.kv_budget = p.kv_budget;
  o.sequence = p.sequence;
  try {
    r.plan = plan::make_plan(m, reg, now, o);
  } catch (const plan::BudgetError& e) {
    throw OutOfMemory("out of memory: " + failed + "; no schedule fits " + plan::human_bytes(budget) + ": " + e.what());
  }
  r.retried = true;
  r.note = "retried once: " + failed + "; planned again under a budget of " + plan::human_bytes(budget) +
           " (estimated peak " + plan::human_bytes(r.plan.estimated_peak_bytes) + ")";
  try {
    r.out = run_planned(m, r.plan, w, in, reg, now, progress, nullptr, group);
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) throw;
    release_cached(device);
    throw OutOfMemory("out of memory again after a retry under " + plan::human_bytes(budget) + " (" + failed + ")");
  }
  return r;
}

}  // namespace sp::exec
