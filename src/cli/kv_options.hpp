// The KV budget options of routed block-sparse attention (--consumer sparse): the schedule
// over a denoising run (plan::KvSchedule) and the step that runs now.
//
// Example:
//     sp::cli::KvArgs kv;
//     sp::cli::add_kv_options(cmd, kv);
//     double b = sp::cli::kv_budget(kv);   // plan::kv_budget_at(kv.schedule, kv.step, kv.steps)
#pragma once

#include <CLI/CLI.hpp>

#include "plan/kv_budget.hpp"

namespace sp::cli {

struct KvArgs {
  plan::KvSchedule schedule;
  int step = 0, steps = 1;
};

inline void add_kv_options(CLI::App* cmd, KvArgs& a) {
  cmd->add_option("--kv-budget", a.schedule.budget, "sparse attention: fraction of video key tiles a video query tile keeps (1: dense)")
      ->capture_default_str();
  cmd->add_option("--step", a.step, "sparse attention: the denoising step that runs (0-based)")->capture_default_str();
  cmd->add_option("--steps", a.steps, "sparse attention: denoising steps of the run")->capture_default_str();
  cmd->add_option("--early-steps", a.schedule.early_steps, "sparse attention: the first steps use --early-kv")->capture_default_str();
  cmd->add_option("--early-kv", a.schedule.early_kv, "sparse attention: budget of the early steps")->capture_default_str();
  cmd->add_option("--late-steps", a.schedule.late_steps, "sparse attention: the last steps use --late-kv")->capture_default_str();
  cmd->add_option("--late-kv", a.schedule.late_kv, "sparse attention: budget of the late steps")->capture_default_str();
}

// The budget of the step (throws plan::PlanError naming the option on a bad value).
inline double kv_budget(const KvArgs& a) {
  plan::validate(a.schedule);
  return plan::kv_budget_at(a.schedule, a.step, a.steps);
}

}  // namespace sp::cli
