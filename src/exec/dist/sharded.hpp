// Weights sharded over a sequence-parallel group, as FSDP shards them: each block's tensors are
// packed into one buffer, of which every rank keeps 1/N on its device; as a block begins, the
// whole buffer is all-gathered into one of two device slots, and the next block's gather starts
// into the other, so that it runs while this block computes. A block's tensors are views of its
// slot while it runs. Blocks kept whole (plan::Residency::streamed false) and the tensors outside
// the blocks are on every rank's device whole.
//
// Example (every rank of `pg`, the same model and weights):
//     sp::exec::dist::ShardedWeights w(model, weights, reg, pg, at::Device(at::kCUDA, rank));
//     at::Tensor out = sp::exec::run_planned(model, plan, w, inputs, reg, caps, {}, nullptr, pg.get());
#pragma once

#include <memory>
#include <vector>

#include "exec/dist/exchange.hpp"
#include "exec/residency/streamed.hpp"

namespace sp::exec::dist {

class ShardedWeights : public PlacedWeights {
 public:
  // Packs the tensors of each block of `w` that `sharded` names (block_tensors; all where it is
  // empty) and keeps this rank's share on `device`; moves the other tensors of `w` there (w no
  // longer holds the sharded blocks' own).
  ShardedWeights(const ir::Model& m, std::shared_ptr<TensorWeights> w, const contracts::Registry& reg, Group pg,
                 const at::Device& device, std::vector<bool> sharded = {});
  ~ShardedWeights() override;
  ShardedWeights(const ShardedWeights&) = delete;
  ShardedWeights& operator=(const ShardedWeights&) = delete;

  at::Tensor tensor(const std::string& name) const override;
  // Every rank calls them for the same blocks in the same order (the executors do).
  void begin_block(size_t block) const override;
  void end_block(size_t block) const override;

  int64_t shard_bytes() const;  // this rank's shares of the sharded blocks, on the device
  int64_t slot_bytes() const;   // the two slots a block is gathered into
  // The tensors on the device whole: kept blocks, outside the blocks.
  int64_t whole_bytes() const { return whole_bytes_; }

 private:
  void gather(size_t block) const;  // starts the gather of `block` into its slot

  Group pg_;
  std::vector<at::Tensor> shards_;  // per block: this rank's share of its packed bytes (undefined: kept whole)
  std::vector<int64_t> ordinal_;    // per block: its place among the sharded blocks (its slot: ordinal % 2)
  std::vector<size_t> next_;        // per block: the sharded block after it (shards_.size(): none)
  int64_t whole_bytes_ = 0;
  mutable at::Tensor slots_[2];
  mutable int64_t gathered_[2] = {-1, -1};  // the block each slot holds (or is receiving)
  mutable c10::intrusive_ptr<c10d::Work> pending_[2];
  mutable int64_t current_ = -1;  // the block running
};

}  // namespace sp::exec::dist
