#include "exec/dist/sharded.hpp"

#include <stdexcept>

namespace sp::exec::dist {

namespace {
constexpr int64_t kAlign = 512;  // bytes: every tensor's offset in its block, every share
}  // namespace

ShardedWeights::ShardedWeights(const ir::Model& m, std::shared_ptr<TensorWeights> w, const contracts::Registry& reg,
                               Group pg, const at::Device& device, std::vector<bool> sharded)
    : PlacedWeights(std::move(w), reg), pg_(std::move(pg)) {
  const int64_t p = pg_->getSize(), me = pg_->getRank();
  const auto blocks = block_tensors(m, *w_, reg);
  if (sharded.empty()) sharded.assign(blocks.size(), true);
  if (sharded.size() != blocks.size())
    throw std::invalid_argument("sharded weights: " + std::to_string(sharded.size()) + " block flags for a model of " +
                                std::to_string(blocks.size()) + " blocks");
  shards_.resize(blocks.size());
  ordinal_.assign(blocks.size(), -1);
  next_.assign(blocks.size(), blocks.size());
  int64_t most = 0, count = 0;
  for (size_t b = blocks.size(); b-- > 0;)
    if (b + 1 < blocks.size()) next_[b] = sharded[b + 1] ? b + 1 : next_[b + 1];
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (!sharded[b]) continue;
    ordinal_[b] = count++;
    // The block packed: each tensor's bytes at an aligned offset.
    std::vector<std::pair<const Place*, at::Tensor>> packed;
    int64_t bytes = 0;
    for (const auto& name : blocks[b]) {
      const at::Tensor t = w_->tensor(name);
      const Place& pl = places_[name] = {b, bytes, t.scalar_type(), t.sizes().vec()};
      packed.emplace_back(&pl, t);
      bytes = ir::round_up(bytes + t.numel() * int64_t(t.element_size()), kAlign);
    }
    // This rank's share: bytes [me * share, (me + 1) * share) of the packed block.
    const int64_t share = plan::shard_of(bytes, p), lo = me * share, hi = lo + share;
    at::Tensor mine = at::zeros({share}, at::TensorOptions().dtype(at::kByte).device(device));
    for (const auto& [pl, t] : packed) {
      const int64_t n = t.numel() * int64_t(t.element_size());
      const int64_t from = std::max(pl->offset, lo), to = std::min(pl->offset + n, hi);
      if (from < to)
        mine.narrow(0, from - lo, to - from)
            .copy_(t.contiguous().view({-1}).view(at::kByte).narrow(0, from - pl->offset, to - from));
    }
    shards_[b] = std::move(mine);
    most = std::max(most, share * p);
  }
  if (count > 0)
    for (auto& s : slots_) s = at::empty({most}, at::TensorOptions().dtype(at::kByte).device(device));
  // The packed tensors are the shares now; the others whole on the device.
  std::vector<std::string> names;
  for (const auto& [name, t] : w_->all()) names.push_back(name);
  for (const auto& name : names) {
    if (places_.count(name)) w_->take(name);
    else {
      const at::Tensor t = w_->tensor(name);
      if (t.device() != device) w_->add(name, t.to(device));
      whole_bytes_ += int64_t(t.nbytes());
    }
  }
}

ShardedWeights::~ShardedWeights() {
  for (auto& w : pending_)
    if (w) w->wait();
}

void ShardedWeights::gather(size_t block) const {
  const size_t s = size_t(ordinal_[block] % 2);
  if (pending_[s]) pending_[s]->wait();  // a gather of a run that stopped half-way
  at::Tensor out = slots_[s].narrow(0, 0, shards_[block].numel() * pg_->getSize());
  at::Tensor in = shards_[block];
  pending_[s] = pg_->_allgather_base(out, in);
  gathered_[s] = int64_t(block);
}

void ShardedWeights::begin_block(size_t block) const {
  if (block >= shards_.size() || !shards_[block].defined()) return;
  const size_t s = size_t(ordinal_[block] % 2);
  if (gathered_[s] != int64_t(block) || !pending_[s]) gather(block);  // not prefetched
  pending_[s]->wait();
  pending_[s].reset();
  if (next_[block] < shards_.size()) gather(next_[block]);  // while this block computes
  current_ = int64_t(block);
}

void ShardedWeights::end_block(size_t) const { current_ = -1; }

at::Tensor ShardedWeights::tensor(const std::string& name) const {
  auto it = places_.find(name);
  if (it == places_.end()) return w_->tensor(name);
  const Place& p = it->second;
  if (int64_t(p.block) != current_)
    throw std::logic_error("weight '" + name + "' of sharded block " + std::to_string(p.block) +
                           " read outside the block's work");
  return view(slots_[size_t(ordinal_[p.block] % 2)], p);
}

int64_t ShardedWeights::shard_bytes() const {
  int64_t n = 0;
  for (const auto& s : shards_)
    if (s.defined()) n += s.numel();
  return n;
}

int64_t ShardedWeights::slot_bytes() const {
  return slots_[0].defined() ? slots_[0].numel() + slots_[1].numel() : 0;
}

}  // namespace sp::exec::dist
