// streamplan command line.
//
//   streamplan demo [--tokens N] [--layers N] [--dtype fp32|bf16|fp16] [--json] ...
//   streamplan plan --explain [--consumer NAME] [--format NAME] [--patch NAME]... [--json]
//   streamplan run --checkpoint F [--frames/--height/--width | --tokens N | --inputs I] ...
//   streamplan make-checkpoint --family NAME [--layers N] [--layout L] [--tiny] --out F
//   streamplan bench [--cases a,b] [--reps N] [--out results.json]
//   streamplan bench-attention [--cases wan14b,h3-10s] [--kv-budgets 0.3,1] [--out rows.json]
//   streamplan --version
//
// Exit status (the table in README.md):
//   0  success, also --help and --version
//   1  bad input: an unknown, missing or malformed option, an unreadable or unrecognized
//      checkpoint, a model or geometry that cannot be built
//   2  a memory budget (--budget) that no schedule meets
//   3  out of memory while running
//   4  internal error: a bug, to be reported
// Every error is one line on stderr that starts with "streamplan: error: ". Work that runs
// longer than 2 s reports progress on stderr unless --quiet.
#include <CLI/CLI.hpp>
#include <torch/headeronly/version.h>

#include <iostream>
#include <new>

#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "cli/sparse_run.hpp"
#include "exec/registry.hpp"
#include "exec/device/device.hpp"
#include "exec/device/memory.hpp"
#include "exec/device/probe.hpp"
#include "models/builder.hpp"
#include "plan/arena.hpp"
#include "plan/budget.hpp"
#include "plan/residency.hpp"
#include "report/report.hpp"
#include "report/retry.hpp"

