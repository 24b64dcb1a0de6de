#include "report/report.hpp"
#include "exec/run/retry.hpp"

#include "plan/arena.hpp"
#include "plan/budget.hpp"
#include "plan/cost.hpp"

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>

#include "exec/device/device.hpp"
#include "exec/device/memory.hpp"

namespace sp::report {

Progress::Progress(std::string label, bool enabled)
    : label_(std::move(label)), enabled_(enabled), start_(Clock::now()), next_(start_ + std::chrono::seconds(2)) {}

bool Progress::due() {
  if (!enabled_) return false;
  const std::lock_guard lock(mutex_);
  const auto now = Clock::now();
  if (now < next_) return false;
  next_ = now + std::chrono::seconds(2);
  return true;
}

void Progress::print(const std::string& what) const {
  std::fprintf(stderr, "[%s] %s, %.1f s\n", label_.c_str(), what.c_str(),
               std::chrono::duration<double>(Clock::now() - start_).count());
}

void Progress::note(const std::string& what) const {
  if (enabled_) std::fprintf(stderr, "[%s] %s\n", label_.c_str(), what.c_str());
}

exec::Progress Progress::sublayers(const ir::Model& m, const std::string& what) {
  if (!enabled_) return {};
  // Block of every sublayer, 1-based, in execution order.
  std::vector<int64_t> block_of;
  for (size_t b = 0; b < m.blocks.size(); ++b) block_of.insert(block_of.end(), m.blocks[b].sublayers.size(), int64_t(b) + 1);
  const int64_t blocks = int64_t(m.blocks.size());
  struct Position {
    std::atomic<int64_t> done{0}, total{0};
  };
  auto at = std::make_shared<Position>();
  at->total = int64_t(block_of.size());
  auto text = [what, block_of = std::move(block_of), blocks, at] {
    const int64_t total = at->total, running = std::min(at->done + 1, total);  // the sublayer being computed
    const int64_t block = running >= 1 && running <= int64_t(block_of.size()) ? block_of[size_t(running - 1)] : blocks;
    return what + ": sublayer " + std::to_string(running) + "/" + std::to_string(total) + " (block " +
           std::to_string(block) + "/" + std::to_string(blocks) + ")";
  };
  auto ticker = std::make_shared<Phase>(*this, std::move(text));
  return [at, ticker](int64_t done, int64_t total) {
    at->done = done;
    at->total = total;
  };
}

Progress::Phase Progress::phase(std::string what) { return Phase(*this, [what = std::move(what)] { return what; }); }

Progress::Phase::Phase(Progress& p, std::function<std::string()> text) {
  if (!p.enabled()) return;
  thread_ = std::thread([this, &p, text = std::move(text)] {
    std::unique_lock lock(mutex_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return done_; }))
      if (p.due()) p.print(text());
  });
}

