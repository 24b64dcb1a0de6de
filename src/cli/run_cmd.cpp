// streamplan run: one denoiser forward of a checkpoint, naive vs planned.
#include <iostream>

#include "cli/commands.hpp"
#include "cli/kv_options.hpp"
#include "cli/options.hpp"
#include "cli/sparse_run.hpp"
#include "exec/registry.hpp"
#include "exec/device/device.hpp"
#include "exec/device/memory.hpp"
#include "exec/device/probe.hpp"
#include "exec/residency/streamed.hpp"
#include "models/checkpoint.hpp"
#include "models/families.hpp"
#include "models/lora_file.hpp"
#include "models/quant_load.hpp"
#include "plan/budget.hpp"
#include "plan/residency.hpp"
#include "report/report.hpp"

namespace sp::cli {

namespace {

struct Args {
  std::string checkpoint, sidecar, inputs, output, dtype = "auto", device = "auto", consumer = "sdpa", budget;
  std::string device_memory, resident_blocks;
  std::vector<std::string> loras;
  std::string precision = "preserve";
  models::Geometry geom;
  int64_t chunk = 0, feature_slice = 0;
  uint64_t seed = 0;
  bool planned_only = false, json = false, explain = false, quiet = false;
  KvArgs kv;
};

ir::DType pick_dtype(const std::string& s, const at::Device& d) {
  if (s == "auto") return d.is_cuda() ? ir::DType::BF16 : ir::DType::F32;
  return ir::parse_dtype(s, "--dtype");
}

// The residency planner's request from the loaded weights and the options.
plan::ResidencyRequest residency_request(const models::Instance& inst, const contracts::Registry& reg,
                                         const contracts::DeviceCaps& dev, const Args& a) {
  plan::ResidencyRequest rq = exec::residency_request(inst.model, *inst.weights, inst.inputs, reg, dev);
  if (!a.device_memory.empty()) rq.device_memory = plan::parse_budget(a.device_memory);
  rq.resident_blocks = parse_resident_blocks(a.resident_blocks);
  return rq;
}

int run(const Args& a) {
  auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device(a.device);
  auto dev = exec::describe_device(d);
  exec::install_cpu_meter();
  report::Progress progress("run", !a.quiet);
  const auto file = io::SafetensorsFile::open(a.checkpoint);
  const auto sidecar = a.sidecar.empty() ? models::sidecar_of(file) : recognize::load_sidecar(a.sidecar);
  const auto rec = recognize::recognize(file, sidecar);
  const ir::DType dtype = pick_dtype(a.dtype, d);
  const std::string consumer = resolve_consumer(a.consumer);
  require_consumer_device(consumer, d, dtype);
  // Under a device-memory budget the weights are read into host memory; the residency moves
  // what stays on the device there once it is planned.
  const bool residency = !a.device_memory.empty() || !a.resident_blocks.empty();
  auto weights = [&] {
    const auto phase = progress.phase("reading the weights");
    return models::load_canonical(file, rec, exec::to_aten(dtype), residency ? at::Device(at::kCPU) : d, reg);
  }();
  models::TensorMap raw;
  if (!a.inputs.empty()) {
    raw = models::read_tensors(a.inputs);
  } else {
    if (a.geom.tokens <= 0 && a.geom.height <= 0)
      throw std::invalid_argument("run: give --inputs, --tokens, or the geometry (--frames/--height/--width)");
    raw = models::random_raw_inputs(rec.config, a.geom, a.seed);
  }
  models::FamilyRun fr = models::prepare(rec.config, *weights, raw, dtype, consumer);
  const SparseRun sparse = prepare_sparse(reg, consumer, fr.model, a.kv);
  if (residency)
    for (auto* group : {&fr.inputs.tokens, &fr.inputs.tables})
      for (auto& [name, t] : *group) t = t.to(d);
  std::vector<models::LoraInput> lora_inputs;
  for (const auto& spec : a.loras) lora_inputs.push_back(models::read_lora(spec));
  models::LoraSet lora =
      models::load_loras(lora_inputs, rec.config, exec::to_aten(dtype), residency ? at::Device(at::kCPU) : d);
  for (const auto& [name, t] : lora.tensors) weights->add(name, t);
  lora.attach(fr.model);
  models::apply_precision(fr.model, *weights, models::parse_precision(a.precision), dev);
  const models::Instance inst{fr.model, weights, fr.inputs};
  plan::Options po;
  po.token_chunk = a.chunk;
  po.feature_slice = a.feature_slice;
  // The chooser compares estimated times; an automatic budget is read once the weights and
  // inputs are resident.
  exec::apply_rates(exec::probe_device(d, dev), dev);
  if (!a.budget.empty()) po.budget_bytes = plan::budget_from_option(a.budget, exec::describe_device(d));
  std::optional<plan::Residency> res;
  const plan::Plan p = [&] {
    const auto phase = progress.phase("planning " + std::to_string(inst.model.blocks.size()) + " blocks");
    if (!residency) return plan::make_plan(inst.model, reg, dev, po);
    plan::ResidentPlan rp = plan::plan_with_residency(inst.model, reg, dev, po, residency_request(inst, reg, dev, a));
    res = rp.residency;
    return rp.plan;
  }();
  if (!a.json) {
    std::cout << rec.config.variant << " (" << rec.layout << " layout) from " << a.checkpoint << "\n";
    if (!a.loras.empty()) std::cout << lora.summary();
    if (a.explain) std::cout << plan::explain(p) << "\n" << models::formats_text(models::format_lines(inst.model, *weights, reg, dev));
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
  opt.keep_outputs = !a.output.empty();
  const report::RunReport r = report::compare(inst, p, reg, dev, opt);
  if (!a.output.empty()) {
    models::TensorMap out{{"output", fr.finish(r.planned_out).cpu()}};
    if (r.naive_out.defined()) out["naive_output"] = fr.finish(r.naive_out).cpu();
    if (fr.named_outputs) {
      for (const auto& [name, t] : fr.named_outputs(r.planned_out)) out["output_" + name] = t.cpu();
      if (r.naive_out.defined())
        for (const auto& [name, t] : fr.named_outputs(r.naive_out)) out["naive_output_" + name] = t.cpu();
    }
    models::write_tensors(a.output, out);
  }
  if (a.json) {
    nlohmann::json j = report::to_json(r);
    if (res) j["residency"] = report::to_json(*res);
    if (!a.loras.empty()) j["lora"] = {{"adapters", lora.adapter_count()}, {"unmatched", lora.unmatched}, {"unapplied", lora.unapplied}};
    j["formats"] = models::formats_json(models::format_lines(inst.model, *weights, reg, dev));
    if (sparse.active) j["sparse_attention"] = sparse.json(reg);
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << report::to_table(r);
    if (sparse.active) std::cout << sparse.text(reg);
  }
  return 0;
}

}  // namespace

Runner add_run(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("run", "one denoiser forward of a checkpoint: naive vs planned");
  cmd->add_option("--checkpoint", a->checkpoint, "safetensors checkpoint")->required()->check(CLI::ExistingFile);
  cmd->add_option("--sidecar", a->sidecar, "sidecar descriptor (JSON); default: the checkpoint's metadata")
      ->check(CLI::ExistingFile);
  cmd->add_option("--frames", a->geom.frames, "video frames (Wan: pixel frames 4k+1; avdit, MiniMax H3: latent frames)");
  cmd->add_option("--height", a->geom.height, "pixel height");
  cmd->add_option("--width", a->geom.width, "pixel width");
  cmd->add_option("--tokens", a->geom.tokens, "video/image tokens in one row instead of a geometry")
      ->check(at_least(1));
  cmd->add_option("--text-tokens", a->geom.text_tokens, "text tokens (default: the family's)")->check(at_least(1));
  cmd->add_option("--audio-tokens", a->geom.audio_tokens, "audio tokens (avdit); audio latent frames (MiniMax H3)")->check(at_least(1));
  cmd->add_option("--inputs", a->inputs, "inputs (safetensors; see docs/checkpoints.md) instead of random ones")
      ->check(CLI::ExistingFile);
  cmd->add_option("--output", a->output, "write the outputs (output, naive_output) to this safetensors file");
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
  cmd->add_option("--feature-slice", a->feature_slice, "MLP feature slice (default: automatic; -1: off)");
  cmd->add_option("--lora", a->loras, "LoRA file, FILE or FILE:STRENGTH (repeatable)");
  cmd->add_option("--seed", a->seed, "seed of the random inputs")->capture_default_str();
  cmd->add_option("--precision", a->precision,
                  "weights: preserve (as stored; quantized checkpoints run natively), fp8 or int8 (convert the "
                  "blocks' 16-bit linears at load)")
      ->check(CLI::IsMember({"preserve", "fp8", "int8"}))
      ->capture_default_str();
  cmd->add_option("--budget", a->budget, "activation memory budget: bytes, 512MiB, 2.5GiB, ... or auto (default: none)");
  add_residency_options(cmd, a->device_memory, a->resident_blocks);
  cmd->add_flag("--planned-only", a->planned_only, "skip the naive run (shapes where only the planned one fits)");
  cmd->add_flag("--json", a->json, "print the run report as JSON");
  cmd->add_flag("--explain", a->explain, "print the plan with every rejection");
  cmd->add_flag("--quiet", a->quiet, "no progress lines on stderr");
  return [cmd, a]() { return cmd->parsed() ? run(*a) : -1; };
}

}  // namespace sp::cli
