// Device probe: the rates of the cost model (plan/cost.hpp), measured on the device; what it
// measures, its cache and its sanity bounds are docs/budgets.md's "Calibration".
//
// Design note. Each figure is the median of several timings. A probe that breaks a sanity
// bound, or during which other processes kept more than a quarter of a CPU core busy, is taken
// again (up to three times) and never cached; a run whose measured time is off its estimate by
// more than 2x drops the cache (forget_if_off). The probe refines the time estimates only,
// never the memory plan.
//
// Example:
//     at::Device d = sp::exec::pick_device("auto");
//     sp::contracts::DeviceCaps caps = sp::exec::describe_device(d);
//     sp::exec::ProbeResult r = sp::exec::probe_device(d, caps);   // cached after the first call
//     caps.rates = r.rates;                                        // the estimate runs on them
#pragma once

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "contracts/contracts.hpp"
#include "plan/plan_types.hpp"

namespace sp::exec {

struct ProbeResult {
  std::string key;               // sanitized device key (file name part)
  contracts::Rates rates;        // what was measured (0: not applicable on the device)
  double probe_ms = 0;           // time the measurement took (as measured, also when cached)
  double other_cores = 0;        // CPU cores other processes kept busy meanwhile (/proc/stat; 0 where unknown)
  int attempts = 0;              // probes taken (more than 1: earlier ones were not trusted)
  bool from_cache = false;
  bool cached = false;           // written to (or read from) the cache
  std::string untrusted;         // why the probe was not cached ("" when it was)
  std::string cache_path;        // empty: no cache directory known
};

// Figures that break a sanity bound, each as "name value (bound)"; empty when all hold.
std::vector<std::string> sanity_problems(const ProbeResult& r, bool gpu);

// Cache file of a device: $XDG_CACHE_HOME/streamplan/probe-<key>.json, else
// $HOME/.cache/streamplan/...; empty when neither variable is set.
std::string probe_cache_path(const contracts::DeviceCaps& caps);
// "cuda:0 (NVIDIA H200)" -> "cuda_0_NVIDIA_H200"; for the CPU the model name and the
// thread count are added, since both change the rates.
std::string probe_key(const contracts::DeviceCaps& caps);

// The cached result when a valid one exists and use_cache; otherwise measures and (re)writes
// the cache (a cache that cannot be written is skipped silently: it is only a shortcut).
ProbeResult probe_device(const at::Device& d, const contracts::DeviceCaps& caps, bool use_cache = true);

// The cached result of the device, without measuring (nullopt when none is valid).
std::optional<ProbeResult> cached_probe(const contracts::DeviceCaps& caps);
// Removes the device's cache; true when there was one.
bool forget_probe(const contracts::DeviceCaps& caps);
// A run measured `measured_ms` (100 ms or more) against `estimated_ms`: off by more than 2x either way, the
// device's cache is dropped and the note says so (the next run probes again); "" otherwise.
std::string forget_if_off(const contracts::DeviceCaps& caps, double estimated_ms, double measured_ms);
// The figures as lines for people ("flops_per_s  812.3 GFLOP/s", ...).
std::string probe_text(const ProbeResult& r);
nlohmann::json probe_json(const ProbeResult& r);

// A run's set-up, one for the commands, bench and the host: the device described now, with
// the rates its time estimates use (probe_device: measured once per device, then cached).
contracts::DeviceCaps run_device(const at::Device& d);

// What a run's user chose for its plan: fixed chunk sizes (0: chosen by the planner), the
// budget ("": none, "auto", or a size: plan::budget_from_option) and the KV budget.
struct RunChoices {
  int64_t token_chunk = 0;
  int64_t feature_slice = 0;
  std::string budget;
  double kv_budget = 1.0;
};
// The plan options of those choices; "auto" takes the device's free memory now.
plan::Options plan_options(const RunChoices& c, const at::Device& d);

}  // namespace sp::exec