Progress::Phase::~Phase() {
  if (!thread_.joinable()) return;
  {
    const std::lock_guard lock(mutex_);
    done_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

at::Tensor noting_out_of_memory(const std::string& context, const std::function<at::Tensor()>& f) {
  try {
    return f();
  } catch (c10::Error& e) {
    if (exec::is_out_of_memory(e)) e.add_context(context);
    throw;
  }
}

std::pair<at::Tensor, Measurement> measure(const at::Device& d, const std::function<at::Tensor()>& f) {
  exec::synchronize(d);
  exec::PeakMeter meter(d);
  at::Tensor out;
  Measurement m;
  m.ms = exec::time_ms(d, [&] { out = f(); });
  m.peak_bytes = meter.peak_above_start();
  return {out, m};
}

double rel_l2(const at::Tensor& out, const at::Tensor& ref) {
  const at::Tensor r = ref.to(at::kDouble);
  return ((out.to(at::kDouble) - r).norm() / r.norm().clamp_min(1e-300)).item<double>();
}

RunReport compare(const models::Instance& inst, const plan::Plan& p, const contracts::Registry& reg,
                  const contracts::DeviceCaps& dev, const CompareOptions& opt) {
  RunReport r;
  r.model = inst.model.name;
  r.tokens = inst.model.tokens();
  r.segments = inst.model.segments;
  r.device = dev.name;
  r.dtype = ir::to_string(inst.model.dtype);
  r.estimated_peak_bytes = p.estimated_peak_bytes;
  r.floor_bytes = p.floor_bytes;
  r.plan = to_json(p);
  const at::Device d = inst.inputs.device();
  Progress own("run", opt.progress && !opt.reporter);
  Progress& progress = opt.progress && opt.reporter ? *opt.reporter : own;
  const exec::WeightSource& w = opt.weights ? *opt.weights : *inst.weights;
  auto naive = [&](const std::string& what) {
    return noting_out_of_memory("while running the naive schedule", [&] {
      return exec::run_naive(inst.model, w, inst.inputs, reg, progress.sublayers(inst.model, what), p.kv_budget);
    });
  };
  // Out of memory: one retry under what is free; later runs keep the plan that ran.
  plan::Plan current = p;
  auto planned = [&](const std::string& what) {
    return noting_out_of_memory("while running the planned schedule", [&] {
      if (!opt.memory_cap.empty()) {
        try {
          return exec::run_planned(inst.model, current, w, inst.inputs, reg, dev, progress.sublayers(inst.model, what));
        } catch (const std::exception& e) {
          if (!exec::is_out_of_memory(e)) throw;
          throw exec::OutOfMemory("out of memory under " + opt.memory_cap + " (" + exec::allocator_state(d) +
                                "; the plan counted " + plan::human_bytes(current.estimated_peak_bytes) +
                                " of activations)");
        }
      }
      exec::Retried run = exec::run_planned_retrying(inst.model, w, inst.inputs, current, reg, dev, d,
                                         progress.sublayers(inst.model, what));
      if (run.retried) {
        current = run.plan;
        r.retry = run.note;
        r.plan = to_json(current);
        r.estimated_peak_bytes = current.estimated_peak_bytes;
      }
      return run.out;
    });
  };
  // On a GPU the first call of each schedule pays for library handles and kernel loading;
  // one untimed call of each keeps that out of the comparison.
  if (d.is_cuda()) {
    if (opt.run_naive) naive("naive warm-up");
    planned("planned warm-up");
  }
  at::Tensor ref;
  if (opt.run_naive) {
    auto [out, m] = measure(d, [&] { return naive("naive schedule"); });
    ref = out;
    r.naive = m;
  }
  auto [out, m] = measure(d, [&] { return planned("planned schedule"); });
  r.planned = m;
  if (opt.keep_outputs) {
    r.planned_out = out;
    r.naive_out = ref;
  }
  if (ref.defined()) {
    r.max_abs = (out.to(at::kDouble) - ref.to(at::kDouble)).abs().max().item<double>();
    r.rel_l2 = rel_l2(out, ref);
  }
  return r;
}

nlohmann::json to_json(const plan::Residency& r) {
  nlohmann::json streamed = nlohmann::json::array();
  for (size_t b = 0; b < r.streamed.size(); ++b)
    if (r.streamed[b]) streamed.push_back(b);
  return {{"resident_blocks", r.resident_blocks()},
          {"kept_blocks", r.kept_count()},
          {"streamed_blocks", streamed},
          {"slots", r.slots},
          {"slot_bytes", r.slot_bytes},
          {"kept_bytes", r.kept_bytes},
          {"fixed_bytes", r.fixed_bytes},
          {"prologue_bytes", r.prologue_bytes},
          {"prologue_copied", r.prologue_copied},
          {"activation_bytes", r.activation_bytes},
          {"slack_bytes", r.slack_bytes},
          {"device_memory_bytes", r.device_memory},
          {"planned_device_bytes", r.device_bytes()},
          {"host_bytes_per_s", r.host_bytes_per_s},
          {"copy_ms", r.copy_ms},
          {"predicted_ms", r.predicted_ms},
          {"all_resident_ms", r.resident_ms},
          {"sharded", r.sharded},
          {"ranks", r.ranks},
          {"shard_bytes", r.shard_bytes},
          {"link_bytes_per_s", r.link_bytes_per_s},
          {"why", r.why},
          {"explain", plan::explain(r)}};
}

nlohmann::json to_json(const plan::Plan& p) {
  auto decisions = [](const auto& part) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& d : part.decisions) {
      nlohmann::json j{{"transformation", legality::to_string(d.transform)}, {"chosen", part.chosen(d.transform)}};
      if (!d.note.empty()) j["note"] = d.note;
      nlohmann::json rs = nlohmann::json::array();
      for (const auto& r : d.rejections)
        rs.push_back({{"code", legality::code_name(r.check)},
                      {"component_kind", legality::to_string(r.component_kind)},
                      {"component_name", r.component_name},
                      {"component", legality::component_text(r)},
                      {"check", legality::check_text(r)},
                      {"required", r.required},
                      {"actual", r.actual}});
      j["rejections"] = rs;
      arr.push_back(j);
    }
    return arr;
  };
  nlohmann::json blocks = nlohmann::json::array();
  for (const auto& b : p.blocks) {
    nlohmann::json subs = nlohmann::json::array();
    for (const auto& s : b.sublayers) {
      nlohmann::json j{{"name", s.name},
                       {"kind", s.attention ? "attention" : "mlp"},
                       {"token_chunk", s.token_chunk},
                       {"estimated_peak_bytes", s.estimated_peak},
                       {"transformations", decisions(s)}};
      if (s.attention) j["q_chunk"] = s.q_chunk;
      else j["feature_slice"] = s.feature_slice;
      if (!s.strategy.empty()) j["strategy"] = s.strategy;
      j["estimated_ms"] = s.estimated_ms;
      j["held_weights"] = s.held_weights;
      j["slab_weights"] = s.slab_weights;
      nlohmann::json alts = nlohmann::json::array();
      for (const auto& a : s.alternatives)
        alts.push_back({{"strategy", a.strategy},
                        {"token_chunk", a.token_chunk},
                        {"q_chunk", a.q_chunk},
                        {"feature_slice", a.feature_slice},
                        {"estimated_peak_bytes", a.estimated_peak},
                        {"estimated_ms", a.estimated_ms},
                        {"lost", a.lost}});
      if (!alts.empty()) j["alternatives"] = alts;
      subs.push_back(j);
    }
    nlohmann::json jb{{"name", b.name}, {"sublayers", subs}};
    if (b.post_norm_rows > 0) jb["post_norm_rows"] = b.post_norm_rows;
    blocks.push_back(jb);
  }
  nlohmann::json j{{"model", p.model},     {"tokens", p.tokens},
                   {"dtype", ir::to_string(p.dtype)}, {"device", p.device},
                   {"residual_bytes", p.residual_bytes}, {"floor_bytes", p.floor_bytes},
                   {"estimated_peak_bytes", p.estimated_peak_bytes}, {"estimated_ms", p.estimated_ms},
                   {"budget_bytes", p.budget_bytes ? nlohmann::json(p.budget_bytes) : nlohmann::json(nullptr)},
                   {"row_kernels", p.row_kernels}, {"policy", p.policy}, {"blocks", blocks}};
  if (p.final_layer.present)
    j["final_layer"] = {{"chunk", p.final_layer.chunk},
                        {"estimated_peak_bytes", p.final_layer.estimated_peak},
                        {"transformations", decisions(p.final_layer)}};
  if (p.sequence.split())
    j["sequence"] = {{"rank", p.sequence.rank},
                     {"ranks", p.sequence.ranks},
                     {"mode", p.sequence.mode == plan::SeqMode::Ring ? "ring" : "ulysses"},
                     {"sharded", p.sequence.sharded},
                     {"exchange_slabs", plan::exchange_slabs(p)}};
  return j;
}

