// The plan's data: per part the decisions, the chosen chunk sizes, the estimates and the
// compiled Part; the options; the errors. make_plan (plan/plan.hpp) fills them; the budget
// chooser, the explain text and the reports read them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "legality/legality.hpp"
#include "plan/arena.hpp"

namespace sp::plan {

using legality::Rejection;
using legality::Transform;

// A transformation's legality for a part; whether the part's schedule takes it follows from
// its chunk sizes (SublayerPlan::chosen, FinalPlan::chosen).
struct Decision {
  Transform transform;
  std::vector<Rejection> rejections;  // empty: legal
  std::string note;                   // why a legal transformation was not chosen
  bool legal() const { return rejections.empty(); }
};
// Whether `t` is among `ds` and legal.
bool is_legal(const std::vector<Decision>& ds, Transform t);

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

// A sublayer's schedule (its chunk sizes: plan/program.hpp's Schedule) and how it was chosen.
struct SublayerPlan : Schedule {
  std::string name;
  bool attention = false;
  int64_t rows = 0, kv_rows = 0, hidden = 0;  // what the chunks divide: query and K/V rows, or rows and MLP features
  std::vector<Decision> decisions;
  // Legal, and taken by the chunk sizes: a chunk (or slice) below what it divides, or streamed_out.
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
  int64_t rows = 0;   // the output rows
  int64_t chunk = 0;  // below rows: the bounded final layer taken
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
  // 0: no budget (the smallest peak within kLeanTolerance of the fastest schedule's time). > 0: the
  // fastest schedule whose estimated peak (residual included) fits; token_chunk / feature_slice still fix those.
  int64_t budget_bytes = 0;
  // Run-time input: the KV budget of routed block-sparse attention at the step the plan runs
  // (plan/kv_budget.hpp; 1: dense). The attend steps carry it; the estimates follow it.
  double kv_budget = 1.0;
  // Run-time input: the rows this rank computes of a sequence-parallel run (one rank: all).
  Sequence sequence{};
  // Under a ulysses split: the K/V and Q slab rows (plan::ulysses_slabs) of each split
  // self-attention sublayer in plan order, two values each, which every rank's exchanges must
  // share (exchange_slabs, agreed over the ranks); empty: each chosen with the schedule.
  std::vector<int64_t> slabs{};
};

struct Plan {
  std::string model;
  int64_t tokens = 0;
  ir::DType dtype = ir::DType::F32;
  std::string device;
  std::vector<BlockPlan> blocks;
  FinalPlan final_layer;
  int64_t residual_bytes = 0;  // this rank's rows of the residual stream
  int64_t floor_bytes = 0;
  int64_t estimated_peak_bytes = 0;
  int64_t budget_bytes = 0;  // 0: none
  double kv_budget = 1.0;    // Options::kv_budget
  Sequence sequence;         // Options::sequence
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
enum class Mismatch { Model, RegistryEntry, Device, Sequence };
const char* code_name(Mismatch);  // "plan.model", "plan.registry_entry", "plan.device", "plan.sequence"

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

}  // namespace sp::plan
