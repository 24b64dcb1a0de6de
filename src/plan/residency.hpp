// Weight residency: which blocks' weights stay on the device, and how the others stream in
// (docs/residency.md). Blocks are kept (on the device for the whole run) or streamed: copied from
// host memory on a side stream into one of `slots` device buffers before the block runs, loads
// rotating through the slots in block order, cyclically across calls (prefetch depth slots - 1).
// The chooser weighs a few activation plans with 1-3 slots, keeps as many blocks as fit (spread
// evenly), predicts one call with streamed_call_ms and takes the fastest; among near-equal ones
// (0.5%) the one with fewer blocks copied from host memory, then more blocks kept. Under a
// sequence-parallel split the blocks' weights may also be sharded over the ranks: each rank
// keeps 1/N of every block that is not kept whole, and all-gathers the block over the link into
// one of two slots as it begins (exec/dist/sharded.hpp), the next block's gather running meanwhile.
// Arithmetic on measured byte counts only; no ATen.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.hpp"

namespace sp::plan {

// How a sequence-parallel run holds the blocks' weights over its ranks.
enum class WeightSplit {
  Auto,        // whichever arrangement is fastest under the device memory
  Replicated,  // every rank the whole weights: kept on the device or streamed from host memory
  Sharded,     // every rank 1/N of each block not kept, gathered over the link as the block begins
};
const char* to_string(WeightSplit);

struct ResidencyRequest {
  int64_t device_memory = 0;         // what the run may hold on the device; 0: no limit
  int resident_blocks = 0;           // at most this many blocks' weights on the device at once; 0: auto
  std::vector<int64_t> block_bytes;  // per IR block: its weights as the device allocates them
  int64_t fixed_bytes = 0;           // held for the whole run besides: other weights, inputs
  // Weights that only the family's prologue reads, on every call (a host that prepares each
  // call's inputs on the device): kept there with the fixed bytes, or left in host memory and
  // copied as the prologue reads them, the largest at once (`prologue_peak_bytes` on the device
  // while no activation is live). The chooser takes whichever is faster under the device memory.
  int64_t prologue_bytes = 0, prologue_peak_bytes = 0;
  // Under a split (Options::sequence): which arrangements of the weights are weighed. Sharded
  // without a device memory shards every block.
  WeightSplit split = WeightSplit::Auto;
};

struct Residency {
  std::vector<bool> streamed;  // per block; all false: every weight resident
  int slots = 0;               // device buffers the streamed blocks rotate through
  int64_t slot_bytes = 0;      // the largest streamed block
  int64_t kept_bytes = 0;      // weights of the blocks kept on the device
  int64_t fixed_bytes = 0, activation_bytes = 0, slack_bytes = 0, device_memory = 0;
  int64_t prologue_bytes = 0;   // the request's prologue weights, kept (in fixed_bytes) or copied
  bool prologue_copied = false;  // copied from host memory on each call
  double host_bytes_per_s = 0;  // the copy rate the prediction used
  double predicted_ms = 0;      // one call in steady state, copies included
  double resident_ms = 0;       // the same activation plan with every weight resident
  double copy_ms = 0;           // one call's copies back to back
  // Sharded: the streamed blocks come from the ranks' shares, gathered over the link into two
  // slots, not from host memory; this rank holds `shard_bytes` of them.
  bool sharded = false;
  int64_t ranks = 1, shard_bytes = 0;
  double link_bytes_per_s = 0;  // the gather rate the prediction used
  std::string why;              // the arrangements weighed and what each needed or took
  int streamed_count() const;
  // Blocks copied from host memory on each call (sharded ones come over the link).
  int host_streamed() const { return sharded ? 0 : streamed_count(); }
  int kept_count() const { return int(streamed.size()) - streamed_count(); }
  // Blocks whose weights are on the device at once: kept blocks and slots.
  int resident_blocks() const { return kept_count() + slots; }
  bool streaming() const { return slots > 0; }
  int64_t device_bytes() const;  // fixed + kept + shares + slots + activations + slack
};

struct ResidentPlan {
  Plan plan;
  Residency residency;
};

// The device memory is below what the smallest arrangement needs: nothing kept, one slot,
// the smallest activation peak. The message names that size and its parts.
class DeviceMemoryError : public PlanError {
 public:
  DeviceMemoryError(const std::string& what, int64_t device_memory, int64_t smallest)
      : PlanError(what), device_memory_bytes(device_memory), smallest_bytes(smallest) {}
  int64_t device_memory_bytes, smallest_bytes;
};

// One call's time in steady state (the third of three calls in a row): `other_ms` (embedding,
// final layer), then the blocks in order; a streamed block starts once its load finished.
// Loads run one at a time in block order, cyclically, each once the block that used its slot
// (slots loads earlier) has finished. Without `overlap` (a CPU) a load runs inside its block.
double streamed_call_ms(const std::vector<double>& block_ms, const std::vector<bool>& streamed, int slots,
                        const std::vector<double>& copy_ms, double other_ms, bool overlap);

// Which blocks are kept when `kept` of `n` are: spread evenly over the block order.
std::vector<bool> kept_pattern(int n, int kept);

// One rank's share of a block of `bytes` sharded over `ranks`, as exec::dist::ShardedWeights
// keeps it (512-byte aligned); the block's slot holds `ranks` shares.
int64_t shard_of(int64_t bytes, int64_t ranks);

// The activation plan and the residency together (opt.budget_bytes, set, fixes the activation
// budget). Under a split of opt.sequence, replicated and sharded arrangements as req.split
// allows; the plan's sequence says which was taken. Throws DeviceMemoryError when nothing fits.
ResidentPlan plan_with_residency(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
                                 const Options& opt, const ResidencyRequest& req);

// "12 of 40 blocks kept (8.2 GiB), 28 streamed through 2 slots of 702 MiB ...".
std::string explain(const Residency& r);

}  // namespace sp::plan
