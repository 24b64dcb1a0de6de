// Memory budgets: parsing a budget, the automatic budget, and the chooser (docs/budgets.md).
//
// Under a budget make_plan enumerates per sublayer the candidate schedules legality permits,
// costs each (plan/cost.hpp) and choose() takes the fastest whose peak fits, explaining the
// serious alternatives. The candidate sizes are heuristics (below, with their reasoning). A
// budget is never exceeded silently: where nothing fits, make_plan throws BudgetError.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plan/cost.hpp"
#include "plan/plan_types.hpp"
#include "plan/units.hpp"  // human_bytes, human_ms: every message here uses them

namespace sp::plan {

// "123456" (bytes), "512MiB", "2.5GiB", "300MB", "1.5GB", "64KiB", "64KB", "1TiB" (case-insensitive,
// a space allowed before the unit). Throws PlanError naming the value for anything else, zero, or a
// fractional number of bytes.
int64_t parse_budget(const std::string& text);

// What a run may use for activations on `dev`, from its free memory once the weights and inputs
// are resident. CUDA: free − min(10% of total, 1 GiB), room for the context's growth, library
// workspaces and fragmentation; CPU: 90% of MemAvailable. Throws BudgetError if nothing remains.
int64_t budget_auto(const contracts::DeviceCaps& dev);

// "auto" -> budget_auto(dev); anything else -> parse_budget.
int64_t budget_from_option(const std::string& text, const contracts::DeviceCaps& dev);

// Candidate rows per slab for `rows` rows, each < rows (the caller adds the single full
// chunk): powers of two from 64, and the sizes that cut the rows into 2, 3, 4, 6, ... 64
// near-equal slabs while those stay >= 128 rows (no small remainder slab). Below 64 rows a
// slab's matmuls run far below peak and launches dominate, so nothing smaller is offered.
// Each is a multiple of `align` (the consumer's Q alignment); the near-equal sizes also of 8.
std::vector<int64_t> chunk_candidates(int64_t rows, int64_t align);
// Query chunks whose attention calls run whole waves of tiles (plan::attention_efficiency):
// multiples of the rows that make rep x rows fill waves of `slots` tiles (TileWaves::slots)
// over `kv_heads` heads, near each slab count chunk_candidates offers; none where slots <= 0.
std::vector<int64_t> wave_chunk_candidates(int64_t rows, int64_t rep, int64_t kv_heads, int64_t slots, int64_t align);
// Q slabs (of `rows`, each below it and a multiple of `align`) whose attention calls run whole
// tiles and whole waves, on a GPU (slots > 0; none elsewhere). A call attends q / `ranks` rows
// (one rank's rows of a ulysses Q slab; ranks 1: the whole slab) of `groups` K/V heads, rep
// query heads each. Offered: each of `qs` with its calls' rows rounded down and up to whole
// tiles, and the slabs whose calls fill whole waves (wave_chunk_candidates over `most`, the
// most rows a rank holds).
std::vector<int64_t> call_chunk_candidates(const std::vector<int64_t>& qs, int64_t rows, int64_t most, int64_t ranks,
                                           int64_t rep, int64_t groups, int64_t slots, int64_t align);
// Feature slices of a sliceable MLP: hidden/2, /4, /8, rounded up to `align` (the weight
// formats' slice alignment), each < hidden. Narrower slices would shrink the scratch
// further but turn each slice's matmuls skinny and multiply the accumulator passes.
std::vector<int64_t> feature_slice_candidates(int64_t hidden, int64_t align);

// What the chooser keeps free besides a candidate's estimated peak, so that a plan which
// fits by its estimate also fits measured: 4 KiB of scalars. (The caching allocator's reuse
// slack on large blocks is in the estimate itself: DeviceCaps::held.)
inline int64_t allocator_reserve() { return 4096; }

// Without a budget the planner takes the smallest peak whose schedule's estimated time is within
// this fraction of the fastest's: the peak drops for nothing where the time curve is flat, and the
// default runs as fast as the host's own code (a 2% allowance came out 3.5% slower under ComfyUI on
// the H200: small query slabs and projections of a few thousand rows cost more than estimated).
inline constexpr double kLeanTolerance = 0.005;

// One candidate schedule of a sublayer or the final layer, with its cost.
struct Candidate {
  std::string strategy;
  int64_t token_chunk = 0, q_chunk = 0, feature_slice = 0;
  Cost cost;
  int64_t reserve = 0;  // allocator_reserve
  int64_t need() const { return cost.peak_bytes + reserve; }
};

struct Choice {
  std::optional<size_t> chosen;  // none: nothing fits
  size_t smallest = 0;           // the candidate with the least peak
  std::vector<Alternative> alternatives;
};

// The fastest candidate whose need (peak + reserve) is <= `available` (the budget minus the
// residual stream); ties go to the smaller peak. Alternatives, each with why it lost: the fastest
// and the faster one that misses by least (faster ones are over budget), the best of every other
// strategy, and the fastest fitting slower one. `limit` names `available` in the reasons.
Choice choose(const std::vector<Candidate>& candidates, int64_t available, const std::string& limit = "budget");

// Without a budget: the smallest cap on every part's need such that each part's fastest candidate
// under it keeps the schedule's time (`fixed_seconds` of parts without a choice, plus the parts')
// within `tolerance` of the fastest's; no part is then leaner than the peak the others need anyway.
int64_t lean_cap(const std::vector<std::vector<Candidate>>& parts, double fixed_seconds, double tolerance);

// The largest terms of a program's peak, for error messages: "global K/V for 38184 tokens
// at 56x128 bf16 (2 x 522.0 MiB) + consumer 'sdpa' call (3.1 MiB) + 5 more (2.0 MiB)".
std::string dominant_terms(const Program& p, const Placement& pl);

}  // namespace sp::plan
