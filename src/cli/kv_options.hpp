// The KV budget options of routed block-sparse attention (--consumer sparse): the schedule
// over a denoising run (plan::KvSchedule) and the step that runs now.
//
// Example:
//     sp::cli::KvArgs kv;
//     sp::cli::add_kv_options(cmd, kv);
//     sp::cli::check_kv_options(*cmd, kv, consumer);  // after parsing
//     double b = sp::plan::kv_budget_at(kv.schedule, kv.step, kv.steps);
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "plan/kv_budget.hpp"
#include "plan/plan.hpp"

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

// The options as given on `cmd`: valid values (errors name them, --step with --steps), and
// none of them unless the consumer is sparse, the one they change (exit 1 otherwise: an
// option that changes nothing is a mistake to say, not to ignore).
inline void check_kv_options(const CLI::App& cmd, const KvArgs& a, const std::string& consumer) {
  plan::validate(a.schedule);
  if (a.steps < 1 || a.step < 0 || a.step >= a.steps)
    throw plan::PlanError("--step " + std::to_string(a.step) + " and --steps " + std::to_string(a.steps) +
                          ": steps are counted from 0, so --step must lie in 0.." + std::to_string(a.steps - 1) +
                          (a.steps < 1 ? " (and --steps be >= 1)" : ""));
  if (consumer == "sparse") return;
  for (const char* name : {"--kv-budget", "--step", "--steps", "--early-steps", "--early-kv", "--late-steps", "--late-kv"})
    if (cmd.count(name) > 0)
      throw plan::PlanError(std::string(name) + " " + cmd.get_option(name)->results().front() +
                            ": applies to --consumer sparse only, not to --consumer " + consumer +
                            " (which attends to every key)");
}

}  // namespace sp::cli
