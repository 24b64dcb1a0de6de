#include "legality/legality.hpp"

#include <algorithm>
#include <iterator>
#include <numeric>
#include <utility>

namespace sp::legality {

using contracts::Cap;
using contracts::TensorRole;

namespace {
// component_name of the one model quantity a check is about: the MLP's hidden width.
constexpr const char* kMlpHidden = "mlp.hidden";

// Per Check, in declaration order: its code and what it checks.
constexpr std::pair<const char*, const char*> kChecks[] = {
    {"consumer.registered", "is registered"},
    {"consumer.bounded_q", "accepts bounded Q against global K/V"},
    {"consumer.declares_global_k", "states whether it needs complete K"},
    {"consumer.declares_global_v", "states whether it needs complete V"},
    {"consumer.slab_output", "produces output in Q-sized slabs"},
    {"consumer.kv_aligned", "global K/V length aligned"},
    {"consumer.dtype", "accepts activation dtype"},
    {"consumer.lse", "returns each row's log-sum-exp"},
    {"format.held", "held execution (acquire once, reuse per slab)"},
    {"format.region_slicing", "output-feature (row) slicing for regions q|k|v"},
    {"format.row_slicing", "output-feature (row) slicing"},
    {"format.column_slicing", "input-feature (column) slicing"},
    {"format.region_aligned", "region offset aligned"},
    {"format.up_half_aligned", "up half's row offset aligned"},
    {"patch.row_local", "runs on a token slab"},
    {"patch.feature_local", "runs on a feature slice"},
    {"device.dtype", "supports activation dtype"},
    {"device.fp32", "supports fp32 (final projection)"},
    {"transform.prerequisite", "prerequisite is legal"},
    {"sequence.split", "runs on one rank's rows alone"},
    {"model.hidden_too_narrow", "at least two aligned slices"},
};
static_assert(std::size(kChecks) == std::size(kAllChecks), "names for every check");

// The component a check is about: the structured part of a Rejection that names it.
struct Component {
  ComponentKind kind;
  std::string name;
  std::string format;
  std::optional<TensorRole> role;
};

Component weight_component(const ir::Linear& l) { return {ComponentKind::Weight, l.weight, l.format, {}}; }

// Collects rejections for one transformation; the transformation is legal when none was added.
class Checker {
 public:
  Checker(Verdict& v, Transform t) : v_(v), t_(t), before_(v.rejections.size()) { v_.candidates.push_back(t); }
  void require_cap(const Component& component, Check check, Cap actual) {
    if (actual != Cap::Yes) add(component, check, "yes", contracts::to_string(actual));
  }
  void require_declared(const Component& component, Check check, Cap actual) {
    if (actual == Cap::Unknown) add(component, check, "declared (yes or no)", contracts::to_string(actual));
  }
  void require(bool ok, const Component& component, Check check, const std::string& required,
               const std::string& actual, const std::string& region = {}) {
    if (!ok) add(component, check, required, actual, region);
  }
  void depends_on(Transform other) {
    if (!v_.is_legal(other))
      add({ComponentKind::Transformation, to_string(other), {}, {}}, Check::Prerequisite, "legal", "rejected");
  }
  void done() {
    if (v_.rejections.size() == before_) v_.legal.push_back(t_);
  }

