#include "host/slab_positions.hpp"

#include <stdexcept>
#include <variant>

namespace sp::host {

void SlabPositions::reset(const ir::Model& m) {
  sublayers_.clear();
  index_ = 0;
  offset_ = 0;
  for (size_t b = 0; b < m.blocks.size(); ++b)
    for (const auto& s : m.blocks[b].sublayers) {
      const auto* a = std::get_if<ir::Attention>(&s.body);
      if (!a || a->consumer != consumer_) continue;
      sublayers_.push_back({int64_t(b), m.rows(s.segments).size(), a->heads / a->kv_heads,
                            m.blocks[b].name + " " + s.name});
    }
}

SlabPositions::Place SlabPositions::next(int64_t rows) {
  const std::string who = "consumer '" + consumer_ + "': call ";
  if (index_ >= sublayers_.size())
    throw std::logic_error(who + "after its last sublayer (" + std::to_string(sublayers_.size()) + " listed)");
  const Sublayer& s = sublayers_[index_];
  if (rows <= 0 || rows % s.rep != 0)
    throw std::logic_error(who + "of " + std::to_string(rows) + " rows in " + s.name + " (heads per group " +
                           std::to_string(s.rep) + ")");
  const int64_t n = rows / s.rep;
  if (offset_ + n > s.q_total)
    throw std::logic_error(who + "of rows " + std::to_string(offset_) + "..+" + std::to_string(n) + " past the " +
                           std::to_string(s.q_total) + " query rows of " + s.name);
  const Place p{offset_, s.q_total, s.layer};
  offset_ += n;
  if (offset_ == s.q_total) {
    ++index_;
    offset_ = 0;
  }
  return p;
}

void SlabPositions::finish() const {
  if (index_ != sublayers_.size())
    throw std::logic_error("consumer '" + consumer_ + "': the run ended with " +
                           std::to_string(sublayers_.size() - index_) + " of its " + std::to_string(sublayers_.size()) +
                           " sublayers not covered");
}

}  // namespace sp::host
