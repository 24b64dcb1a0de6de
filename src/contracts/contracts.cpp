#include "contracts/contracts.hpp"

#include <algorithm>

namespace sp::contracts {

const char* to_string(Cap c) { return ir::name_of(c, {"undeclared", "no", "yes"}); }

const char* to_string(TensorRole r) {
  return ir::name_of(r, {"Q", "K", "V", "attention output", "MLP hidden", "block input", "block output"});
}

// CUDA's caching allocator hands out blocks in multiples of 512 bytes. A request of 10 MiB
// or more gets its own segment rounded to 2 MiB, and the block keeps the whole segment
// unless more than 1 MiB would be left over (the allocator's split rule for large blocks).
int64_t DeviceCaps::held(int64_t bytes, int allocations) const {
  if (bytes <= 0) return 0;
  const int64_t large = reuse_slack > 0 ? std::min<int64_t>(allocations, bytes >> 20) : 0;
  if (allocations <= 1 && large == 0) return round_alloc(bytes);
  // Each request rounded on its own; a large one's slack also covers a new segment's rounding.
  return ir::round_up(bytes, alloc_round) + (allocations - 1) * (alloc_round - 1) + large * reuse_slack;
}

int64_t DeviceCaps::round_alloc(int64_t bytes) const {
  if (bytes <= 0) return 0;
  const int64_t r = ir::round_up(bytes, alloc_round);
  if (kind != DeviceKind::CUDA) return r;
  constexpr int64_t MiB = int64_t{1} << 20;
  if (r < 10 * MiB) return r;
  const int64_t segment = ir::round_up(r, 2 * MiB);
  return segment - r > MiB ? r : segment;
}

int64_t scalar_operand_bytes(ir::DType op, DeviceKind device) {
  return device == DeviceKind::CPU ? 8 + static_cast<int64_t>(ir::dtype_size(op)) : 0;
}

void Registry::add(ConsumerCaps c) {
  if (!c.call_bytes)
    throw ContractError("consumer '" + c.name + "': call_bytes must be declared");
  consumers_[c.name] = std::move(c);
}
void Registry::add(FormatCaps f) { formats_[f.name] = std::move(f); }
void Registry::add(PatchCaps p) { patches_[p.name] = std::move(p); }

namespace {
template <typename M>
const typename M::mapped_type& lookup(const M& m, const std::string& name, const char* what) {
  auto it = m.find(name);
  if (it != m.end()) return it->second;
  std::string known;
  for (const auto& [k, v] : m) known += (known.empty() ? "" : ", ") + k;
  throw ContractError(std::string("unknown ") + what + " '" + name + "' (known: " + known + ")");
}
template <typename M>
std::vector<std::string> keys(const M& m) {
  std::vector<std::string> out;
  for (const auto& [k, v] : m) out.push_back(k);
  return out;
}
}  // namespace

const ConsumerCaps& Registry::consumer(const std::string& n) const { return lookup(consumers_, n, "attention consumer"); }
const FormatCaps& Registry::format(const std::string& n) const { return lookup(formats_, n, "weight format"); }
const PatchCaps& Registry::patch(const std::string& n) const { return lookup(patches_, n, "patch"); }
std::vector<std::string> Registry::consumer_names() const { return keys(consumers_); }
std::vector<std::string> Registry::format_names() const { return keys(formats_); }
std::vector<std::string> Registry::patch_names() const { return keys(patches_); }

}  // namespace sp::contracts
