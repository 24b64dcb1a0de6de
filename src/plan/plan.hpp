// Plan: the schedule the executor runs, as data.
//
// Design note. For every sublayer the plan records each candidate transformation —
// chosen, or rejected with the reasons legality gave — and the chunk sizes. A
// transformation that is not chosen degenerates to a chunk covering all tokens (or
// all features), so the executor has one bounded code path whose extreme is the
// full-size computation of that sublayer. The buffers each phase of that path
// allocates come from schedule.hpp; the estimate is their sum plus what consumers
// and weight formats declare, so the estimate and the allocation share one source.
//
// Example:
//     auto reg = sp::contracts::Registry::builtin();
//     sp::plan::Plan p = sp::plan::make_plan(model, reg, device, {});
//     std::cout << sp::plan::explain(p);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "contracts/contracts.hpp"
#include "ir/model.hpp"
#include "legality/legality.hpp"

namespace sp::plan {

using legality::Rejection;
using legality::Transform;

struct Decision {
  Transform transform;
  bool chosen = false;
  std::vector<Rejection> rejections;  // empty when chosen or when declined by option
  std::string note;                   // why a legal transformation was not chosen
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
};

struct BlockPlan {
  std::string name;
  std::vector<SublayerPlan> sublayers;
};

struct FinalPlan {
  bool present = false;
  std::vector<Decision> decisions;
  int64_t chunk = 0;
  int64_t estimated_peak = 0;  // above the residual stream, output included
  bool chosen(Transform t) const;
};

struct Options {
  int64_t token_chunk = 0;    // 0: automatic
  int64_t feature_slice = 0;  // 0: automatic; < 0: never slice features
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
};

class PlanError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

Plan make_plan(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
               const Options& opt);

// Floor: residual stream + the largest global K + V of any attention sublayer.
int64_t floor_bytes(const ir::Model& m);

// Heuristic default chunk sizes (pure; reasoning in the definitions).
int64_t default_token_chunk(int64_t tokens, int64_t align);
int64_t default_feature_slice(int64_t hidden, int64_t align);

// Human-readable plan with every rejection; JSON-ready rendering lives in report/.
std::string explain(const Plan& p);

}  // namespace sp::plan
