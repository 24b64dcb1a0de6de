#include "plan/plan.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <tuple>

#include "plan/budget.hpp"

namespace sp::plan {

using legality::Verdict;

namespace {

std::vector<Decision> decide(const Verdict& v) {
  std::vector<Decision> out;
  for (Transform t : v.candidates) {
    Decision d{t, {}, {}};
    for (const auto& r : v.rejections)
      if (r.transform == t) d.rejections.push_back(r);
    out.push_back(std::move(d));
  }
  return out;
}

// A chosen schedule's program with its buffers placed.
Part compiled(Program prog, const contracts::DeviceCaps& dev) {
  Placement pl = place(prog, dev);
#ifndef NDEBUG
  check_placement(prog, pl);
#endif
  return {std::move(prog), std::move(pl)};
}

// Replaces the note of a legal transformation that the part's schedule does not take.
template <typename P>
void note(P& p, Transform t, const std::string& why) {
  for (auto& d : p.decisions)
    if (d.transform == t && d.legal() && !p.chosen(t)) d.note = why;
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

// Legal transformations the schedule does not take get a note naming its strategy.
template <typename P>
void note_unchosen(P& p, const std::string& policy) {
  for (auto& d : p.decisions)
    if (d.legal() && !p.chosen(d.transform)) d.note = policy + " is '" + p.strategy + "'";
}

// Attention with kv rows per K/V (and non-streamed output) slab and q rows per Q slab; the
// output streamed with streamed Q, or as `streamed_out` says.
SublayerPlan attention_candidate(const Verdict& v, int64_t T, int64_t L, int64_t kv, int64_t q,
                                 std::optional<bool> streamed_out = std::nullopt) {
  SublayerPlan p;
  p.attention = true;
  p.rows = T;
  p.kv_rows = L;
  p.decisions = decide(v);
  p.token_chunk = kv;
  p.q_chunk = q;
  p.streamed_out = streamed_out.value_or(q < T) && is_legal(p.decisions, Transform::StreamedOutProj);
  p.strategy = strategy_of(p);
  return p;
}

// Attention with an explicit token chunk: K/V (and non-streamed output) slabs of the chunk,
// Q slabs of it rounded to the consumer's alignment.
SublayerPlan fixed_attention(const Verdict& v, int64_t T, int64_t L, int64_t chunk, const contracts::Registry& reg,
                             const std::string& consumer) {
  const int64_t kv = v.is_legal(Transform::BoundedQkv) ? std::min(std::max(T, L), chunk) : std::max(T, L);
  const bool covers = kv >= T && kv >= L;
  const int64_t q = !covers && v.is_legal(Transform::GlobalKvStreamedQ)
                        ? std::min(T, ir::round_up(chunk, reg.consumer(consumer).q_align))
                        : T;
  return attention_candidate(v, T, L, kv, q, !covers);
}

SublayerPlan mlp_candidate(const Verdict& v, int64_t T, int64_t hidden, int64_t c, int64_t f) {
  SublayerPlan p;
  p.rows = T;
  p.hidden = hidden;
  p.decisions = decide(v);
  p.token_chunk = c;
  p.feature_slice = f;
  p.strategy = strategy_of(p);
  return p;
}

// Where the smallest achievable peak of a plan is set, for BudgetError.
struct Bottleneck {
  int64_t need = -1;  // peak + reserve, above the residual
  int64_t reserve = 0;
  std::string where, how;
  std::string terms;
};

// The candidates of every part that has a choice (sublayers, final layer), in plan order.
using Survey = std::vector<std::vector<Candidate>>;

// Candidate costs by the form of what they schedule. Blocks equal but for the names of what
// they read (ir::anonymous) compile each candidate of a sublayer to the same steps, buffers and
// terms, so a candidate is compiled and costed once per form and its program is not kept.
class Costs {
 public:
  // The form of a block: an index shared by the blocks equal to it but for names.
  size_t form(const ir::Block& b) {
    ir::Block a = ir::anonymous(b);
    const auto it = std::find(forms_.begin(), forms_.end(), a);
    if (it != forms_.end()) return size_t(it - forms_.begin());
    forms_.push_back(std::move(a));
    return forms_.size() - 1;
  }
  // The cost of schedule `p` of sublayer `si` of form `form` (kFinal: the final layer).
  template <typename F>
  Cost of(size_t form, size_t si, const Schedule& p, F&& compute) {
    const auto [it, fresh] =
        costs_.try_emplace({form, si, p.token_chunk, p.q_chunk, p.feature_slice, p.streamed_out});
    if (fresh) it->second = compute();
    return it->second;
  }
  static constexpr size_t kFinal = size_t(-1);

 private:
  std::vector<ir::Block> forms_;
  std::map<std::tuple<size_t, size_t, int64_t, int64_t, int64_t, bool>, Cost> costs_;
};

// Whether the sublayer's attention is traded slab by slab between ranks (a ulysses split of
// self-attention).
bool ulysses_split(const Sequence& seq, const ir::Attention& a) {
  return seq.split() && seq.mode == SeqMode::Ulysses && a.kind != ir::AttnKind::Cross;
}

// Where a sublayer is: its block, the block's form (Costs) and its index.
struct Site {
  const ir::Block& b;
  const ir::Sublayer& s;
  size_t form, si;
};

// Picks one candidate schedule per sublayer (and for the final layer): the fastest whose
// need fits what is available: under a budget the budget less the residual stream, without
// one the default's cap (lean_cap), and while surveying (`survey` given: every part's
// candidates recorded) anything. While surveying the chosen schedules are not compiled.
class Chooser {
 public:
  Chooser(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev, const Options& opt,
          int64_t residual, int64_t cap, Survey* survey, Costs& costs)
      : m_(m), reg_(reg), dev_(dev), opt_(opt), residual_(residual),
        available_(opt.budget_bytes > 0 ? opt.budget_bytes - residual
                   : cap > 0            ? cap
                                        : std::numeric_limits<int64_t>::max()),
        survey_(survey), costs_(costs) {}

  // A part without a choice, compiled and placed; kept where the plan is not a survey.
  Cost fixed(Program prog, Part& into) {
    Part part = compiled(std::move(prog), dev_);
    const Cost c = program_cost(part.program, part.placement, dev_);
    if (!survey_) into = std::move(part);
    return c;
  }

  SublayerPlan attention(const Site& at, const ir::Attention& a, const Verdict& v) {
    const int64_t T = m_.rows(at.s.segments).size(), L = m_.kv_rows(at.s);
    std::vector<SublayerPlan> plans;
    if (const auto slabs = agreed_slabs(at, a)) {  // the ranks' exchanges: token and q chunks that give them
      const auto [kv, q] = *slabs;
      const int64_t most = most_rows(opt_.sequence, m_.tokens(), m_.rows(at.s.segments)), P = opt_.sequence.ranks;
      plans.push_back(attention_candidate(v, T, L, kv < most ? kv : std::max(T, L), q * P < T ? q * P : T));
    } else if (opt_.token_chunk > 0) {  // the chunk is fixed
      plans.push_back(fixed_attention(v, T, L, opt_.token_chunk, reg_, a.consumer));
    } else {
      plans.push_back(attention_candidate(v, T, L, std::max(T, L), T));
      const auto kvs = chunk_candidates(std::max(T, L), 1);
      if (v.is_legal(Transform::BoundedQkv))
        for (int64_t kv : kvs) plans.push_back(attention_candidate(v, T, L, kv, T));
      if (v.is_legal(Transform::GlobalKvStreamedQ) && v.is_legal(Transform::BoundedQkv)) {
        const int64_t align = reg_.consumer(a.consumer).q_align;
        auto qs = chunk_candidates(T, align);
        const int64_t slots = tile_waves(rates_of(dev_)).slots();
        // A call attends a Q slab's rows under one process; under a ulysses split, one rank's
        // rows of it, of this rank's head groups.
        const bool split = ulysses_split(opt_.sequence, a);
        const int64_t P = split ? opt_.sequence.ranks : 1,
                      most = split ? most_rows(opt_.sequence, m_.tokens(), m_.rows(at.s.segments)) : T,
                      groups = split ? shares(a.kv_heads, P)[size_t(opt_.sequence.rank)] : a.kv_heads;
        for (int64_t q : call_chunk_candidates(qs, T, most, P, a.heads / a.kv_heads, groups, slots, align))
          if (std::find(qs.begin(), qs.end(), q) == qs.end()) qs.push_back(q);
        for (int64_t q : qs)
          for (int64_t kv : kvs) plans.push_back(attention_candidate(v, T, L, kv, q));
      }
    }
    return pick(at, std::move(plans));
  }

  // The slabs Options::slabs fixes for this sublayer, the next pair where it splits.
  std::optional<std::pair<int64_t, int64_t>> agreed_slabs(const Site& at, const ir::Attention& a) {
    if (opt_.slabs.empty() || !ulysses_split(opt_.sequence, a)) return std::nullopt;
    if (next_slab_ + 2 > opt_.slabs.size())
      throw PlanError("slabs: " + std::to_string(opt_.slabs.size()) + " values, the model's split attention " +
                      "sublayers take more (block " + at.b.name + " " + at.s.name + ")");
    next_slab_ += 2;
    return std::pair{opt_.slabs[next_slab_ - 2], opt_.slabs[next_slab_ - 1]};
  }

  SublayerPlan mlp(const Site& at, const ir::Mlp& f, const Verdict& v) {
    const int64_t T = m_.rows(at.s.segments).size();
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
    SublayerPlan p = pick(at, std::move(plans));
    if (opt_.feature_slice < 0) note(p, Transform::FeatureSlicedMlp, "disabled by option");
    return p;
  }

  void final_layer(FinalPlan& f) {
    const int64_t rows = m_.output_tokens();
    std::vector<int64_t> chunks = {rows};
    f.rows = rows;
    if (is_legal(f.decisions, Transform::BoundedFinal)) {
      if (opt_.token_chunk > 0) chunks = {std::min(rows, opt_.token_chunk)};
      else for (int64_t c : chunk_candidates(rows, 1)) chunks.push_back(c);
    }
    std::vector<Candidate> cands;
    for (int64_t c : chunks) {
      f.chunk = c;
      const Cost cost =
          costs_.of(Costs::kFinal, 0, {c}, [&] { return program_cost(compile_final(m_, c, reg_, dev_, opt_.sequence), dev_); });
      cands.push_back({strategy_of(f), c, 0, 0, cost, allocator_reserve()});
    }
    const Choice ch = decide_among(cands);
    if (!ch.chosen) {
      const Candidate& k = cands[ch.smallest];
      note_bottleneck(k, "the final layer", k.strategy + ", chunk " + std::to_string(k.token_chunk),
                      [&] { return compile_final(m_, k.token_chunk, reg_, dev_, opt_.sequence); });
      return;
    }
    const Candidate& c = cands[*ch.chosen];
    f.chunk = c.token_chunk;
    f.strategy = c.strategy;
    f.estimated_peak = c.cost.peak_bytes;
    f.estimated_ms = c.cost.ms();
    f.alternatives = ch.alternatives;
    if (!survey_) f.part = compiled(compile_final(m_, f.chunk, reg_, dev_, opt_.sequence), dev_);
    note_unchosen(f, policy_word());
    if (rows <= c.token_chunk) note(f, Transform::BoundedFinal, "one chunk covers all tokens");
  }

  Cost embedding(Part& into) {
    Candidate c;
    c.cost = fixed(compile_embed(m_, reg_, dev_, opt_.sequence), into);
    c.reserve = allocator_reserve();
    if (opt_.budget_bytes > 0) note_bottleneck(c, "the embedding", "", [&] { return compile_embed(m_, reg_, dev_, opt_.sequence); });
    return c.cost;
  }

  // Throws BudgetError when the smallest achievable peak exceeds the budget.
  void check() const {
    if (opt_.budget_bytes <= 0) return;
    const int64_t smallest = residual_ + worst_.need;
    if (smallest <= opt_.budget_bytes) return;
    const auto [budget, least] = distinct_bytes(opt_.budget_bytes, smallest);
    std::string msg = "budget " + budget + " is below the smallest achievable peak " + least + " (" +
                      std::to_string(smallest) + " bytes): residual stream " +
                      human_bytes(residual_) + " + " + worst_.terms;
    if (worst_.reserve > 0) msg += " + allocator reserve (" + human_bytes(worst_.reserve) + ")";
    msg += " in " + worst_.where;
    if (!worst_.how.empty()) msg += " (" + worst_.how + ")";
    throw BudgetError(msg, opt_.budget_bytes, smallest);
  }

 private:
  const char* policy_word() const {
    return opt_.budget_bytes > 0 ? "the budget's fastest fitting schedule" : "the default's fastest schedule under its cap";
  }

  Choice decide_among(const std::vector<Candidate>& cands) const {
    if (survey_) survey_->push_back(cands);
    return choose(cands, available_, opt_.budget_bytes > 0 ? "budget" : "the default's cap");
  }

  SublayerPlan pick(const Site& at, std::vector<SublayerPlan> plans) {
    const ir::Block& b = at.b;
    const ir::Sublayer& s = at.s;
    std::vector<Candidate> cands;
    cands.reserve(plans.size());
    for (const auto& p : plans) {
      const Cost c = costs_.of(at.form, at.si, p, [&] { return sublayer_cost(m_, b, s, p, reg_, dev_, opt_.kv_budget, opt_.sequence); });
      cands.push_back({p.strategy, p.token_chunk, p.q_chunk, p.feature_slice, c, allocator_reserve()});
    }
    const Choice ch = decide_among(cands);
    if (!ch.chosen) {
      const SublayerPlan& k = plans[ch.smallest];
      note_bottleneck(cands[ch.smallest], "block " + b.name + " " + s.name,
                      k.strategy + ", " + chunks_text(k.attention, false, k.token_chunk, k.q_chunk, k.feature_slice),
                      [&] { return compile_sublayer(m_, b, s, k, reg_, dev_, opt_.kv_budget, opt_.sequence); });
      return k;
    }
    SublayerPlan p = std::move(plans[*ch.chosen]);
    if (!survey_) {
      p.part = compiled(compile_sublayer(m_, b, s, p, reg_, dev_, opt_.kv_budget, opt_.sequence), dev_);
      weights_of(p.part.program, p);
    }
    p.estimated_peak = cands[*ch.chosen].cost.peak_bytes;
    p.estimated_ms = cands[*ch.chosen].cost.ms();
    p.alternatives = ch.alternatives;
    note_unchosen(p, policy_word());
    if (p.attention && p.token_chunk >= std::max(p.rows, p.kv_rows) && p.q_chunk >= p.rows)
      for (Transform t : {Transform::BoundedQkv, Transform::GlobalKvStreamedQ, Transform::StreamedOutProj})
        note(p, t, "one chunk covers all tokens");
    if (!p.attention && p.token_chunk >= p.rows) note(p, Transform::TokenChunkedMlp, "one chunk covers all tokens");
    return p;
  }

  // Which weights the program holds for the whole block and which it acquires per slab.
  static void weights_of(const Program& prog, SublayerPlan& p) {
    for (const Step& st : prog.steps) {
      const auto* a = std::get_if<AcquireStep>(&st.body);
      if (!a) continue;
      const std::string name = a->linear ? a->linear->weight : a->tensor;
      auto& list = st.depth == 0 ? p.held_weights : p.slab_weights;
      if (std::find(list.begin(), list.end(), name) == list.end()) list.push_back(name);
    }
  }

  // Records a part whose least need does not fit, keeping the largest.
  template <typename F>
  void note_bottleneck(const Candidate& c, const std::string& where, const std::string& how, F&& program) {
    if (c.need() + residual_ <= opt_.budget_bytes || c.need() <= worst_.need) return;
    const Program prog = program();
    worst_ = {c.need(), c.reserve, where, how, dominant_terms(prog, place(prog, dev_))};
  }

  const ir::Model& m_;
  const contracts::Registry& reg_;
  const contracts::DeviceCaps& dev_;
  const Options& opt_;
  int64_t residual_, available_;
  Survey* survey_;
  Costs& costs_;
  Bottleneck worst_;
  size_t next_slab_ = 0;  // into opt_.slabs
};

// Under a ring split, self-attention's output comes back to its rows after every query row is
// attended: no output projection streams with the Q slabs. A consumer that returns no
// log-sum-exp leaves the K/V blocks to the math consumer.
void split_rejections(Verdict& v, const contracts::Registry& reg, const ir::Sublayer& s, const ir::Block& b,
                      const Sequence& seq) {
  const auto* a = std::get_if<ir::Attention>(&s.body);
  if (!seq.split() || seq.mode != SeqMode::Ring || !a || a->kind == ir::AttnKind::Cross) return;
  if (ring_consumer(reg, *a) != a->consumer)
    v.rejections.push_back({Transform::GlobalKvStreamedQ, legality::Check::ConsumerLse,
                            legality::ComponentKind::Consumer, a->consumer, {}, {}, {},
                            "yes (ring attention merges the K/V blocks' outputs by it)",
                            std::string(contracts::to_string(reg.consumer(a->consumer).lse)) +
                                ": the K/V blocks of " + b.name + "." + s.name + " are attended by 'math'"});
  const auto it = std::find(v.legal.begin(), v.legal.end(), Transform::StreamedOutProj);
  if (it == v.legal.end()) return;
  v.legal.erase(it);
  v.rejections.push_back({Transform::StreamedOutProj, legality::Check::SequenceSplit,
                          legality::ComponentKind::Transformation, b.name + "." + s.name, {}, {}, {},
                          "the output projection of a Q slab as it is attended",
                          "ring attention returns the output of all this rank's rows at once"});
}

// The plan whose parts take their fastest candidate within the Chooser's limit (see Chooser).
Plan build_plan(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
                const Options& opt, int64_t cap, Survey* survey, Costs& costs) {
  legality::Context ctx{&m, &reg, &dev};
  Plan p;
  p.model = m.name;
  p.tokens = m.tokens();
  p.dtype = m.dtype;
  p.device = dev.name;
  p.residual_bytes = dev.held(own_rows(opt.sequence, m.tokens()).size() * m.dim * int64_t(ir::dtype_size(m.dtype)));
  p.floor_bytes = floor_bytes(m);
  p.budget_bytes = opt.budget_bytes;
  p.kv_budget = opt.kv_budget;
  p.sequence = opt.sequence;
  p.row_kernels = row_kernels_note(m, reg, dev);
  if (opt.budget_bytes > 0)
    p.policy = "budget " + human_bytes(opt.budget_bytes) + ": the fastest schedule whose estimated peak fits";
  Chooser chooser(m, reg, dev, opt, p.residual_bytes, cap, survey, costs);
  const Cost embed = chooser.embedding(p.embed);
  int64_t worst = embed.peak_bytes;
  double seconds = embed.seconds;
  for (const auto& b : m.blocks) {
    BlockPlan bp;
    bp.name = b.name;
    const size_t form = costs.form(b);
    for (size_t si = 0; si < b.sublayers.size(); ++si) {
      const ir::Sublayer& s = b.sublayers[si];
      Verdict v = legality::check_sublayer(ctx, s);
      split_rejections(v, reg, s, b, opt.sequence);
      const Site at{b, s, form, si};
      SublayerPlan sp = s.is_attention() ? chooser.attention(at, std::get<ir::Attention>(s.body), v)
                                         : chooser.mlp(at, std::get<ir::Mlp>(s.body), v);
      sp.name = s.name;
      worst = std::max(worst, sp.estimated_peak);
      seconds += sp.estimated_ms / 1e3;
      bp.sublayers.push_back(std::move(sp));
    }
    if (b.post_norm) {
      bp.post_norm_rows = m.rows(b.post_norm->segments).size();
      const Cost pc = chooser.fixed(compile_post_norm(m, b, reg, dev, opt.sequence), bp.post_norm.emplace());
      worst = std::max(worst, pc.peak_bytes);
      seconds += pc.seconds;
    }
    p.blocks.push_back(std::move(bp));
  }
  if (m.final_layer) {
    FinalPlan& f = p.final_layer;
    f.present = true;
    f.decisions = decide(legality::check_final(ctx, *m.final_layer));
    chooser.final_layer(f);
    worst = std::max(worst, f.estimated_peak);
    seconds += f.estimated_ms / 1e3;
  }
  // Without a final layer the residual stream is returned in the accumulation dtype: a
  // reduced-precision stream is converted beside itself.
  if (!m.final_layer && m.dtype != accumulation_dtype(m.dtype))
    worst = std::max(worst, dev.held(m.tokens() * m.dim * int64_t(ir::dtype_size(accumulation_dtype(m.dtype)))));
  // A split run's output: this rank's rows sent to every rank, every rank's rows received.
  if (opt.sequence.split()) {
    const ir::RowRange out = m.final_layer ? m.rows(m.final_layer->segments) : ir::RowRange{0, m.tokens()};
    const int64_t width = (m.final_layer ? m.final_layer->proj.out_features : m.dim) *
                          int64_t(ir::dtype_size(accumulation_dtype(m.dtype)));
    const std::vector<int64_t> rows = rows_per_rank(opt.sequence, m.tokens(), out);
    worst = std::max(worst, dev.held(opt.sequence.ranks * rows[size_t(opt.sequence.rank)] * width) +
                                dev.held(out.size() * width));
  }
  chooser.check();
  p.estimated_peak_bytes = p.residual_bytes + worst;
  p.estimated_ms = seconds * 1e3;
  return p;
}

// The registry entries the parts' programs call.
std::vector<Plan::Entry> entries_of(const Plan& p, const contracts::Registry& reg) {
  std::vector<Plan::Entry> out;
  auto add = [&](char kind, const std::string& name) {
    const auto& impl = kind == 'c' ? reg.consumer(name).impl : kind == 'f' ? reg.format(name).impl : reg.patch(name).impl;
    Plan::Entry e{kind, name, impl.get()};
    if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(std::move(e));
  };
  for (const Part* part : parts(p))
    for (const Step& st : part->program.steps) {
      if (const auto* a = std::get_if<AcquireStep>(&st.body); a && a->linear) add('f', a->linear->format);
      else if (const AttendStep* c = attend_of(st.body)) add('c', c->consumer);
      else if (const auto* k = std::get_if<CarryKStep>(&st.body)) add('c', k->consumer);
      else if (const auto* x = std::get_if<PatchStep>(&st.body)) add('p', x->patch);
      else if (const auto* l = std::get_if<LoraStep>(&st.body)) add('p', l->patch);
    }
  return out;
}

Plan choose_plan(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
                 const Options& opt) {
  const std::string fixed = opt.token_chunk > 0 ? " (token chunk fixed at " + std::to_string(opt.token_chunk) + ")" : "";
  Costs costs;
  if (opt.budget_bytes > 0) {
    Plan p = build_plan(m, reg, dev, opt, 0, nullptr, costs);
    p.policy += fixed;
    return p;
  }
  // The default: every part's candidates and the fastest schedule first, then the smallest
  // cap on a part's need that keeps the whole schedule within kLeanTolerance of it.
  Survey parts;
  const Plan fastest = build_plan(m, reg, dev, opt, 0, &parts, costs);
  double chosen = 0;  // the parts' fastest times (every part has a candidate); the rest of the estimate has no choice
  for (const auto& cs : parts)
    chosen += std::ranges::min_element(cs, {}, [](const Candidate& c) { return c.cost.seconds; })->cost.seconds;
  const int64_t cap = lean_cap(parts, std::max(fastest.estimated_ms / 1e3 - chosen, 0.0), kLeanTolerance);
  Plan p = build_plan(m, reg, dev, opt, cap, nullptr, costs);
  char tolerance[16];
  std::snprintf(tolerance, sizeof tolerance, "%g%%", kLeanTolerance * 100);
  p.policy = std::string("default: the smallest peak whose schedule's estimated time is within ") + tolerance +
             " of the fastest schedule's (" +
             human_ms(p.estimated_ms) + " vs " + human_ms(fastest.estimated_ms) + "; peak " +
             human_bytes(p.estimated_peak_bytes) + " vs " + human_bytes(fastest.estimated_peak_bytes) + ")" + fixed;
  return p;
}

}  // namespace

bool is_legal(const std::vector<Decision>& ds, Transform t) {
  for (const auto& d : ds)
    if (d.transform == t) return d.legal();
  return false;
}

bool SublayerPlan::chosen(Transform t) const {
  if (!is_legal(decisions, t)) return false;
  switch (t) {
    case Transform::BoundedQkv: return token_chunk < std::max(rows, kv_rows) || q_chunk < rows;
    case Transform::GlobalKvStreamedQ: return q_chunk < rows;
    case Transform::StreamedOutProj: return streamed_out;
    case Transform::TokenChunkedMlp: return token_chunk < rows;
    case Transform::FeatureSlicedMlp: return feature_slice < hidden;
    default: return false;
  }
}

bool FinalPlan::chosen(Transform t) const {
  return t == Transform::BoundedFinal && is_legal(decisions, t) && chunk < rows;
}

int64_t floor_bytes(const ir::Model& m) {
  int64_t kv = 0;  // elements of the largest K + V
  for (const auto& b : m.blocks)
    for (const auto& s : b.sublayers)
      if (const auto* a = std::get_if<ir::Attention>(&s.body))
        kv = std::max(kv, 2 * m.kv_rows(s) * a->kv_heads * a->head_dim);
  return (m.tokens() * m.dim + kv) * static_cast<int64_t>(ir::dtype_size(m.dtype));
}

Plan make_plan(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
               const Options& opt) {
  ir::validate(m);
  if (opt.budget_bytes < 0)
    throw PlanError("budget_bytes: must be positive (0: no budget), got " + std::to_string(opt.budget_bytes));
  if (opt.token_chunk < 0) throw PlanError("token_chunk: must be positive, got " + std::to_string(opt.token_chunk));
  auto source = std::make_shared<const ir::Model>(m);  // what the programs point into
  Plan p = choose_plan(*source, reg, dev, opt);
  p.source = std::move(source);
  p.entries = entries_of(p, reg);
  p.device_caps = dev;
  return p;
}

std::vector<int64_t> exchange_slabs(const Plan& p) {
  std::vector<int64_t> out;
  if (!p.source) return out;
  for (size_t bi = 0; bi < p.blocks.size(); ++bi)
    for (size_t si = 0; si < p.blocks[bi].sublayers.size(); ++si) {
      const ir::Sublayer& s = p.source->blocks[bi].sublayers[si];
      const auto* a = std::get_if<ir::Attention>(&s.body);
      if (!a || !ulysses_split(p.sequence, *a)) continue;
      const int64_t most = most_rows(p.sequence, p.tokens, p.source->rows(s.segments));
      const auto [kv, q] = ulysses_slabs(p.blocks[bi].sublayers[si], most, p.sequence.ranks);
      out.insert(out.end(), {kv, q});
    }
  return out;
}

const char* code_name(Mismatch c) { return ir::name_of(c, {"plan.model", "plan.registry_entry", "plan.device", "plan.sequence"}); }

void check_match(const Plan& p, const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev) {
  if (!p.source || p.blocks.size() != m.blocks.size() || p.tokens != m.tokens())
    throw PlanMismatch(Mismatch::Model, "planned for " + std::to_string(p.blocks.size()) + " blocks / " +
                                            std::to_string(p.tokens) + " tokens, the model has " +
                                            std::to_string(m.blocks.size()) + " / " + std::to_string(m.tokens()));
  if (!(*p.source == m)) {
    const auto diff = std::mismatch(m.blocks.begin(), m.blocks.end(), p.source->blocks.begin()).first;
    const std::string where = diff == m.blocks.end() ? "outside its blocks" : "in block " + diff->name;
    throw PlanMismatch(Mismatch::Model, "the model differs from the one planned " + where);
  }
  for (const Plan::Entry& e : p.entries) {
    const char* kind = e.kind == 'c' ? "consumer" : e.kind == 'f' ? "format" : "patch";
    const void* impl = nullptr;
    try {
      impl = e.kind == 'c' ? reg.consumer(e.name).impl.get() : e.kind == 'f' ? reg.format(e.name).impl.get()
                                                                              : reg.patch(e.name).impl.get();
    } catch (const contracts::ContractError&) {
      throw PlanMismatch(Mismatch::RegistryEntry, std::string(kind) + " '" + e.name + "' is not registered");
    }
    if (impl != e.impl)
      throw PlanMismatch(Mismatch::RegistryEntry,
                         std::string(kind) + " '" + e.name + "' is another implementation than the one planned with");
  }
  contracts::DeviceCaps d = dev;
  d.memory_free = p.device_caps.memory_free;
  if (!(d == p.device_caps))
    throw PlanMismatch(Mismatch::Device, "planned for device '" + p.device_caps.name + "', run on '" + dev.name +
                                             "' with other capabilities or rates");
}

std::vector<const Part*> parts(const Plan& p) {
  std::vector<const Part*> out{&p.embed};
  for (const auto& b : p.blocks) {
    for (const auto& s : b.sublayers) out.push_back(&s.part);
    if (b.post_norm) out.push_back(&*b.post_norm);
  }
  if (p.final_layer.present) out.push_back(&p.final_layer.part);
  return out;
}

}  // namespace sp::plan
