// make-checkpoint support: presets, the tensor list of a layout (generated from the same
// tables recognition reads), and the sidecar of a config.
#include <algorithm>
#include <set>
#include <stdexcept>

#include "recognize/recognize.hpp"
#include "recognize/table.hpp"

namespace sp::recognize {

using namespace detail;

std::vector<TensorSpec> checkpoint_tensors(const FamilyConfig& config, const std::string& layout) {
  const Family* fam = find_family(config.family);
  if (!fam) throw RecognizeError("checkpoint_tensors: unknown family \"" + config.family + "\"");
  const auto lay = std::find_if(fam->layouts.begin(), fam->layouts.end(), [&](const Layout& l) { return l.name == layout; });
  if (lay == fam->layouts.end())
    throw RecognizeError("checkpoint_tensors: family " + config.family + " has no layout \"" + layout +
                         "\" (known: " + join(layouts(config.family)) + ")");

  const Symbols syms = fam->symbols(config);
  const Features feats = fam->features(config);
  std::vector<TensorSpec> out;
  std::vector<int> part_of;  // Concat0 part of each emitted tensor
  auto emit = [&](const Entry& e, int64_t index) {
    const std::string i = std::to_string(index);
    TensorSpec t{expand(e.name, i), {}, expand(e.canonical.empty() ? e.name : e.canonical, i), e.op, 0};
    for (const Expr& d : parse_shape(e.shape)) {
      auto v = evaluate(d, syms);
      if (!v) throw std::logic_error("recognize table: unbound symbol in " + e.shape);
      if (*v <= 0)
        throw RecognizeError("checkpoint_tensors: " + t.name + " dimension " + to_string(d) +
                             " = " + std::to_string(*v) + " is not positive for this config");
      t.shape.push_back(*v);
    }
    out.push_back(std::move(t));
    part_of.push_back(e.part);
  };

  // Top-level tensors in table order; a block group at the position of its first entry,
  // block by block, each block's tensors in table order.
  std::set<std::string> groups_done;
  for (size_t i = 0; i < lay->entries.size(); ++i) {
    const Entry& e = lay->entries[i];
    if (!e.feature.empty() && !feats.count(e.feature)) continue;
    const std::string sym = placeholder(e.name);
    if (sym.empty()) {
      emit(e, -1);
      continue;
    }
    if (!groups_done.insert(sym).second) continue;
    for (int64_t b = 0; b < syms.at(sym); ++b)
      for (size_t j = i; j < lay->entries.size(); ++j)
        if (placeholder(lay->entries[j].name) == sym &&
            (lay->entries[j].feature.empty() || feats.count(lay->entries[j].feature)))
          emit(lay->entries[j], b);
  }

  // Row offsets of Concat0 parts within their canonical tensor, in part order.
  std::map<std::string, std::vector<std::pair<int, size_t>>> parts;
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i].op == Source::Op::Concat0) parts[out[i].canonical].push_back({part_of[i], i});
  for (auto& [c, v] : parts) {
    std::sort(v.begin(), v.end());
    int64_t offset = 0;
    for (auto [part, i] : v) {
      out[i].row_offset = offset;
      offset += out[i].shape[0];
    }
  }
  return out;
}

FamilyConfig preset(const std::string& variant, int layers, bool tiny) {
  for (const Family* f : all_families()) {
    for (const Preset& p : f->presets) {
      const FamilyConfig* c = nullptr;
      if (p.name == variant) c = tiny ? &p.tiny : &p.real;
      if (!c && p.tiny.variant == variant) c = &p.tiny;  // "-tiny" names
      if (!c) continue;
      FamilyConfig out = *c;
      if (layers == 0 || layers < -1)
        throw RecognizeError("preset " + variant + ": layers must be positive or -1, got " +
                             std::to_string(layers));
      if (layers > 0) {
        out.layers = layers;
        if (out.single_layers > 0) out.single_layers = 2 * static_cast<int64_t>(layers);
      }
      return out;
    }
  }
  throw RecognizeError("unknown preset \"" + variant + "\" (known: " + join(preset_names()) + ")");
}

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const Family* f : all_families())
    for (const Preset& p : f->presets) out.push_back(p.name);
  return out;
}

Sidecar sidecar_for(const FamilyConfig& c) {
  return {c.family,        c.head_dim,   c.eps,         c.rope_theta,
          c.rope_axes_dim, c.rotary_dim, c.text_tokens, c.segments.empty() ? std::nullopt : std::optional(c.segments)};
}

}  // namespace sp::recognize
