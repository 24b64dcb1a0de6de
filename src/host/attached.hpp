// A planner attached to a host's live module: recognized once, planned once per geometry,
// run per call on the module's own weights.
//
// Design note. A host (the Python package, src/python) hands over the module's tensors by
// state_dict() name and, where names and shapes cannot tell, a sidecar built from its config.
// Each call is one batch element in the family's raw-input format (models/families.hpp, that of
// `streamplan run --inputs`): the prologue builds the IR and tables of that geometry, whose plan
// comes from the cache (made on first sight), and the planned schedule runs on the module's
// weights (module_weights.hpp), retried once under what is free when it runs out of memory
// (exec/run/retry.hpp); the output is the family's reference layout, in fp32. What a call may
// carry besides (masks, ControlNet residuals, LoRA scales) is the host's to refuse before it calls.
//
// Example:
//     sp::host::Attached a(tensors, sidecar, {.consumer = "sdpa", .budget = "auto"}, sp::exec::builtin_registry());
//     at::Tensor out = a.forward({{"latents", lat}, {"timestep", t}, {"text", text}});  // Wan: [C, F, H, W]
//     std::cout << sp::plan::explain(a.last()->plan);
#pragma once

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "exec/dist/sharded.hpp"
#include "exec/residency/streamed.hpp"
#include "host/module_weights.hpp"
#include "models/families.hpp"
#include "models/lora_file.hpp"
#include "models/tensor_io.hpp"
#include "plan/plan.hpp"
#include "plan/residency.hpp"

namespace sp::host {

struct AttachOptions {
  std::string consumer = "sdpa";
  std::string budget;       // empty: none; "auto"; or a size ("12GiB", "512MiB", bytes)
  int64_t token_chunk = 0;  // 0: automatic
  int64_t feature_slice = 0;  // 0: automatic; < 0: never slice features
  // The KV budget of routed block-sparse attention (consumer "sparse"; 1: dense): a plan
  // input, so each budget has plans of its own (set_kv_budget changes it between calls).
  double kv_budget = 1.0;
  // A weight hook (module_weights.hpp) over the module tensors named in `hooked` (state_dict
  // names; all of them where empty); none where unset.
  WeightHook weight_hook;
  std::vector<std::string> hooked;
  // LoRA state dicts applied lazily on top of the module's weights (models/lora_file.hpp).
  std::vector<models::LoraInput> loras;
  // Weight residency (exec/residency/streamed.hpp), on when either is set: the bytes the
  // calls may hold on the device (weights kept there, the slots the other blocks stream
  // through, activations; 0: no limit), and at most how many blocks' weights are there at
  // once (0: chosen). The module's tensors stay where they are, in host memory, and are
  // copied once into the streamed blocks' pinned buffers and the device; `device` names
  // where the calls run (empty: the module's device).
  int64_t device_memory = 0;
  int resident_blocks = -1;  // -1: not set
  std::string device;
  // A host that places the module's weights itself (ComfyUI's partial loading): its tensors
  // may be on `device` and in host memory at once. Those on the device are read in place and
  // count as neither kept nor streamed; those in host memory stream from where they are (the
  // host pins them), with no pinned copy of streamplan's own; the allocator is not capped
  // (the host accounts for the device memory it hands over).
  bool in_place = false;
  // The compute (activation) dtype, "fp32" | "bf16" | "fp16"; empty: the 16/32-bit float dtype
  // holding most of the module's bytes. A host that stores weights in 8 bits and casts them per
  // use (ComfyUI's fp8 models) names the dtype it casts to.
  std::string dtype;
  // Sequence parallel: the process group of the ranks (each attaches the same module and calls
  // it with the same inputs; each computes its share of the rows, and every one returns the
  // whole output) and how attention sees the other ranks' rows (plan::Sequence). Unset: one process.
  exec::dist::Group process_group;
  plan::SeqMode sequence_mode = plan::SeqMode::Ulysses;
  // With process_group: the bytes per second a rank sends and receives in an all-to-all, which
  // the plans price the exchanges at; 0: measured when attached (exec::dist::probe_link).
  double link_bytes_per_s = 0;
  // With process_group, how the ranks hold the blocks' weights (plan/residency.hpp):
  // Sharded, each rank keeps 1/N of every block's weights on `device` and gathers a block from
  // the others as it begins (exec/dist/sharded.hpp); the module's tensors are read once (keep
  // the module in host memory so that its own copy is not on the device). Replicated, every rank
  // the whole. Auto: replicated, or under device_memory whichever the planner finds fastest
  // within it (replicated and resident, streamed from host memory, or sharded).
  plan::WeightSplit weight_split = plan::WeightSplit::Auto;
  bool streams() const { return device_memory > 0 || resident_blocks >= 0; }
};

// The plan of one geometry, with what it needs to be shown.
struct GeometryPlan {
  std::string key;   // "video 3072, text 512 (fp32)": tokens per segment and context, dtype (, kv budget)
  ir::Model model;   // the IR of that geometry
  plan::Plan plan;
  int64_t calls = 0;
  std::string retry;  // why and how the plan was made again after running out of memory
  std::optional<plan::Residency> residency;  // where the weights were, under AttachOptions' residency
  uint64_t used = 0;                          // the call count when it last ran (least recent goes first)
};

// Plans kept per attached module: the least recently used geometry's goes when a new one
// would exceed it.
constexpr size_t kPlanCacheSize = 32;

// The linears of one weight format in a geometry's model, and what computes them.
struct FormatUse {
  std::string format;
  int64_t linears = 0;
  std::string provider;  // exec::gemm_provider
};

class Attached {
 public:
  // Recognizes the module (throws recognize::RecognizeError), checks that its tensors share
  // one device and that the consumer and budget are valid (std::invalid_argument naming the
  // option and its value), and measures the device's rates (cached per device).
  Attached(const NamedTensors& tensors, const std::optional<recognize::Sidecar>& sidecar, AttachOptions options,
           contracts::Registry reg);
  Attached(const Attached&) = delete;
  Attached& operator=(const Attached&) = delete;

