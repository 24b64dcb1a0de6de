#include "host/attached.hpp"

#include <chrono>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>

#include "exec/device/device.hpp"
#include "exec/device/probe.hpp"
#include "exec/patches/lora.hpp"
#include "models/families.hpp"
#include "plan/budget.hpp"
#include "plan/kv_budget.hpp"
#include "report/report.hpp"
#include "exec/run/retry.hpp"

namespace sp::host {

namespace {

// The activation dtype: the one named, else the 16/32-bit float dtype holding most of the
// module's bytes (8-bit weights are stored forms, cast or dequantized to it).
ir::DType module_dtype(const NamedTensors& tensors, const std::string& named) {
  if (!named.empty()) return ir::parse_dtype(named, "dtype");
  std::map<at::ScalarType, int64_t> bytes;
  for (const auto& [name, t] : tensors)
    if (t.is_floating_point() && t.element_size() > 1) bytes[t.scalar_type()] += int64_t(t.nbytes());
  if (bytes.empty())
    throw std::invalid_argument("module: it holds no 16- or 32-bit floating-point tensors (8-bit weights are cast "
                                "to a compute dtype: name it, dtype='bf16' or 'fp16' or 'fp32')");
  const auto most = std::max_element(bytes.begin(), bytes.end(), [](auto& a, auto& b) { return a.second < b.second; });
  if (const auto d = float_dtype(most->first)) return *d;
  throw std::invalid_argument(std::string("module: most of its parameter bytes are ") + c10::toString(most->first) +
                              "; streamplan runs modules held in float32, bfloat16 or float16");
}

// The device of the module's tensors. Byte tensors are descriptions, not data the forward
// computes with (ComfyUI's "<layer>.comfy_quant" JSON, which it keeps on the CPU while the
// weights move to the GPU; the quantization scan reads them there): they may be anywhere.
at::Device module_device(const NamedTensors& tensors) {
  const auto is_data = [](const auto& named) { return named.second.scalar_type() != at::kByte; };
  const auto first = std::find_if(tensors.begin(), tensors.end(), is_data);
  if (first == tensors.end()) throw std::invalid_argument("module: it holds no tensors");
  const at::Device d = first->second.device();
  for (const auto& [name, t] : tensors)
    if (t.scalar_type() != at::kByte && t.device() != d)
      throw std::invalid_argument("module: tensor '" + name + "' is on " + t.device().str() + ", tensor '" +
                                  first->first + "' on " + d.str() + "; move the module to one device first");
  if (d.is_meta())
    throw std::invalid_argument("module: its tensors are on the meta device (not loaded); load the weights first");
  return d;
}

// The device of a module whose host places its tensors itself (AttachOptions::in_place): the
// one device besides host memory that its tensors are on (module_device of those), which must
// be `run_on` where that is named; host memory where all of them are there.
at::Device held_device(const NamedTensors& tensors, const std::string& run_on) {
  NamedTensors off_host;
  for (const auto& named : tensors)
    if (named.second.scalar_type() != at::kByte && !named.second.device().is_cpu()) off_host.push_back(named);
  const at::Device run = run_on.empty() ? at::Device(at::kCPU) : exec::pick_device(run_on);
  if (off_host.empty()) return run;
  const at::Device d = module_device(off_host);
  if (!run_on.empty() && d != run)
    throw std::invalid_argument("module: tensor '" + off_host.front().first + "' is on " + d.str() +
                                ", the run's device is " + run.str() + "; its tensors may be there or in host memory");
  return d;
}

// The plan cache's key: the geometry and the run-time inputs the plan is made for.
std::string geometry_key(const ir::Model& m, double kv_budget) {
  std::string key;
  for (const auto& s : m.segments) key += (key.empty() ? "" : ", ") + s.name + " " + std::to_string(s.length);
  for (const auto& c : m.contexts) key += (key.empty() ? "" : ", ") + c.name + " " + std::to_string(c.length);
  key += " (" + std::string(ir::to_string(m.dtype));
  if (kv_budget < 1.0) key += report::printf_text(", kv budget %g", kv_budget);
  return key + ")";
}

}  // namespace

Attached::Attached(const NamedTensors& tensors, const std::optional<recognize::Sidecar>& sidecar, AttachOptions options,
                   contracts::Registry reg)
    : reg_(std::move(reg)), options_(std::move(options)) {
  const bool in_place = options_.in_place && options_.streams();
  const at::Device held_on = in_place ? held_device(tensors, options_.device) : module_device(tensors);
  device_ = options_.device.empty() ? held_on : exec::pick_device(options_.device);
  moved_ = device_ != held_on && options_.process_group;
  if (options_.streams()) {
    if (options_.device_memory < 0)
      throw std::invalid_argument("device_memory: must be > 0 bytes, got " + std::to_string(options_.device_memory));
    if (!in_place && !held_on.is_cpu())
      throw std::invalid_argument("device_memory: the module's tensors are on " + held_on.str() +
                                  "; streamed weights come from host memory: keep the module on the CPU "
                                  "(module.to('cpu')) and pass device='" + held_on.str() + "'");
  } else if (device_ != held_on && options_.weight_split != plan::WeightSplit::Sharded) {
    throw std::invalid_argument("device: " + device_.str() + ", but the module's tensors are on " + held_on.str() +
                                "; only with device_memory, resident_blocks or sharded weights do the calls run elsewhere");
  }
  dtype_ = module_dtype(tensors, options_.dtype);
  reg_.consumer(options_.consumer);  // throws ContractError naming the registered consumers
  if (!options_.budget.empty() && options_.budget != "auto") {
    try {
      plan::parse_budget(options_.budget);
    } catch (const std::exception& e) {
      throw std::invalid_argument(std::string("budget: ") + e.what());
    }
  }
  set_kv_budget(options_.kv_budget);
  rec_ = recognize_module(tensors, sidecar);
  weights_ = std::make_unique<ModuleWeights>(tensors, rec_, &reg_, dtype_);
  if (options_.weight_hook) {
    weights_->set_hook(options_.weight_hook, options_.hooked);
    register_hook_format(reg_, dtype_, weights_.get());
  }
  lora_ = models::load_loras(options_.loras, rec_.config, exec::to_aten(dtype_),
                             options_.streams() ? at::Device(at::kCPU) : device_);
  dev_ = exec::run_device(device_);
  if (const auto& pg = options_.process_group) {
    if (options_.in_place && options_.streams())
      throw std::invalid_argument("process_group: a host that places the weights itself (in_place) does not "
                                  "combine with sequence parallel runs");
    sequence_ = {pg->getRank(), pg->getSize(), options_.sequence_mode};
    if (!(options_.link_bytes_per_s >= 0) || !std::isfinite(options_.link_bytes_per_s))
      throw std::invalid_argument("link_rate: expected bytes per second (finite, > 0; 0: measured), got " +
                                  std::to_string(options_.link_bytes_per_s));
    if (sequence_.split())
      dev_.rates.link_bytes_per_s =
          options_.link_bytes_per_s > 0 ? options_.link_bytes_per_s : exec::dist::probe_link(pg, device_);
  } else if (options_.weight_split == plan::WeightSplit::Sharded) {
    throw std::invalid_argument("shard_weights: shares the weights over the ranks of a process_group; none is given");
  }
}

void Attached::set_kv_budget(double budget) {
  plan::validate({.budget = budget});
  options_.kv_budget = budget;
}

at::Tensor Attached::forward(const models::TensorMap& raw) {
  c10::NoGradGuard no_grad;  // the planned run records no autograd graph
  auto [fr, out] = run(raw);
  return fr.finish(out);
}

models::TensorMap Attached::forward_named(const models::TensorMap& raw) {
  c10::NoGradGuard no_grad;
  auto [fr, out] = run(raw);
  if (fr.named_outputs) return fr.named_outputs(out);
  return {{"out", fr.finish(out)}};
}

models::FamilyRun Attached::prepare(const models::TensorMap& raw) {
  // The prologue reads quantized weights whole, dequantized (ModuleWeights::prologue_view);
  // where a host placed them on several devices, each on the run's (until they stream). Under
  // residency, those it alone reads may be left in host memory: each comes to the device in
  // its stored form and is dequantized there.
  const exec::OnDevice on_device(weights_->prologue_view(), device_);
  const exec::OnDevice stored(streamed_ ? static_cast<const exec::WeightSource&>(*streamed_) : on_device, device_);
  const auto over_streamed = streamed_ ? weights_->prologue_over(stored) : nullptr;
  const exec::WeightSource& prologue = over_streamed                                        ? *over_streamed
                                       : (options_.in_place && options_.streams()) || moved_ ? on_device
                                                                                           : weights_->prologue_view();
  models::FamilyRun fr = models::prepare(rec_.config, prologue, raw, dtype_, options_.consumer);
  weights_->mark_quantized(fr.model);
  weights_->mark_stored(fr.model);
  weights_->mark_hooked(fr.model);
  lora_.attach(fr.model);
  return fr;
}

std::shared_ptr<exec::TensorWeights> Attached::host_weights() const {
  auto w = std::make_shared<exec::TensorWeights>(&reg_);
  for (auto& [name, t] : weights_->canonical_tensors()) w->add(name, t);
  for (const auto& [name, t] : lora_.tensors) w->add(name, t);
  return w;
}

plan::ResidencyRequest Attached::residency_request(const models::FamilyRun& fr,
                                                   std::shared_ptr<exec::TensorWeights>& host) {
  if (!weight_request_) {
    host = host_weights();
    weight_request_ = exec::residency_request(fr.model, *host, {}, reg_, dev_, exec::Prologue::Device,
                                              options_.in_place ? device_ : at::Device(at::kCPU));
    weight_request_->device_memory = options_.device_memory;
    weight_request_->resident_blocks = std::max(options_.resident_blocks, 0);
    weight_request_->split = options_.weight_split;
  }
  plan::ResidencyRequest rq = *weight_request_;
  rq.fixed_bytes += exec::input_bytes(fr.inputs, dev_);
  return rq;
}

void Attached::place_as(const plan::Residency& r, models::FamilyRun& fr, const models::TensorMap& raw,
                        std::shared_ptr<exec::TensorWeights> host) {
  if (placed_as_ && placed_as_->streamed == r.streamed && placed_as_->slots == r.slots &&
      placed_as_->sharded == r.sharded)
    return;
  release_streamed();  // its device memory goes before the next arrangement takes its own
  if (!host) host = host_weights();
  if (r.sharded)
    sharded_ = std::make_unique<exec::dist::ShardedWeights>(fr.model, std::move(host), reg_, options_.process_group,
                                                            device_, r.streamed);
  else
    streamed_ = std::make_unique<exec::StreamedWeights>(fr.model, std::move(host), r, reg_, device_,
                                                        exec::Prologue::Device, options_.in_place);
  placed_as_ = r;
  fr = prepare(raw);  // the inputs again, from the weights where the calls run
}

void Attached::check_same_call(const std::string& key, const models::TensorMap& raw) const {
  // The geometry's key and a checksum of the inputs' values, each with its complement: the
  // smallest of both over the ranks are complements of each other where every rank has the same.
  const int64_t geometry = int64_t(std::hash<std::string>{}(key) >> 1);
  // Summed where the inputs are, then read once: one wait for the device per call, not one per input.
  at::Tensor total;
  for (const auto& [name, t] : raw) {
    if (!t.defined() || t.numel() == 0) continue;
    const at::Tensor s = t.to(at::kDouble).abs().sum() + double(t.numel());
    total = total.defined() ? total + s.to(total.device()) : s;
  }
  const double sum = total.defined() ? total.item<double>() : 0.0;
  int64_t values = 0;
  std::memcpy(&values, &sum, sizeof values);
  const std::vector<int64_t> least =
      exec::dist::min_over_ranks(options_.process_group, {geometry, ~geometry, values, ~values}, device_);
  if (least[0] != ~least[1])
    throw std::invalid_argument("sequence parallel: the ranks of the process group called the module with inputs of "
                                "different shapes (this rank's: " + key + "); every rank calls it with the same inputs");
  if (least[2] != ~least[3])
    throw std::invalid_argument("sequence parallel: the ranks of the process group called the module with different "
                                "input values (" + key + "); every rank calls it with the same inputs (the same "
                                "seed for the noise)");
}

void Attached::plan_geometry(GeometryPlan& g, const models::FamilyRun& fr, std::shared_ptr<exec::TensorWeights>& host) {
  plan::Options po = exec::plan_options(
      {options_.token_chunk, options_.feature_slice, options_.budget, options_.kv_budget}, device_);
  po.sequence = sequence_;
  std::optional<plan::ResidencyRequest> rq;
  if (arranges()) rq = residency_request(fr, host);
  auto make = [&] {
    if (!rq) {
      g.plan = plan::make_plan(fr.model, reg_, dev_, po);
      return;
    }
    plan::ResidentPlan rp = plan::plan_with_residency(fr.model, reg_, dev_, po, *rq);
    g.plan = std::move(rp.plan);
    g.residency = rp.residency;
  };
  if (!sequence_.split()) return make();
  // The ranks plan their own rows, so their choices may differ where the ranks must act alike:
  // the slabs their exchanges trade, and which blocks are sharded. Every rank takes the
  // smallest of each (which fits wherever the larger did) and plans again where it differs.
  // A rank that cannot plan tells the others, so that every rank stops with the error.
  const exec::dist::Group& pg = options_.process_group;
  auto agreed = [&](const std::vector<int64_t>& mine) { return exec::dist::min_over_ranks(pg, mine, device_); };
  auto every_rank = [&](const std::function<void()>& f) {
    std::exception_ptr failed;
    try {
      f();
    } catch (...) {
      failed = std::current_exception();
    }
    if (agreed({failed ? 0 : 1}).front() == 1) return;
    if (failed) std::rethrow_exception(failed);
    throw plan::PlanError("sequence parallel: another rank could not plan this geometry (its error says why)");
  };
  every_rank(make);
  // Every decision below is on what all ranks agreed, so that all of them plan again or none.
  const std::vector<int64_t> mine = plan::exchange_slabs(g.plan), slabs = agreed(mine);
  if (agreed({slabs == mine ? 1 : 0}).front() == 0) {
    po.slabs = slabs;
    every_rank(make);
  }
  // Sharded blocks are gathered together: every rank shards the same ones.
  const bool sharded = g.residency && g.residency->sharded;
  const int64_t kept = sharded ? g.residency->kept_count() : std::numeric_limits<int64_t>::max();
  // {all sharded, any sharded (-1), the fewest kept, minus the most kept} of the sharded ranks
  const std::vector<int64_t> all = agreed({sharded ? 1 : 0, sharded ? -1 : 0, kept, sharded ? -kept : 0});
  if (all[1] == 0 || (all[0] == 1 && all[2] == -all[3])) return;
  rq->split = plan::WeightSplit::Sharded;
  rq->resident_blocks = int(all[2]) + 2;  // the blocks kept and the two slots
  every_rank(make);
}

void Attached::evict_least_recent(const GeometryPlan* keep) {
  if (cache_.size() <= kPlanCacheSize) return;
  auto oldest = cache_.end();
  for (auto it = cache_.begin(); it != cache_.end(); ++it)
    if (it->second.get() != keep && (oldest == cache_.end() || it->second->used < oldest->second->used)) oldest = it;
  const GeometryPlan* gone = oldest->second.get();
  order_.erase(std::find(order_.begin(), order_.end(), gone));
  if (last_ == gone) last_ = nullptr;
  cache_.erase(oldest);
}

std::pair<models::FamilyRun, at::Tensor> Attached::run(const models::TensorMap& raw) {
  const auto t0 = std::chrono::steady_clock::now();
  weights_->refresh();
  models::FamilyRun fr = prepare(raw);
  const std::string key = geometry_key(fr.model, options_.kv_budget);
  if (sequence_.split()) check_same_call(key, raw);
  std::unique_ptr<GeometryPlan>& slot = cache_[key];
  std::shared_ptr<exec::TensorWeights> host;  // the module's tensors, where planning read them
  if (!slot) {
    auto g = std::make_unique<GeometryPlan>();
    g->key = key;
    g->model = fr.model;
    plan_geometry(*g, fr, host);
    slot = std::move(g);
    order_.push_back(slot.get());
    evict_least_recent(slot.get());
  }
  slot->used = ++uses_;
  std::shared_ptr<void> cap;
  if (slot->residency) {
    place_as(*slot->residency, fr, raw, std::move(host));
    const int64_t held = streamed_ ? streamed_->device_bytes()
                                   : sharded_->shard_bytes() + sharded_->slot_bytes() + sharded_->whole_bytes();
    if (options_.device_memory > 0 && !options_.in_place)
      cap = exec::cap_device_memory(device_, options_.device_memory, held + exec::input_bytes(fr.inputs, dev_));
  }
  const exec::LoraWeights with_lora(*weights_, lora_.tensors);
  const exec::WeightSource& w = streamed_   ? static_cast<const exec::WeightSource&>(*streamed_)
                                : sharded_ ? static_cast<const exec::WeightSource&>(*sharded_)
                                           : with_lora;
  last_prepare_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const exec::Retried r = exec::run_planned_retrying(fr.model, w, fr.inputs, slot->plan, reg_, dev_, device_, {},
                                                     sequence_.split() ? options_.process_group.get() : nullptr);
  if (r.retried) {
    slot->plan = r.plan;
    slot->retry = r.note;
  }
  ++slot->calls;
  last_ = slot.get();
  return {std::move(fr), r.out};
}

void Attached::release_streamed() {
  streamed_.reset();
  sharded_.reset();
  placed_as_.reset();
  exec::release_cached(device_);
}

std::pair<int64_t, int64_t> Attached::sharded_bytes() const {
  if (!sharded_) return {0, 0};
  return {sharded_->shard_bytes(), sharded_->slot_bytes()};
}

std::pair<int64_t, int64_t> Attached::streamed_bytes() const {
  if (!streamed_) return {0, 0};
  return {streamed_->device_bytes(), streamed_->host_bytes()};
}

std::vector<FormatUse> Attached::formats(const GeometryPlan& g) const {
  std::vector<FormatUse> out;
  ir::for_each_linear(const_cast<ir::Model&>(g.model), [&](ir::Linear& l) {
    auto it = std::find_if(out.begin(), out.end(), [&](const FormatUse& u) { return u.format == l.format; });
    if (it == out.end()) it = out.insert(it, {l.format, 0, exec::gemm_provider(reg_.format(l.format), dev_)});
    ++it->linears;
  });
  return out;
}

nlohmann::json Attached::document(const GeometryPlan& g) const {
  nlohmann::json j = report::plan_document(g.model, g.plan, reg_, dev_, true);
  if (g.residency) j["residency"] = report::to_json(*g.residency);
  return j;
}

}  // namespace sp::host
