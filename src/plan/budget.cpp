#include "plan/budget.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <limits>
#include <numeric>
#include <tuple>

namespace sp::plan {

namespace {

constexpr int64_t GiB = int64_t{1} << 30;

[[noreturn]] void bad_budget(const std::string& text, const std::string& why) {
  throw PlanError("budget: cannot use '" + text + "': " + why +
                  " (expected bytes, or a size with a unit: KiB, MiB, GiB, TiB, KB, MB, GB, TB; e.g. 512MiB, 2.5GiB)");
}

// Multiplier of a unit: binary units are powers of 1024, decimal ones of 1000; 0 if unknown.
int64_t unit_bytes(std::string u) {
  std::transform(u.begin(), u.end(), u.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  static const std::pair<const char*, int64_t> units[] = {
      {"", 1},          {"b", 1},
      {"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", GiB}, {"tib", GiB << 10},
      {"kb", 1000},     {"mb", 1000000},  {"gb", 1000000000}, {"tb", 1000000000000}};
  for (const auto& [name, mult] : units)
    if (u == name) return mult;
  return 0;
}

// "12.3 ms vs 10.1 ms", with more decimals where the usual ones would print two equal figures.
std::string ms_pair(double a, double b) {
  const auto [x, y] = distinct_ms(a, b);
  return x + " vs " + y;
}

std::vector<int64_t> sorted_unique(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

}  // namespace

int64_t parse_budget(const std::string& text) {
  size_t i = 0, n = text.size();
  auto skip_space = [&] {
    while (i < n && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  };
  skip_space();
  const size_t int_begin = i;
  while (i < n && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  const std::string whole = text.substr(int_begin, i - int_begin);
  std::string frac;
  if (i < n && text[i] == '.') {
    const size_t f = ++i;
    while (i < n && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    frac = text.substr(f, i - f);
  }
  if (whole.empty() && frac.empty()) bad_budget(text, "no number");
  skip_space();
  const size_t unit_begin = i;
  while (i < n && std::isalpha(static_cast<unsigned char>(text[i]))) ++i;
  const std::string unit = text.substr(unit_begin, i - unit_begin);
  skip_space();
  if (i != n) bad_budget(text, "unexpected '" + text.substr(i) + "'");
  const int64_t mult = unit_bytes(unit);
  if (mult == 0) bad_budget(text, "unknown unit '" + unit + "'");

  const bool fractional = frac.find_first_not_of('0') != std::string::npos;
  int64_t bytes = 0;
  if (!fractional) {
    int64_t v = 0;
    for (char c : whole)
      if (__builtin_mul_overflow(v, int64_t{10}, &v) || __builtin_add_overflow(v, int64_t(c - '0'), &v))
        bad_budget(text, "too large");
    if (__builtin_mul_overflow(v, mult, &bytes)) bad_budget(text, "too large");
  } else {
    const long double v = std::stold((whole.empty() ? "0" : whole) + "." + frac) * static_cast<long double>(mult);
    if (mult == 1) bad_budget(text, "a fractional number of bytes");
    if (v >= static_cast<long double>(std::numeric_limits<int64_t>::max())) bad_budget(text, "too large");
    bytes = std::llround(v);
  }
  if (bytes <= 0) bad_budget(text, "a budget must be positive");
  return bytes;
}

int64_t budget_auto(const contracts::DeviceCaps& dev) {
  const int64_t margin =
      dev.kind == contracts::DeviceKind::CUDA ? std::min(dev.memory_total / 10, GiB) : dev.memory_free / 10;
  const int64_t b = dev.memory_free - margin;
  if (b <= 0)
    throw BudgetError("budget auto: device '" + dev.name + "' has " + human_bytes(dev.memory_free) +
                          " free and the margin is " + human_bytes(margin) + ": nothing remains for activations",
                      b, 0);
  return b;
}

int64_t budget_from_option(const std::string& text, const contracts::DeviceCaps& dev) {
  return text == "auto" ? budget_auto(dev) : parse_budget(text);
}

std::vector<int64_t> chunk_candidates(int64_t rows, int64_t align) {
  align = std::max<int64_t>(align, 1);
  std::vector<int64_t> out;
  auto offer = [&](int64_t c) {
    if (c >= ir::round_up(64, align) && c < rows) out.push_back(c);
  };
  for (int64_t p = 64; p < rows; p *= 2) offer(ir::round_up(p, align));
  const int64_t even = std::lcm(align, int64_t{8});
  for (int64_t k : {2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64}) {
    const int64_t c = (rows + k - 1) / k;
    if (c < 128) break;
    offer(ir::round_up(c, even));
  }
  return sorted_unique(std::move(out));
}

std::vector<int64_t> wave_chunk_candidates(int64_t rows, int64_t rep, int64_t kv_heads, int64_t slots, int64_t align) {
  if (slots <= 0 || kv_heads <= 0 || rep <= 0) return {};
  // Rows per head of one full wave, then the query rows whose rep-fold is a multiple of it.
  const int64_t wave = kAttentionTileRows * (slots / std::gcd(slots, kv_heads));
  const int64_t step = std::lcm(wave / std::gcd(wave, rep), std::max<int64_t>(align, 1));
  std::vector<int64_t> out;
  for (int64_t k : {2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32}) {
    const int64_t c = (rows + k - 1) / k;
    for (int64_t w : {c / step * step, ir::round_up(c, step)})
      if (w >= 64 && w < rows) out.push_back(w);
  }
  return sorted_unique(std::move(out));
}

std::vector<int64_t> call_chunk_candidates(const std::vector<int64_t>& qs, int64_t rows, int64_t most, int64_t ranks,
                                           int64_t rep, int64_t groups, int64_t slots, int64_t align) {
  if (slots <= 0 || ranks <= 0) return {};
  std::vector<int64_t> out;
  auto offer = [&](int64_t each) {
    if (each > 0 && each * ranks < rows && each * ranks % std::max<int64_t>(align, 1) == 0) out.push_back(each * ranks);
  };
  for (int64_t q : qs) {
    const int64_t each = (q + ranks - 1) / ranks;
    offer(each / kAttentionTileRows * kAttentionTileRows);
    offer(ir::round_up(each, kAttentionTileRows));
  }
  if (groups > 0)
    for (int64_t each : wave_chunk_candidates(most, rep, groups, slots, align)) offer(each);
  return sorted_unique(std::move(out));
}

std::vector<int64_t> feature_slice_candidates(int64_t hidden, int64_t align) {
  align = std::max<int64_t>(align, 1);
  std::vector<int64_t> out;
  for (int64_t k : {2, 4, 8}) {
    const int64_t f = ir::round_up((hidden + k - 1) / k, align);
    if (f < hidden) out.push_back(f);
  }
  return sorted_unique(std::move(out));
}

Choice choose(const std::vector<Candidate>& cs, int64_t available, const std::string& limit) {
  Choice ch;
  auto fits = [&](size_t i) { return cs[i].need() <= available; };
  // Strict "i is a better pick than j": faster, then smaller peak, then enumeration order.
  auto better = [&](size_t i, size_t j) {
    return std::tuple(cs[i].cost.seconds, cs[i].cost.peak_bytes, i) <
           std::tuple(cs[j].cost.seconds, cs[j].cost.peak_bytes, j);
  };
  // The same for the least need first.
  auto smaller = [&](size_t i, size_t j) {
    return cs[i].need() < cs[j].need() || (cs[i].need() == cs[j].need() && better(i, j));
  };
  for (size_t i = 0; i < cs.size(); ++i) {
    if (smaller(i, ch.smallest)) ch.smallest = i;
    if (fits(i) && (!ch.chosen || better(i, *ch.chosen))) ch.chosen = i;
  }
  if (!ch.chosen) return ch;
  const size_t c = *ch.chosen;

  std::vector<size_t> picks;
  auto pick = [&](std::optional<size_t> i) {
    if (i && *i != c && std::find(picks.begin(), picks.end(), *i) == picks.end()) picks.push_back(*i);
  };
  // Faster than the choice (so over budget): the fastest, and the one that misses by least.
  std::optional<size_t> fastest, closest, runner_up;
  for (size_t i = 0; i < cs.size(); ++i) {
    if (i == c) continue;
    if (better(i, c)) {
      if (!fastest || better(i, *fastest)) fastest = i;
      if (!closest || cs[i].need() < cs[*closest].need()) closest = i;
    } else if (fits(i) && cs[i].cost.seconds > cs[c].cost.seconds && (!runner_up || better(i, *runner_up))) {
      runner_up = i;
    }
  }
  pick(fastest);
  pick(closest);
  pick(runner_up);
  // The best of every other strategy: its fastest fitting candidate, else its smallest.
  std::vector<std::string> seen = {cs[c].strategy};
  for (size_t i = 0; i < cs.size(); ++i) {
    const std::string& s = cs[i].strategy;
    if (std::find(seen.begin(), seen.end(), s) != seen.end()) continue;
    seen.push_back(s);
    std::optional<size_t> best, least;
    for (size_t j = i; j < cs.size(); ++j) {
      if (cs[j].strategy != s) continue;
      if (fits(j) && (!best || better(j, *best))) best = j;
      if (!least || smaller(j, *least)) least = j;
    }
    pick(best ? best : least);
  }
  std::sort(picks.begin(), picks.end(), better);
  for (size_t i : picks) {
    const Candidate& k = cs[i];
    Alternative a{k.strategy, k.token_chunk, k.q_chunk, k.feature_slice, k.cost.peak_bytes, k.cost.ms(), ""};
    if (!fits(i)) a.lost = "over " + limit + " by " + human_bytes(k.need() - available);
    else if (k.cost.seconds > cs[c].cost.seconds)
      a.lost = "slower: " + ms_pair(k.cost.ms(), cs[c].cost.ms());
    else a.lost = "same time, larger peak";
    ch.alternatives.push_back(std::move(a));
  }
  return ch;
}

int64_t lean_cap(const std::vector<std::vector<Candidate>>& parts, double fixed_seconds, double tolerance) {
  // The schedule's time when every part takes its fastest candidate of need <= cap; the
  // largest double where some part has none.
  auto time_under = [&](int64_t cap) {
    double t = fixed_seconds;
    for (const auto& cs : parts) {
      double best = std::numeric_limits<double>::infinity();
      for (const auto& c : cs)
        if (c.need() <= cap) best = std::min(best, c.cost.seconds);
      t += best;
    }
    return t;
  };
  std::vector<int64_t> caps;
  for (const auto& cs : parts)
    for (const auto& c : cs) caps.push_back(c.need());
  if (caps.empty()) return 0;
  caps = sorted_unique(std::move(caps));
  const double limit = time_under(caps.back()) * (1.0 + tolerance);
  // time_under only falls as the cap grows: the first cap within the limit.
  size_t lo = 0, hi = caps.size() - 1;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (time_under(caps[mid]) <= limit) hi = mid;
    else lo = mid + 1;
  }
  return caps[lo];
}

std::string dominant_terms(const Program& p, const Placement& pl) {
  struct Term {
    std::string text;
    int64_t bytes;
  };
  std::vector<Term> terms;
  auto live_at = [&](size_t i, int step) {
    return pl.offset[i] >= 0 && pl.live[i].first <= step && step <= pl.live[i].second;
  };
  // The step of the largest transient, else the one with the most bytes live in the arena.
  int at = pl.peak_step;
  if (at < 0) {
    int64_t best = -1;
    for (int s = 0; s < int(p.steps.size()); ++s) {
      int64_t bytes = 0;
      for (size_t i = 0; i < p.buffers.size(); ++i)
        if (live_at(i, s)) bytes += p.buffers[i].bytes();
      if (bytes > best) best = bytes, at = s;
    }
  }
  at = std::max(at, 0);
  auto live = [&](size_t i) { return live_at(i, at); };
  int k = -1, v = -1;
  for (size_t i = 0; i < p.buffers.size(); ++i) {
    if (!live(i)) continue;
    if (p.buffers[i].role == BufRole::GlobalK) k = int(i);
    if (p.buffers[i].role == BufRole::GlobalV) v = int(i);
  }
  // Rows, heads and head_dim: of head-major K and V [G, rows, hd], or from the attend step
  // reading token-major ones [rows, G*hd]. A consumer's K carrier (another dtype than V) is
  // a term of its own.
  std::array<int64_t, 3> shape{};
  if (k >= 0 && v >= 0 && p.buffers[size_t(k)].dtype == p.buffers[size_t(v)].dtype) {
    const auto& ks = p.buffers[size_t(k)].shape;
    if (ks.size() == 3) shape = {ks[1], ks[0], ks[2]};
    for (const Step& st : p.steps)
      if (const AttendStep* a = attend_of(st.body);
          a && a->k.buf == k && a->kv_layout == Layout::Same && ks.size() == 2)
        shape = {ks[0], a->kv_heads, a->head_dim};
  }
  if (shape[0] == 0) k = v = -1;
  if (k >= 0 && v >= 0) {
    const Buffer& kb = p.buffers[size_t(k)];
    const int64_t kx = kb.bytes(), vx = p.buffers[size_t(v)].bytes();
    terms.push_back({"global K/V for " + std::to_string(shape[0]) + " tokens at " + std::to_string(shape[1]) +
                         "x" + std::to_string(shape[2]) + " " + ir::to_string(kb.dtype) + " (" +
                         (kx == vx ? "2 x " + human_bytes(kx) : human_bytes(kx) + " + " + human_bytes(vx)) + ")",
                     kx + vx});
  }
  for (size_t i = 0; i < p.buffers.size(); ++i) {
    const Buffer& b = p.buffers[i];
    if (int(i) == k || int(i) == v) continue;
    if (live(i) || (separate(b) && pl.live[i].first >= 0))
      terms.push_back({std::string(describe(b.role)) + " " + ir::shape_text(b.shape) + " " + ir::to_string(b.dtype) +
                           " (" + human_bytes(b.bytes()) + ")",
                       b.bytes()});
  }
  if (pl.transient_bytes > 0)
    terms.push_back({p.steps[size_t(at)].what + " (" + human_bytes(pl.transient_bytes) + ")", pl.transient_bytes});
  std::stable_sort(terms.begin(), terms.end(), [](const Term& a, const Term& b) { return a.bytes > b.bytes; });
  const int64_t total = pl.peak_bytes;
  std::string out;
  int64_t shown = 0;
  size_t i = 0;
  // The largest terms until they make up 90% of the peak, at most four.
  for (; i < terms.size() && i < 4 && (i == 0 || 10 * shown < 9 * total); ++i) {
    out += (i ? " + " : "") + terms[i].text;
    shown += terms[i].bytes;
  }
  if (i < terms.size())
    out += " + " + std::to_string(terms.size() - i) + " more (" + human_bytes(std::max<int64_t>(total - shown, 0)) + ")";
  return out.empty() ? "nothing" : out;
}

}  // namespace sp::plan
