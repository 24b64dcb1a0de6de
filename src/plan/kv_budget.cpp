#include "plan/kv_budget.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "plan/plan_types.hpp"

namespace sp::plan {

namespace {

void check_budget(const char* option, double v) {
  if (!(v > 0.0 && v <= 1.0)) throw PlanError(std::string(option) + ": a fraction in (0, 1], got " + std::to_string(v));
}

void check_steps(const char* option, int v) {
  if (v < 0) throw PlanError(std::string(option) + ": must be >= 0, got " + std::to_string(v));
}

}  // namespace

void validate(const KvSchedule& s) {
  check_budget("--kv-budget", s.budget);
  check_budget("--early-kv", s.early_kv);
  check_budget("--late-kv", s.late_kv);
  check_steps("--early-steps", s.early_steps);
  check_steps("--late-steps", s.late_steps);
}

double kv_budget_at(const KvSchedule& s, int step, int steps) {
  validate(s);
  if (steps < 1 || step < 0 || step >= steps)
    throw PlanError("--step " + std::to_string(step) + " of --steps " + std::to_string(steps) +
                    ": expected 0 <= step < steps");
  double b = s.budget;
  if (step < s.early_steps) b = std::max(b, s.early_kv);
  if (step >= steps - s.late_steps) b = std::max(b, s.late_kv);
  return b;
}

int64_t kept_tiles(double budget, int64_t tiles) {
  if (tiles <= 0) return 0;
  // A small tolerance keeps 0.3 x 10 at 3 despite 0.3's binary rounding.
  const int64_t k = int64_t(std::ceil(budget * double(tiles) - 1e-9));
  return std::clamp<int64_t>(k, 1, tiles);
}

std::optional<ir::RowRange> video_rows(const ir::Model& m) {
  for (const auto& g : m.segments)
    if (g.name == "video") return m.rows({g.name});
  return std::nullopt;
}

contracts::AttnCall attn_call(const ir::Model& m, const ir::Block& b, const ir::Sublayer& s, double kv_budget) {
  check_budget("--kv-budget", kv_budget);
  contracts::AttnCall c;
  while (c.layer < int64_t(m.blocks.size()) && &m.blocks[size_t(c.layer)] != &b) ++c.layer;
  c.queries = m.rows(s.segments);
  c.kv_budget = kv_budget;
  const std::optional<ir::RowRange> video = video_rows(m);
  if (!video) {
    if (kv_budget >= 1.0) return c;
    std::string names;
    for (const auto& g : m.segments) names += (names.empty() ? "" : ", ") + g.name;
    throw PlanError("--kv-budget " + std::to_string(kv_budget) + ": the model has no 'video' segment to route (segments: " +
                    names + ")");
  }
  const auto* a = std::get_if<ir::Attention>(&s.body);
  if (a && a->kind != ir::AttnKind::Cross && c.queries.begin == 0 && c.queries.end == m.tokens())
    c.video = *video;
  return c;
}

}  // namespace sp::plan
