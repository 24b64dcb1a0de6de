// Plan: the schedule the executor runs, as data.
//
// Design note. For every sublayer the plan records each candidate transformation —
// chosen, or rejected with the reasons legality gave — and the chunk sizes. A
// transformation that is not chosen degenerates to a chunk covering all tokens (or
// all features), so one program compiler (plan/program.hpp) covers every schedule, whose
// extreme is the full-size computation of that sublayer. The estimates are the cost
// model's sums over that program (plan/cost.hpp), the same program the executor runs.
//
// The chooser enumerates, per sublayer, the candidate chunk sizes legality permits
// (plan/budget.hpp). Without a budget it takes the smallest peak whose whole schedule is
// within 0.5% (kLeanTolerance) of the fastest schedule's estimated time: every sublayer takes its fastest
// candidate under one cap, the smallest cap that keeps the sum within 0.5% (lean and fast). With
// Options::budget_bytes it takes the fastest candidate whose estimated peak fits; a budget
// below the smallest achievable peak throws BudgetError. The plan records the policy, the
// strategy, its estimates and the serious alternatives with the reason each lost.
//
// The chosen schedule of every part (embedding, sublayers, row norms, final layer) is compiled
// once, when the plan is made, into its Part: the program and the placement of its buffers,
// which the executor runs and the report prints as they are. The programs point into the
// plan's own copy of the model; check_match() refuses the plan against any other model,
// registry entries or device (PlanMismatch, with a code).
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
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "contracts/contracts.hpp"
#include "ir/model.hpp"
#include "legality/legality.hpp"
#include "plan/arena.hpp"

namespace sp::plan {

using legality::Rejection;
using legality::Transform;

struct Decision {
  Transform transform;
  bool chosen = false;
  std::vector<Rejection> rejections;  // empty when chosen or when declined by option
  std::string note;                   // why a legal transformation was not chosen
};

// A candidate schedule of a sublayer (or the final layer) that the budget chooser did not take.
struct Alternative {
  std::string strategy;
  int64_t token_chunk = 0, q_chunk = 0, feature_slice = 0;
  int64_t estimated_peak = 0;  // bytes above the residual stream
  double estimated_ms = 0;
  std::string lost;            // e.g. "over budget by 3.2 MiB", "slower: 12.3 ms vs 10.1 ms"
};

// A part's chosen program and where its buffers lie (plan/arena.hpp).
struct Part {
  Program program;
  Placement placement;
};

struct SublayerPlan {
  std::string name;
  bool attention = false;
  std::vector<Decision> decisions;
  int64_t token_chunk = 0;    // rows per slab: K/V projection, MLP, out projection
  int64_t q_chunk = 0;        // attention: Q rows per slab (== tokens when Q is not streamed)
  int64_t feature_slice = 0;  // MLP: hidden features per slice (== hidden when not sliced)
  bool chosen(Transform t) const;
  int64_t estimated_peak = 0;  // bytes above the residual stream, this sublayer's worst phase
  std::string strategy;        // short name, e.g. "streamed-q", "chunked+sliced", "full"
  double estimated_ms = 0;     // cost model's time for this sublayer
  std::vector<Alternative> alternatives;  // only under a budget
  // Weights of the chosen program: acquired once and held while the sublayer runs over the
  // block's rows, or acquired (and released) per slab or slice.
  std::vector<std::string> held_weights, slab_weights;
  Part part;  // the chosen schedule, compiled
};

struct BlockPlan {
  std::string name;
  std::vector<SublayerPlan> sublayers;
  int64_t post_norm_rows = 0;  // > 0: the block's row norm after its sublayers, over these rows
  std::optional<Part> post_norm;
};

struct FinalPlan {
  bool present = false;
  std::vector<Decision> decisions;
  int64_t chunk = 0;
  int64_t estimated_peak = 0;  // above the residual stream, output included
  std::string strategy;
  double estimated_ms = 0;
  std::vector<Alternative> alternatives;
  bool chosen(Transform t) const;
  Part part;
};

struct Options {
  int64_t token_chunk = 0;    // 0: automatic
  int64_t feature_slice = 0;  // 0: automatic; < 0: never slice features
  // 0: no budget (the smallest peak whose schedule is within 0.5% of the fastest). > 0: the fastest schedule
  // whose estimated activation peak (residual included) fits; explicit token_chunk /
  // feature_slice above still fix those sizes.
  int64_t budget_bytes = 0;
};

struct Plan {
  std::string model;
  int64_t tokens = 0;
  ir::DType dtype = ir::DType::F32;
  std::string device;
  std::vector<BlockPlan> blocks;
  FinalPlan final_layer;
  int64_t residual_bytes = 0;
  int64_t floor_bytes = 0;
  int64_t estimated_peak_bytes = 0;
  int64_t budget_bytes = 0;  // 0: none
  double estimated_ms = 0;   // sum of the sublayers', the final layer's and the embedding's
  std::string row_kernels;   // program.hpp row_kernels_note
  std::string policy;        // which rule chose the schedules
  Part embed;
  // What the parts were compiled against: the model their programs point into, the registry
  // entries they call (kind, name, implementation) and the device.
  struct Entry {
    char kind;  // 'c' consumer, 'f' format, 'p' patch
    std::string name;
    const void* impl;
    bool operator==(const Entry&) const = default;
  };
  std::shared_ptr<const ir::Model> source;
  std::vector<Entry> entries;
  contracts::DeviceCaps device_caps;
};

// Why a plan cannot run against a model, registry and device.
enum class Mismatch { Model, RegistryEntry, Device };
const char* code_name(Mismatch);  // "plan.model", "plan.registry_entry", "plan.device"

class PlanError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The budget is below the smallest peak any legal schedule reaches; the message states
// that peak and the buffers that set it. smallest_peak_bytes is what a budget must be.
class BudgetError : public PlanError {
 public:
  BudgetError(const std::string& what, int64_t budget, int64_t smallest)
      : PlanError(what), budget_bytes(budget), smallest_peak_bytes(smallest) {}
  int64_t budget_bytes, smallest_peak_bytes;
};

class PlanMismatch : public PlanError {
 public:
  PlanMismatch(Mismatch c, const std::string& reason)
      : PlanError(std::string("plan does not match (") + code_name(c) + "): " + reason), check(c) {}
  Mismatch check;
};

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
