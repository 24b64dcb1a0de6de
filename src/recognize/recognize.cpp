// The generic recognition engine: tries every (family, layout) table on a checkpoint's names
// and shapes, in the steps of README.md ("Engine"). Nothing here knows a family; the tables
// (tables_*.cpp) are the rules.
#include "recognize/recognize.hpp"

#include <algorithm>
#include <numeric>
#include <set>
#include <unordered_map>

#include "recognize/table.hpp"

namespace sp::recognize {
namespace {

using namespace detail;

const std::vector<std::string> kPrefixes = {"model.diffusion_model.", "diffusion_model.",
                                            "transformer."};
constexpr size_t kListed = 20;

struct Pattern {
  const Entry* entry = nullptr;
  std::string count;  // placeholder symbol, "" for a top-level tensor
  std::vector<Expr> shape;
};

struct CompiledLayout {
  const Family* family = nullptr;
  const Layout* layout = nullptr;
  std::vector<Pattern> patterns;
  std::unordered_map<std::string, size_t> by_key;  // name, placeholder replaced by "#"
};

const std::vector<CompiledLayout>& compiled() {
  static const std::vector<CompiledLayout> all = [] {
    std::vector<CompiledLayout> out;
    for (const Family* f : all_families()) {
      for (const Layout& l : f->layouts) {
        CompiledLayout c{f, &l, {}, {}};
        for (const Entry& e : l.entries) {
          c.by_key.emplace(expand(e.name, "#"), c.patterns.size());
          c.patterns.push_back({&e, placeholder(e.name), parse_shape(e.shape)});
        }
        out.push_back(std::move(c));
      }
    }
    return out;
  }();
  return all;
}

std::string list_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < kListed; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > kListed) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

// Block index of an all-digit name component ("12"); rejects leading zeros and huge values.
std::optional<int64_t> parse_index(const std::string& s) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  if (s.size() > 1 && s[0] == '0') return std::nullopt;
  return std::stoll(s);
}

struct Hit {
  size_t pattern;
  int64_t index;  // -1 for top-level
};

std::optional<Hit> lookup(const CompiledLayout& cl, const std::string& name) {
  if (auto it = cl.by_key.find(name);
      it != cl.by_key.end() && cl.patterns[it->second].count.empty())
    return Hit{it->second, -1};
  size_t start = 0;
  while (start <= name.size()) {
    const size_t end = std::min(name.find('.', start), name.size());
    if (auto idx = parse_index(name.substr(start, end - start))) {
      std::string key = name.substr(0, start) + "#" + name.substr(end);
      if (auto it = cl.by_key.find(key);
          it != cl.by_key.end() && !cl.patterns[it->second].count.empty())
        return Hit{it->second, *idx};
    }
    start = end + 1;
  }
  return std::nullopt;
}

struct Tensor {
  std::string name;  // prefix stripped
  const io::TensorInfo* info;
};

struct Attempt {
  const CompiledLayout* cl = nullptr;
  std::vector<std::string> unexplained;
  std::string error;
};

struct Binding {
  int64_t value;
  std::string by;
};

class Matcher {
 public:
  Matcher(const CompiledLayout& cl, const std::vector<Tensor>& tensors)
      : cl_(cl), tensors_(tensors), inst_(cl.patterns.size()) {}

  // Returns the unexplained tensors; fills instances.
  std::vector<std::string> explain() {
    std::vector<std::string> unexplained;
    for (const Tensor& t : tensors_) {
      if (auto hit = lookup(cl_, t.name))
        inst_[hit->pattern].push_back({hit->index, &t});
      else
        unexplained.push_back(t.name);
    }
    for (auto& v : inst_) std::sort(v.begin(), v.end());  // by block index (unique within a pattern)
    return unexplained;
  }

  Recognized validate(const std::string& prefix, const Sidecar& sidecar) {
    count_blocks();
    check_missing();
    bind_symbols();
    check_shapes();
    return {configure(bound_values(), sidecar), cl_.layout->name, prefix, sources(prefix), {}};
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw RecognizeError(cl_.family->name + " (" + cl_.layout->name + " layout): " + what);
  }

  Symbols bound_values() const {
    Symbols syms;
    for (const auto& [s, b] : bound_) syms[s] = b.value;
    return syms;
  }

  bool active(const Pattern& p) const {
    return p.entry->feature.empty() || features_.count(p.entry->feature) > 0;
  }

