// Cost model: the peak bytes and the estimated time of a candidate schedule.
//
// Design note. Memory is exact accounting: a sublayer's peak is its worst phase of
// schedule.hpp (buffers + declared extras, rounded by DeviceCaps::round_alloc), the same
// specs the executor allocates. Time is an estimate, good for ranking candidates of one
// model on one device, not a benchmark. It walks the slab and slice loops of the bounded
// executor (exec/bounded.cpp) and charges each operation
//
//   matmul      max(2·rows·in·out / (peak · efficiency(rows)),  bytes moved / bandwidth)
//   attention   max(4·q·kv·heads·head_dim / (peak · efficiency(q rows per K/V head)),
//                   (Q + K + V + output + 2 × the consumer's declared scratch) / bandwidth)
//   elementwise bytes read and written / bandwidth
//
// plus a fixed launch cost for every operation, so more and smaller slabs cost more
// launches, smaller matmuls run further below peak, and every Q slab re-reads the global
// K/V. Efficiency is rows/(rows + k): k is the row count at which a matmul reaches half its
// peak — with few rows a matmul re-reads its whole weight for little work. The rates (peak
// matmul throughput per dtype, bandwidth, launch cost, k) come from exec/probe.hpp where
// measured on the device, and from default_rates() otherwise.
//
// Example:
//     sp::plan::Cost c = sp::plan::sublayer_cost(model, block, sub, splan, reg, dev);
//     std::cout << c.peak_bytes << " bytes, " << c.ms() << " ms, " << c.launches << " launches\n";
#pragma once

#include <cstdint>

#include "contracts/contracts.hpp"
#include "ir/model.hpp"

namespace sp::plan {

struct SublayerPlan;

struct Rates {
  double flops_f16 = 0;       // matmul FLOP/s in bf16 / fp16
  double flops_f32 = 0;       // matmul FLOP/s in fp32 (fp64: half)
  double bytes_per_s = 0;     // bandwidth (bytes read + written)
  double launch_s = 0;        // per operation
  double gemm_half_rows = 0;  // k of the efficiency rows/(rows + k)
  double flops(ir::DType dt) const;
};

// Defaults when no probe ran (documented figures, not measurements):
//   CPU:  50 GFLOP/s (fp32 and 16-bit), 10 GB/s, 5 us per operation, k = 32 rows
//         (a few cores of a server CPU; its matmuls are near peak from a few dozen rows).
//   CUDA: an H200: 700 TFLOP/s bf16/fp16 (achieved, of ~990 peak), 50 TFLOP/s fp32 (ATen's
//         default disables TF32), 3.5 TB/s, 8 us per operation, k = 256 rows (a bf16 matmul
//         of 4096 x 4096 weights is bound by reading its weight below ~300 rows).
Rates default_rates(contracts::DeviceKind kind);
// The device's measured rates, each missing (0) one from default_rates().
Rates rates_of(const contracts::DeviceCaps& dev);

// Fraction of peak a matmul of `rows` rows reaches: rows / (rows + k); 1 when k <= 0.
double gemm_efficiency(int64_t rows, double half_rows);

struct Cost {
  int64_t peak_bytes = 0;  // above the residual stream: the worst phase
  double seconds = 0;
  int64_t launches = 0;
  double ms() const { return seconds * 1e3; }
};

// Peak (worst phase, as make_plan counts it) and time of one sublayer under plan `p`.
Cost sublayer_cost(const ir::Model& m, const ir::Block& b, const ir::Sublayer& s, const SublayerPlan& p,
                   const contracts::Registry& reg, const contracts::DeviceCaps& dev);
// The final layer with `chunk` rows per slab; the embedding of every segment.
Cost final_cost(const ir::Model& m, int64_t chunk, const contracts::Registry& reg, const contracts::DeviceCaps& dev);
Cost embed_cost(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev);

}  // namespace sp::plan
