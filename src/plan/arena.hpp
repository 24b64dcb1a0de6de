// Arena: a program's buffers placed at offsets of one allocation by liveness.
//
// Design note. A buffer lives from the first step that touches it to the last; a buffer
// used inside a loop but declared outside it lives across the whole loop (later slabs use
// it again). place() assigns each buffer an offset so that no two buffers alive at the same
// step overlap — larger buffers first, each at the lowest offset that fits, as ggml-alloc's
// reserve pass does — and the arena is the highest end. This replaces hand-declared sharing:
// N32 is dead once H holds the rows, so a later slab buffer takes its bytes, and so on.
//
// The executor allocates exactly `arena_bytes` once per program and takes views at the
// offsets, so the estimate and the allocation are the same numbers: the estimated peak is
// the rounded arena, plus the buffers allocated on their own (the model output, which
// outlives the program), plus the largest transient a step allocates outside the arena
// (a consumer's output and scratch, a CPU kernel's cast temporary).
//
// Example:
//     sp::plan::Placement pl = sp::plan::place(prog, dev);
//     at::Tensor arena = at::empty({pl.arena_bytes}, at::kByte);
//     // buffer i: arena.narrow(0, pl.offset[i], prog.buffers[i].bytes())
#pragma once

#include <cstdint>
#include <vector>

#include "contracts/contracts.hpp"
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

// Throws std::logic_error naming them where two buffers alive at the same step share arena
// bytes, or a buffer ends beyond the arena. make_plan checks every chosen program in debug
// builds.
void check_placement(const Program& p, const Placement& pl);

}  // namespace sp::plan
