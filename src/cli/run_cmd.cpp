// streamplan run: one denoiser forward of a checkpoint, naive vs planned.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "cli/checkpoint_model.hpp"
#include "cli/commands.hpp"
#include "cli/kv_options.hpp"
#include "cli/options.hpp"
#include "cli/ranks.hpp"
#include "cli/run_args.hpp"
#include "cli/output_check.hpp"
#include "cli/sparse_run.hpp"
#include "exec/registry.hpp"
#include "exec/device/device.hpp"
#include "exec/device/memory.hpp"
#include "exec/device/probe.hpp"
#include "exec/residency/streamed.hpp"
#include "models/checkpoint.hpp"
#include "models/convert.hpp"
#include "models/families.hpp"
#include "models/lora_file.hpp"
#include "models/quant_load.hpp"
#include "plan/budget.hpp"
#include "plan/residency.hpp"
#include "report/feasibility.hpp"
#include "report/formats_text.hpp"
#include "report/report.hpp"

namespace sp::cli {

namespace {

// --nproc --precision fp8|int8: the blocks' linears converted once, as `streamplan convert`
// writes them (the weights --precision makes at load), into a temporary file the ranks read;
// removed when they end (or on SIGINT / SIGTERM).
int spawn_converted(const RunArgs& a, const at::Device& d, const contracts::Registry& reg) {
  const models::Precision p = models::parse_precision(a.precision);
  models::check_precision_device(p, exec::run_device(d));
  const models::Conversion c(a.checkpoint, {models::precision_format(p)}, reg);
  const std::string tmp =
      (std::filesystem::temp_directory_path() / ("streamplan-ranks-" + std::to_string(getpid()) + ".safetensors"))
          .string();
  check_free_space("--precision " + a.precision + ": the ranks' converted checkpoint", tmp, c.report().file_bytes);
  {
    TempFileGuard guard(tmp + ".tmp");
    c.write(tmp);
  }
  struct Removed {  // however the ranks end
    const std::string& path;
    ~Removed() {
      std::error_code ignored;
      std::filesystem::remove(path, ignored);
    }
  } removed{tmp};
  setenv(kRanksCheckpointEnv, tmp.c_str(), 1);
  TempFileGuard guard(tmp);
  return spawn_ranks(a.nproc);
}

// run --nproc, or one rank under torchrun's environment.
int run_ranks(const RunArgs& a) {
  const auto env = rank_env();
  if (a.precision != "preserve" && env && !std::getenv(kRanksCheckpointEnv))
    throw std::invalid_argument("--precision " + a.precision + ": under torchrun each process is one rank, and none "
                                "converts the weights for the others; write the checkpoint in that precision first "
                                "(streamplan convert IN OUT --to " + a.precision + ") and run that");
  for (const char* o : {"--resident-blocks", "--planned-only", "--chunk", "--feature-slice"})
    if (a.given(o)) throw std::invalid_argument(std::string(o) + ": does not combine with --nproc (sequence parallel)");
  const std::string consumer = resolve_consumer(a.consumer);
  check_kv_options(*a.cmd, a.kv, consumer);
  if (!env) {  // what every rank would find about its consumer and device, said once
    const at::Device d = exec::pick_device(a.device);
    const auto reg = exec::builtin_registry();  // a conversion reads it as it writes
    require_consumer_device(reg, consumer, d, run_dtype(a.dtype, d));
    return a.precision == "preserve" ? spawn_ranks(a.nproc) : spawn_converted(a, d, reg);
  }
  if (a.nproc > 0 && a.nproc != env->size)
    throw std::invalid_argument("--nproc " + std::to_string(a.nproc) + ": WORLD_SIZE of this rank's environment is " +
                                std::to_string(env->size));
  return run_rank(a, *env);
}

int run(const RunArgs& a) {
  if (a.nproc > 0 || rank_env()) return run_ranks(a);
  for (const char* o : {"--sequence", "--weights", "--check", "--link-rate"})
    if (a.given(o)) throw std::invalid_argument(std::string(o) + ": applies to sequence-parallel runs (--nproc)");
  auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device(a.device);
  exec::install_cpu_meter();
  report::Progress progress("run", !a.quiet);
  const auto file = io::SafetensorsFile::open(a.checkpoint);
  const auto sidecar = a.sidecar.empty() ? models::sidecar_of(file) : recognize::load_sidecar(a.sidecar);
  const auto rec = models::with_lora_hint(a.checkpoint, [&] { return recognize::recognize(file, sidecar); });
  const ir::DType dtype = run_dtype(a.dtype, d);
  const std::string consumer = resolve_consumer(a.consumer);
  check_kv_options(*a.cmd, a.kv, consumer);  // the options' values first, then the device
  require_consumer_device(reg, consumer, d, dtype);
  // Under a device-memory budget the weights are read into host memory; the residency moves
  // what stays on the device there once it is planned.
  const bool residency = !a.device_memory.empty() || !a.resident_blocks.empty();
  const auto dev = exec::run_device(d);
  // Before any weight is read: the model at its geometry from the checkpoint's header
  // (cli/checkpoint_model.hpp), and whether the run can fit at all (report/feasibility.hpp).
  const MetaModel mm = [&] {
    const auto phase = progress.phase("building the model from the checkpoint's header");
    return meta_model(file, rec, a.inputs, a.geom, a.seed, dtype, consumer, reg);
  }();
  const SparseRun sparse = prepare_sparse(consumer, mm.model, a.kv);
  const report::Fit fit = [&] {
    const auto phase = progress.phase("planning " + std::to_string(mm.model.blocks.size()) + " blocks against " +
                                      (d.is_cpu() ? "the host's memory" : "the device's memory"));
    const bool weights_on_device = !residency || d.is_cpu();
    report::FitRequest rq;
    rq.weight_bytes = weights_on_device ? mm.weight_bytes : 0;
    rq.kept_bytes = rq.weight_bytes + mm.input_bytes;
    rq.kept_text = (weights_on_device ? "weights " + plan::human_bytes(mm.weight_bytes) + " + " : std::string()) +
                   "inputs " + plan::human_bytes(mm.input_bytes);
    rq.naive = !a.planned_only && !residency;
    rq.streams_weights = residency;
    rq.budget_given = !a.budget.empty() && a.budget != "auto";
    rq.command = "run";
    const plan::Options po =
        exec::plan_options({a.chunk, a.feature_slice, rq.budget_given ? a.budget : "", sparse.budget}, d);
    return report::check_fit(mm.model, reg, dev, po, rq);
  }();
  if (mm.raw.empty()) throw plan::BudgetError("run: " + mm.note, 0, 0);
  auto weights = [&] {
    const auto phase = progress.phase("reading the weights");
    return models::load_canonical(file, rec, exec::to_aten(dtype), residency ? at::Device(at::kCPU) : d, reg);
  }();
  // The inputs the check was made with.
  models::FamilyRun fr = models::prepare_loaded(rec.config, *weights, reg, mm.raw, dtype, consumer);
  if (residency)
    for (auto* group : {&fr.inputs.tokens, &fr.inputs.tables})
      for (auto& [name, t] : *group) t = t.to(d);
  std::vector<models::LoraInput> lora_inputs;
  for (const auto& spec : a.loras) lora_inputs.push_back(models::read_lora(spec));
  models::LoraSet lora =
      models::load_loras(lora_inputs, rec.config, exec::to_aten(dtype), residency ? at::Device(at::kCPU) : d);
  for (const auto& [name, t] : lora.tensors) weights->add(name, t);
  lora.attach(fr.model);
  const models::Precision precision = models::parse_precision(a.precision);
  models::apply_precision(fr.model, *weights, precision, dev);
  const models::Instance inst{fr.model, weights, fr.inputs};
  // An automatic budget is read once the weights and inputs are resident.
  plan::Options po = exec::plan_options({a.chunk, a.feature_slice, a.budget, sparse.budget}, d);
  if (a.budget.empty() && fit.auto_budget) {
    std::cerr << "streamplan: warning: " << fit.note << "\n";
    po.budget_bytes = plan::budget_auto(exec::describe_device(d));
  }
  std::optional<plan::Residency> res;
  const plan::Plan p = [&] {
    const auto phase = progress.phase("planning " + std::to_string(inst.model.blocks.size()) + " blocks");
    if (!residency) return plan::make_plan(inst.model, reg, dev, po);
    plan::ResidencyRequest rq = exec::residency_request(inst.model, *inst.weights, inst.inputs, reg, dev);
    if (!a.device_memory.empty()) rq.device_memory = plan::parse_budget(a.device_memory);
    rq.resident_blocks = parse_resident_blocks(a.resident_blocks);
    plan::ResidentPlan rp = plan::plan_with_residency(inst.model, reg, dev, po, rq);
    res = rp.residency;
    return rp.plan;
  }();
  const auto formats = models::format_lines(inst.model, *weights, reg, dev, precision);
  if (!a.json) {
    std::cout << rec.config.variant << " (" << rec.layout << " layout) from " << a.checkpoint << "\n";
    if (!a.loras.empty()) std::cout << lora.summary();
    std::cout << models::outside_summary(formats);
    if (!a.explain.empty())
      std::cout << plan::explain(p, a.explain == "full") << "\n"
                << report::formats_text(inst.model, formats, a.explain == "full");
    if (res) std::cout << plan::explain(*res) << "\n";
  }
  report::CompareOptions opt;
  std::unique_ptr<exec::StreamedWeights> streamed;
  std::shared_ptr<void> cap;
  if (res) {
    const auto phase = progress.phase("moving the weights into place");
    streamed = std::make_unique<exec::StreamedWeights>(inst.model, weights, *res, reg, d);
    opt.weights = streamed.get();
    if (res->device_memory > 0) {
      cap = exec::cap_device_memory(d, res->device_memory);
      opt.memory_cap = "--device-memory " + plan::human_bytes(res->device_memory);
    }
  }
  opt.progress = !a.quiet;
  opt.reporter = &progress;
  // The naive schedule holds every weight and full-size intermediates: not under a device-memory budget.
  opt.run_naive = !a.planned_only && !residency;
  opt.keep_outputs = true;  // written with --output; counted for non-finite values
  progress.note(report::estimate_text(p, opt, d.is_cuda()));
  const report::RunReport r = report::compare(inst, p, reg, dev, opt);
  // A probe far off what the run measured is not kept for the next run.
  if (const std::string note = exec::forget_if_off(dev, p.estimated_ms, r.planned.ms); !note.empty())
    std::cerr << "streamplan: note: " << note << "\n";
  const int64_t nonfinite = r.planned_out.isfinite().logical_not().sum().item<int64_t>();
  if (nonfinite > 0)
    std::cerr << "streamplan: warning: output has " << nonfinite << " non-finite values (NaN or Inf) of "
              << r.planned_out.numel() << "\n";
  if (!a.output.empty()) {
    models::TensorMap out;
    for (const auto& [prefix, rows] : {std::pair{"", r.planned_out}, {"naive_", r.naive_out}}) {
      if (!rows.defined()) continue;
      out[prefix + std::string("output")] = fr.finish(rows).cpu();
      if (fr.named_outputs)
        for (const auto& [name, t] : fr.named_outputs(rows)) out[prefix + std::string("output_") + name] = t.cpu();
    }
    models::write_tensors(a.output, out);
  }
  if (a.json) {
    nlohmann::json j = report::to_json(r);
    if (res) j["residency"] = report::to_json(*res);
    if (!a.loras.empty()) j["lora"] = lora.json();
    j["formats"] = models::formats_json(formats);
    j["nonfinite"] = nonfinite;
    if (sparse.active) j["sparse_attention"] = sparse.json();
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << report::to_table(r);
    if (sparse.active) std::cout << sparse.text();
  }
  return 0;
}

}  // namespace

Runner add_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  auto* cmd = app.add_subcommand("run", "one denoiser forward of a checkpoint: naive vs planned");
  cmd->add_option("--checkpoint", a->checkpoint, "safetensors checkpoint")->required()->check(CLI::ExistingFile);
  cmd->add_option("--sidecar", a->sidecar, "sidecar descriptor (JSON); default: the checkpoint's metadata")
      ->check(CLI::ExistingFile);
  add_geometry_options(cmd, a->geom);
  cmd->add_option("--inputs", a->inputs, "inputs (safetensors; see docs/checkpoints.md) instead of random ones")
      ->check(CLI::ExistingFile);
  cmd->add_option("--output", a->output, "write the outputs (output, naive_output) to this safetensors file")
      ->check(output_file());
  cmd->add_option("--dtype", a->dtype, "activation dtype (auto: bf16 on CUDA, fp32 on the CPU)")
      ->check(CLI::IsMember([] {
        auto names = ir::activation_dtype_names();
        names.insert(names.begin(), "auto");
        return names;
      }()))
      ->capture_default_str();
  cmd->add_option("--device", a->device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  cmd->add_option("--consumer", a->consumer,
                  "attention consumer: sdpa, math, int8, sparse (CUDA only; sparse follows the --kv-budget options), or "
                  "auto (the fastest exact one)")
      ->capture_default_str();
  add_kv_options(cmd, a->kv);
  cmd->add_option("--chunk", a->chunk, "token chunk (default: automatic)")->check(at_least(1));
  cmd->add_option("--feature-slice", a->feature_slice, "MLP feature slice (default: automatic; -1: off)")
      ->check(feature_slice_check());
  cmd->add_option("--lora", a->loras, "LoRA file, FILE or FILE:STRENGTH (repeatable)");
  cmd->add_option("--seed", a->seed, "seed of the random inputs")->capture_default_str();
  cmd->add_option("--precision", a->precision,
                  "weights: preserve (as stored; quantized checkpoints run natively), fp8 or int8 (convert the "
                  "blocks' 16-bit linears at load)")
      ->check(CLI::IsMember({"preserve", "fp8", "int8"}))
      ->capture_default_str();
  cmd->add_option("--budget", a->budget, "activation memory budget: bytes, 512MiB, 2.5GiB, ... or auto (default: none)");
  cmd->add_option("--device-memory", a->device_memory,
                  "device memory the run may use for everything (weights, staging, activations): 8GiB, ...; weights "
                  "that do not fit stream from host memory");
  cmd->add_option("--resident-blocks", a->resident_blocks,
                  "blocks whose weights are on the device at once (N or auto; default auto under --device-memory)");
  cmd->add_option("--nproc", a->nproc,
                  "sequence parallel: run over this many ranks of this host (one GPU each on CUDA; gloo on the CPU); "
                  "under torchrun (RANK, WORLD_SIZE set) each process is one rank")
      ->check(at_least(1));
  cmd->add_option("--sequence", a->sequence, "with --nproc: how attention sees the other ranks' rows")
      ->check(CLI::IsMember({"ulysses", "ring"}))
      ->capture_default_str();
  cmd->add_option("--weights", a->weights,
                  "with --nproc: how the ranks hold the blocks' weights (auto: replicated, or under --device-memory "
                  "the fastest arrangement that fits)")
      ->check(CLI::IsMember({"auto", "replicated", "sharded"}))
      ->capture_default_str();
  add_link_rate_option(cmd, a->link_rate, "with --nproc", "measured over the ranks");
  cmd->add_flag("--check", a->check, "with --nproc: rank 0 also runs the forward alone and prints the rel L2 between them");
  cmd->add_flag("--planned-only", a->planned_only, "skip the naive run (shapes where only the planned one fits)");
  cmd->add_flag("--json", a->json, "print the run report as JSON");
  add_explain_option(cmd, a->explain, "print the plan with every rejection and the linears' formats");
  cmd->add_flag("--quiet", a->quiet, "no progress lines on stderr");
  a->cmd = cmd;
  return [cmd, a]() { return cmd->parsed() ? run(*a) : -1; };
}

}  // namespace sp::cli
