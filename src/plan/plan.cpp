#include "plan/plan.hpp"

#include <algorithm>
#include <sstream>

#include "plan/schedule.hpp"

namespace sp::plan {

using legality::Verdict;

bool SublayerPlan::chosen(Transform t) const {
  for (const auto& d : decisions)
    if (d.transform == t) return d.chosen;
  return false;
}

bool FinalPlan::chosen(Transform t) const {
  for (const auto& d : decisions)
    if (d.transform == t) return d.chosen;
  return false;
}

namespace {

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

std::string human_bytes(int64_t b) {
  std::ostringstream os;
  os.precision(b >= (int64_t{10} << 20) ? 1 : 2);
  os << std::fixed << static_cast<double>(b) / (1 << 20) << " MiB";
  return os.str();
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
  legality::Context ctx{&m, &reg, &dev};
  Plan p;
  p.model = m.name;
  p.tokens = m.tokens();
  p.dtype = m.dtype;
  p.device = dev.name;
  p.residual_bytes = dev.round_alloc(m.tokens() * m.dim * static_cast<int64_t>(ir::dtype_size(m.dtype)));
  p.floor_bytes = floor_bytes(m);
  int64_t worst = embed_phase(m, reg).total_bytes(dev);
  for (const auto& b : m.blocks) {
    BlockPlan bp;
    bp.name = b.name;
    for (const auto& s : b.sublayers) {
      Verdict v = legality::check_sublayer(ctx, s);
      SublayerPlan sp = s.is_attention() ? plan_attention(m, s, std::get<ir::Attention>(s.body), v, opt, reg)
                                         : plan_mlp(m, s, std::get<ir::Mlp>(s.body), v, opt, reg);
      sp.name = s.name;
      for (const auto& ph : sublayer_phases(m, s, sp, reg, dev))
        sp.estimated_peak = std::max(sp.estimated_peak, ph.total_bytes(dev));
      worst = std::max(worst, sp.estimated_peak);
      bp.sublayers.push_back(std::move(sp));
    }
    p.blocks.push_back(std::move(bp));
  }
  if (m.final_layer) {
    FinalPlan& f = p.final_layer;
    f.present = true;
    f.decisions = decide(legality::check_final(ctx, *m.final_layer));
    const int64_t rows = m.output_tokens();
    f.chunk = f.chosen(Transform::BoundedFinal) ? token_chunk_for(rows, opt) : rows;
    if (f.chunk >= rows) decline(f.decisions, Transform::BoundedFinal, "one chunk covers all tokens");
    f.estimated_peak = final_phase(m, f.chunk, reg).total_bytes(dev);
    worst = std::max(worst, f.estimated_peak);
  }
  p.estimated_peak_bytes = p.residual_bytes + worst;
  return p;
}

std::string explain(const Plan& p) {
  std::ostringstream os;
  os << "plan for " << p.model << ": " << p.tokens << " tokens, " << ir::to_string(p.dtype) << ", device "
     << p.device << "\n";
  os << "  floor " << human_bytes(p.floor_bytes) << ", estimated peak " << human_bytes(p.estimated_peak_bytes)
     << " (residual " << human_bytes(p.residual_bytes) << ")\n";
  // Consecutive blocks with the same plan are printed once, with their range.
  std::vector<std::string> bodies;
  for (const BlockPlan& b : p.blocks) {
    std::ostringstream bs;
    for (const auto& s : b.sublayers) {
      bs << "   " << s.name << ": ";
      if (s.attention) bs << "kv/out chunk " << s.token_chunk << ", q chunk " << s.q_chunk;
      else bs << "token chunk " << s.token_chunk << ", feature slice " << s.feature_slice;
      bs << ", estimated " << human_bytes(s.estimated_peak) << " above the residual\n";
      explain_decisions(bs, s.decisions);
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
    os << "  final layer: chunk " << p.final_layer.chunk << ", estimated " << human_bytes(p.final_layer.estimated_peak)
       << " above the residual\n";
    explain_decisions(os, p.final_layer.decisions);
  }
  return os.str();
}

}  // namespace sp::plan
