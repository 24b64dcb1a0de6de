// Cost model: the peak bytes and the estimated time of a schedule program (the model, its
// terms and rates: docs/budgets.md).
//
// Design note. Both come from the program (plan/program.hpp) and nothing else. Memory is exact
// accounting: the arena plan/arena.hpp places (the executor allocates exactly it), the buffers
// allocated on their own, and the largest transient a step declares. Time is the larger of the
// device's and the host's sums over the steps (loop bodies times their slab counts): the host
// queues work ahead of a GPU, so a program takes its device time unless dispatching its
// operations takes longer. The rates come from exec/device/probe.hpp where measured on the
// device, from default_rates() otherwise. Good for ranking candidates of one model on one device.
//
// Example:
//     sp::plan::Cost c = sp::plan::sublayer_cost(model, block, sub, splan, reg, dev);
//     std::cout << c.peak_bytes << " bytes, " << c.ms() << " ms, " << c.launches << " launches\n";
#pragma once

#include <cstdint>

#include "contracts/contracts.hpp"
#include "ir/model.hpp"
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

// Fraction of peak a matmul of `rows` rows and `cols` output features reaches: r / (r + k),
// r its rows at the width the curve was measured at (rows x cols / probe_cols: a matmul's
// output tiles fill the device, not its rows alone; rows where either width is unknown);
// 1 when k <= 0.
double gemm_efficiency(int64_t rows, int64_t cols, const Rates& r);

// How a GPU runs attention tiles (kAttentionTileRows query rows of one K/V head each): `units`
// multiprocessors running `per_unit` tiles each at once, so waves of units x per_unit tiles. A
// last, partly filled wave takes as long as a full one where some multiprocessor runs
// per_unit tiles in it; with one tile on each it takes `lone` of a full wave (a tile alone on
// a multiprocessor runs faster), and in between in proportion. units 0: not a GPU.
struct TileWaves {
  int units = 0;
  int per_unit = 1;
  double lone = 1.0;
  int64_t slots() const { return int64_t{units} * per_unit; }
};
TileWaves tile_waves(const Rates& r);

// Fraction of peak an attention call reaches on a GPU: its tiles over the time of its waves.
// With a long K/V a tile runs for about a millisecond, so a slab of queries that leaves a wave
// mostly empty costs that much: measured on an H200 (132 units of 2 tiles), about 0.5 ms per
// attention call of a 75,600-token Wan block. 1 when units <= 0.
inline constexpr int64_t kAttentionTileRows = 128;
double attention_efficiency(int64_t rows_per_head, int64_t heads, const TileWaves& w);
// The time one of those tiles takes, for a call of `flops` at `peak` FLOP/s (a wave's time
// over its slots).
double attention_tile_seconds(double flops, int64_t rows_per_head, int64_t heads, double peak, const TileWaves& w);

struct Cost {
  int64_t peak_bytes = 0;  // above the residual stream
  double seconds = 0;
  int64_t launches = 0;
  double ms() const { return seconds * 1e3; }
};

// Device time of one execution of a step at the given rates, and the host's (its dispatch).
double step_seconds(const Terms& t, const Rates& r);
double step_host_seconds(const Terms& t, const Rates& r);
// Peak (plan/arena.hpp) and time of a program: the larger of its summed device and host times.
Cost program_cost(const Program& p, const contracts::DeviceCaps& dev);
// The same with the program's placement at hand.
Cost program_cost(const Program& p, const Placement& pl, const contracts::DeviceCaps& dev);

// compile_* (plan/program.hpp), then program_cost.
Cost sublayer_cost(const ir::Model& m, const ir::Block& b, const ir::Sublayer& s, const Schedule& p,
                   const contracts::Registry& reg, const contracts::DeviceCaps& dev, double kv_budget = 1.0);
Cost final_cost(const ir::Model& m, int64_t chunk, const contracts::Registry& reg, const contracts::DeviceCaps& dev);

}  // namespace sp::plan
