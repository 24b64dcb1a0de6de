#include "legality/legality.hpp"

#include <algorithm>
#include <numeric>

namespace sp::legality {

using contracts::Cap;
using contracts::TensorRole;

const char* to_string(Transform t) {
  switch (t) {
    case Transform::TokenChunkedMlp: return "token-chunked MLP";
    case Transform::FeatureSlicedMlp: return "feature-sliced MLP";
    case Transform::BoundedQkv: return "bounded QKV";
    case Transform::GlobalKvStreamedQ: return "global K/V + streamed Q";
    case Transform::StreamedOutProj: return "streamed output projection";
    case Transform::BoundedFinal: return "bounded final layer";
  }
  return "?";
}

std::string describe(const Rejection& r) {
  return std::string(to_string(r.transform)) + ": " + r.component + ": " + r.check + " — required " +
         r.required + ", actual " + r.actual;
}

bool Verdict::is_legal(Transform t) const { return std::find(legal.begin(), legal.end(), t) != legal.end(); }

namespace {

// Collects rejections for one transformation; the transformation is legal when none was added.
class Checker {
 public:
  Checker(Verdict& v, Transform t) : v_(v), t_(t), before_(v.rejections.size()) { v_.candidates.push_back(t); }
  void require_cap(const std::string& component, const std::string& check, Cap actual) {
    if (actual != Cap::Yes) add(component, check, "yes", contracts::to_string(actual));
  }
  void require_declared(const std::string& component, const std::string& check, Cap actual) {
    if (actual == Cap::Unknown) add(component, check, "declared (yes or no)", contracts::to_string(actual));
  }
  void require(bool ok, const std::string& component, const std::string& check, const std::string& required,
               const std::string& actual) {
    if (!ok) add(component, check, required, actual);
  }
  void depends_on(Transform other) {
    if (!v_.is_legal(other))
      add("transformation '" + std::string(to_string(other)) + "'", "prerequisite is legal", "legal", "rejected");
  }
  void done() {
    if (v_.rejections.size() == before_) v_.legal.push_back(t_);
  }

