// Where each call of an attention consumer lies in the model: for a host's consumer that
// takes the position of its Q slab (a consumer written in Python receives q_start, q_total
// and the layer index beside the slab).
//
// Design note. A planned run calls a sublayer's consumer once per Q slab, sublayer by
// sublayer in the model's order, each slab the next rows of that sublayer's queries (one
// slab of all of them where Q is not streamed). reset() lists the attention sublayers that
// use the consumer; next() gives each call its place and throws std::logic_error where the
// calls do not follow that order, so a consumer never sees a wrong position; finish() throws
// unless every listed sublayer was covered. reset() starts every run (also a retried one).
//
// Example:
//     sp::host::SlabPositions pos("my-attention");
//     pos.reset(model);                        // before the run
//     auto [q_start, q_total, layer] = pos.next(q.size(2));   // in each call
//     pos.finish();                            // after the run
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/model.hpp"

namespace sp::host {

class SlabPositions {
 public:
  explicit SlabPositions(std::string consumer) : consumer_(std::move(consumer)) {}

  void reset(const ir::Model& m);

  struct Place {
    int64_t q_start = 0, q_total = 0;
    int64_t layer = 0;  // block index in the model
  };
  // The place of a call with `rows` query rows as the consumer sees them (grouped-query heads
  // folded into rows).
  Place next(int64_t rows);
  void finish() const;

 private:
  struct Sublayer {
    int64_t layer = 0, q_total = 0, rep = 1;
    std::string name;
  };
  std::string consumer_;
  std::vector<Sublayer> sublayers_;
  size_t index_ = 0;
  int64_t offset_ = 0;
};

}  // namespace sp::host
