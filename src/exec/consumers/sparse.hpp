// "sparse": routed block-sparse INT8 attention (block_sparse.hpp's routing, the int8 kernels).
//
// Design note. The consumer is registered dense (budget 1); a run that chooses it registers it
// again with its options: the budget of the step (plan::kv_budget_at) and the video rows in
// the model's token order. Routing applies to self-attention over all `rows` tokens (K/V of
// exactly that length); other attention (cross-attention to a context) runs dense. Q slabs
// are routed by their position (ConsumerImpl::attend_rows), so a slab's query tiles are the
// tiles of the full attention when slabs start at multiples of 64 (q_align). Grouped-query
// heads (rows folded per group) are not routed by position: use kv_heads == heads models.
// Every call records the fraction of tiles it visited; calls that share a K carrier form one
// phase (one attention sublayer run) in sparse_phases().
//
// Example:
//     sp::exec::configure_sparse(reg, {.budget = 0.3, .video = {512, 75584}, .rows = 75584});
//     ... run ...
//     for (const auto& ph : sp::exec::sparse_phases(reg)) std::cout << ph.density << "\n";
#pragma once

#include <cstdint>
#include <vector>

#include "contracts/contracts.hpp"
#include <ATen/ATen.h>

#include "exec/consumers/block_sparse.hpp"
#include "ir/model.hpp"

namespace sp::exec {

struct SparseOptions {
  double budget = 1.0;
  VideoRows video;
  int64_t rows = 0;  // tokens of the self-attention that is routed
};

struct SparsePhase {
  int64_t kv_rows = 0;
  double budget = 1.0;
  int64_t visited = 0, tiles = 0;  // (head, query tile, key tile) triples
  double density() const { return tiles ? double(visited) / double(tiles) : 1.0; }
};

// The key tiles each query tile of a Q slab visits, as the CSR list the int8 kernel takes:
// qm [G, ceil(q_rows / 64), D] and km [G, ceil(kv_rows / 64), D] the tile means of the slab
// (first row q_begin) and of K, on any device. Dense (undefined offsets) where the options do
// not route this call. `visited` / `tiles` count (head, query tile, key tile) triples.
struct RoutedTiles {
  at::Tensor offsets, indices;  // int32 [G * q tiles + 1], [visited]
  int64_t visited = 0, tiles = 0;
};
RoutedTiles route_slab(const at::Tensor& qm, const at::Tensor& km, int64_t q_begin, int64_t q_rows, int64_t kv_rows,
                       const SparseOptions& o);

// The options of a run of model `m`: its "video" segment's rows and all its tokens; throws
// std::invalid_argument naming the segments when it has no "video" segment.
SparseOptions sparse_options(const ir::Model& m, double budget);

// Registers "sparse" with these options (replacing the registered one).
void configure_sparse(contracts::Registry& reg, const SparseOptions& o);
// For hosts that keep one registry over runs of several geometries: the registered sparse
// consumer's (caps from Registry::consumer("sparse")) budget, checked to lie in (0, 1], and
// its rows from the model of the next run (sparse_options).
void set_sparse_budget(const contracts::ConsumerCaps& sparse, double budget);
void set_sparse_model(const contracts::ConsumerCaps& sparse, const ir::Model& m);
// The phases the registered "sparse" consumer ran so far, in order.
std::vector<SparsePhase> sparse_phases(const contracts::Registry& reg);

}  // namespace sp::exec
