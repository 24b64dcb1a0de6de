#include "plan/plan.hpp"

#include <algorithm>
#include <optional>
#include <sstream>

#include "plan/budget.hpp"
#include "plan/cost.hpp"
#include "plan/schedule.hpp"

namespace sp::plan {

using legality::Verdict;

namespace {

bool is_chosen(const std::vector<Decision>& ds, Transform t) {
  for (const auto& d : ds)
    if (d.transform == t) return d.chosen;
  return false;
}

int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

int64_t kv_bytes(const ir::Model& m) {
  int64_t best = 0;
  for (const auto& b : m.blocks)
    for (const auto& s : b.sublayers)
      if (const auto* a = std::get_if<ir::Attention>(&s.body)) {
        const int64_t L = a->kind == ir::AttnKind::Cross ? m.context(a->context).length : m.rows(s.segments).size();
        best = std::max(best, 2 * L * a->kv_heads * a->head_dim);
      }
  return best * static_cast<int64_t>(ir::dtype_size(m.dtype));
}

std::vector<Decision> decide(const Verdict& v) {
  std::vector<Decision> out;
  for (Transform t : v.candidates) {
    Decision d{t, v.is_legal(t), {}, {}};
    for (const auto& r : v.rejections)
      if (r.transform == t) d.rejections.push_back(r);
    out.push_back(std::move(d));
  }
  return out;
}

Decision* find(std::vector<Decision>& ds, Transform t) {
  for (auto& d : ds)
    if (d.transform == t) return &d;
  return nullptr;
}

}  // namespace

bool SublayerPlan::chosen(Transform t) const { return is_chosen(decisions, t); }
bool FinalPlan::chosen(Transform t) const { return is_chosen(decisions, t); }

namespace {

void decline(std::vector<Decision>& ds, Transform t, const std::string& why) {
  if (Decision* d = find(ds, t); d && d->chosen) {
    d->chosen = false;
    d->note = why;
  }
}

int64_t token_chunk_for(int64_t T, const Options& opt) {
  if (opt.token_chunk < 0) throw PlanError("token_chunk: must be positive, got " + std::to_string(opt.token_chunk));
  return std::min(T, opt.token_chunk > 0 ? opt.token_chunk : default_token_chunk(T, 1));
}

SublayerPlan plan_attention(const ir::Model& m, const ir::Sublayer& s, const ir::Attention& a, Verdict v,
                            const Options& opt, const contracts::Registry& reg) {
  const int64_t T = m.rows(s.segments).size();
  // Cross-attention's K/V rows are the context's; a full-size chunk covers both.
  const int64_t kv_rows = a.kind == ir::AttnKind::Cross ? m.context(a.context).length : T;
  SublayerPlan p;
  p.attention = true;
  p.decisions = decide(v);
  p.token_chunk = std::max(T, kv_rows);
  p.q_chunk = T;
  if (p.chosen(Transform::BoundedQkv)) p.token_chunk = token_chunk_for(T, opt);
  if (p.chosen(Transform::GlobalKvStreamedQ)) {
    const int64_t align = reg.consumer(a.consumer).q_align;
    p.q_chunk = std::min(T, round_up(p.token_chunk, align));
  }
  if (p.token_chunk >= T && p.token_chunk >= kv_rows) {
    const char* why = "one chunk covers all tokens";
    decline(p.decisions, Transform::BoundedQkv, why);
    decline(p.decisions, Transform::GlobalKvStreamedQ, why);
    decline(p.decisions, Transform::StreamedOutProj, why);
  }
  return p;
}

SublayerPlan plan_mlp(const ir::Model& m, const ir::Sublayer& s, const ir::Mlp& mlp, Verdict v, const Options& opt,
                      const contracts::Registry& reg) {
  const int64_t T = m.rows(s.segments).size();
  SublayerPlan p;
  p.decisions = decide(v);
  p.token_chunk = p.chosen(Transform::TokenChunkedMlp) ? token_chunk_for(T, opt) : T;
  p.feature_slice = mlp.hidden;
  if (p.chosen(Transform::FeatureSlicedMlp)) {
    const int64_t align = legality::feature_alignment(reg, mlp);
    if (opt.feature_slice < 0) {
      decline(p.decisions, Transform::FeatureSlicedMlp, "disabled by option");
    } else {
      const int64_t f = opt.feature_slice > 0 ? opt.feature_slice : default_feature_slice(mlp.hidden, align);
      if (f % align != 0)
        throw PlanError("feature_slice: " + std::to_string(f) + " is not a multiple of the weight formats' alignment " +
                        std::to_string(align));
      if (f >= mlp.hidden) decline(p.decisions, Transform::FeatureSlicedMlp, "one slice covers the hidden width");
      else p.feature_slice = f;
    }
  }
  if (p.token_chunk >= T) decline(p.decisions, Transform::TokenChunkedMlp, "one chunk covers all tokens");
  return p;
}

void explain_decisions(std::ostringstream& os, const std::vector<Decision>& ds) {
  for (const auto& d : ds) {
    os << "    " << (d.chosen ? "[x] " : "[ ] ") << legality::to_string(d.transform);
    if (!d.note.empty()) os << " (legal; not chosen: " << d.note << ")";
    os << "\n";
    for (const auto& r : d.rejections)
      os << "        rejected by " << r.component << ": " << r.check << " — required " << r.required << ", actual "
         << r.actual << "\n";
  }
}

// "kv/out chunk 256, q chunk 256" / "token chunk 128, feature slice 256" / "chunk 128".
std::string chunks_text(bool attention, bool final_layer, int64_t token_chunk, int64_t q_chunk, int64_t slice) {
  if (final_layer) return "chunk " + std::to_string(token_chunk);
  if (attention) return "kv/out chunk " + std::to_string(token_chunk) + ", q chunk " + std::to_string(q_chunk);
  return "token chunk " + std::to_string(token_chunk) + ", feature slice " + std::to_string(slice);
}

void explain_alternatives(std::ostringstream& os, const std::vector<Alternative>& as, bool attention,
                          bool final_layer) {
  if (as.empty()) return;
  os << "    alternatives:\n";
  for (const auto& a : as)
    os << "      " << a.strategy << " (" << chunks_text(attention, final_layer, a.token_chunk, a.q_chunk, a.feature_slice)
       << "): " << human_bytes(a.estimated_peak) << ", " << human_ms(a.estimated_ms) << " — " << a.lost << "\n";
}

// ---------------------------------------------------------------------------------------
// Strategies: a short name for what a sublayer plan does, from its chosen transformations.

std::string strategy_of(const SublayerPlan& p) {
  if (p.attention) {
    if (p.chosen(Transform::GlobalKvStreamedQ))
      return p.chosen(Transform::StreamedOutProj) ? "streamed-q" : "streamed-q+full-out";
    return p.chosen(Transform::BoundedQkv) ? "chunked-kv" : "full";
  }
  const bool chunked = p.chosen(Transform::TokenChunkedMlp), sliced = p.chosen(Transform::FeatureSlicedMlp);
  if (chunked) return sliced ? "chunked+sliced" : "chunked";
  return sliced ? "sliced" : "full";
}

std::string strategy_of(const FinalPlan& f) { return f.chosen(Transform::BoundedFinal) ? "chunked" : "full"; }

// ---------------------------------------------------------------------------------------
// Budget: candidate plans of each sublayer, the choice, and the error when nothing fits.

// Sets each legal transformation chosen exactly when `on` says so; the others keep their
// rejections. Legal ones left out get a note naming the strategy.
template <typename P, typename F>
void choose_transforms(P& p, F&& on) {
  for (auto& d : p.decisions) d.chosen = d.rejections.empty() && on(d.transform);
}
template <typename P>
void note_unchosen(P& p) {
  for (auto& d : p.decisions)
    if (d.rejections.empty() && !d.chosen)
      d.note = "the budget's fastest fitting schedule is '" + p.strategy + "'";
}

// Attention with kv rows per K/V (and non-streamed output) slab and q rows per Q slab.
SublayerPlan attention_candidate(const Verdict& v, int64_t T, int64_t L, int64_t kv, int64_t q) {
  SublayerPlan p;
  p.attention = true;
  p.decisions = decide(v);
  p.token_chunk = kv;
  p.q_chunk = q;
  p.feature_slice = 0;
  const bool bounded = kv < std::max(T, L), streamed = q < T;
  choose_transforms(p, [&](Transform t) {
    if (t == Transform::BoundedQkv) return bounded || streamed;
    return streamed;  // streamed Q, and with it the streamed output projection
  });
  p.strategy = strategy_of(p);
  return p;
}

SublayerPlan mlp_candidate(const Verdict& v, int64_t T, int64_t hidden, int64_t c, int64_t f) {
  SublayerPlan p;
  p.decisions = decide(v);
  p.token_chunk = c;
  p.feature_slice = f;
  choose_transforms(p, [&](Transform t) { return t == Transform::TokenChunkedMlp ? c < T : f < hidden; });
  p.strategy = strategy_of(p);
  return p;
}

// Where the smallest achievable peak of a plan is set, for BudgetError.
struct Bottleneck {
  int64_t need = -1;  // peak + reserve, above the residual
  int64_t reserve = 0;
  std::string where, how;
  PhaseSpec phase;
};

PhaseSpec worst_phase(const std::vector<PhaseSpec>& phases, const contracts::DeviceCaps& dev) {
  PhaseSpec best = phases.front();
  for (const auto& ph : phases)
    if (ph.total_bytes(dev) > best.total_bytes(dev)) best = ph;
  return best;
}

class BudgetPlanner {
 public:
  BudgetPlanner(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
                const Options& opt, int64_t residual)
      : m_(m), reg_(reg), dev_(dev), opt_(opt), residual_(residual), available_(opt.budget_bytes - residual) {}

