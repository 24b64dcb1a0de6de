// Legality: which schedule transformations every party of a run permits.
//
// Each transformation is guarded by small named predicates, one per (component, check); every
// failing one yields a Rejection (a Check code, the component, required, actual), and all are
// collected. The codes are the stable interface; the human texts derive from the fields. A
// transformation is legal only if model, patches, weight formats, consumer and device all permit
// it; anything undeclared fails closed for that transformation only. Dependencies between
// transformations (streamed Q needs bounded QKV, ...) are rejections too.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "contracts/contracts.hpp"

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

// One enumerator per check legality performs; the code_name of each is the stable interface.
enum class Check {
  ConsumerRegistered,       // the attention's consumer name is in the registry
  ConsumerBoundedQ,         // consumer accepts bounded Q against global K/V
  ConsumerDeclaresGlobalK,  // consumer states whether it needs complete K
  ConsumerDeclaresGlobalV,  // consumer states whether it needs complete V
  ConsumerSlabOutput,       // consumer produces output in Q-sized slabs
  ConsumerKvAligned,        // global K/V length is a multiple of the consumer's alignment
  ConsumerDtype,            // consumer accepts the activation dtype
  ConsumerLse,              // consumer returns each row's log-sum-exp (ring attention merges by it)
  FormatHeld,               // weight format supports held execution
  FormatRegionSlicing,      // fused QKV weight format slices by output rows into q|k|v
  FormatRowSlicing,         // MLP input weight format slices by output rows
  FormatColumnSlicing,      // MLP down weight format slices by input columns
  RegionAligned,            // a fused QKV region starts on the format's row alignment
  UpHalfAligned,            // the up half of fused [gate | up] starts on the row alignment
  PatchRowLocal,            // patch runs on a token slab
  PatchFeatureLocal,        // patch runs on a feature slice
  DeviceDtype,              // device supports the activation dtype
  DeviceFp32,               // device supports fp32 for the final projection
  Prerequisite,             // the transformation this one builds on is legal
  SequenceSplit,            // runs on one rank's rows alone (a sequence-parallel plan)
  HiddenTooNarrow,          // MLP hidden width holds fewer than two aligned slices
};
// Every enumerator, in declaration order (HiddenTooNarrow is the last).
inline constexpr auto kAllChecks = [] {
  std::array<Check, static_cast<size_t>(Check::HiddenTooNarrow) + 1> all{};
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<Check>(i);
  return all;
}();
// Stable dotted identifier, e.g. "consumer.bounded_q"; "?" for a value outside the enum.
const char* code_name(Check);

enum class ComponentKind { Consumer, Weight, Patch, Device, Model, Transformation };
const char* to_string(ComponentKind);  // "consumer", "weight", ...

struct Rejection {
  Transform transform;
  Check check;
  ComponentKind component_kind;
  // Consumer, patch or device name; weight name; transformation (to_string of it);
  // model quantity ("mlp.hidden").
  std::string component_name;
  std::string format;                         // Weight: the weight's format
  std::optional<contracts::TensorRole> role;  // Patch: the tensor role it touches
  std::string region;                         // RegionAligned: the fused weight's region
  std::string required;
  std::string actual;
};
// Human texts, derived from the fields: "consumer 'whole'", "weight 'W' (format F)",
// "patch 'P' on Q", "device 'cpu'", "transformation 'bounded QKV'", "MLP hidden width";
// "accepts bounded Q against global K/V", "region 'k' offset aligned".
std::string component_text(const Rejection&);
std::string check_text(const Rejection&);
// "<transformation>: <component>: <check> [<code>] — required <r>, actual <a>".
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