  void count_blocks() {
    std::map<std::string, std::set<int64_t>> indices;
    std::map<std::string, std::string> example;  // a pattern of the group, for messages
    for (size_t i = 0; i < cl_.patterns.size(); ++i) {
      const Pattern& p = cl_.patterns[i];
      if (!inst_[i].empty() && !p.entry->feature.empty()) features_.insert(p.entry->feature);
      if (p.count.empty()) continue;
      auto& set = indices[p.count];
      example.emplace(p.count, p.entry->name);
      for (const auto& [idx, t] : inst_[i]) set.insert(idx);
    }
    for (const auto& [sym, set] : indices) {
      const int64_t n = set.empty() ? 0 : *set.rbegin() + 1;
      const std::string group = example[sym].substr(0, example[sym].find('{')) + "N";
      if (n == 0) fail("no " + group + ".* tensor found (at least one block is required)");
      if (static_cast<int64_t>(set.size()) != n) {
        std::string missing;
        for (int64_t i = 0; i < n; ++i)
          if (!set.count(i)) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
        fail("block indices of " + group + " have gaps: found " + std::to_string(set.size()) +
             " blocks up to index " + std::to_string(n - 1) + ", missing " + missing);
      }
      bound_[sym] = {n, "block indices"};
    }
  }

  void check_missing() const {
    std::vector<std::string> missing;
    for (size_t i = 0; i < cl_.patterns.size(); ++i) {
      const Pattern& p = cl_.patterns[i];
      if (!active(p)) continue;
      if (p.count.empty()) {
        if (inst_[i].empty()) missing.push_back(p.entry->name);
        continue;
      }
      const int64_t n = bound_.at(p.count).value;
      size_t k = 0;
      for (int64_t b = 0; b < n; ++b) {
        if (k < inst_[i].size() && inst_[i][k].first == b)
          ++k;
        else
          missing.push_back(expand(p.entry->name, std::to_string(b)));
      }
    }
    if (!missing.empty())
      fail("missing " + std::to_string(missing.size()) + " tensor(s): " + list_names(missing));
  }

  // Binds every symbol it can from the first tensor of each pattern; a dimension whose
  // expression has more than one unknown waits for a later round.
  void bind_symbols() {
    std::vector<std::pair<size_t, size_t>> pending;  // (pattern, dimension)
    for (size_t i = 0; i < cl_.patterns.size(); ++i) {
      if (inst_[i].empty()) continue;
      const auto& shape = inst_[i][0].second->info->shape;
      if (shape.size() != cl_.patterns[i].shape.size()) shape_error(i, 0);
      for (size_t d = 0; d < shape.size(); ++d) pending.push_back({i, d});
    }
    size_t before = 0;
    do {  // rounds, in order, until one binds nothing more
      before = pending.size();
      std::erase_if(pending, [&](const auto& p) { return try_bind(p.first, p.second); });
    } while (!pending.empty() && pending.size() < before);
    if (!pending.empty())
      throw std::logic_error("recognize table " + cl_.family->name + "/" + cl_.layout->name +
                             ": cannot bind symbols of " +
                             cl_.patterns[pending[0].first].entry->shape);
  }

  // True when dimension d of pattern i's first tensor needs nothing more (bound or known).
  bool try_bind(size_t i, size_t d) {
    const Expr& e = cl_.patterns[i].shape[d];
    const Tensor& t = *inst_[i][0].second;
    const int64_t actual = t.info->shape[d];
    std::set<std::string> unknown;
    for (const auto& term : e)
      for (const auto& s : term.syms)
        if (!bound_.count(s)) unknown.insert(s);
    if (unknown.empty()) return true;  // checked in check_shapes()
    if (unknown.size() > 1) return false;
    const std::string& u = *unknown.begin();
    int64_t known = 0, coef = 0;
    for (const auto& term : e) {
      int64_t v = term.coef, uses = 0;
      for (const auto& s : term.syms) {
        if (s == u)
          ++uses;
        else
          v *= bound_.at(s).value;
      }
      if (uses > 1 || (uses == 1 && coef != 0)) return false;  // not linear in u
      (uses ? coef : known) += v;
    }
    if (coef <= 0 || actual - known <= 0 || (actual - known) % coef != 0)
      fail("tensor " + t.name + " has shape " + shape_string(t.info->shape) + ": dimension " +
           std::to_string(d) + " = " + std::to_string(actual) + " does not fit " + to_string(e) +
           " for any positive " + u + context(e, u));
    bound_[u] = {(actual - known) / coef, t.name};
    return true;
  }