  SublayerPlan attention(const ir::Block& b, const ir::Sublayer& s, const ir::Attention& a, const Verdict& v) {
    const int64_t T = m_.rows(s.segments).size();
    const int64_t L = a.kind == ir::AttnKind::Cross ? m_.context(a.context).length : T;
    std::vector<SublayerPlan> plans;
    if (opt_.token_chunk > 0) {
      plans.push_back(plan_attention(m_, s, a, v, opt_, reg_));  // the chunk is fixed: as without a budget
      plans.back().strategy = strategy_of(plans.back());
    } else {
      plans.push_back(attention_candidate(v, T, L, std::max(T, L), T));
      const auto kvs = chunk_candidates(std::max(T, L), 1);
      if (v.is_legal(Transform::BoundedQkv))
        for (int64_t kv : kvs) plans.push_back(attention_candidate(v, T, L, kv, T));
      if (v.is_legal(Transform::GlobalKvStreamedQ) && v.is_legal(Transform::BoundedQkv))
        for (int64_t q : chunk_candidates(T, reg_.consumer(a.consumer).q_align))
          for (int64_t kv : kvs) plans.push_back(attention_candidate(v, T, L, kv, q));
    }
    return pick(b, s, std::move(plans));
  }

  SublayerPlan mlp(const ir::Block& b, const ir::Sublayer& s, const ir::Mlp& f, const Verdict& v) {
    const int64_t T = m_.rows(s.segments).size();
    std::vector<int64_t> chunks = {T}, slices = {f.hidden};
    if (v.is_legal(Transform::TokenChunkedMlp)) {
      if (opt_.token_chunk > 0) chunks = {std::min(T, opt_.token_chunk)};
      else for (int64_t c : chunk_candidates(T, 1)) chunks.push_back(c);
    }
    if (v.is_legal(Transform::FeatureSlicedMlp) && opt_.feature_slice >= 0) {
      const int64_t align = legality::feature_alignment(reg_, f);
      if (opt_.feature_slice > 0) {
        if (opt_.feature_slice % align != 0)
          throw PlanError("feature_slice: " + std::to_string(opt_.feature_slice) +
                          " is not a multiple of the weight formats' alignment " + std::to_string(align));
        slices = {std::min(opt_.feature_slice, f.hidden)};
      } else {
        for (int64_t x : feature_slice_candidates(f.hidden, align)) slices.push_back(x);
      }
    }
    std::vector<SublayerPlan> plans;
    for (int64_t c : chunks)
      for (int64_t x : slices) plans.push_back(mlp_candidate(v, T, f.hidden, c, x));
    return pick(b, s, std::move(plans));
  }

