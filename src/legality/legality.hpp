// Legality: which schedule transformations every party of a run permits.
//
// Design note. Each transformation is guarded by small named predicates, one per
// (component, check). A predicate that fails yields a Rejection — component, check,
// required, actual — and all failing predicates are collected, never just the first.
// A transformation is legal only if model semantics ∩ patches ∩ weight formats ∩
// consumer ∩ device all permit it; anything undeclared fails closed for that
// transformation only. Dependencies between transformations (streamed Q needs bounded
// QKV; streamed output projection needs streamed Q; feature slicing needs token
// chunks) are rejections too, naming the transformation that is missing.
//
// Example:
//     auto reg = sp::contracts::Registry::builtin();
//     sp::legality::Context ctx{&model, &reg, &device};
//     auto d = sp::legality::check_sublayer(ctx, model.blocks[0].sublayers[0]);
//     for (const auto& r : d.rejections) std::cout << sp::legality::describe(r) << "\n";
#pragma once

#include <string>
#include <vector>

#include "contracts/contracts.hpp"
#include "ir/model.hpp"

namespace sp::legality {

enum class Transform {
  TokenChunkedMlp,
  FeatureSlicedMlp,
  BoundedQkv,
  GlobalKvStreamedQ,
  StreamedOutProj,
  BoundedFinal,
};
const char* to_string(Transform);

struct Rejection {
  Transform transform;
  std::string component;  // e.g. "consumer 'whole'", "patch 'attn-out-renorm'"
  std::string check;      // e.g. "accepts bounded Q"
  std::string required;
  std::string actual;
};
std::string describe(const Rejection&);

struct Context {
  const ir::Model* model = nullptr;
  const contracts::Registry* registry = nullptr;
  const contracts::DeviceCaps* device = nullptr;
};

// Result for one sublayer (or the final layer): the transformations that apply to it,
// which of them are legal, and every reason for the others.
struct Verdict {
  std::vector<Transform> candidates;
  std::vector<Transform> legal;
  std::vector<Rejection> rejections;
  bool is_legal(Transform t) const;
};

Verdict check_sublayer(const Context& ctx, const ir::Sublayer& s);
Verdict check_final(const Context& ctx, const ir::FinalLayer& f);

// Alignment every feature-slice boundary of this MLP must respect (lcm of the formats').
int64_t feature_alignment(const contracts::Registry& reg, const ir::Mlp& m);

}  // namespace sp::legality