  // " (dim=1536 from patch_embedding.weight, ...)" for the bound symbols of `e`.
  std::string context(const Expr& e, const std::string& skip = "") const {
    std::set<std::string> seen;
    std::string out;
    for (const auto& term : e)
      for (const auto& s : term.syms)
        if (s != skip && bound_.count(s) && seen.insert(s).second)
          out += (out.empty() ? "" : ", ") + s + "=" + std::to_string(bound_.at(s).value) +
                 " from " + bound_.at(s).by;
    return out.empty() ? "" : " (" + out + ")";
  }

  [[noreturn]] void shape_error(size_t i, size_t k) const {
    const Pattern& p = cl_.patterns[i];
    const Tensor& t = *inst_[i][k].second;
    std::string expect, values, ctx;
    for (size_t d = 0; d < p.shape.size(); ++d) {
      expect += (d ? ", " : "") + to_string(p.shape[d]);
      auto v = evaluate(p.shape[d], bound_values());
      values += (d ? ", " : "") + (v ? std::to_string(*v) : "?");
      std::string c = context(p.shape[d]);
      if (!c.empty() && ctx.find(c.substr(2, c.size() - 3)) == std::string::npos)
        ctx += (ctx.empty() ? "" : "; ") + c.substr(2, c.size() - 3);
    }
    fail("tensor " + t.name + " has shape " + shape_string(t.info->shape) + ", expected [" + expect +
         "] = [" + values + "]" + (ctx.empty() ? "" : " (" + ctx + ")"));
  }

  void check_shapes() const {
    const Symbols syms = bound_values();
    for (size_t i = 0; i < cl_.patterns.size(); ++i) {
      const Pattern& p = cl_.patterns[i];
      for (size_t k = 0; k < inst_[i].size(); ++k) {
        const auto& shape = inst_[i][k].second->info->shape;
        if (shape.size() != p.shape.size()) shape_error(i, k);
        for (size_t d = 0; d < shape.size(); ++d)
          if (evaluate(p.shape[d], syms) != shape[d]) shape_error(i, k);
      }
    }
  }

  FamilyConfig configure(const Symbols& syms, const Sidecar& sc) const {
    const Family& fam = *cl_.family;
    FamilyConfig c;
    try {
      c = fam.structure(syms, features_, sc);
      const FamilyConfig* match = nullptr;
      for (const Preset& p : fam.presets)
        for (const FamilyConfig* candidate : {&p.real, &p.tiny})
          if (!match && same_structure(c, *candidate)) match = candidate;
      c.variant = match ? match->variant : "custom";
      if (match)
        copy_conventions(*match, c);
      else
        fam.custom_defaults(c);
      if (sc.eps) c.eps = *sc.eps;
      if (sc.rope_theta) c.rope_theta = *sc.rope_theta;
      if (sc.rope_axes_dim) c.rope_axes_dim = *sc.rope_axes_dim;
      if (sc.rotary_dim) c.rotary_dim = *sc.rotary_dim;
      // Partial rotation (avdit, MiniMax H3) with new axes but no rotary_dim: rotate sum(axes)
      // dims (check_rope fills it in). Full rotation (Wan, Flux) stays at head_dim.
      if (sc.rope_axes_dim && !sc.rotary_dim && c.rotary_dim != c.head_dim) c.rotary_dim = 0;
      if (sc.text_tokens) c.text_tokens = *sc.text_tokens;
      if (sc.segments) c.segments = *sc.segments;
      check_rope(c, sc);
      fam.check(c, syms);
    } catch (const RecognizeError& e) {
      fail(e.what());
    }
    return c;
  }

  static void check_rope(FamilyConfig& c, const Sidecar& sc) {
    const std::string hd = std::to_string(c.head_dim);
    if (c.rope_axes_dim.empty())
      throw RecognizeError("no default rope.axes_dim for a " + c.variant + " " + c.family +
                           " with head_dim " + hd + "; give rope.axes_dim (and rope.rotary_dim) " +
                           "in a sidecar");
    const int64_t sum = std::accumulate(c.rope_axes_dim.begin(), c.rope_axes_dim.end(), int64_t{0});
    if (c.rotary_dim == 0) c.rotary_dim = sum;
    const std::string src = sc.rope_axes_dim ? "sidecar" : "default";
    if (sum != c.rotary_dim)
      throw RecognizeError("rope.axes_dim " + shape_string(c.rope_axes_dim) + " (" + src + ") sums to " +
                           std::to_string(sum) + " but rope.rotary_dim is " +
                           std::to_string(c.rotary_dim) + " (head_dim " + hd + ")");
    if (c.rotary_dim > c.head_dim)
      throw RecognizeError("rope.rotary_dim " + std::to_string(c.rotary_dim) +
                           " exceeds head_dim " + hd);
  }

