// Plan: the schedule the executor runs, as data (how it is made, stage by stage: plan/README.md).
//
// Per sublayer the plan records each candidate transformation, legal or rejected with
// legality's reasons, the chunk sizes (a transformation not chosen degenerates to a chunk
// covering everything), the policy, the estimates, the alternatives with why each lost, and the
// chosen schedule compiled into its Part. The programs point into the plan's own copy of the
// model; check_match() refuses the plan against any other model, registry entries or device.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan_types.hpp"

namespace sp::plan {

// Throws PlanMismatch unless `p` was made for a model equal to `m`, with the registry entries
// its programs call in `reg` (the same implementations) and the device `dev` (its free memory
// aside). Compares the model field by field: microseconds for a model of 50 blocks.
void check_match(const Plan& p, const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev);

// The parts in the order they run: the embedding, per block its sublayers and row norm, the final layer.
std::vector<const Part*> parts(const Plan& p);

Plan make_plan(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
               const Options& opt);

// Under a ulysses split: per split self-attention sublayer in plan order, the K/V and Q slab
// rows its exchanges trade (two values each; Options::slabs). Each rank chooses its chunks for
// its own rows, so the ranks' may differ: a run takes each value's smallest over the ranks and
// plans again with them (host/attached.cpp). Empty without a ulysses split.
std::vector<int64_t> exchange_slabs(const Plan& p);

// Floor: residual stream + the largest global K + V of any attention sublayer.
int64_t floor_bytes(const ir::Model& m);

// Human-readable plan with every rejection (JSON: report/). Consecutive blocks with the same plan
// are printed once with their range, unless `full`.
std::string explain(const Plan& p, bool full = false);

// "kv/out chunk 256, q chunk 256" / "token chunk 128, feature slice 256" / "chunk 128".
std::string chunks_text(bool attention, bool final_layer, int64_t token_chunk, int64_t q_chunk, int64_t slice);

}  // namespace sp::plan
