// Device probe: the rates of the cost model (plan/cost.hpp), measured on the device.
//
// Design note. A few short measurements, well under a second: matmuls of a few row counts
// (the peak and the rows at which a matmul reaches half of it, fitted to
// throughput = peak · rows / (rows + k)), one large copy (bandwidth) and a run of
// one-element additions (the fixed cost of an operation: dispatch and launch); ~50 ms on an
// H200, a few hundred ms on a small CPU. The result is cached as JSON under $XDG_CACHE_HOME/streamplan (or ~/.cache/streamplan) in
// probe-<device>.json, keyed by the device's name (and, for the CPU, its model and thread
// count), so later runs read it instead of measuring. A run without a probe uses the cost
// model's defaults; the probe only refines the time estimates, never the memory plan.
//
// Example:
//     at::Device d = sp::exec::pick_device("auto");
//     sp::contracts::DeviceCaps caps = sp::exec::describe_device(d);
//     sp::exec::ProbeResult r = sp::exec::probe_device(d, caps);   // cached after the first call
//     sp::exec::apply_rates(r, caps);                              // caps.flops_per_s, ... set
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "contracts/contracts.hpp"

namespace sp::exec {

struct ProbeResult {
  std::string key;               // sanitized device key (file name part)
  double flops_per_s = 0;        // bf16 (fp16 where bf16 is unsupported) matmul peak
  double flops_per_s_f32 = 0;    // fp32 matmul peak
  double bytes_per_s = 0;        // copy bandwidth, bytes read + written
  double launch_s = 0;           // per small operation, dispatched and run
  double launch_gap_s = 0;       // per small operation on the device, the host ahead (CPU: launch_s)
  double gemm_half_rows = 0;     // k of rows / (rows + k)
  double gemm_cols = 0;          // output features of the matmuls k was measured at
  double attention_ratio = 0;    // SDPA FLOP/s over the matmul peak, in the probe's dtype
  double attention_ratio_ragged = 0;  // the same with a K/V length not a multiple of 128
  double attention_call_tiles = 0;    // per call besides its waves, in its tiles (GPU; CPU: 0)
  double row_bytes_per_s = 0;    // fused norm kernel bandwidth (0: none built / not a GPU)
  double qk_bytes_per_s = 0;     // fused Q/K norm + RoPE kernel bandwidth (0: none built / not a GPU)
  double host_bytes_per_s = 0;   // pinned host memory -> device copies (CPU: a copy within memory), bytes/s
  double probe_ms = 0;           // time the measurement took (as measured, also when cached)
  bool from_cache = false;
  std::string cache_path;        // empty: no cache directory known
};

// Cache file of a device: $XDG_CACHE_HOME/streamplan/probe-<key>.json, else
// $HOME/.cache/streamplan/...; empty when neither variable is set.
std::string probe_cache_path(const contracts::DeviceCaps& caps);
// "cuda:0 (NVIDIA H200)" -> "cuda_0_NVIDIA_H200"; for the CPU the model name and the
// thread count are added, since both change the rates.
std::string probe_key(const contracts::DeviceCaps& caps);

// Measures now; touches no cache.
ProbeResult measure_rates(const at::Device& d, const contracts::DeviceCaps& caps);
// The cached result when a valid one exists and use_cache; otherwise measures and (re)writes
// the cache (a cache that cannot be written is skipped silently: it is only a shortcut).
ProbeResult probe_device(const at::Device& d, const contracts::DeviceCaps& caps, bool use_cache = true);
void apply_rates(const ProbeResult& r, contracts::DeviceCaps& caps);

}  // namespace sp::exec