  std::map<std::string, Source> sources(const std::string& prefix) const {
    std::map<std::string, std::vector<std::pair<int, std::string>>> parts;  // (part, stored name)
    std::map<std::string, Source> out;
    for (size_t i = 0; i < cl_.patterns.size(); ++i) {
      const Entry& e = *cl_.patterns[i].entry;
      const std::string& canon = e.canonical.empty() ? e.name : e.canonical;
      for (const auto& [idx, t] : inst_[i]) {
        const std::string c = expand(canon, std::to_string(idx));
        parts[c].push_back({e.part, prefix + t->name});
        out[c].op = e.op;
      }
    }
    for (auto& [c, v] : parts) {
      std::sort(v.begin(), v.end());
      for (auto& [part, name] : v) out[c].tensors.push_back(name);
    }
    return out;
  }

  const CompiledLayout& cl_;
  const std::vector<Tensor>& tensors_;
  std::vector<std::vector<std::pair<int64_t, const Tensor*>>> inst_;
  Features features_;
  std::map<std::string, Binding> bound_;
};

}  // namespace

Recognized recognize(const std::vector<io::TensorInfo>& infos,
                     const std::optional<Sidecar>& sidecar) {
  if (infos.empty()) throw RecognizeError("unrecognized checkpoint: it holds no tensors");
  std::set<std::string> seen;
  for (const auto& t : infos)
    if (!seen.insert(t.name).second) throw RecognizeError("tensor " + t.name + " appears twice");

  auto shared = std::find_if(kPrefixes.begin(), kPrefixes.end(), [&](const std::string& p) {
    return std::all_of(infos.begin(), infos.end(), [&](const io::TensorInfo& t) { return t.name.starts_with(p); });
  });
  const std::string prefix = shared == kPrefixes.end() ? "" : *shared;
  std::vector<Tensor> tensors;
  for (const auto& t : infos) tensors.push_back({t.name.substr(prefix.size()), &t});

  const Sidecar sc = sidecar.value_or(Sidecar{});
  std::vector<Attempt> attempts;
  for (const CompiledLayout& cl : compiled()) {
    if (sc.family && cl.family->name != *sc.family) continue;
    Matcher m(cl, tensors);
    Attempt a{&cl, m.explain(), {}};
    if (a.unexplained.empty()) {
      try {
        return m.validate(prefix, sc);
      } catch (const RecognizeError& e) {
        a.error = e.what();
      }
    }
    attempts.push_back(std::move(a));
  }
  for (const Attempt& a : attempts)
    if (a.unexplained.empty()) throw RecognizeError(a.error);

  const Attempt* best = &*std::min_element(attempts.begin(), attempts.end(), [](const Attempt& a, const Attempt& b) {
    return a.unexplained.size() < b.unexplained.size();
  });
  std::string tried;
  for (const Attempt& a : attempts)
    tried += (tried.empty() ? "" : ", ") + a.cl->family->name + "/" + a.cl->layout->name;
  const size_t n = tensors.size();
  throw RecognizeError(
      "unrecognized checkpoint: no known layout explains all " + std::to_string(n) + " tensors" +
      (prefix.empty() ? "" : " (prefix " + prefix + " stripped)") + ". Closest: family " +
      best->cl->family->name + ", " + best->cl->layout->name + " layout, which explains " +
      std::to_string(n - best->unexplained.size()) + " of " + std::to_string(n) +
      "; unexplained (" + std::to_string(best->unexplained.size()) +
      "): " + list_names(best->unexplained) + ". Tried: " + tried + ".");
}

Recognized recognize(const io::SafetensorsFile& file, const std::optional<Sidecar>& sidecar) {
  QuantScan q = scan_quant(file);
  Recognized r = recognize(q.structural, sidecar);
  r.quant = std::move(q.weights);
  return r;
}

std::vector<std::string> families() {
  std::vector<std::string> out;
  for (const Family* f : all_families()) out.push_back(f->name);
  return out;
}

std::vector<std::string> layouts(const std::string& family) {
  const Family* f = find_family(family);
  if (!f) throw RecognizeError("unknown family \"" + family + "\"");
  std::vector<std::string> out;
  for (const auto& l : f->layouts) out.push_back(l.name);
  return out;
}

}  // namespace sp::recognize