 private:
  void add(const std::string& c, const std::string& check, const std::string& req, const std::string& act) {
    v_.rejections.push_back({t_, c, check, req, act});
  }
  Verdict& v_;
  Transform t_;
  size_t before_;
};

std::string weight_component(const ir::Linear& l) { return "weight '" + l.weight + "' (format " + l.format + ")"; }

// Every patch on `roles` must declare the locality `cap` selects.
void require_patch_locality(Checker& c, const Context& ctx, const std::vector<std::string>& patches,
                            std::initializer_list<TensorRole> roles, bool feature) {
  for (const auto& name : patches) {
    const auto& p = ctx.registry->patch(name);
    for (TensorRole r : roles) {
      if (!p.touches(r)) continue;
      c.require_cap("patch '" + name + "' on " + contracts::to_string(r),
                    feature ? "runs on a feature slice" : "runs on a token slab",
                    feature ? p.feature_local : p.row_local);
    }
  }
}

void require_held(Checker& c, const Context& ctx, const ir::Linear& l) {
  c.require_cap(weight_component(l), "held execution (acquire once, reuse per slab)",
                ctx.registry->format(l.format).held_execution);
}

void require_device_dtype(Checker& c, const Context& ctx) {
  const auto dt = ctx.model->dtype;
  c.require(ctx.device->dtypes.count(dt) != 0, "device '" + ctx.device->name + "'", "supports activation dtype",
            ir::to_string(dt), "unsupported");
}

// Fused QKV: projecting only the k|v rows, then only the q rows, slices the weight by output rows.
void require_region_slicing(Checker& c, const Context& ctx, const ir::Linear& l) {
  const auto& f = ctx.registry->format(l.format);
  c.require_cap(weight_component(l), "output-feature (row) slicing for regions q|k|v", f.out_slicing);
  for (const auto& r : l.out_regions)
    c.require(r.offset % f.out_align == 0, weight_component(l), "region '" + r.name + "' offset aligned",
              "multiple of " + std::to_string(f.out_align), std::to_string(r.offset));
}

void check_attention(Verdict& v, const Context& ctx, const ir::Attention& a, int64_t kv_rows) {
  std::initializer_list<TensorRole> qkv_roles = {TensorRole::Q, TensorRole::K, TensorRole::V};
  {
    Checker c(v, Transform::BoundedQkv);
    for (const ir::AttnProj* p : a.all_proj()) {
      if (p->fused()) require_region_slicing(c, ctx, *p->qkv);
      for (const ir::Linear* l : {p->qkv ? &*p->qkv : nullptr, p->q ? &*p->q : nullptr, p->k ? &*p->k : nullptr,
                                  p->v ? &*p->v : nullptr})
        if (l) require_held(c, ctx, *l);
    }
    require_patch_locality(c, ctx, a.patches, qkv_roles, false);
    // A parallel MLP is computed slab by slab with Q.
    if (a.parallel) require_patch_locality(c, ctx, a.patches, {TensorRole::MlpHidden}, false);
    require_device_dtype(c, ctx);
    c.done();
  }
  {
    Checker c(v, Transform::GlobalKvStreamedQ);
    c.depends_on(Transform::BoundedQkv);
    const std::string comp = "consumer '" + a.consumer + "'";
    if (!ctx.registry->has_consumer(a.consumer)) {
      c.require(false, comp, "is registered", "registered consumer", "unknown name");
    } else {
      const auto& k = ctx.registry->consumer(a.consumer);
      c.require_cap(comp, "accepts bounded Q against global K/V", k.accepts_bounded_q);
      c.require_declared(comp, "states whether it needs complete K", k.requires_global_k);
      c.require_declared(comp, "states whether it needs complete V", k.requires_global_v);
      c.require_cap(comp, "produces output in Q-sized slabs", k.slab_output);
      c.require(kv_rows % k.kv_align == 0, comp, "global K/V length aligned",
                "multiple of " + std::to_string(k.kv_align), std::to_string(kv_rows));
      c.require(k.dtypes.count(ctx.model->dtype) != 0, comp, "accepts activation dtype", ir::to_string(ctx.model->dtype),
                "not accepted");
    }
    c.done();
  }
  {
    Checker c(v, Transform::StreamedOutProj);
    c.depends_on(Transform::GlobalKvStreamedQ);
    require_patch_locality(c, ctx, a.patches, {TensorRole::AttnOut}, false);
    for (const ir::AttnProj* p : a.all_proj()) require_held(c, ctx, p->out);
    c.done();
  }
}

void check_mlp(Verdict& v, const Context& ctx, const ir::Mlp& m) {
  std::vector<const ir::Linear*> ins = {&*m.up};
  if (m.gate) ins.push_back(&*m.gate);
  {
    Checker c(v, Transform::TokenChunkedMlp);
    for (const auto* l : ins) require_held(c, ctx, *l);
    require_held(c, ctx, m.down);
    require_patch_locality(c, ctx, m.patches, {TensorRole::MlpHidden, TensorRole::BlockOutput}, false);
    require_device_dtype(c, ctx);
    c.done();
  }
  {
    Checker c(v, Transform::FeatureSlicedMlp);
    c.depends_on(Transform::TokenChunkedMlp);
    for (const auto* l : ins)
      c.require_cap(weight_component(*l), "output-feature (row) slicing", ctx.registry->format(l->format).out_slicing);
    c.require_cap(weight_component(m.down), "input-feature (column) slicing",
                  ctx.registry->format(m.down.format).in_slicing);
    require_patch_locality(c, ctx, m.patches, {TensorRole::MlpHidden}, true);
    const int64_t align = feature_alignment(*ctx.registry, m);
    // The up half of a fused [gate | up] weight starts at row `hidden`: slices of it are
    // aligned only if that offset is.
    if (m.layout == ir::GateUpLayout::FusedHalves) {
      const int64_t oa = ctx.registry->format(m.up->format).out_align;
      c.require(m.hidden % oa == 0, weight_component(*m.up), "up half's row offset aligned",
                "multiple of " + std::to_string(oa), std::to_string(m.hidden));
    }
    c.require(m.hidden >= 2 * align, "MLP hidden width", "at least two aligned slices",
              ">= " + std::to_string(2 * align) + " (alignment " + std::to_string(align) + ")",
              std::to_string(m.hidden));
    c.done();
  }
}

}  // namespace

int64_t feature_alignment(const contracts::Registry& reg, const ir::Mlp& m) {
  int64_t a = reg.format(m.down.format).in_align;
  a = std::lcm(a, reg.format(m.up->format).out_align);
  if (m.gate) a = std::lcm(a, reg.format(m.gate->format).out_align);
  return a;
}

Verdict check_sublayer(const Context& ctx, const ir::Sublayer& s) {
  Verdict v;
  if (const auto* a = std::get_if<ir::Attention>(&s.body)) {
    const int64_t kv_rows = a->kind == ir::AttnKind::Cross ? ctx.model->context(a->context).length
                                                           : ctx.model->rows(s.segments).size();
    check_attention(v, ctx, *a, kv_rows);
  }
  else check_mlp(v, ctx, std::get<ir::Mlp>(s.body));
  return v;
}

Verdict check_final(const Context& ctx, const ir::FinalLayer& f) {
  Verdict v;
  Checker c(v, Transform::BoundedFinal);
  require_held(c, ctx, f.proj);
  c.require(ctx.device->dtypes.count(ir::DType::F32) != 0, "device '" + ctx.device->name + "'",
            "supports fp32 (final projection)", "fp32", "unsupported");
  c.done();
  return v;
}

}  // namespace sp::legality