  const recognize::Recognized& recognized() const { return rec_; }
  ir::DType dtype() const { return dtype_; }  // activations: the dtype of most parameter bytes
  const at::Device& device() const { return device_; }
  const AttachOptions& options() const { return options_; }
  // From the next call on: plans made under this KV budget (plan::PlanError unless in (0, 1]).
  void set_kv_budget(double budget);
  const ModuleWeights& weights() const { return *weights_; }
  // The LoRA adapters matched from the options' files, with the keys that matched no weight.
  const models::LoraSet& lora() const { return lora_; }

  // One forward of one batch element; the output in the family's reference layout, fp32.
  // Throws plan::BudgetError when no schedule meets the budget, exec::OutOfMemory when the
  // run does not fit even after its retry.
  at::Tensor forward(const models::TensorMap& raw);
  // The same forward, with every output by name: the family's named outputs (MiniMax H3:
  // "video" [C, T, H, W] and "audio" [C_a, 2, T_a]), or {"out": forward's output} for a family
  // with one output.
  models::TensorMap forward_named(const models::TensorMap& raw);

  // The plan of the most recent call's geometry (null before the first call), and all plans
  // made so far in the order they were made.
  const GeometryPlan* last() const { return last_; }
  // Host milliseconds the last call spent before its planned run started: the inputs and the
  // geometry's IR prepared, the plan looked up (or made), the weights' arrangement checked.
  double last_prepare_ms() const { return last_prepare_ms_; }
  const std::vector<const GeometryPlan*>& plans() const { return order_; }
  // Gives back what the streamed weights hold (device slots and kept weights, pinned host
  // buffers); a later call streams them again. The plans stay.
  void release_streamed();
  // What the streamed weights hold now: device bytes (kept weights and slots) and pinned host
  // bytes of streamplan's own (0, 0 when nothing streams or after release_streamed).
  std::pair<int64_t, int64_t> streamed_bytes() const;
  // Under sharded weights: this rank's shares of the blocks' weights and the two block slots,
  // on the device (0, 0 before the first call, after release_streamed, or without them).
  std::pair<int64_t, int64_t> sharded_bytes() const;
  // The JSON of `streamplan plan --explain --json` for one of them, with `residency` where
  // the weights stream.
  nlohmann::json document(const GeometryPlan& g) const;
  // The weight formats of the geometry's linears, in the order first met, and their providers.
  std::vector<FormatUse> formats(const GeometryPlan& g) const;

 private:
  contracts::Registry reg_;
  AttachOptions options_;
  recognize::Recognized rec_;
  std::unique_ptr<ModuleWeights> weights_;
  models::LoraSet lora_;
  at::Device device_{at::kCPU};
  contracts::DeviceCaps dev_;
  plan::Sequence sequence_;  // this process's rows under options_.process_group
  bool moved_ = false;       // a sequence-parallel module in host memory whose calls run on device_
  ir::DType dtype_ = ir::DType::F32;
  // Under residency: the weights as they stream or are sharded over the ranks (made for the
  // first geometry, again for one whose arrangement differs) and the request's weight bytes,
  // inputs not counted.
  std::unique_ptr<exec::StreamedWeights> streamed_;
  std::unique_ptr<exec::dist::ShardedWeights> sharded_;
  std::optional<plan::Residency> placed_as_;
  std::optional<plan::ResidencyRequest> weight_request_;
  std::shared_ptr<exec::TensorWeights> host_weights() const;  // the module's tensors, canonical, with the LoRA's
  // The request of this call; `host` gets the module's tensors where it read them to count
  // their bytes (the first time), for place_as to take.
  plan::ResidencyRequest residency_request(const models::FamilyRun& fr, std::shared_ptr<exec::TensorWeights>& host);
  // Streams or shards the weights as `r` arranges them, unless they are so already (from
  // `host` where this call read them already); `fr` is then prepared again (from `raw`) on
  // the weights where the calls run.
  void place_as(const plan::Residency& r, models::FamilyRun& fr, const models::TensorMap& raw,
                std::shared_ptr<exec::TensorWeights> host);
  // Whether the calls plan the weights' arrangement with the activations (residency, sharding).
  bool arranges() const { return options_.streams() || options_.weight_split == plan::WeightSplit::Sharded; }
  models::FamilyRun prepare(const models::TensorMap& raw);  // the call's IR and inputs
  // Under a split: std::invalid_argument on every rank unless every rank's call has the same
  // geometry and input values (a checksum over the ranks).
  void check_same_call(const std::string& key, const models::TensorMap& raw) const;
  // The plan (and the weights' arrangement) of a new geometry; under a split, the same
  // exchanges and sharded blocks on every rank (every rank calls it for the same geometry).
  void plan_geometry(GeometryPlan& g, const models::FamilyRun& fr, std::shared_ptr<exec::TensorWeights>& host);
  std::map<std::string, std::unique_ptr<GeometryPlan>> cache_;
  std::vector<const GeometryPlan*> order_;
  const GeometryPlan* last_ = nullptr;
  uint64_t uses_ = 0;
  double last_prepare_ms_ = 0;
  void evict_least_recent(const GeometryPlan* keep);  // down to kPlanCacheSize plans, `keep` kept

  // The prepared call and its planned output rows (what finish and named_outputs take), under
  // the caller's NoGradGuard.
  std::pair<models::FamilyRun, at::Tensor> run(const models::TensorMap& raw);
};

}  // namespace sp::host
