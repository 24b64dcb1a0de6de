// The plan as people read it (`--explain`): the estimates, the policy, and per sublayer the
// strategy, its chunks, every transformation with its rejections, the weights it holds and
// the alternatives the chooser did not take.
#include <algorithm>
#include <sstream>

#include "plan/budget.hpp"
#include "plan/cost.hpp"
#include "plan/plan.hpp"

namespace sp::plan {

namespace {

template <typename P>
void explain_decisions(std::ostringstream& os, const P& part) {
  for (const auto& d : part.decisions) {
    os << "    " << (part.chosen(d.transform) ? "[x] " : "[ ] ") << legality::to_string(d.transform);
    if (!d.note.empty()) os << " (legal; not chosen: " << d.note << ")";
    os << "\n";
    for (const auto& r : d.rejections)
      os << "        rejected by " << legality::component_text(r) << ": " << legality::check_text(r) << " ["
         << legality::code_name(r.check) << "] — required " << r.required << ", actual " << r.actual << "\n";
  }
}

void explain_alternatives(std::ostringstream& os, const std::vector<Alternative>& as, bool attention,
                          bool final_layer) {
  if (as.empty()) return;
  os << "    alternatives:\n";
  for (const auto& a : as)
    os << "      " << a.strategy << " (" << chunks_text(attention, final_layer, a.token_chunk, a.q_chunk, a.feature_slice)
       << "): " << human_bytes(a.estimated_peak) << ", " << human_ms(a.estimated_ms) << " — " << a.lost << "\n";
}

// The sublayer's weights by their names below the prefix they share (so that blocks with the
// same plan read the same): "blocks.3.attn.qkv.weight" -> "qkv.weight".
void explain_weights(std::ostream& os, const SublayerPlan& s) {
  std::vector<std::string> all = s.held_weights;
  all.insert(all.end(), s.slab_weights.begin(), s.slab_weights.end());
  size_t cut = 0;  // after a dot; npos + 1 == 0: no dot, nothing cut
  if (!all.empty()) {
    const std::string& first = all.front();
    auto common = first.end();
    for (const auto& n : all) common = std::mismatch(first.begin(), common, n.begin(), n.end()).first;
    cut = first.rfind('.', common == first.begin() ? 0 : size_t(common - first.begin()) - 1) + 1;
    // keep at least the last two components ("fc1.weight")
    const size_t last = first.rfind('.');
    cut = std::min(cut, last == std::string::npos || last == 0 ? 0 : first.rfind('.', last - 1) + 1);
  }
  auto list = [&](const std::vector<std::string>& names) {
    std::string t;
    for (const auto& n : names) t += (t.empty() ? "" : ", ") + n.substr(std::min(cut, n.size()));
    return t;
  };
  if (!s.held_weights.empty()) os << "    weights held for the block: " << list(s.held_weights) << "\n";
  if (!s.slab_weights.empty()) os << "    weights acquired per slab: " << list(s.slab_weights) << "\n";
}

}  // namespace

std::string chunks_text(bool attention, bool final_layer, int64_t token_chunk, int64_t q_chunk, int64_t slice) {
  if (final_layer) return "chunk " + std::to_string(token_chunk);
  if (attention) return "kv/out chunk " + std::to_string(token_chunk) + ", q chunk " + std::to_string(q_chunk);
  return "token chunk " + std::to_string(token_chunk) + ", feature slice " + std::to_string(slice);
}

std::string explain(const Plan& p, bool full) {
  std::ostringstream os;
  os << "plan for " << p.model << ": " << p.tokens << " tokens, " << ir::to_string(p.dtype) << ", device "
     << p.device << "\n";
  os << "  floor " << human_bytes(p.floor_bytes) << ", estimated peak " << human_bytes(p.estimated_peak_bytes)
     << " (residual " << human_bytes(p.residual_bytes) << ")";
  if (p.budget_bytes > 0) os << ", budget " << human_bytes(p.budget_bytes);
  os << ", estimated time " << human_ms(p.estimated_ms) << "\n";
  os << "  policy: " << p.policy << "\n";
  if (!p.row_kernels.empty()) os << "  row operations: " << p.row_kernels << "\n";
  if (p.sequence.split()) {
    // The exchanges of every part: how many a forward runs, the bytes this rank sends and
    // receives, and their time.
    double link = 0;
    int64_t count = 0;
    for (const Part* part : parts(p))
      for_each_run(part->program, [&](const Step& st, int64_t runs) {
        const auto* x = std::get_if<ExchangeStep>(&st.body);
        if (!x || x->kind == Exchange::Complete) return;
        link += double(runs) * st.terms.link_bytes;
        count += runs;
      });
    const double rate = rates_of(p.device_caps).link_bytes_per_s;
    os << "  sequence parallel: " << sequence_text(p.sequence, p.tokens) << "; weights "
       << (p.sequence.sharded ? "sharded, each block gathered as it begins" : "replicated") << "; " << count
       << " exchanges per forward, " << human_bytes(int64_t(link)) << " sent + received by this rank, "
       << human_ms(1e3 * link / rate) << " at " << rate / 1e9 << " GB/s\n";
  }
  // Consecutive blocks with the same plan are printed once, with their range (unless full).
  std::vector<std::string> bodies;
  for (const BlockPlan& b : p.blocks) {
    std::ostringstream bs;
    for (const auto& s : b.sublayers) {
      bs << "   " << s.name << ": " << s.strategy << ", "
         << chunks_text(s.attention, false, s.token_chunk, s.q_chunk, s.feature_slice) << ", estimated "
         << human_bytes(s.estimated_peak) << " above the residual, " << human_ms(s.estimated_ms) << "\n";
      explain_decisions(bs, s);
      explain_weights(bs, s);
      explain_alternatives(bs, s.alternatives, s.attention, false);
    }
    if (b.post_norm_rows > 0) bs << "   row norm after the sublayers: " << b.post_norm_rows << " rows\n";
    bodies.push_back(bs.str());
  }
  for (size_t i = 0; i < bodies.size();) {
    size_t j = i;
    while (!full && j + 1 < bodies.size() && bodies[j + 1] == bodies[i]) ++j;
    if (j > i) os << "  blocks " << p.blocks[i].name << "–" << p.blocks[j].name << " (" << (j - i + 1) << " blocks, same plan)";
    else os << "  block " << p.blocks[i].name;
    os << "\n" << bodies[i];
    i = j + 1;
  }
  if (p.final_layer.present) {
    const FinalPlan& f = p.final_layer;
    os << "  final layer: " << f.strategy << ", chunk " << f.chunk << ", estimated " << human_bytes(f.estimated_peak)
       << " above the residual, " << human_ms(f.estimated_ms) << "\n";
    explain_decisions(os, f);
    explain_alternatives(os, f.alternatives, false, true);
  }
  return os.str();
}

}  // namespace sp::plan
