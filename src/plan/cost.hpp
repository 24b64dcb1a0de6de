// Cost model: the peak bytes and the estimated time of a schedule program, from the program
// alone (the model, its terms and rates: docs/budgets.md). Memory is exact accounting (arena,
// separate buffers, largest transient); time is the larger of the device's and the host's sums
// over the steps. Good for ranking candidates of one model on one device.
#pragma once

#include <cstdint>

#include "plan/arena.hpp"

namespace sp::plan {

// The rates the estimate runs on: the device's measured ones, defaults for the others.
struct Rates : contracts::Rates {
  int compute_units = 0;  // GPU multiprocessors (tile_waves); 0: none
  double flops(ir::DType dt) const;
};

// Defaults when no probe ran: documented figures of a server CPU and of an H200, not
// measurements (docs/budgets.md, "Calibration").
Rates default_rates(contracts::DeviceKind kind);
// The device's measured rates, each missing (0) one from default_rates().
Rates rates_of(const contracts::DeviceCaps& dev);

// Fraction of peak a matmul of `rows` rows and `cols` output features reaches: r / (r + k), r its
// rows at the probe's width (rows x cols / probe_cols: output tiles fill the device; rows where a
// width is unknown); 1 when k <= 0.
double gemm_efficiency(int64_t rows, int64_t cols, const Rates& r);

// How a GPU runs attention tiles (kAttentionTileRows query rows of one K/V head each): waves of
// `units` multiprocessors x `per_unit` tiles; a last wave with one tile on each takes `lone` of
// a full one, one with per_unit on some a full one, in between in proportion. units 0: no GPU.
struct TileWaves {
  int units = 0;
  int per_unit = 1;
  double lone = 1.0;
  int64_t slots() const { return int64_t{units} * per_unit; }
};
TileWaves tile_waves(const Rates& r);

// Fraction of peak an attention call reaches on a GPU: its tiles over the time of its waves
// (docs/budgets.md: a mostly empty last wave cost ~0.5 ms per call of a Wan block), times the
// share of its tiles' rows that are rows (a head's last tile runs whole, however few rows it
// holds). 1 when units <= 0.
inline constexpr int64_t kAttentionTileRows = 128;
double attention_efficiency(int64_t rows_per_head, int64_t heads, const TileWaves& w);

struct Cost {
  int64_t peak_bytes = 0;  // above the residual stream
  double seconds = 0;
  int64_t launches = 0;
  double ms() const { return seconds * 1e3; }
};

// Device time of one execution of a step at the given rates.
double step_seconds(const Terms& t, const Rates& r);
// Peak (plan/arena.hpp) and time of a program: the larger of its summed device and host times.
Cost program_cost(const Program& p, const contracts::DeviceCaps& dev);
// The same with the program's placement at hand.
Cost program_cost(const Program& p, const Placement& pl, const contracts::DeviceCaps& dev);

// compile_sublayer (plan/program.hpp), then program_cost.
Cost sublayer_cost(const ir::Model& m, const ir::Block& b, const ir::Sublayer& s, const Schedule& p,
                   const contracts::Registry& reg, const contracts::DeviceCaps& dev, double kv_budget = 1.0,
                   const Sequence& seq = {});

}  // namespace sp::plan