  void final_layer(FinalPlan& f) {
    const int64_t rows = m_.output_tokens();
    std::vector<int64_t> chunks = {rows};
    if (f.chosen(Transform::BoundedFinal)) {
      if (opt_.token_chunk > 0) chunks = {std::min(rows, opt_.token_chunk)};
      else for (int64_t c : chunk_candidates(rows, 1)) chunks.push_back(c);
    }
    std::vector<Candidate> cands;
    for (int64_t c : chunks) {
      FinalPlan k = f;
      k.chunk = c;
      for (auto& d : k.decisions) d.chosen = d.rejections.empty() && c < rows;
      cands.push_back({strategy_of(k), c, 0, 0, final_cost(m_, c, reg_, dev_),
                       row_statistics_bytes(std::min(c, rows), 1, m_.dtype, dev_)});
    }
    const Choice ch = choose(cands, available_);
    if (!ch.chosen) {
      const Candidate& k = cands[ch.smallest];
      note(k, "the final layer", k.strategy + ", chunk " + std::to_string(k.token_chunk),
           final_phase(m_, k.token_chunk, reg_));
      return;
    }
    const Candidate& c = cands[*ch.chosen];
    f.chunk = c.token_chunk;
    for (auto& d : f.decisions) {
      d.chosen = d.rejections.empty() && c.token_chunk < rows;
      d.note.clear();
    }
    f.strategy = c.strategy;
    f.estimated_peak = c.cost.peak_bytes;
    f.estimated_ms = c.cost.ms();
    f.alternatives = ch.alternatives;
    note_unchosen(f);
  }

