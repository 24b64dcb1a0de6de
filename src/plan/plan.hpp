// Plan: the schedule the executor runs, as data (how it is made, stage by stage:
// plan/README.md).
//
// Design note. For every sublayer the plan records each candidate transformation — legal, or
// rejected with the reasons legality gave — and the chunk sizes; a transformation not chosen
// degenerates to a chunk covering all tokens (or all features), down to the full-size
// computation. Without a budget the chooser takes the smallest peak whose whole schedule is
// within 0.5% (kLeanTolerance) of the fastest one's estimated time; with Options::budget_bytes
// the fastest candidate whose estimated peak fits, or it throws BudgetError. The plan records
// the policy, the strategy, its estimates and the serious alternatives with the reason each
// lost. The chosen schedule of every part is compiled once, into its Part (the program and its
// placement), which the executor runs and the report prints as they are; the programs point
// into the plan's own copy of the model, and check_match() refuses the plan against any other
// model, registry entries or device (PlanMismatch, with a code).
//
// Example:
//     auto reg = sp::exec::builtin_registry();
//     sp::plan::Plan p = sp::plan::make_plan(model, reg, device, {});
//     std::cout << sp::plan::explain(p);
//     sp::plan::Options o;
//     o.budget_bytes = sp::plan::parse_budget("512MiB");     // plan/budget.hpp
//     sp::plan::Plan q = sp::plan::make_plan(model, reg, device, o);  // or throws BudgetError
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan_types.hpp"

namespace sp::plan {

// Throws PlanMismatch unless `p` was made for a model equal to `m`, with the registry entries
// its programs call in `reg` (the same implementations) and the device `dev` (its free memory
// aside). Compares the model field by field: microseconds for a model of 50 blocks.
void check_match(const Plan& p, const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev);

// The parts in the order they run: the embedding, per block its sublayers and row norm, the
// final layer.
std::vector<const Part*> parts(const Plan& p);

Plan make_plan(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
               const Options& opt);

// Floor: residual stream + the largest global K + V of any attention sublayer.
int64_t floor_bytes(const ir::Model& m);

// Human-readable plan with every rejection (plan/explain.cpp); JSON-ready rendering lives in
// report/. Consecutive blocks with the same plan are printed once with their range, unless
// `full` (every block on its own).
std::string explain(const Plan& p, bool full = false);

// "kv/out chunk 256, q chunk 256" / "token chunk 128, feature slice 256" / "chunk 128".
std::string chunks_text(bool attention, bool final_layer, int64_t token_chunk, int64_t q_chunk, int64_t slice);

}  // namespace sp::plan