nlohmann::json to_json(const RunReport& r) {
  nlohmann::json j{{"model", r.model}, {"tokens", r.tokens}, {"device", r.device}, {"dtype", r.dtype}};
  j["segments"] = nlohmann::json::object();
  for (const auto& s : r.segments) j["segments"][s.name] = s.length;
  j["naive"] = r.naive ? nlohmann::json{{"peak_bytes", r.naive->peak_bytes}, {"ms", r.naive->ms}}
                       : nlohmann::json{{"peak_bytes", nullptr}, {"ms", nullptr}};
  j["planned"] = {{"peak_bytes", r.planned.peak_bytes},
                  {"estimated_peak_bytes", r.estimated_peak_bytes},
                  {"ms", r.planned.ms}};
  j["floor_bytes"] = r.floor_bytes;
  if (!r.retry.empty()) j["retry"] = r.retry;
  j["error"] = {{"max_abs", r.max_abs ? nlohmann::json(*r.max_abs) : nlohmann::json(nullptr)},
                {"rel_l2", r.rel_l2 ? nlohmann::json(*r.rel_l2) : nlohmann::json(nullptr)}};
  j["plan"] = r.plan;
  return j;
}

std::string estimate_text(const plan::Plan& p, const CompareOptions& opt, bool gpu) {
  const int runs = gpu ? 2 : 1;  // on a GPU an untimed warm-up of each schedule first
  const std::string each = plan::human_ms(runs * p.estimated_ms);
  std::string s = "estimated " + plan::human_ms((opt.run_naive ? 2 : 1) * runs * p.estimated_ms) + " (";
  if (opt.run_naive) s += "naive " + each + ", taken as long as the planned one; ";
  s += "planned " + each;
  if (gpu) s += "; each schedule run twice, a warm-up first";
  return s + ")";
}