  void embedding() {
    const PhaseSpec ph = embed_phase(m_, reg_);
    Candidate c;
    c.cost.peak_bytes = ph.total_bytes(dev_);
    note(c, "the embedding", "", ph);
  }

  // Throws BudgetError when the smallest achievable peak exceeds the budget.
  void check() const {
    const int64_t smallest = residual_ + worst_.need;
    if (smallest <= opt_.budget_bytes) return;
    std::string msg = "budget " + human_bytes(opt_.budget_bytes) + " is below the smallest achievable peak " +
                      human_bytes(smallest) + " (" + std::to_string(smallest) + " bytes): residual stream " +
                      human_bytes(residual_) + " + " + dominant_terms(worst_.phase, dev_);
    if (worst_.reserve > 0) msg += " + row statistics and temporaries (" + human_bytes(worst_.reserve) + ")";
    msg += " in " + worst_.where;
    if (!worst_.how.empty()) msg += " (phase " + worst_.phase.name + ", " + worst_.how + ")";
    throw BudgetError(msg, opt_.budget_bytes, smallest);
  }

 private:
  SublayerPlan pick(const ir::Block& b, const ir::Sublayer& s, std::vector<SublayerPlan> plans) {
    std::vector<Candidate> cands;
    cands.reserve(plans.size());
    for (const auto& p : plans)
      cands.push_back({p.strategy, p.token_chunk, p.q_chunk, p.feature_slice, sublayer_cost(m_, b, s, p, reg_, dev_),
                       reserve(s, p)});
    const Choice ch = choose(cands, available_);
    if (!ch.chosen) {
      const SublayerPlan& k = plans[ch.smallest];
      note(cands[ch.smallest], "block " + b.name + " " + s.name,
           k.strategy + ", " + chunks_text(k.attention, false, k.token_chunk, k.q_chunk, k.feature_slice),
           worst_phase(sublayer_phases(m_, s, k, reg_, dev_), dev_));
      return k;
    }
    SublayerPlan p = std::move(plans[*ch.chosen]);
    p.estimated_peak = cands[*ch.chosen].cost.peak_bytes;
    p.estimated_ms = cands[*ch.chosen].cost.ms();
    p.alternatives = ch.alternatives;
    note_unchosen(p);
    return p;
  }