namespace {

using namespace sp;

int64_t demo_tokens() {
  int64_t n = 0;
  for (const auto& s : models::demo_config().segments) n += s.length;
  return n;
}

struct ModelArgs {
  int64_t tokens = demo_tokens();
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
  bool quiet = false;
};

void add_model_options(CLI::App* cmd, ModelArgs& a) {
  const auto& reg_names = [] {
    static contracts::Registry reg = exec::builtin_registry();
    return &reg;
  }();
  cmd->add_option("--tokens", a.tokens, "total tokens (text + video) of the demo model")
      ->check(cli::at_least(1))
      ->capture_default_str();
  cmd->add_option("--layers", a.layers, "number of blocks")->check(cli::between(1, 1000))->capture_default_str();
  cmd->add_option("--dtype", a.dtype, "activation dtype")
      ->check(CLI::IsMember(ir::activation_dtype_names()))
      ->capture_default_str();
  cmd->add_option("--consumer", a.consumer, "attention consumer (auto: the fastest exact one)")
      ->check(CLI::IsMember([&] {
        auto names = reg_names->consumer_names();
        names.push_back("auto");
        return names;
      }()))
      ->capture_default_str();
  cmd->add_option("--format", a.format, "weight format of the block linears")
      ->check(CLI::IsMember(reg_names->format_names()))
      ->capture_default_str();
  cmd->add_option("--patch", a.patches, "patch to apply (repeatable)")->check(CLI::IsMember(reg_names->patch_names()));
  cmd->add_option("--chunk", a.chunk, "token chunk (default: automatic)")->check(cli::at_least(1));
  cmd->add_option("--feature-slice", a.feature_slice, "MLP feature slice (default: automatic; -1: off)");
  cmd->add_option("--device", a.device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  cmd->add_option("--seed", a.seed, "random seed of weights and inputs")->capture_default_str();
  cmd->add_option("--budget", a.budget, "activation memory budget: bytes, 512MiB, 2.5GiB, ... or auto (default: none)");
  cmd->add_flag("--json", a.json, "print the run report as JSON");
  cmd->add_flag("--explain", a.explain, "print the plan with every rejection (with --json: and the programs)");
  cmd->add_flag("--quiet", a.quiet, "no progress lines on stderr");
}

models::ModelConfig config_from(const ModelArgs& a, const contracts::Registry& reg) {
  models::ModelConfig c = models::demo_config();
  c.layers = a.layers;
  c.dtype = ir::parse_dtype(a.dtype, "--dtype");
  c.consumer = cli::resolve_consumer(a.consumer);
  c.format = a.format;
  c.seed = a.seed;
  models::set_total_tokens(c, a.tokens);
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

std::string planning(const ir::Model& m) { return "planning " + std::to_string(m.blocks.size()) + " blocks"; }

int cmd_plan(const ModelArgs& a) {
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device(a.device);
  auto dev = exec::describe_device(d);
  report::Progress progress("plan", !a.quiet);
  const ir::Model m = models::build_ir(config_from(a, reg));
  const plan::Options po = plan_options(a, dev, d);
  const plan::Plan p = [&] {
    const auto phase = progress.phase(planning(m));
    return plan::make_plan(m, reg, dev, po);
  }();
  const auto phase = progress.phase("writing the plan");
  if (a.json) {
    std::cout << report::plan_document(m, p, reg, dev, a.explain || a.program).dump(2) << "\n";
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
  report::Progress progress("demo", !a.quiet);
  const models::Instance inst = [&] {
    const auto phase = progress.phase("generating weights and inputs");
    return models::instantiate(config_from(a, reg), reg, d);
  }();
  const plan::Options po = plan_options(a, dev, d);
  const plan::Plan p = [&] {
    const auto phase = progress.phase(planning(inst.model));
    return plan::make_plan(inst.model, reg, dev, po);
  }();
  if (!a.json) std::cout << plan::explain(p) << "\n";
  report::CompareOptions opt;
  opt.progress = !a.quiet;
  opt.reporter = &progress;
  const report::RunReport r = report::compare(inst, p, reg, dev, opt);
  if (a.json) std::cout << report::to_json(r).dump(2) << "\n";
  else std::cout << report::to_table(r);
  return 0;
}

std::string version_text() {
  std::string s = std::string("streamplan ") + STREAMPLAN_VERSION + "\n";
  if (std::string(STREAMPLAN_BUILD_KIND) == "CUDA")
    s += std::string("build: CUDA (nvcc ") + STREAMPLAN_NVCC_VERSION + ")\nCUDA architectures: " + STREAMPLAN_CUDA_ARCHS + "\n";
  else
    s += "build: CPU (no CUDA kernels)\n";
  return s + "torch: " + TORCH_VERSION;
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

int fail(int status, const std::string& message) {
  std::cerr << "streamplan: error: " << message << "\n";
  return status;
}

std::string out_of_memory(const std::string& command, const c10::Error& e) {
  std::string m = "out of memory in '" + command + "'";
  for (const auto& c : e.context()) m += " " + c;
  // The CPU allocator's message starts with the failed check ("[enforce fail at ...] err == 0.");
  // CUDA's goes on after the free memory with allocator statistics and tuning advice.
  std::string msg = first_line(e.msg());
  if (const size_t cpu = msg.find("DefaultCPUAllocator"); cpu != std::string::npos) msg = msg.substr(cpu);
  if (const size_t stats = msg.find(" Including non-PyTorch memory"); stats != std::string::npos) msg.resize(stats);
  m += ": " + msg;
  m += " (--budget auto fits the planned schedule into the free memory";
  if (command == "run") m += "; --planned-only skips the naive one";
  return m + ")";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"streamplan: run transformer models with bounded activation memory"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text(), "print the version, the build kind and the torch version");
  ModelArgs demo_args, plan_args;
  auto* demo = app.add_subcommand("demo", "run the embedded default model: naive vs planned");
  add_model_options(demo, demo_args);
  auto* plan_cmd = app.add_subcommand("plan", "print the plan for the demo model without running it");
  add_model_options(plan_cmd, plan_args);
  plan_cmd->add_flag("--program", plan_args.program, "print the schedule program of every sublayer");
  const std::vector<sp::cli::Runner> runners = {sp::cli::add_run(app), sp::cli::add_make_checkpoint(app),
                                                 sp::cli::add_bench(app), sp::cli::add_convert(app),
                                                 sp::cli::add_bench_attention(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --help-all, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const std::string help = app.get_subcommands().empty() ? "streamplan --help"
                                                            : "streamplan " + app.get_subcommands().front()->get_name() + " --help";
    return fail(1, std::string(e.what()) + " (" + help + " lists the options)");
  }
  const std::string command = app.get_subcommands().empty() ? "" : app.get_subcommands().front()->get_name();
  try {
    if (demo->parsed()) return cmd_demo(demo_args);
    if (plan_cmd->parsed()) return cmd_plan(plan_args);
    for (const auto& r : runners)
      if (int rc = r(); rc >= 0) return rc;
    return fail(4, "internal error: no runner for '" + command + "'");
  } catch (const sp::plan::BudgetError& e) {
    return fail(2, e.what());
  } catch (const sp::plan::DeviceMemoryError& e) {
    return fail(2, e.what());
  } catch (const sp::report::OutOfMemory& e) {
    return fail(3, e.what());
  } catch (const std::bad_alloc&) {
    return fail(3, "out of host memory in '" + command + "'");
  } catch (const c10::Error& e) {
    if (sp::report::is_out_of_memory(e)) return fail(3, out_of_memory(command, e));
    return fail(4, "internal error in '" + command + "': " + first_line(e.what_without_backtrace()) + " (please report it)");
  } catch (const std::invalid_argument& e) {
    return fail(1, e.what());
  } catch (const std::logic_error& e) {
    return fail(4, "internal error in '" + command + "': " + e.what() + " (please report it)");
  } catch (const std::exception& e) {
    return fail(1, e.what());
  }
}
