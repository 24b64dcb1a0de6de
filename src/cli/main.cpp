// streamplan command line: its commands, options and exit status are docs/cli.md. Every error
// is one line on stderr that starts with "streamplan: error: ".
#include <CLI/CLI.hpp>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <iostream>
#include <new>
#include <optional>

#include "cli/checkpoint_model.hpp"
#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "cli/sparse_run.hpp"
#include "exec/registry.hpp"
#include "exec/device/device.hpp"
#include "exec/device/memory.hpp"
#include "exec/device/probe.hpp"
#include "exec/residency/streamed.hpp"
#include "models/builder.hpp"
#include "plan/budget.hpp"
#include "plan/residency.hpp"
#include "models/checkpoint.hpp"
#include "models/quant_load.hpp"
#include "report/feasibility.hpp"
#include "report/formats_text.hpp"
#include "report/report.hpp"
#include "exec/run/retry.hpp"

namespace {

using namespace sp;

struct ModelArgs {
  int64_t tokens = models::demo_config().tokens();
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
  std::string explain;  // "", "grouped" or "full"
  bool program = false;
  bool quiet = false;
  // plan --checkpoint: a checkpoint's model at a geometry instead of the demo model.
  std::string checkpoint, sidecar;
  models::Geometry geom;
  // plan --ranks: one rank's plan of a sequence-parallel run.
  int64_t ranks = 1, rank = 0;
  std::string sequence = "ulysses";
  double link_rate = 0;  // GB/s; 0: the device's default
  // plan --device-memory: the weights' arrangement with the plan (a checkpoint's weights).
  std::string device_memory, weights = "auto";
  const CLI::App* cmd = nullptr;  // which options were given
  bool given(const char* option) const { return cmd && cmd->count(option) > 0; }
};

void add_model_options(CLI::App* cmd, ModelArgs& a) {
  a.cmd = cmd;
  static const contracts::Registry reg = exec::builtin_registry();
  cmd->add_option("--tokens", a.tokens, "total tokens (text + video) of the demo model")
      ->check(cli::at_least(1))
      ->capture_default_str();
  cmd->add_option("--layers", a.layers, "number of blocks")->check(cli::between(1, 1000))->capture_default_str();
  cmd->add_option("--dtype", a.dtype, "activation dtype")
      ->check(CLI::IsMember(ir::activation_dtype_names()))
      ->capture_default_str();
  cmd->add_option("--consumer", a.consumer, "attention consumer (auto: the fastest exact one)")
      ->check(CLI::IsMember([&] {
        auto names = reg.consumer_names();
        names.push_back("auto");
        return names;
      }()))
      ->capture_default_str();
  cmd->add_option("--format", a.format, "weight format of the block linears")
      ->check(CLI::IsMember(reg.format_names()))
      ->capture_default_str();
  cmd->add_option("--patch", a.patches, "patch to apply (repeatable)")->check(CLI::IsMember(reg.patch_names()));
  cmd->add_option("--chunk", a.chunk, "token chunk (default: automatic)")->check(cli::at_least(1));
  cmd->add_option("--feature-slice", a.feature_slice, "MLP feature slice (default: automatic; -1: off)")
      ->check(cli::feature_slice_check());
  cmd->add_option("--device", a.device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  cmd->add_option("--seed", a.seed, "random seed of weights and inputs")->capture_default_str();
  cmd->add_option("--budget", a.budget, "activation memory budget: bytes, 512MiB, 2.5GiB, ... or auto (default: none)");
  cmd->add_flag("--json", a.json, "print the run report as JSON");
  cli::add_explain_option(cmd, a.explain, "print the plan with every rejection and the linears' formats (with --json: and the programs)");
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

std::string planning(const ir::Model& m) { return "planning " + std::to_string(m.blocks.size()) + " blocks"; }

// The demo model's formats: every linear in --format (the builder stores them so).
std::vector<models::FormatLine> demo_formats(const ir::Model& m, const contracts::Registry& reg,
                                             const contracts::DeviceCaps& dev, const std::string& format) {
  auto lines = models::format_lines(m, exec::TensorWeights(&reg), reg, dev);
  for (auto& l : lines) l.why = "the demo model's --format " + format;
  return lines;
}

// What the demo model keeps on the device besides activations: its linears' weights and,
// about, its inputs (the tokens and the per-segment tables), from the IR alone.
std::pair<int64_t, int64_t> demo_kept_bytes(const ir::Model& m) {
  const int64_t size = int64_t(ir::dtype_size(m.dtype));
  int64_t weights = 0;
  ir::for_each_linear(const_cast<ir::Model&>(m), [&](ir::Linear& l) { weights += l.in_features * l.out_features * size; });
  return {weights, 2 * m.tokens() * m.dim * size};
}

// Options that the chosen model has no use for: with --checkpoint those of the demo model,
// without it those of a checkpoint's geometry.
void check_plan_options(const ModelArgs& a) {
  const bool checkpoint = !a.checkpoint.empty();
  const std::vector<const char*> demo_only = {"--layers", "--format", "--patch"},
                                 checkpoint_only = {"--sidecar", "--frames",      "--height",
                                                    "--width",   "--text-tokens", "--audio-tokens"};
  for (const char* o : checkpoint ? demo_only : checkpoint_only)
    if (a.given(o))
      throw std::invalid_argument(std::string(o) + " " + a.cmd->get_option(o)->results().front() +
                                  (checkpoint ? ": applies to the demo model, not with --checkpoint (the checkpoint sets it)"
                                              : ": applies with --checkpoint only (the demo model takes --tokens and --layers)"));
}

int cmd_plan(ModelArgs a) {
  check_plan_options(a);
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device(a.device);
  auto dev = exec::run_device(d);
  if (a.given("--link-rate")) {
    if (a.ranks < 2)
      throw std::invalid_argument("--link-rate " + a.cmd->get_option("--link-rate")->results().front() +
                                  ": prices the exchanges between ranks, so applies with --ranks 2 or more");
    dev.rates.link_bytes_per_s = a.link_rate * 1e9;
  }
  report::Progress progress("plan", !a.quiet);
  std::optional<cli::MetaModel> mm;
  std::string variant;
  const ir::Model m = [&] {
    if (a.checkpoint.empty()) return models::build_ir(config_from(a, reg));
    if (a.given("--tokens")) a.geom.tokens = a.tokens;
    const auto phase = progress.phase("reading the checkpoint's header");
    const auto file = io::SafetensorsFile::open(a.checkpoint);
    const auto sidecar = a.sidecar.empty() ? models::sidecar_of(file) : recognize::load_sidecar(a.sidecar);
    const auto rec = recognize::recognize(file, sidecar);
    variant = rec.config.variant + " (" + rec.layout + " layout) from " + a.checkpoint;
    const ir::DType dtype = cli::run_dtype(a.given("--dtype") ? a.dtype : "auto", d);
    mm = cli::meta_model(file, rec, "", a.geom, a.seed, dtype, cli::resolve_consumer(a.consumer), reg);
    return mm->model;
  }();
  plan::Options po = exec::plan_options({a.chunk, a.feature_slice, a.budget}, d);
  if (a.rank >= a.ranks)
    throw std::invalid_argument("--rank " + std::to_string(a.rank) + ": must be below --ranks " + std::to_string(a.ranks));
  po.sequence = {a.rank, a.ranks, a.sequence == "ring" ? plan::SeqMode::Ring : plan::SeqMode::Ulysses};
  const bool arranged = a.given("--device-memory") || a.given("--weights");
  if (arranged && !mm)
    throw std::invalid_argument(std::string(a.given("--weights") ? "--weights" : "--device-memory") +
                                ": applies with --checkpoint only (the weights it arranges are the checkpoint's)");
  if (a.weights == "sharded" && a.ranks < 2)
    throw std::invalid_argument("--weights sharded: shares the weights over the ranks of --ranks 2 or more, got --ranks " +
                                std::to_string(a.ranks));
  // The slabs every rank's exchanges trade, as a run agrees on them: each the smallest any
  // rank's plan chose (every rank planned here, with this device's rates).
  if (po.sequence.split()) {
    const auto phase = progress.phase("agreeing on the exchanges of " + std::to_string(a.ranks) + " ranks");
    std::vector<int64_t> slabs;
    for (int64_t r = 0; r < a.ranks; ++r) {
      plan::Options o = po;
      o.sequence.rank = r;
      const std::vector<int64_t> mine = plan::exchange_slabs(plan::make_plan(m, reg, dev, o));
      if (slabs.empty()) slabs = mine;
      for (size_t i = 0; i < slabs.size(); ++i) slabs[i] = std::min(slabs[i], mine[i]);
    }
    po.slabs = slabs;
  }
  std::optional<plan::Residency> res;
  const plan::Plan p = [&] {
    const auto phase = progress.phase(planning(m));
    if (!arranged) return plan::make_plan(m, reg, dev, po);
    plan::ResidencyRequest rq = exec::residency_request(m, *mm->weights, {}, reg, dev);
    rq.fixed_bytes += mm->input_bytes;
    if (!a.device_memory.empty()) rq.device_memory = plan::parse_budget(a.device_memory);
    rq.split = a.weights == "sharded"      ? plan::WeightSplit::Sharded
               : a.weights == "replicated" ? plan::WeightSplit::Replicated
                                           : plan::WeightSplit::Auto;
    plan::ResidentPlan rp = plan::plan_with_residency(m, reg, dev, po, rq);
    res = rp.residency;
    return std::move(rp.plan);
  }();
  const auto phase = progress.phase("writing the plan");
  const auto formats = [&] {
    return mm ? models::format_lines(m, *mm->weights, reg, dev) : demo_formats(m, reg, dev, a.format);
  };
  if (a.json) {
    nlohmann::json j = report::plan_document(m, p, reg, dev, !a.explain.empty() || a.program);
    if (mm) j["formats"] = models::formats_json(formats());
    if (mm && !mm->note.empty()) j["note"] = mm->note;
    if (res) j["residency"] = report::to_json(*res);
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  if (!variant.empty()) std::cout << variant << "\n";
  if (mm && !mm->note.empty()) std::cout << "note: " << mm->note << "\n";
  if (a.program) {
    for (const plan::Part* part : plan::parts(p))
      std::cout << plan::to_text(part->program, part->placement.offset, part->placement.arena_bytes);
    return 0;
  }
  std::cout << plan::explain(p, a.explain == "full");
  if (res) std::cout << plan::explain(*res) << "\n";
  if (!a.explain.empty()) std::cout << report::formats_text(m, formats(), a.explain == "full");
  return 0;
}

int cmd_demo(const ModelArgs& a) {
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device(a.device);
  const auto dev = exec::run_device(d);
  exec::install_cpu_meter();
  report::Progress progress("demo", !a.quiet);
  const models::ModelConfig config = config_from(a, reg);
  plan::Options po = exec::plan_options({a.chunk, a.feature_slice, a.budget}, d);
  // Before any weight is made: can the run fit at all (report/feasibility.hpp)?
  const report::Fit fit = [&] {
    const ir::Model m = models::build_ir(config);
    const auto phase = progress.phase(planning(m) + " against the device's memory");
    const auto [weights, inputs] = demo_kept_bytes(m);
    report::FitRequest rq;
    rq.kept_bytes = weights + inputs;
    rq.weight_bytes = weights;
    rq.kept_text = "weights " + plan::human_bytes(weights) + " + inputs about " + plan::human_bytes(inputs);
    rq.naive = true;
    rq.budget_given = !a.budget.empty();
    rq.command = "demo";
    return report::check_fit(m, reg, dev, po, rq);
  }();
  const models::Instance inst = [&] {
    const auto phase = progress.phase("generating weights and inputs");
    return models::instantiate(config, reg, d);
  }();
  if (fit.auto_budget) {
    std::cerr << "streamplan: warning: " << fit.note << "\n";
    po.budget_bytes = plan::budget_auto(exec::describe_device(d));
  }
  const plan::Plan p = [&] {
    const auto phase = progress.phase(planning(inst.model));
    return plan::make_plan(inst.model, reg, dev, po);
  }();
  if (!a.json) {
    std::cout << plan::explain(p, a.explain == "full") << "\n";
    if (!a.explain.empty())
      std::cout << report::formats_text(inst.model, demo_formats(inst.model, reg, dev, a.format), a.explain == "full");
  }
  report::CompareOptions opt;
  opt.progress = !a.quiet;
  opt.reporter = &progress;
  progress.note(report::estimate_text(p, opt, d.is_cuda()));
  const report::RunReport r = report::compare(inst, p, reg, dev, opt);
  // A probe far off what the run measured is not kept for the next run.
  if (const std::string note = exec::forget_if_off(dev, p.estimated_ms, r.planned.ms); !note.empty())
    std::cerr << "streamplan: note: " << note << "\n";
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
  std::string where;
  for (const auto& c : e.context()) where += " " + c;
  std::string m = "out of memory in '" + command + "'" + where;
  // The CPU allocator's message starts with the failed check ("[enforce fail at ...] err == 0.");
  // CUDA's goes on after the free memory with allocator statistics and tuning advice.
  std::string msg = first_line(e.msg());
  if (const size_t cpu = msg.find("DefaultCPUAllocator"); cpu != std::string::npos) msg = msg.substr(cpu);
  if (const size_t stats = msg.find(" Including non-PyTorch memory"); stats != std::string::npos) msg.resize(stats);
  m += ": " + msg;
  // Advice only where it changes the outcome: the schedule that ran out says which.
  if (where.find("naive schedule") != std::string::npos && command == "run")
    m += " (--planned-only runs the planned schedule alone)";
  else if (where.find("planned schedule") != std::string::npos)
    m += " (--budget auto fits the planned schedule into the free memory)";
  return m;
}

// The subcommands, for "unknown subcommand" and "a subcommand is required".
std::string command_list(const CLI::App& app) {
  std::string s;
  for (const auto* c : app.get_subcommands({})) s += (s.empty() ? "the commands are " : ", ") + c->get_name();
  return s + " (streamplan --help describes them)";
}

// Edits (insertions, deletions, substitutions) from a to b.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// A first argument that is no option and no subcommand: "unknown subcommand 'rn'", the
// commands, and the nearest one where it is a slip away.
std::optional<std::string> unknown_subcommand(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return std::nullopt;
  const std::string given = argv[1];
  std::string nearest;
  size_t best = 3;  // at most two edits away
  for (const auto* c : app.get_subcommands({})) {
    if (c->get_name() == given) return std::nullopt;
    if (const size_t e = edit_distance(given, c->get_name()); e < best) best = e, nearest = c->get_name();
  }
  return "unknown subcommand '" + given + "'" + (nearest.empty() ? "" : " (did you mean '" + nearest + "'?)") + "; " +
         command_list(app);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"streamplan: run transformer models with bounded activation memory"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text(), "print the version, the build kind and the torch version");
  ModelArgs demo_args, plan_args;
  auto* demo = app.add_subcommand("demo", "run the embedded default model: naive vs planned");
  add_model_options(demo, demo_args);
  auto* plan_cmd = app.add_subcommand("plan", "print the plan for the demo model or a checkpoint without running it");
  add_model_options(plan_cmd, plan_args);
  plan_cmd->add_flag("--program", plan_args.program, "print the schedule program of every sublayer");
  plan_cmd->add_option("--checkpoint", plan_args.checkpoint,
                       "plan this safetensors checkpoint (read: its header only) at the geometry of --frames/--height/"
                       "--width or --tokens (video tokens in one row), as run would")
      ->check(CLI::ExistingFile);
  plan_cmd->add_option("--sidecar", plan_args.sidecar, "with --checkpoint: sidecar descriptor (JSON)")->check(CLI::ExistingFile);
  sp::cli::add_geometry_options(plan_cmd, plan_args.geom, /*tokens=*/false);
  plan_cmd->add_option("--ranks", plan_args.ranks, "plan one rank of a sequence-parallel run over this many ranks")
      ->check(cli::between(1, 1024))
      ->capture_default_str();
  plan_cmd->add_option("--rank", plan_args.rank, "with --ranks: the rank whose plan to print")
      ->check(cli::at_least(0))
      ->capture_default_str();
  plan_cmd->add_option("--sequence", plan_args.sequence, "with --ranks: how attention sees the other ranks' rows")
      ->check(CLI::IsMember({"ulysses", "ring"}))
      ->capture_default_str();
  sp::cli::add_link_rate_option(plan_cmd, plan_args.link_rate, "with --ranks", "200 on a GPU, 2 on a CPU");
  plan_cmd->add_option("--device-memory", plan_args.device_memory,
                       "with --checkpoint: plan the weights' arrangement too, within this much device memory per "
                       "rank (e.g. 24GiB): blocks kept, streamed from host memory or, with --ranks, sharded");
  plan_cmd->add_option("--weights", plan_args.weights,
                       "with --checkpoint and --ranks: how the ranks hold the blocks' weights (auto: the fastest "
                       "arrangement within --device-memory)")
      ->check(CLI::IsMember({"auto", "replicated", "sharded"}))
      ->capture_default_str();
  const std::vector<sp::cli::Runner> runners = {sp::cli::add_run(app), sp::cli::add_make_checkpoint(app),
                                                 sp::cli::add_bench(app), sp::cli::add_convert(app),
                                                 sp::cli::add_bench_attention(app), sp::cli::add_probe(app)};
  if (const auto unknown = unknown_subcommand(app, argc, argv)) return fail(1, *unknown);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --help-all, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (app.get_subcommands().empty())
      return fail(1, std::string(e.what()) + ": " + command_list(app));
    return fail(1, std::string(e.what()) + " (streamplan " + app.get_subcommands().front()->get_name() +
                       " --help lists the options)");
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
  } catch (const sp::exec::OutOfMemory& e) {
    return fail(3, e.what());
  } catch (const std::bad_alloc&) {
    return fail(3, "out of host memory in '" + command + "'");
  } catch (const c10::Error& e) {
    if (sp::exec::is_out_of_memory(e)) return fail(3, out_of_memory(command, e));
    return fail(4, "internal error in '" + command + "': " + first_line(e.what_without_backtrace()) + " (please report it)");
  } catch (const std::invalid_argument& e) {
    return fail(1, e.what());
  } catch (const std::logic_error& e) {
    return fail(4, "internal error in '" + command + "': " + e.what() + " (please report it)");
  } catch (const std::exception& e) {
    return fail(1, e.what());
  }
}
