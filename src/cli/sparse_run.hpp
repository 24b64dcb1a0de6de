// What `run` does for the int8 attention consumers: the early device check (before any weight
// is read), the sparse consumer's KV budget for this step (a plan option), and its report.
//
// Example:
//     sp::cli::require_consumer_device(reg, "sparse", device, ir::DType::BF16);
//     const sp::cli::SparseRun s = sp::cli::prepare_sparse("sparse", model, kv);
//     po.kv_budget = s.budget;
//     ... plan, run ...
//     j["sparse_attention"] = s.json();
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "cli/kv_options.hpp"
#include "contracts/contracts.hpp"
#include "exec/consumers/sparse.hpp"
#include "ir/model.hpp"

namespace sp::cli {

struct SparseRun {
  bool active = false;  // consumer "sparse"
  KvArgs kv;
  double budget = 1.0;  // of --step (plan::Options::kv_budget)
  ir::RowRange video;   // the model's video rows
  std::shared_ptr<exec::SparseTally> tally;  // the phases run on this thread since prepare_sparse
  nlohmann::json json() const;  // budget, step and the density per phase
  std::string text() const;
};

// --consumer auto: the fastest exact consumer (sdpa); any other name as given.
inline std::string resolve_consumer(const std::string& name) { return name == "auto" ? "sdpa" : name; }

// For int8/sparse: throws unless they run on `device` in `dtype` (the consumers' own check
// and self-test), before anything is loaded; other consumers pass.
void require_consumer_device(const contracts::Registry& reg, const std::string& consumer, const at::Device& device,
                             ir::DType dtype);

// For sparse: the budget of --step and the model's video rows. Other consumers: inactive, budget 1.
SparseRun prepare_sparse(const std::string& consumer, const ir::Model& m, const KvArgs& kv);

}  // namespace sp::cli
