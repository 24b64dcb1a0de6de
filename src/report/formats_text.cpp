#include "report/formats_text.hpp"

#include <map>
#include <set>
#include <tuple>

namespace sp::report {

namespace {

// "0–39", "0–9, 20–39", "3": ascending block indices as ranges of consecutive ones.
std::string index_ranges(const std::vector<size_t>& sorted) {
  std::string out;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(sorted[i]);
    if (j > i) out += "–" + std::to_string(sorted[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

std::string formats_text(const ir::Model& m, const std::vector<models::FormatLine>& lines, bool full) {
  if (full) return models::formats_text(lines);
  // The block of every block linear's weight.
  std::map<std::string, size_t> block_of;
  for (size_t b = 0; b < m.blocks.size(); ++b)
    ir::for_each_linear(m.blocks[b], [&](const ir::Linear& l) { block_of.emplace(l.weight, b); });
  struct Group {
    std::map<size_t, int> per_block;  // block -> linears of the group in it
    std::vector<std::string> outside;
  };
  using Key = std::tuple<std::string, std::string, std::string>;  // format, why, GEMM
  std::vector<Key> order;
  std::map<Key, Group> groups;
  for (const auto& l : lines) {
    const Key k{l.format, l.why, l.gemm};
    if (!groups.count(k)) order.push_back(k);
    Group& g = groups[k];
    if (auto it = block_of.find(l.weight); it != block_of.end()) ++g.per_block[it->second];
    else g.outside.push_back(l.weight);
  }
  std::string out = "weight formats (" + std::to_string(lines.size()) + " linears, grouped; --explain=full lists each):\n";
  for (const Key& k : order) {
    const Group& g = groups.at(k);
    const auto& [format, why, gemm] = k;
    const std::string what = format + " (" + why + "); GEMM: " + gemm + "\n";
    auto count = [](size_t n) { return std::to_string(n) + (n == 1 ? " linear" : " linears"); };
    if (!g.per_block.empty()) {
      std::vector<size_t> blocks;
      std::set<int> sizes;
      size_t n = 0;
      for (const auto& [b, c] : g.per_block) {
        blocks.push_back(b);
        sizes.insert(c);
        n += size_t(c);
      }
      out += "  " + count(n) + " in " + (blocks.size() == 1 ? "block " : "blocks ") + index_ranges(blocks);
      if (blocks.size() > 1 && sizes.size() == 1) out += " (" + std::to_string(*sizes.begin()) + " per block)";
      out += ": " + what;
    }
    if (!g.outside.empty()) {
      out += "  " + count(g.outside.size()) + " outside the blocks (";
      for (size_t i = 0; i < g.outside.size() && i < 4; ++i) out += (i ? ", " : "") + g.outside[i];
      if (g.outside.size() > 4) out += ", " + std::to_string(g.outside.size() - 4) + " more";
      out += "): " + what;
    }
  }
  return out;
}

}  // namespace sp::report