  // The transients (budget.hpp) of the largest slab of any phase of a sublayer plan.
  int64_t reserve(const ir::Sublayer& s, const SublayerPlan& p) const {
    const int64_t T = m_.rows(s.segments).size();
    if (const auto* a = std::get_if<ir::Attention>(&s.body)) {
      const int64_t L = a->kind == ir::AttnKind::Cross ? m_.context(a->context).length : T;
      const int64_t rows = std::max(std::min(p.token_chunk, std::max(T, L)), std::min(p.q_chunk, T));
      return row_statistics_bytes(rows, a->heads, m_.dtype, dev_);
    }
    const int64_t rows = std::min(p.token_chunk, T);
    return row_statistics_bytes(rows, 1, m_.dtype, dev_);
  }

  // Records a part whose least need does not fit, keeping the largest.
  void note(const Candidate& c, const std::string& where, const std::string& how, const PhaseSpec& phase) {
    if (c.need() + residual_ <= opt_.budget_bytes || c.need() <= worst_.need) return;
    worst_ = {c.need(), c.reserve, where, how, phase};
  }

  const ir::Model& m_;
  const contracts::Registry& reg_;
  const contracts::DeviceCaps& dev_;
  const Options& opt_;
  int64_t residual_, available_;
  Bottleneck worst_;
};

}  // namespace

// Slabs of about 1/16 of the sequence keep a slab's scratch (norm, projections, one
// attention output) a small fraction of the residual stream and the global K/V, which
// dominate the floor. Below 128 rows the matrix products lose efficiency and the fixed
// per-launch overhead grows with the slab count; above 4096 rows they gain nothing while
// the scratch keeps growing. The result is a multiple of `align`.
int64_t default_token_chunk(int64_t tokens, int64_t align) {
  const int64_t c = std::clamp<int64_t>((tokens + 15) / 16, 128, 4096);
  return std::max<int64_t>(align, round_up(c, align));
}

// A quarter of the hidden width per slice: the FFN scratch of a slab shrinks fourfold while
// each slice's matrix products stay wide. Rounded up to the formats' slice alignment.
int64_t default_feature_slice(int64_t hidden, int64_t align) { return round_up((hidden + 3) / 4, align); }

int64_t floor_bytes(const ir::Model& m) {
  return m.tokens() * m.dim * static_cast<int64_t>(ir::dtype_size(m.dtype)) + kv_bytes(m);
}

Plan make_plan(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
               const Options& opt) {
  ir::validate(m);
  if (opt.budget_bytes < 0)
    throw PlanError("budget_bytes: must be positive (0: no budget), got " + std::to_string(opt.budget_bytes));
  if (opt.token_chunk < 0) throw PlanError("token_chunk: must be positive, got " + std::to_string(opt.token_chunk));
  legality::Context ctx{&m, &reg, &dev};
  Plan p;
  p.model = m.name;
  p.tokens = m.tokens();
  p.dtype = m.dtype;
  p.device = dev.name;
  p.residual_bytes = dev.round_alloc(m.tokens() * m.dim * static_cast<int64_t>(ir::dtype_size(m.dtype)));
  p.floor_bytes = floor_bytes(m);
  p.budget_bytes = opt.budget_bytes;
  p.row_kernels = row_kernels_note(m, reg, dev);
  std::optional<BudgetPlanner> budget;
  if (opt.budget_bytes > 0) budget.emplace(m, reg, dev, opt, p.residual_bytes);
  const Cost embed = embed_cost(m, reg, dev);
  int64_t worst = embed.peak_bytes;
  double seconds = embed.seconds;
  if (budget) budget->embedding();
  for (const auto& b : m.blocks) {
    BlockPlan bp;
    bp.name = b.name;
    for (const auto& s : b.sublayers) {
      Verdict v = legality::check_sublayer(ctx, s);
      SublayerPlan sp;
      if (budget) {
        sp = s.is_attention() ? budget->attention(b, s, std::get<ir::Attention>(s.body), v)
                              : budget->mlp(b, s, std::get<ir::Mlp>(s.body), v);
      } else {
        sp = s.is_attention() ? plan_attention(m, s, std::get<ir::Attention>(s.body), v, opt, reg)
                              : plan_mlp(m, s, std::get<ir::Mlp>(s.body), v, opt, reg);
        const Cost c = sublayer_cost(m, b, s, sp, reg, dev);
        sp.estimated_peak = c.peak_bytes;
        sp.estimated_ms = c.ms();
        sp.strategy = strategy_of(sp);
      }
      sp.name = s.name;
      worst = std::max(worst, sp.estimated_peak);
      seconds += sp.estimated_ms / 1e3;
      bp.sublayers.push_back(std::move(sp));
    }
    p.blocks.push_back(std::move(bp));
  }
  if (m.final_layer) {
    FinalPlan& f = p.final_layer;
    f.present = true;
    f.decisions = decide(legality::check_final(ctx, *m.final_layer));
    const int64_t rows = m.output_tokens();
    if (budget) {
      budget->final_layer(f);
    } else {
      f.chunk = f.chosen(Transform::BoundedFinal) ? token_chunk_for(rows, opt) : rows;
      if (f.chunk >= rows) decline(f.decisions, Transform::BoundedFinal, "one chunk covers all tokens");
      const Cost c = final_cost(m, f.chunk, reg, dev);
      f.estimated_peak = c.peak_bytes;
      f.estimated_ms = c.ms();
      f.strategy = strategy_of(f);
    }
    worst = std::max(worst, f.estimated_peak);
    seconds += f.estimated_ms / 1e3;
  }
  if (budget) budget->check();
  p.estimated_peak_bytes = p.residual_bytes + worst;
  p.estimated_ms = seconds * 1e3;
  return p;
}

std::string explain(const Plan& p) {
  std::ostringstream os;
  os << "plan for " << p.model << ": " << p.tokens << " tokens, " << ir::to_string(p.dtype) << ", device "
     << p.device << "\n";
  os << "  floor " << human_bytes(p.floor_bytes) << ", estimated peak " << human_bytes(p.estimated_peak_bytes)
     << " (residual " << human_bytes(p.residual_bytes) << ")";
  if (p.budget_bytes > 0) os << ", budget " << human_bytes(p.budget_bytes);
  os << ", estimated time " << human_ms(p.estimated_ms) << "\n";
  if (!p.row_kernels.empty()) os << "  row operations: " << p.row_kernels << "\n";
  // Consecutive blocks with the same plan are printed once, with their range.
  std::vector<std::string> bodies;
  for (const BlockPlan& b : p.blocks) {
    std::ostringstream bs;
    for (const auto& s : b.sublayers) {
      bs << "   " << s.name << ": " << s.strategy << ", "
         << chunks_text(s.attention, false, s.token_chunk, s.q_chunk, s.feature_slice) << ", estimated "
         << human_bytes(s.estimated_peak) << " above the residual, " << human_ms(s.estimated_ms) << "\n";
      explain_decisions(bs, s.decisions);
      explain_alternatives(bs, s.alternatives, s.attention, false);
    }
    bodies.push_back(bs.str());
  }
  for (size_t i = 0; i < bodies.size();) {
    size_t j = i;
    while (j + 1 < bodies.size() && bodies[j + 1] == bodies[i]) ++j;
    os << "  block " << p.blocks[i].name;
    if (j > i) os << " .. " << p.blocks[j].name << " (" << (j - i + 1) << " blocks, same plan)";
    os << "\n" << bodies[i];
    i = j + 1;
  }
  if (p.final_layer.present) {
    const FinalPlan& f = p.final_layer;
    os << "  final layer: " << f.strategy << ", chunk " << f.chunk << ", estimated " << human_bytes(f.estimated_peak)
       << " above the residual, " << human_ms(f.estimated_ms) << "\n";
    explain_decisions(os, f.decisions);
    explain_alternatives(os, f.alternatives, false, true);
  }
  return os.str();
}

}  // namespace sp::plan
