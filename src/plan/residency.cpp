#include "plan/residency.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <sstream>

#include "plan/budget.hpp"

namespace sp::plan {

int Residency::streamed_count() const { return int(std::count(streamed.begin(), streamed.end(), true)); }

int64_t Residency::device_bytes() const {
  return fixed_bytes + kept_bytes + shard_bytes + int64_t(slots) * slot_bytes + activation_bytes + slack_bytes;
}

const char* to_string(WeightSplit s) { return ir::name_of(s, {"auto", "replicated", "sharded"}); }

int64_t shard_of(int64_t bytes, int64_t ranks) { return ir::round_up((bytes + ranks - 1) / ranks, 512); }

double streamed_call_ms(const std::vector<double>& block_ms, const std::vector<bool>& streamed, int slots,
                        const std::vector<double>& copy_ms, double other_ms, bool overlap) {
  std::vector<size_t> order;  // the streamed blocks, in load order within a call
  for (size_t b = 0; b < streamed.size(); ++b)
    if (streamed[b]) order.push_back(b);
  if (order.empty() || slots <= 0) return other_ms + std::accumulate(block_ms.begin(), block_ms.end(), 0.0);
  const size_t k = order.size();
  std::vector<double> load_end, block_end;  // per load number: when its copy and its block finished
  double t = 0, call_begin = 0;
  constexpr int kCalls = 3;
  for (int c = 0; c < kCalls; ++c) {
    call_begin = t;
    t += other_ms;
    size_t j = 0;
    for (size_t b = 0; b < block_ms.size(); ++b) {
      if (!streamed[b]) {
        t += block_ms[b];
        continue;
      }
      const size_t q = size_t(c) * k + j++;
      const double engine_free = q ? load_end[q - 1] : 0.0;
      const double slot_free = q >= size_t(slots) ? block_end[q - size_t(slots)] : 0.0;
      const double start = overlap ? std::max(engine_free, slot_free) : t;
      load_end.push_back(start + copy_ms[b]);
      t = std::max(t, load_end.back()) + block_ms[b];
      block_end.push_back(t);
    }
  }
  return t - call_begin;
}

std::vector<bool> kept_pattern(int n, int kept) {
  std::vector<bool> k(size_t(std::max(n, 0)), false);
  kept = std::clamp(kept, 0, n);
  for (int j = 0; j < kept; ++j) k[size_t((2 * int64_t(j) + 1) * n / (2 * int64_t(kept)))] = true;
  return k;
}

namespace {

// What the device allocator holds beyond the counted buffers: segment rounding, cuBLAS and
// cuDNN workspaces. CUDA: 256 MiB + 2% of the device memory; CPU: allocator_reserve.
int64_t residency_slack(const contracts::DeviceCaps& dev, int64_t device_memory) {
  if (dev.kind != contracts::DeviceKind::CUDA) return allocator_reserve();
  return (int64_t{256} << 20) + device_memory / 50;
}

// The activation plans the chooser weighs: with a fixed budget that one; else the lean
// default and plans between the smallest achievable peak and the default's.
std::vector<Plan> activation_plans(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
                                   const Options& opt) {
  if (opt.budget_bytes > 0) return {make_plan(m, reg, dev, opt)};
  Options o = opt;
  std::vector<Plan> plans{make_plan(m, reg, dev, o)};
  int64_t smallest = 0;
  try {
    o.budget_bytes = 1;
    make_plan(m, reg, dev, o);
  } catch (const BudgetError& e) {
    smallest = e.smallest_peak_bytes;
  }
  const int64_t lean = plans.front().estimated_peak_bytes;
  for (double f : {0.0, 1.0 / 3, 2.0 / 3}) {
    o.budget_bytes = smallest + int64_t(f * double(lean - smallest));
    if (smallest <= 0 || o.budget_bytes >= lean) continue;
    try {
      Plan p = make_plan(m, reg, dev, o);
      if (std::none_of(plans.begin(), plans.end(),
                       [&](const Plan& q) { return q.estimated_peak_bytes == p.estimated_peak_bytes; }))
        plans.push_back(std::move(p));
    } catch (const BudgetError&) {
    }
  }
  return plans;
}

std::vector<double> block_times(const Plan& p, double& other_ms) {
  std::vector<double> ms;
  double sum = 0;
  for (const auto& b : p.blocks) {
    double t = 0;
    for (const auto& s : b.sublayers) t += s.estimated_ms;
    ms.push_back(t);
    sum += t;
  }
  other_ms = std::max(0.0, p.estimated_ms - sum);
  return ms;
}

// Where the streamed blocks come from: host memory at the host rate, or (ranks > 1) the ranks'
// shares, gathered at the link rate.
struct Source {
  int64_t ranks = 1;
  double rate = 0;
  bool sharded() const { return ranks > 1; }
};

// The byte counts of the arrangement (`streamed` blocks through `slots` slots) and its time on plan `p`.
Residency evaluate(const std::vector<bool>& streamed, int slots, bool copied, const Plan& p,
                   const ResidencyRequest& req, const contracts::DeviceCaps& dev, const Source& from, int64_t slack) {
  Residency r;
  r.streamed = streamed;
  r.slots = slots;
  r.sharded = from.sharded() && std::count(streamed.begin(), streamed.end(), true) > 0;
  std::vector<double> copy(streamed.size(), 0.0);
  for (size_t b = 0; b < streamed.size(); ++b) {
    const int64_t bytes = req.block_bytes[b];
    if (!streamed[b]) {
      r.kept_bytes += bytes;
    } else if (r.sharded) {  // this rank's share kept; the others' gathered into a slot
      const int64_t share = shard_of(bytes, from.ranks);
      r.shard_bytes += share;
      r.slot_bytes = std::max(r.slot_bytes, share * from.ranks);
      copy[b] = 1e3 * double(share * (from.ranks - 1)) / from.rate;
    } else {
      r.slot_bytes = std::max(r.slot_bytes, bytes);
      copy[b] = 1e3 * double(bytes) / from.rate;
    }
  }
  if (r.streamed_count() == 0) r.slots = 0;
  if (r.sharded) {
    r.ranks = from.ranks;
    r.link_bytes_per_s = from.rate;
  }
  r.prologue_bytes = req.prologue_bytes;
  r.prologue_copied = copied && req.prologue_bytes > 0;
  r.fixed_bytes = req.fixed_bytes + (r.prologue_copied ? 0 : req.prologue_bytes);
  r.activation_bytes = std::max(p.estimated_peak_bytes, r.prologue_copied ? req.prologue_peak_bytes : 0);
  r.slack_bytes = slack;
  r.device_memory = req.device_memory;
  r.host_bytes_per_s = rates_of(dev).host_bytes_per_s;
  double other = 0;
  const std::vector<double> ms = block_times(p, other);
  r.copy_ms = std::accumulate(copy.begin(), copy.end(), 0.0);  // 0 for the kept blocks
  r.resident_ms = p.estimated_ms;
  r.predicted_ms = streamed_call_ms(ms, r.streamed, r.slots, copy, other, dev.kind == contracts::DeviceKind::CUDA);
  if (r.prologue_copied) {  // before the first block, not overlapped
    const double ms_copied = 1e3 * double(req.prologue_bytes) / r.host_bytes_per_s;
    r.copy_ms += ms_copied;
    r.predicted_ms += ms_copied;
  }
  return r;
}

bool fits(const Residency& r) { return r.device_memory <= 0 || r.device_bytes() <= r.device_memory; }

// The arrangements of `n` blocks with `slots` slots: with a count of blocks on the device,
// kept = count - slots; else (auto) the most kept blocks that fit (sharded without a device
// memory: none).
std::optional<Residency> arrange(const Plan& p, const ResidencyRequest& req, const contracts::DeviceCaps& dev,
                                 const Source& from, int64_t slack, int slots, bool copied) {
  const int n = int(req.block_bytes.size());
  auto with_kept = [&](int kept) {
    std::vector<bool> streamed = kept_pattern(n, kept);
    streamed.flip();
    return evaluate(streamed, slots, copied, p, req, dev, from, slack);
  };
  if (req.resident_blocks > 0) {
    const int kept = req.resident_blocks - slots;
    if (kept < 0 || n - kept <= slots) return std::nullopt;
    Residency r = with_kept(kept);
    return fits(r) ? std::optional(r) : std::nullopt;
  }
  if (from.sharded() && req.device_memory <= 0) return with_kept(0);
  for (int kept = n - slots - 1; kept >= 0; --kept) {
    Residency r = with_kept(kept);
    if (fits(r)) return r;
  }
  return std::nullopt;
}

// The least block weights an arrangement from `from` holds: from host memory, nothing kept and
// one slot of the largest block (or the requested count of blocks); sharded, every block's
// share and two slots of the largest.
int64_t least_weights(const ResidencyRequest& req, const Source& from, std::string* parts = nullptr) {
  if (!from.sharded()) {
    const int64_t blocks =
        std::max<int64_t>(1, std::min<int64_t>(req.resident_blocks, int64_t(req.block_bytes.size())));
    const int64_t largest = req.block_bytes.empty() ? 0 : std::ranges::max(req.block_bytes);
    if (parts) *parts = std::to_string(blocks) + " x the largest block " + human_bytes(largest);
    return blocks * largest;
  }
  int64_t shares = 0, slot = 0;
  for (int64_t bytes : req.block_bytes) {
    shares += shard_of(bytes, from.ranks);
    slot = std::max(slot, shard_of(bytes, from.ranks) * from.ranks);
  }
  if (parts)
    *parts = "this rank's shares of every block " + human_bytes(shares) + " + 2 slots of the largest block " +
             human_bytes(slot);
  return shares + 2 * slot;
}

// The least device memory an arrangement from `from` needs: its least weights, the smallest
// activation peak; the slack grows with the device memory (residency_slack).
int64_t smallest_device_memory(const ResidencyRequest& req, const contracts::DeviceCaps& dev, int64_t activations,
                               const Source& from) {
  const int64_t base = req.fixed_bytes + least_weights(req, from) + std::max(activations, req.prologue_peak_bytes);
  int64_t smallest = base + residency_slack(dev, base);
  while (base + residency_slack(dev, smallest) > smallest) smallest = base + residency_slack(dev, smallest);
  return smallest;
}

std::string too_small(const ResidencyRequest& req, const contracts::DeviceCaps& dev, int64_t activations,
                      const Source& from) {
  const int64_t smallest = smallest_device_memory(req, dev, activations, from);
  std::string weights;
  least_weights(req, from, &weights);
  std::ostringstream os;
  os << "the device memory " << human_bytes(req.device_memory) << " is too small";
  if (req.resident_blocks > 0) os << " for " << req.resident_blocks << " resident blocks";
  os << ": the smallest device memory that works is " << human_bytes(smallest) << " = weights and inputs held for "
     << "the whole run " << human_bytes(req.fixed_bytes) << " + " << weights << " + activations "
     << human_bytes(std::max(activations, req.prologue_peak_bytes))
     << (activations < req.prologue_peak_bytes ? " (the prologue's largest weight read from host memory)"
                                               : " (the smallest schedule)")
     << " + allocator slack " << human_bytes(residency_slack(dev, smallest))
     << (from.sharded() ? ", with the weights sharded over " + std::to_string(from.ranks) + " ranks" : "");
  return os.str();
}

// The kinds of arrangement the chooser weighs, for the `why` line: each one's best, the taken
// one marked (among near-equal times: fewer blocks from host memory, then more kept).
enum Kind { kResident, kHost, kSharded, kKinds };
Kind kind_of(const Residency& r) { return !r.streaming() ? kResident : r.sharded ? kSharded : kHost; }

std::string weighed(const std::optional<Residency> (&best)[kKinds], const bool (&allowed)[kKinds], Kind taken,
                    int64_t resident_needs, const Residency& chosen, bool split) {
  const char* names[kKinds] = {split ? "replicated, every block on each rank" : "every block resident",
                               split ? "replicated, blocks streamed from host memory" : "blocks streamed from host memory",
                               "sharded over the ranks"};
  std::ostringstream os;
  for (int k = 0; k < kKinds; ++k) {
    if (k == kSharded && !split) continue;
    if (os.tellp() > 0) os << "; ";
    os << names[k] << ": ";
    if (const auto& r = best[k]) {
      const double slower = r->predicted_ms - chosen.predicted_ms;
      if (k == taken) os << human_ms(r->predicted_ms) << " per call";
      else if (slower > 0) os << human_ms(slower) << " per call slower";
      else os << "as fast";
      if (k != kResident) os << " (" << r->kept_count() << (r->kept_count() == 1 ? " block" : " blocks") << " kept)";
      if (k == taken) os << ", taken";
    } else if (!allowed[k]) {
      os << "excluded by the request";
    } else if (k == kResident && resident_needs > 0) {
      os << "needs " << human_bytes(resident_needs) << ", over the device memory";
    } else {
      os << "does not fit";
    }
  }
  return os.str();
}

}  // namespace

ResidentPlan plan_with_residency(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
                                 const Options& opt, const ResidencyRequest& req) {
  if (req.block_bytes.size() != m.blocks.size())
    throw PlanError("residency: " + std::to_string(req.block_bytes.size()) + " block sizes for a model of " +
                    std::to_string(m.blocks.size()) + " blocks");
  if (req.device_memory < 0 || req.resident_blocks < 0)
    throw PlanError("residency: device memory and resident blocks must be >= 0, got " +
                    std::to_string(req.device_memory) + " and " + std::to_string(req.resident_blocks));
  const bool split = opt.sequence.split();
  if (!split && req.split == WeightSplit::Sharded)
    throw PlanError("residency: sharded weights need a sequence-parallel split of 2 or more ranks, the plan has one");
  const std::vector<Plan> plans = activation_plans(m, reg, dev, opt);
  const Source host{1, rates_of(dev).host_bytes_per_s};
  const Source link{opt.sequence.ranks, rates_of(dev).link_bytes_per_s};
  std::vector<Source> sources;
  if (req.split != WeightSplit::Sharded) sources.push_back(host);
  if (split && req.split != WeightSplit::Replicated) sources.push_back(link);
  const int64_t slack = residency_slack(dev, req.device_memory);
  const int n = int(m.blocks.size());
  std::optional<ResidentPlan> best;
  std::optional<Residency> best_of[kKinds];
  int64_t resident_needs = 0;  // the least bytes of every weight resident, where none fitted
  // Faster; among near-equal ones (0.5%), fewer blocks copied from host memory, then more blocks
  // that never move (all of them without streaming), then the smaller activation peak.
  auto better = [&](const Residency& r, const std::optional<Residency>& than) {
    if (!than) return true;
    const Residency& b = *than;
    auto fixed_blocks = [&](const Residency& x) { return x.streaming() ? x.kept_count() : n; };
    const bool near = std::abs(r.predicted_ms - b.predicted_ms) <= 0.005 * b.predicted_ms;
    if (!near) return r.predicted_ms < b.predicted_ms;
    if (r.host_streamed() != b.host_streamed()) return r.host_streamed() < b.host_streamed();
    return fixed_blocks(r) > fixed_blocks(b) ||
           (fixed_blocks(r) == fixed_blocks(b) && r.activation_bytes < b.activation_bytes);
  };
  auto weigh = [&](const Plan& p, const Residency& r) {
    if (better(r, best_of[kind_of(r)])) best_of[kind_of(r)] = r;
    if (better(r, best ? std::optional(best->residency) : std::nullopt)) best = ResidentPlan{p, r};
  };
  const bool all_allowed = req.resident_blocks == 0 || req.resident_blocks >= n;
  const bool allowed[kKinds] = {all_allowed && req.split != WeightSplit::Sharded, req.split != WeightSplit::Sharded,
                                split && req.split != WeightSplit::Replicated};
  for (const Plan& p : plans)
    for (bool copied : {false, true}) {
      if (copied && req.prologue_bytes == 0) continue;
      // Every weight resident, where allowed.
      if (allowed[kResident]) {
        Residency r = evaluate(std::vector<bool>(size_t(n), false), 0, copied, p, req, dev, host, slack);
        if (fits(r)) weigh(p, r);
        else if (!resident_needs || r.device_bytes() < resident_needs) resident_needs = r.device_bytes();
      }
      for (const Source& from : sources) {
        if (from.sharded() && copied) continue;  // the shards' run keeps the prologue's weights
        for (int slots : from.sharded() ? std::vector<int>{2} : std::vector<int>{1, 2, 3})
          if (auto r = arrange(p, req, dev, from, slack, slots, copied)) weigh(p, *r);
      }
    }
  if (!best) {
    const int64_t smallest = std::ranges::min_element(plans, {}, &Plan::estimated_peak_bytes)->estimated_peak_bytes;
    auto need = [&](const Source& from) { return smallest_device_memory(req, dev, smallest, from); };
    const Source& least = *std::ranges::min_element(sources, {}, need);
    throw DeviceMemoryError(too_small(req, dev, smallest, least), req.device_memory, need(least));
  }
  Residency& r = best->residency;
  if (best_of[kResident]) resident_needs = 0;
  r.why = weighed(best_of, allowed, kind_of(r), resident_needs, r, split);
  best->plan.sequence.sharded = r.sharded;
  best->plan.policy += r.sharded     ? "; weights sharded over the ranks under the device memory"
                       : r.streaming() ? "; weights streamed under the device memory"
                                       : "";
  return *best;
}

std::string explain(const Residency& r) {
  std::ostringstream os;
  const int n = int(r.streamed.size());
  char rate[32];
  std::snprintf(rate, sizeof rate, "%.1f GB/s", (r.sharded ? r.link_bytes_per_s : r.host_bytes_per_s) / 1e9);
  auto predicted = [&](const char* copies) {
    os << copies << " per call: " << human_ms(r.copy_ms) << " at " << rate << "; predicted " << human_ms(r.predicted_ms)
       << " per call against " << human_ms(r.resident_ms) << " with every weight resident (" << copies
       << (r.predicted_ms <= 1.01 * r.resident_ms ? " hidden behind compute)" : " not fully hidden)");
  };
  if (!r.streaming()) {
    os << "weights: all " << n << " blocks resident (" << human_bytes(r.kept_bytes) << ")";
  } else if (r.sharded) {
    os << "weights: " << r.kept_count() << " of " << n << " blocks kept whole on each rank ("
       << human_bytes(r.kept_bytes) << "), " << r.streamed_count() << " sharded over " << r.ranks
       << " ranks: this rank holds 1/" << r.ranks << " of each (" << human_bytes(r.shard_bytes)
       << ") and gathers the block over the link into one of 2 slots of " << human_bytes(r.slot_bytes)
       << " as it begins, the next block's gather meanwhile\n";
    predicted("gathers");
  } else {
    os << "weights: " << r.kept_count() << " of " << n << " blocks kept on the device (" << human_bytes(r.kept_bytes)
       << "), " << r.streamed_count() << " streamed from host memory through " << r.slots << " slot"
       << (r.slots > 1 ? "s" : "") << " of " << human_bytes(r.slot_bytes) << " (prefetch " << r.slots - 1 << " ahead); "
       << r.resident_blocks() << " blocks on the device at once\n";
    predicted("copies");
  }
  if (r.prologue_bytes > 0)
    os << "\nweights only the prologue reads (" << human_bytes(r.prologue_bytes) << "): "
       << (r.prologue_copied ? "in host memory, copied to the device as the prologue reads them on each call"
                             : "kept on the device");
  if (r.device_memory > 0)
    os << "\ndevice memory " << human_bytes(r.device_memory) << ": " << human_bytes(r.device_bytes())
       << " planned = other weights and inputs " << human_bytes(r.fixed_bytes) << " + kept blocks "
       << human_bytes(r.kept_bytes) << (r.sharded ? " + shares " + human_bytes(r.shard_bytes) : "") << " + slots "
       << human_bytes(int64_t(r.slots) * r.slot_bytes) << " + activations " << human_bytes(r.activation_bytes)
       << " + allocator slack " << human_bytes(r.slack_bytes);
  if (!r.why.empty()) os << "\nweighed: " << r.why;
  return os.str();
}

}  // namespace sp::plan