 private:
  void add(const Component& c, Check check, const std::string& req, const std::string& act,
           const std::string& region = {}) {
    v_.rejections.push_back({.transform = t_, .check = check, .component_kind = c.kind, .component_name = c.name,
                             .format = c.format, .role = c.role, .region = region, .required = req, .actual = act});
  }
  Verdict& v_;
  Transform t_;
  size_t before_;
};

// Every patch on `roles` must declare the locality `feature` selects (feature slice, else token slab).
void require_patch_locality(Checker& c, const Context& ctx, const std::vector<std::string>& patches,
                            std::initializer_list<TensorRole> roles, bool feature) {
  for (const auto& name : patches) {
    const auto& p = ctx.registry->patch(name);
    for (TensorRole r : roles) {
      if (!p.touches(r)) continue;
      c.require_cap({ComponentKind::Patch, name, {}, r}, feature ? Check::PatchFeatureLocal : Check::PatchRowLocal,
                    feature ? p.feature_local : p.row_local);
    }
  }
}

void require_held(Checker& c, const Context& ctx, const ir::Linear& l) {
  c.require_cap(weight_component(l), Check::FormatHeld, ctx.registry->format(l.format).held_execution);
}

// The device supports `dt` (the activation dtype, or fp32 for the final projection).
void require_device_dtype(Checker& c, const Context& ctx, ir::DType dt, Check check) {
  c.require(ctx.device->dtypes.count(dt) != 0, {ComponentKind::Device, ctx.device->name, {}, {}}, check,
            ir::to_string(dt), "unsupported");
}

// Fused QKV: projecting only the k|v rows, then only the q rows, slices the weight by output rows.
void require_region_slicing(Checker& c, const Context& ctx, const ir::Linear& l) {
  const auto& f = ctx.registry->format(l.format);
  c.require_cap(weight_component(l), Check::FormatRegionSlicing, f.out_slicing);
  for (const auto& r : l.out_regions)
    c.require(r.offset % f.out_align == 0, weight_component(l), Check::RegionAligned,
              "multiple of " + std::to_string(f.out_align), std::to_string(r.offset), r.name);
}

void check_attention(Verdict& v, const Context& ctx, const ir::Attention& a, int64_t kv_rows) {
  {
    Checker c(v, Transform::BoundedQkv);
    for (const ir::AttnProj* p : a.all_proj()) {
      if (p->fused()) require_region_slicing(c, ctx, *p->qkv);
      for (const auto* l : {&p->qkv, &p->q, &p->k, &p->v})
        if (*l) require_held(c, ctx, **l);
    }
    require_patch_locality(c, ctx, a.patches, {TensorRole::Q, TensorRole::K, TensorRole::V}, false);
    // A parallel MLP is computed slab by slab with Q.
    if (a.parallel) require_patch_locality(c, ctx, a.patches, {TensorRole::MlpHidden}, false);
    require_device_dtype(c, ctx, ctx.model->dtype, Check::DeviceDtype);
    c.done();
  }
  {
    Checker c(v, Transform::GlobalKvStreamedQ);
    c.depends_on(Transform::BoundedQkv);
    const Component comp{ComponentKind::Consumer, a.consumer, {}, {}};
    if (!ctx.registry->has_consumer(a.consumer)) {
      c.require(false, comp, Check::ConsumerRegistered, "registered consumer", "unknown name");
    } else {
      const auto& k = ctx.registry->consumer(a.consumer);
      c.require_cap(comp, Check::ConsumerBoundedQ, k.accepts_bounded_q);
      c.require_declared(comp, Check::ConsumerDeclaresGlobalK, k.requires_global_k);
      c.require_declared(comp, Check::ConsumerDeclaresGlobalV, k.requires_global_v);
      c.require_cap(comp, Check::ConsumerSlabOutput, k.slab_output);
      c.require(kv_rows % k.kv_align == 0, comp, Check::ConsumerKvAligned, "multiple of " + std::to_string(k.kv_align),
                std::to_string(kv_rows));
      c.require(k.dtypes.count(ctx.model->dtype) != 0, comp, Check::ConsumerDtype, ir::to_string(ctx.model->dtype),
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
    require_device_dtype(c, ctx, ctx.model->dtype, Check::DeviceDtype);
    c.done();
  }
  {
    Checker c(v, Transform::FeatureSlicedMlp);
    c.depends_on(Transform::TokenChunkedMlp);
    for (const auto* l : ins)
      c.require_cap(weight_component(*l), Check::FormatRowSlicing, ctx.registry->format(l->format).out_slicing);
    c.require_cap(weight_component(m.down), Check::FormatColumnSlicing, ctx.registry->format(m.down.format).in_slicing);
    require_patch_locality(c, ctx, m.patches, {TensorRole::MlpHidden}, true);
    const int64_t align = feature_alignment(*ctx.registry, m);
    // The up half of a fused [gate | up] weight starts at row `hidden`: slices of it are
    // aligned only if that offset is.
    if (m.layout == ir::GateUpLayout::FusedHalves) {
      const int64_t oa = ctx.registry->format(m.up->format).out_align;
      c.require(m.hidden % oa == 0, weight_component(*m.up), Check::UpHalfAligned, "multiple of " + std::to_string(oa),
                std::to_string(m.hidden));
    }
    c.require(m.hidden >= 2 * align, {ComponentKind::Model, kMlpHidden, {}, {}}, Check::HiddenTooNarrow,
              ">= " + std::to_string(2 * align) + " (alignment " + std::to_string(align) + ")",
              std::to_string(m.hidden));
    c.done();
  }
}

}  // namespace

const char* to_string(Transform t) {
  return ir::name_of(t, {"token-chunked MLP", "feature-sliced MLP", "bounded QKV", "global K/V + streamed Q",
                         "streamed output projection", "bounded final layer"});
}

const char* code_name(Check c) {
  return static_cast<size_t>(c) < std::size(kChecks) ? kChecks[static_cast<size_t>(c)].first : "?";
}

const char* to_string(ComponentKind k) {
  return ir::name_of(k, {"consumer", "weight", "patch", "device", "model", "transformation"});
}

std::string component_text(const Rejection& r) {
  const std::string quoted = "'" + r.component_name + "'";
  switch (r.component_kind) {
    case ComponentKind::Consumer: return "consumer " + quoted;
    case ComponentKind::Weight: return "weight " + quoted + " (format " + r.format + ")";
    case ComponentKind::Patch:
      return "patch " + quoted + (r.role ? std::string(" on ") + contracts::to_string(*r.role) : "");
    case ComponentKind::Device: return "device " + quoted;
    case ComponentKind::Model: return r.component_name == kMlpHidden ? "MLP hidden width" : "model " + quoted;
    case ComponentKind::Transformation: return "transformation " + quoted;
  }
  return quoted;
}

std::string check_text(const Rejection& r) {
  if (r.check == Check::RegionAligned) return "region '" + r.region + "' offset aligned";
  const auto i = static_cast<size_t>(r.check);
  return i < std::size(kChecks) ? kChecks[i].second : code_name(r.check);
}

std::string describe(const Rejection& r) {
  return std::string(to_string(r.transform)) + ": " + component_text(r) + ": " + check_text(r) + " [" +
         code_name(r.check) + "] — required " + r.required + ", actual " + r.actual;
}

bool Verdict::is_legal(Transform t) const { return std::find(legal.begin(), legal.end(), t) != legal.end(); }

int64_t feature_alignment(const contracts::Registry& reg, const ir::Mlp& m) {
  int64_t a = reg.format(m.down.format).in_align;
  a = std::lcm(a, reg.format(m.up->format).out_align);
  if (m.gate) a = std::lcm(a, reg.format(m.gate->format).out_align);
  return a;
}

Verdict check_sublayer(const Context& ctx, const ir::Sublayer& s) {
  Verdict v;
  if (const auto* a = std::get_if<ir::Attention>(&s.body)) check_attention(v, ctx, *a, ctx.model->kv_rows(s));
  else check_mlp(v, ctx, std::get<ir::Mlp>(s.body));
  return v;
}

Verdict check_final(const Context& ctx, const ir::FinalLayer& f) {
  Verdict v;
  Checker c(v, Transform::BoundedFinal);
  require_held(c, ctx, f.proj);
  require_device_dtype(c, ctx, ir::DType::F32, Check::DeviceFp32);
  c.done();
  return v;
}

}  // namespace sp::legality
