// streamplan command line.
//
//   streamplan demo [--tokens N] [--layers N] [--dtype fp32|bf16|fp16] [--json] ...
//   streamplan plan --explain [--consumer NAME] [--format NAME] [--patch NAME]... [--json]
//   streamplan run --checkpoint F [--frames/--height/--width | --tokens N | --inputs I] ...
//   streamplan make-checkpoint --family NAME [--layers N] [--layout L] [--tiny] --out F
//   streamplan bench [--cases a,b] [--reps N] [--out results.json]
//
// Exit status: 0 success, 1 a usage or input error, 2 a memory budget no schedule meets
// (message on stderr).
#include <CLI/CLI.hpp>

#include <iostream>

#include "cli/commands.hpp"
#include "exec/registry.hpp"
#include "exec/device/device.hpp"
#include "exec/device/memory.hpp"
#include "exec/device/probe.hpp"
#include "models/builder.hpp"
#include "plan/arena.hpp"
#include "plan/budget.hpp"
#include "report/report.hpp"

namespace {

using namespace sp;

struct ModelArgs {
  int64_t tokens = 0;
  int layers = 2;
  std::string dtype = "fp32";
  std::string consumer = "sdpa";
  std::string format = "dense";
  std::vector<std::string> patches;
  int64_t chunk = 0;
  int64_t feature_slice = 0;
  std::string device = "auto";
  uint64_t seed = 0;
  std::string budget;
  bool json = false;
  bool explain = false;
  bool program = false;
};

void add_model_options(CLI::App* cmd, ModelArgs& a) {
  const auto& reg_names = [] {
    static contracts::Registry reg = exec::builtin_registry();
    return &reg;
  }();
  cmd->add_option("--tokens", a.tokens, "total tokens (text + video) of the demo model")->check(CLI::PositiveNumber);
  cmd->add_option("--layers", a.layers, "number of blocks")->check(CLI::Range(1, 1000));
  cmd->add_option("--dtype", a.dtype, "activation dtype")->check(CLI::IsMember(ir::activation_dtype_names()));
  cmd->add_option("--consumer", a.consumer, "attention consumer")->check(CLI::IsMember(reg_names->consumer_names()));
  cmd->add_option("--format", a.format, "weight format of the block linears")
      ->check(CLI::IsMember(reg_names->format_names()));
  cmd->add_option("--patch", a.patches, "patch to apply (repeatable)")->check(CLI::IsMember(reg_names->patch_names()));
  cmd->add_option("--chunk", a.chunk, "token chunk (default: automatic)")->check(CLI::PositiveNumber);
  cmd->add_option("--feature-slice", a.feature_slice, "MLP feature slice (default: automatic; -1: off)");
  cmd->add_option("--device", a.device, "cpu, cuda, cuda:N or auto");
  cmd->add_option("--seed", a.seed, "random seed of weights and inputs");
  cmd->add_option("--budget", a.budget, "activation memory budget: bytes, 512MiB, 2.5GiB, ... or auto");
  cmd->add_flag("--json", a.json, "print the run report as JSON");
  cmd->add_flag("--explain", a.explain, "print the plan with every rejection (with --json: and the programs)");
}

models::ModelConfig config_from(const ModelArgs& a, const contracts::Registry& reg) {
  models::ModelConfig c = models::demo_config();
  c.layers = a.layers;
  c.dtype = ir::parse_dtype(a.dtype, "--dtype");
  c.consumer = a.consumer;
  c.format = a.format;
  c.seed = a.seed;
  if (a.tokens > 0) models::set_total_tokens(c, a.tokens);
  for (const auto& name : a.patches) {
    const auto& p = reg.patch(name);
    const bool mlp = p.modifies.count(contracts::TensorRole::MlpHidden) != 0;
    (mlp ? c.mlp_patches : c.attn_patches).push_back(name);
  }
  return c;
}

// The chooser compares estimated times: the device's rates are measured once (cached per
// device) first.
plan::Options plan_options(const ModelArgs& a, contracts::DeviceCaps& dev, const at::Device& d) {
  exec::apply_rates(exec::probe_device(d, dev), dev);
  plan::Options o;
  o.token_chunk = a.chunk;
  o.feature_slice = a.feature_slice;
  if (!a.budget.empty()) o.budget_bytes = plan::budget_from_option(a.budget, dev);
  return o;
}

int cmd_plan(const ModelArgs& a) {
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device(a.device);
  auto dev = exec::describe_device(d);
  const ir::Model m = models::build_ir(config_from(a, reg));
  const plan::Plan p = plan::make_plan(m, reg, dev, plan_options(a, dev, d));
  if (a.json) {
    nlohmann::json j{{"model", m.name}, {"tokens", m.tokens()}, {"device", dev.name}, {"dtype", ir::to_string(m.dtype)}};
    j["planned"] = {{"estimated_peak_bytes", p.estimated_peak_bytes}};
    j["floor_bytes"] = p.floor_bytes;
    j["plan"] = report::to_json(p);
    if (a.explain || a.program) {
      nlohmann::json progs = nlohmann::json::array();
      for (const auto& prog : report::programs(m, p, reg, dev)) progs.push_back(report::to_json(prog, dev));
      j["programs"] = progs;
    }
    std::cout << j.dump(2) << "\n";
  } else if (a.program) {
    for (const auto& prog : report::programs(m, p, reg, dev)) {
      const plan::Placement pl = plan::place(prog, dev);
      std::cout << plan::to_text(prog, pl.offset, pl.arena_bytes);
    }
  } else {
    std::cout << plan::explain(p);
  }
  return 0;
}

int cmd_demo(const ModelArgs& a) {
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device(a.device);
  auto dev = exec::describe_device(d);
  exec::install_cpu_meter();
  const models::Instance inst = models::instantiate(config_from(a, reg), reg, d);
  const plan::Plan p = plan::make_plan(inst.model, reg, dev, plan_options(a, dev, d));
  if (!a.json) std::cout << plan::explain(p) << "\n";
  const report::RunReport r = report::compare(inst, p, reg, dev, {});
  if (a.json) std::cout << report::to_json(r).dump(2) << "\n";
  else std::cout << report::to_table(r);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"streamplan: run transformer models with bounded activation memory"};
  app.require_subcommand(1);
  ModelArgs demo_args, plan_args;
  auto* demo = app.add_subcommand("demo", "run the embedded default model: naive vs planned");
  add_model_options(demo, demo_args);
  auto* plan_cmd = app.add_subcommand("plan", "print the plan for the demo model without running it");
  add_model_options(plan_cmd, plan_args);
  plan_cmd->add_flag("--program", plan_args.program, "print the schedule program of every sublayer");
  const std::vector<sp::cli::Runner> runners = {sp::cli::add_run(app), sp::cli::add_make_checkpoint(app),
                                                 sp::cli::add_bench(app)};
  CLI11_PARSE(app, argc, argv);
  try {
    if (demo->parsed()) return cmd_demo(demo_args);
    if (plan_cmd->parsed()) return cmd_plan(plan_args);
    for (const auto& r : runners)
      if (int rc = r(); rc >= 0) return rc;
    return 1;
  } catch (const sp::plan::BudgetError& e) {
    std::cerr << "streamplan: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "streamplan: error: " << e.what() << "\n";
    return 1;
  }
}
