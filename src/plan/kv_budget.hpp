// The KV budget of routed block-sparse attention over a denoising run: per video query tile the
// ceil(budget x video key tiles) best key tiles are kept (exec/consumers/block_sparse.hpp). A base
// budget, with optional early and late windows of their own; where several apply the densest
// wins. Sparse attention changes the result, so it is only ever an explicit choice.
#pragma once

#include <cstdint>
#include <optional>

#include "contracts/contracts.hpp"

namespace sp::plan {

struct KvSchedule {
  double budget = 1.0;  // fraction of video key tiles a video query tile keeps (1: dense)
  int early_steps = 0;  // the first steps of the run use early_kv
  double early_kv = 1.0;
  int late_steps = 0;  // the last steps of the run use late_kv
  double late_kv = 1.0;
};

// Throws PlanError naming the option (--kv-budget, --early-kv, --late-kv, --early-steps,
// --late-steps) and its value: budgets must lie in (0, 1], step counts be >= 0.
void validate(const KvSchedule& s);

// The budget of step `step` (0-based) of `steps`: the densest of the base budget and the
// windows covering the step (early: steps [0, early_steps), late: [steps - late_steps, steps)).
// Throws PlanError naming --step and --steps unless 0 <= step < steps.
double kv_budget_at(const KvSchedule& s, int step, int steps);

// Key tiles one query tile keeps of `tiles`: ceil(budget x tiles), at least 1, at most tiles.
int64_t kept_tiles(double budget, int64_t tiles);

// The rows of the model's "video" segment, the rows routed attention routes; none without one.
std::optional<ir::RowRange> video_rows(const ir::Model& m);

// The consumer call's arguments of attention sublayer `s` of block `b` (one of m.blocks) under
// `kv_budget` (q_begin aside): the video rows only for self-attention over every row of the model.
// Throws PlanError naming --kv-budget outside (0, 1], or below 1 without a "video" segment.
contracts::AttnCall attn_call(const ir::Model& m, const ir::Block& b, const ir::Sublayer& s, double kv_budget);

}  // namespace sp::plan
