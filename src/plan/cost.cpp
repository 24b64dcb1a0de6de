#include "plan/cost.hpp"

#include <algorithm>
#include <cmath>

namespace sp::plan {

using ir::DType;

double Rates::flops(DType dt) const {
  switch (dt) {
    case DType::F32: return flops_per_s_f32;
    case DType::F64: return flops_per_s_f32 / 2;
    // 8-bit tensor cores (a format's native GEMM): twice the 16-bit rate, not probed.
    case DType::I8:
    case DType::F8E4M3: return 2 * flops_per_s;
    default: return flops_per_s;
  }
}

Rates default_rates(contracts::DeviceKind kind) {
  Rates r;
  const bool gpu = kind == contracts::DeviceKind::CUDA;
  r.flops_per_s = gpu ? 700e12 : 50e9;
  r.flops_per_s_f32 = gpu ? 50e12 : 50e9;
  r.bytes_per_s = gpu ? 3.5e12 : 10e9;
  r.launch_s = gpu ? 8e-6 : 5e-6;
  r.launch_gap_s = gpu ? 2e-6 : r.launch_s;
  r.gemm_half_rows = gpu ? 256 : 32;
  r.gemm_probe_cols = gpu ? 4096 : 512;
  r.attention_ratio = gpu ? 0.7 : 0.5;
  r.attention_unit_tiles = 1;
  r.attention_lone_wave = 1;
  r.host_bytes_per_s = gpu ? 25e9 : 5e9;
  r.link_bytes_per_s = gpu ? 200e9 : 2e9;
  return r;
}

Rates rates_of(const contracts::DeviceCaps& dev) {
  Rates r = default_rates(dev.kind);
  for (const auto& f : contracts::kRateFields)
    if (dev.rates.*f.member > 0) r.*f.member = dev.rates.*f.member;
  r.compute_units = dev.compute_units;
  return r;
}

double gemm_efficiency(int64_t rows, int64_t cols, const Rates& r) {
  if (r.gemm_half_rows <= 0 || rows <= 0) return 1.0;
  const double eq = cols > 0 && r.gemm_probe_cols > 0 ? double(rows) * double(cols) / r.gemm_probe_cols : double(rows);
  return eq / (eq + r.gemm_half_rows);
}

TileWaves tile_waves(const Rates& r) {
  if (r.compute_units <= 0) return {};
  const int per_unit = std::clamp(static_cast<int>(std::lround(r.attention_unit_tiles)), 1, 16);
  return {r.compute_units, per_unit, per_unit > 1 ? std::clamp(r.attention_lone_wave, 0.05, 1.0) : 1.0};
}

namespace {
int64_t tiles_of(int64_t rows_per_head, int64_t heads) {
  return (rows_per_head + kAttentionTileRows - 1) / kAttentionTileRows * heads;
}

// The share of a head's tiles' rows that are query rows: its last tile runs whole.
double tile_fill(int64_t rows_per_head) {
  return double(rows_per_head) / double(tiles_of(rows_per_head, 1) * kAttentionTileRows);
}

// The time one whole tile takes, for a call of `flops` at `peak` FLOP/s (a wave's time over its slots).
double attention_tile_seconds(double flops, int64_t rows_per_head, int64_t heads, double peak, const TileWaves& w) {
  if (w.units <= 0 || rows_per_head <= 0 || heads <= 0 || peak <= 0) return 0;
  return flops / tile_fill(rows_per_head) / double(tiles_of(rows_per_head, heads)) / (peak / double(w.slots()));
}
}  // namespace

double attention_efficiency(int64_t rows_per_head, int64_t heads, const TileWaves& w) {
  if (w.units <= 0 || rows_per_head <= 0 || heads <= 0) return 1.0;
  const int64_t tiles = tiles_of(rows_per_head, heads), slots = w.slots(), rest = tiles % slots;
  double waves = double(tiles / slots);
  if (rest > 0) {
    const int64_t busiest = (rest + w.units - 1) / w.units;  // tiles on the fullest multiprocessor
    waves += w.per_unit > 1 ? w.lone + (1.0 - w.lone) * double(busiest - 1) / double(w.per_unit - 1) : 1.0;
  }
  return tile_fill(rows_per_head) * double(tiles) / (waves * double(slots));
}

double step_seconds(const Terms& t, const Rates& r) {
  double compute = 0;
  if (t.flops > 0) {
    double ratio = 1.0;
    if (t.attention)
      ratio = t.attention_kv % kAttentionTileRows != 0 && r.attention_ratio_ragged > 0 ? r.attention_ratio_ragged
                                                                                         : r.attention_ratio;
    const double peak = r.flops(t.dtype) * ratio;
    double eff = t.gemm_rows > 0 ? gemm_efficiency(t.gemm_rows, t.gemm_cols, r) : 1.0;
    const TileWaves w = t.attention ? tile_waves(r) : TileWaves{};
    if (w.units > 0) eff = attention_efficiency(t.gemm_rows, t.attention_heads, w);
    compute = t.flops / (peak * eff);
    if (w.units > 0) compute += r.attention_call_tiles * attention_tile_seconds(t.flops, t.gemm_rows, t.attention_heads, peak, w);
  }
  double bw = r.bytes_per_s;
  if (t.mover == Mover::NormKernel && r.row_bytes_per_s > 0) bw = r.row_bytes_per_s;
  if (t.mover == Mover::QkKernel && r.qk_bytes_per_s > 0) bw = r.qk_bytes_per_s;
  // An exchange waits for its link, but for the share that runs beside this step's own work.
  const double link = t.link_bytes / r.link_bytes_per_s, beside = link * std::clamp(t.link_beside, 0.0, 1.0);
  return std::max({compute, t.bytes / bw, beside}) + (link - beside) + double(t.launches) * r.launch_gap_s;
}

Cost program_cost(const Program& p, const contracts::DeviceCaps& dev) { return program_cost(p, place(p, dev), dev); }

Cost program_cost(const Program& p, const Placement& pl, const contracts::DeviceCaps& dev) {
  const Rates r = rates_of(dev);
  Cost c;
  double host = 0;
  // Per loop (and the program): its passes, the link time of its exchanges left in flight and
  // the time of everything else in it, over all passes. Each pass's exchanges travel while the
  // next pass runs; the last pass's complete after the loop.
  struct Open {
    int64_t runs;
    double link = 0, other = 0;
  };
  std::vector<Open> open{{1}};
  auto close = [&] {
    const Open o = open.back();
    open.pop_back();
    const double hidden = std::min(o.link * (1.0 - 1.0 / double(std::max<int64_t>(o.runs, 1))), o.other);
    return o.other + o.link - hidden;
  };
  for (const Step& s : p.steps) {
    if (const auto* l = std::get_if<LoopStep>(&s.body)) {
      open.push_back({open.back().runs * l->count});
      continue;
    }
    if (std::holds_alternative<EndLoopStep>(s.body)) {
      const double loop = close();
      open.back().other += loop;
      continue;
    }
    const int64_t runs = open.back().runs;
    Terms t = s.terms;
    if (t.overlapped) {
      open.back().link += double(runs) * t.link_bytes / r.link_bytes_per_s;
      t.link_bytes = 0;
    }
    open.back().other += double(runs) * step_seconds(t, r);
    host += double(runs) * (double(s.terms.launches) * r.launch_s);  // the host's dispatch
    c.launches += runs * s.terms.launches;
  }
  c.seconds = std::max(close(), host);
  c.peak_bytes = pl.peak_bytes;
  return c;
}

Cost sublayer_cost(const ir::Model& m, const ir::Block& b, const ir::Sublayer& s, const Schedule& p,
                   const contracts::Registry& reg, const contracts::DeviceCaps& dev, double kv_budget,
                   const Sequence& seq) {
  return program_cost(compile_sublayer(m, b, s, p, reg, dev, kv_budget, seq), dev);
}

}  // namespace sp::plan
