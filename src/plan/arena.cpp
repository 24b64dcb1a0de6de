#include "plan/arena.hpp"

#include <algorithm>
#include <stdexcept>

namespace sp::plan {

bool separate(const Buffer& b) { return b.role == BufRole::Output; }

namespace {

int64_t align_up(int64_t v) { return ir::round_up(v, kArenaAlign); }

// [first, last] step of every buffer, a loop-carried use extended over the whole loop.
std::vector<std::pair<int, int>> liveness(const Program& p) {
  std::vector<std::pair<int, int>> live(p.buffers.size(), {-1, -1});
  std::vector<int> open;  // LoopStep indices enclosing the current step, outermost first
  auto touch = [&](int buf, int step) {
    auto& [first, last] = live[size_t(buf)];
    int lo = step, hi = step;
    for (size_t k = 0; k < open.size(); ++k) {
      if (int(k) + 1 <= p.buffers[size_t(buf)].depth) continue;  // declared inside this loop
      lo = std::min(lo, open[k]);
      hi = std::max(hi, std::get<LoopStep>(p.steps[size_t(open[k])].body).end);
    }
    first = first < 0 ? lo : std::min(first, lo);
    last = std::max(last, hi);
  };
  for (int i = 0; i < int(p.steps.size()); ++i) {
    const Step& s = p.steps[size_t(i)];
    if (std::holds_alternative<EndLoopStep>(s.body)) open.pop_back();
    for (int b : s.reads) touch(b, i);
    for (int b : s.writes) touch(b, i);
    if (std::holds_alternative<LoopStep>(s.body)) open.push_back(i);
  }
  return live;
}

}  // namespace

Placement place(const Program& p, const contracts::DeviceCaps& dev) {
  Placement pl;
  pl.live = liveness(p);
  pl.offset.assign(p.buffers.size(), -1);
  std::vector<int> order;
  for (int i = 0; i < int(p.buffers.size()); ++i) {
    const Buffer& b = p.buffers[size_t(i)];
    if (b.bytes() == 0 || pl.live[size_t(i)].first < 0) continue;
    if (separate(b)) pl.separate_bytes += dev.held(b.bytes());
    else order.push_back(i);
  }
  // Largest first; ties by first use, so the placement is deterministic.
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const int64_t x = p.buffers[size_t(a)].bytes(), y = p.buffers[size_t(b)].bytes();
    if (x != y) return x > y;
    return pl.live[size_t(a)].first < pl.live[size_t(b)].first;
  });
  std::vector<int> placed;
  for (int i : order) {
    const auto [f, l] = pl.live[size_t(i)];
    const int64_t size = align_up(p.buffers[size_t(i)].bytes());
    // Byte ranges of placed buffers alive at the same time, by offset.
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (int j : placed) {
      const auto [g, m] = pl.live[size_t(j)];
      if (g <= l && f <= m) busy.push_back({pl.offset[size_t(j)], pl.offset[size_t(j)] + align_up(p.buffers[size_t(j)].bytes())});
    }
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (const auto& [lo, hi] : busy) {
      if (at + size <= lo) break;
      at = std::max(at, hi);
    }
    pl.offset[size_t(i)] = at;
    pl.arena_bytes = std::max(pl.arena_bytes, at + size);
    placed.push_back(i);
  }
  for (int i = 0; i < int(p.steps.size()); ++i)
    if (p.steps[size_t(i)].transient > pl.transient_bytes) {
      pl.transient_bytes = p.steps[size_t(i)].transient;
      pl.peak_step = i;
    }
  pl.peak_bytes = dev.held(pl.arena_bytes) + pl.separate_bytes + pl.transient_bytes;
  return pl;
}

void check_placement(const Program& p, const Placement& pl) {
  auto end = [&](size_t i) { return pl.offset[i] + p.buffers[i].bytes(); };
  auto text = [&](size_t i) {
    return buffer_text(p.buffers[i]) + " at [" + std::to_string(pl.offset[i]) + ", " + std::to_string(end(i)) +
           ") alive in steps [" + std::to_string(pl.live[i].first) + ", " + std::to_string(pl.live[i].second) + "]";
  };
  for (size_t i = 0; i < p.buffers.size(); ++i) {
    if (pl.offset[i] < 0) continue;
    if (end(i) > pl.arena_bytes)
      throw std::logic_error(p.name + ": " + text(i) + " ends beyond the arena of " + std::to_string(pl.arena_bytes));
    for (size_t j = i + 1; j < p.buffers.size(); ++j) {
      const bool together = pl.live[j].first <= pl.live[i].second && pl.live[i].first <= pl.live[j].second;
      if (pl.offset[j] >= 0 && together && pl.offset[j] < end(i) && pl.offset[i] < end(j))
        throw std::logic_error(p.name + ": " + text(i) + " and " + text(j) + " share bytes");
    }
  }
}

}  // namespace sp::plan
