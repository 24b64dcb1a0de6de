// Schedule programs as data: names, sizes, printing, and which row operations run fused.
// The compiler that writes programs is compile.cpp.
#include "plan/program.hpp"

#include <algorithm>
#include <iterator>
#include <numeric>
#include <stdexcept>
#include <sstream>
#include <utility>

namespace sp::plan {

using contracts::TensorRole;
using ir::DType;

namespace {
// Per BufRole, in declaration order: its short name in programs and its description.
constexpr std::pair<const char*, const char*> kRoles[] = {
    {"K", "global K"},
    {"V", "global V"},
    {"N32", "normalized rows (fp32)"},
    {"H", "normalized rows"},
    {"Stats", "row statistics"},
    {"KV", "projected K/V slab"},
    {"S32", "Q/K slab for norm and RoPE"},
    {"RopeTmp", "RoPE scratch"},
    {"Q", "projected Q slab"},
    {"QF", "Q slab in the attention layout"},
    {"O", "attention output slab"},
    {"OFull", "complete attention output"},
    {"Y", "projection slab"},
    {"U", "MLP hidden slab"},
    {"Acc", "feature-slice accumulator"},
    {"Out", "model output"},
    {"W", "acquired weight"},
    {"LoraAx", "LoRA A·x slab"},
    {"KSlab", "K slab for the consumer's carrier"},
    {"Rows", "this rank's rows for an exchange"},
    {"Heads", "every rank's rows of this rank's heads"},
};
static_assert(std::size(kRoles) == static_cast<size_t>(BufRole::SeqHeads) + 1, "names for every buffer role");
}  // namespace

const char* to_string(BufRole r) { return kRoles[static_cast<size_t>(r)].first; }
const char* describe(BufRole r) { return kRoles[static_cast<size_t>(r)].second; }

int64_t Buffer::bytes() const {
  if (view) return 0;
  int64_t n = static_cast<int64_t>(ir::dtype_size(dtype));
  for (int64_t d : shape) n *= d;
  return n;
}

const char* step_name(const StepBody& b) {
  static const char* names[] = {"loop",    "end",     "acquire", "release", "zero",     "norm",
                                "copy",    "project", "qk-norm", "rope",    "qk-fused", "patch",
                                "attend",  "activate", "mul",    "add",     "add-bias", "residual-add", "lora",
                                "carry-k", "exchange"};
  static_assert(std::size(names) == std::variant_size_v<StepBody>, "a name for every step kind");
  return names[b.index()];
}

const char* to_string(SeqMode m) { return m == SeqMode::Ulysses ? "ulysses" : "ring"; }

std::vector<int64_t> shares(int64_t n, int64_t p) {
  if (n < 0 || p < 1)
    throw std::invalid_argument("shares: " + std::to_string(n) + " items over " + std::to_string(p) + " ranks");
  std::vector<int64_t> s(size_t(p), n / p);
  for (int64_t i = 0; i < n % p; ++i) ++s[size_t(i)];
  return s;
}

ir::RowRange own_rows(const Sequence& s, int64_t tokens) {
  const std::vector<int64_t> r = shares(tokens, s.ranks);
  if (s.rank < 0 || s.rank >= s.ranks)
    throw std::invalid_argument("sequence: rank " + std::to_string(s.rank) + " of " + std::to_string(s.ranks));
  const int64_t begin = std::accumulate(r.begin(), r.begin() + s.rank, int64_t{0});
  return {begin, begin + r[size_t(s.rank)]};
}

std::vector<ir::RowRange> ranges_per_rank(const Sequence& s, int64_t tokens, ir::RowRange rr) {
  std::vector<ir::RowRange> out;
  for (int64_t k = 0; k < s.ranks; ++k) {
    const ir::RowRange o = own_rows({k, s.ranks, s.mode}, tokens);
    const int64_t begin = std::clamp(o.begin, rr.begin, rr.end);
    out.push_back({begin, std::clamp(o.end, begin, rr.end)});
  }
  return out;
}

std::vector<int64_t> rows_per_rank(const Sequence& s, int64_t tokens, ir::RowRange rr) {
  std::vector<int64_t> out;
  for (const ir::RowRange& r : ranges_per_rank(s, tokens, rr)) out.push_back(r.size());
  return out;
}

int64_t most_rows(const Sequence& s, int64_t tokens, ir::RowRange rr) {
  return std::ranges::max(rows_per_rank(s, tokens, rr));
}

std::pair<int64_t, int64_t> ulysses_slabs(const Schedule& p, int64_t most, int64_t ranks) {
  const int64_t top = std::max<int64_t>(most, 1);
  return {std::clamp<int64_t>(p.token_chunk, 1, top), std::clamp<int64_t>((p.q_chunk + ranks - 1) / ranks, 1, top)};
}

std::string sequence_text(const Sequence& s, int64_t tokens) {
  if (!s.split()) return "";
  const ir::RowRange o = own_rows(s, tokens);
  return std::string(to_string(s.mode)) + " over " + std::to_string(s.ranks) + " ranks, rank " +
         std::to_string(s.rank) + ": rows [" + std::to_string(o.begin) + ", " + std::to_string(o.end) + ") of " +
         std::to_string(tokens);
}

ir::DType accumulation_dtype(ir::DType activations) { return activations == DType::F64 ? DType::F64 : DType::F32; }

bool fused_norm(const ir::Model& m, const contracts::DeviceCaps& dev) {
  return dev.fused_row_kernels == contracts::Cap::Yes &&
         (m.dtype == DType::F32 || m.dtype == DType::F16 || m.dtype == DType::BF16);
}

bool fused_qk(const ir::Model& m, const ir::Attention& a, const contracts::Registry& reg,
              const contracts::DeviceCaps& dev) {
  if (!fused_norm(m, dev)) return false;
  return std::none_of(a.patches.begin(), a.patches.end(), [&](const std::string& name) {
    const auto& p = reg.patch(name);
    return p.touches(TensorRole::Q) || p.touches(TensorRole::K);
  });
}

std::string ring_consumer(const contracts::Registry& reg, const ir::Attention& a) {
  return reg.consumer(a.consumer).lse == contracts::Cap::Yes ? a.consumer : "math";
}

std::string row_kernels_note(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev) {
  if (dev.fused_row_kernels != contracts::Cap::Yes)
    return std::string("ATen operations with fp32 staging (device '") + dev.name + "' declares fused row kernels: " +
           contracts::to_string(dev.fused_row_kernels) + ")";
  if (!fused_norm(m, dev))
    return std::string("ATen operations with fp32 staging (the fused kernels take fp32, fp16 and bf16, not ") +
           ir::to_string(m.dtype) + ")";
  std::string note = "fused kernels (norm + modulation; Q/K norm + RoPE)";
  std::vector<std::string> staged;
  for (const auto& b : m.blocks)
    for (const auto& s : b.sublayers)
      if (const auto* a = std::get_if<ir::Attention>(&s.body); a && !fused_qk(m, *a, reg, dev))
        staged.push_back(b.name + "." + s.name);
  if (!staged.empty())
    note += "; Q/K staged in fp32 in " + std::to_string(staged.size()) + " sublayer(s) (first: " + staged.front() +
            ") because a patch reads or modifies Q or K";
  return note;
}

std::string buffer_text(const Buffer& b) {
  return b.label + " " + ir::shape_text(b.shape) + " " + ir::to_string(b.dtype) + (b.view ? " (view)" : "");
}

std::string to_text(const Program& p, const std::vector<int64_t>& offsets, int64_t arena_bytes) {
  std::ostringstream os;
  os << "program " << p.name << ": " << p.steps.size() << " steps, " << p.buffers.size() << " buffers, arena "
     << arena_bytes << " bytes\n";
  auto names = [&](const std::vector<int>& ids) {
    std::string out;
    for (int b : ids) out += (out.empty() ? "" : ", ") + std::string(to_string(p.buffers[size_t(b)].role)) + "#" + std::to_string(b);
    return out;
  };
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const Step& s = p.steps[i];
    if (std::holds_alternative<EndLoopStep>(s.body)) continue;
    os << "  " << std::string(size_t(2 * s.depth), ' ') << i << " " << step_name(s.body) << ": " << s.what;
    if (!s.writes.empty()) os << " -> " << names(s.writes);
    if (!s.reads.empty()) os << " <- " << names(s.reads);
    if (s.terms.launches > 0)
      os << " {" << s.terms.flops << " flop, " << s.terms.bytes << " B, " << s.terms.launches << " launch}";
    if (s.transient > 0) os << " +" << s.transient << " B transient";
    os << "\n";
  }
  os << "  buffers:\n";
  for (size_t i = 0; i < p.buffers.size(); ++i) {
    os << "    " << to_string(p.buffers[i].role) << "#" << i << " " << buffer_text(p.buffers[i]);
    if (i < offsets.size() && offsets[i] >= 0) os << " at " << offsets[i];
    os << "\n";
  }
  return os.str();
}

}  // namespace sp::plan
