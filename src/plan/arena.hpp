// Arena: a program's buffers placed at offsets of one allocation by liveness (docs/schedule.md).
//
// A buffer lives from the first step that touches it to the last, across a whole loop where it
// is declared outside the loop. place() puts larger buffers first, each at the lowest offset free
// of the buffers alive with it (as ggml-alloc's reserve pass does). The executor allocates exactly
// `arena_bytes` and views the offsets, so the estimate and the allocation are the same numbers.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/program.hpp"

namespace sp::plan {

// Offsets are multiples of this (vectorized kernels; CUDA's own allocations use 512).
inline constexpr int64_t kArenaAlign = 256;

struct Placement {
  std::vector<int64_t> offset;               // per buffer; -1: not in the arena (views, separate)
  std::vector<std::pair<int, int>> live;     // per buffer: first and last step (-1: unused)
  int64_t arena_bytes = 0;
  int64_t separate_bytes = 0;  // buffers allocated on their own, rounded
  int64_t transient_bytes = 0;  // the largest step transient
  int peak_step = -1;           // the step of the largest transient (-1: no step has one)
  int64_t peak_bytes = 0;       // rounded arena + separate + transient
};

// Whether a buffer is allocated on its own rather than in the arena (it outlives the program).
bool separate(const Buffer& b);

Placement place(const Program& p, const contracts::DeviceCaps& dev);

// Throws std::logic_error naming them where two buffers alive at the same step share arena bytes,
// or a buffer ends beyond the arena (make_plan checks every chosen program in debug builds).
void check_placement(const Program& p, const Placement& pl);

}  // namespace sp::plan
