// "sparse": routed block-sparse INT8 attention (block_sparse.hpp's routing, the int8 kernels).
//
// Design note. Each call brings its plan's KV budget and video rows (contracts::AttnCall;
// plan::attn_call sets video rows only for self-attention over every row); other attention
// runs dense. Q slabs are routed by position (AttnCall::q_begin), as the full attention where
// slabs start at multiples of 64 (q_align); grouped-query heads are not routed by position
// (use kv_heads == heads models). Calls sharing a K carrier form one phase of the caller's
// SparseTally.
//
// Example:
//     sp::exec::SparseTally tally;
//     const auto& sparse = sp::exec::impl_of<sp::exec::ConsumerImpl>(reg.consumer("sparse"));
//     at::Tensor o = sparse.attend_rows(q, k, v, scale, {.kv_budget = 0.3, .video = {512, 75584}});
//     for (const auto& ph : tally.phases()) std::cout << ph.density() << "\n";
#pragma once

#include <cstdint>
#include <vector>

#include "contracts/contracts.hpp"
#include <ATen/ATen.h>

#include "exec/consumers/block_sparse.hpp"

namespace sp::exec {

struct SparsePhase {
  int64_t kv_rows = 0;
  int64_t visited = 0, tiles = 0;  // (head, query tile, key tile) triples
  double density() const { return tiles ? double(visited) / double(tiles) : 1.0; }
};

// The key tiles each query tile of a Q slab visits, as the CSR list the int8 kernel takes:
// qm [G, ceil(q_rows / 64), D] and km [G, ceil(kv_rows / 64), D] the tile means of the slab
// (first row call.q_begin) and of K, on any device. Dense (undefined offsets) where the call is
// not routed (AttnCall::routed). `visited` / `tiles` count (head, query tile, key tile) triples.
struct RoutedTiles {
  at::Tensor offsets, indices;  // int32 [G * q tiles + 1], [visited]
  int64_t visited = 0, tiles = 0;
};
RoutedTiles route_slab(const at::Tensor& qm, const at::Tensor& km, int64_t q_rows, int64_t kv_rows,
                       const contracts::AttnCall& call);

// The phases of routed attention that the "sparse" consumer runs on this thread while the
// tally lives, in order (the innermost tally's, where they nest): the caller's record, not
// the consumer's.
class SparseTally {
 public:
  SparseTally();
  ~SparseTally();
  SparseTally(const SparseTally&) = delete;
  SparseTally& operator=(const SparseTally&) = delete;
  const std::vector<SparsePhase>& phases() const { return phases_; }
  // A call of the phase `id` (its K carrier's): a new phase where the last one had another id.
  void add(const SparsePhase& call, uint64_t id);
  static SparseTally* current();

 private:
  SparseTally* outer_;
  std::vector<SparsePhase> phases_;
  std::vector<uint64_t> ids_;
};

}  // namespace sp::exec