std::string printf_text(const char* format, ...) {
  va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string text(size_t(std::max(n, 0)), '\0');
  std::vsnprintf(text.data(), text.size() + 1, format, again);  // the whole text, however long
  va_end(again);
  return text;
}

std::string to_table(const RunReport& r) {
  std::ostringstream os;
  os << r.model << ", " << r.tokens << " tokens, " << r.dtype << ", " << r.device << "\n";
  if (r.segments.size() > 1) {  // "tokens: 1268 = text 512 + audio 256 + video 500"
    os << "  tokens: " << r.tokens;
    for (size_t i = 0; i < r.segments.size(); ++i)
      os << (i ? " + " : " = ") << r.segments[i].name << " " << r.segments[i].length;
    os << "\n";
  }
  if (!r.retry.empty()) os << "  " << r.retry << "\n";
  os << printf_text("  %-8s %14s %12s %10s\n", "schedule", "peak", "time", "x floor");
  auto row = [&](const char* name, const Measurement& m) {
    os << printf_text("  %-8s %14s %9.1f ms %9.2fx\n", name, plan::human_bytes(m.peak_bytes).c_str(), m.ms,
                      double(m.peak_bytes) / double(r.floor_bytes));
  };
  if (r.naive) row("naive", *r.naive);
  row("planned", r.planned);
  os << "  floor " << plan::human_bytes(r.floor_bytes) << ", estimate " << plan::human_bytes(r.estimated_peak_bytes)
     << " ("
     << (r.planned.peak_bytes ? 100.0 * (double(r.estimated_peak_bytes) / double(r.planned.peak_bytes) - 1.0) : 0.0)
     << "% vs measured)\n";
  if (r.naive)
    os << printf_text("  planned/naive: peak %.3f, time %.3f; error max_abs %.3g rel_l2 %.3g\n",
                      double(r.planned.peak_bytes) / double(r.naive->peak_bytes), r.planned.ms / r.naive->ms,
                      r.max_abs.value_or(0), r.rel_l2.value_or(0));
  return os.str();
}

nlohmann::json to_json(const plan::Part& part, const contracts::DeviceCaps& dev) {
  const plan::Program& prog = part.program;
  const plan::Placement& pl = part.placement;
  const plan::Cost cost = plan::program_cost(prog, pl, dev);
  nlohmann::json bufs = nlohmann::json::array();
  for (size_t i = 0; i < prog.buffers.size(); ++i) {
    const plan::Buffer& b = prog.buffers[i];
    bufs.push_back({{"id", i},
                    {"role", plan::to_string(b.role)},
                    {"label", b.label},
                    {"shape", b.shape},
                    {"dtype", ir::to_string(b.dtype)},
                    {"bytes", b.bytes()},
                    {"offset", pl.offset[i]},
                    {"live", {pl.live[i].first, pl.live[i].second}}});
  }
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& s : prog.steps) {
    nlohmann::json j{{"kind", plan::step_name(s.body)}, {"what", s.what}, {"depth", s.depth}};
    if (!s.reads.empty()) j["reads"] = s.reads;
    if (!s.writes.empty()) j["writes"] = s.writes;
    if (const auto* l = std::get_if<plan::LoopStep>(&s.body)) j["slabs"] = {{"rows", l->rows}, {"count", l->count}};
    if (s.terms.launches > 0)
      j["cost"] = {{"flops", s.terms.flops}, {"bytes", s.terms.bytes}, {"launches", s.terms.launches}};
    if (s.transient > 0) j["transient_bytes"] = s.transient;
    steps.push_back(j);
  }
  return {{"name", prog.name},         {"arena_bytes", pl.arena_bytes}, {"peak_bytes", pl.peak_bytes},
          {"estimated_ms", cost.ms()}, {"buffers", bufs},                {"steps", steps}};
}

nlohmann::json plan_document(const ir::Model& m, const plan::Plan& p, const contracts::Registry& reg,
                             const contracts::DeviceCaps& dev, bool with_programs) {
  nlohmann::json j{{"model", m.name}, {"tokens", m.tokens()}, {"device", dev.name}, {"dtype", ir::to_string(m.dtype)}};
  j["planned"] = {{"estimated_peak_bytes", p.estimated_peak_bytes}};
  j["floor_bytes"] = p.floor_bytes;
  j["plan"] = to_json(p);
  if (with_programs) {
    nlohmann::json progs = nlohmann::json::array();
    for (const plan::Part* part : plan::parts(p)) progs.push_back(to_json(*part, dev));
    j["programs"] = progs;
  }
  return j;
}

}  // namespace sp::report
