// Shape expressions and small helpers shared by the engine and the family tables.
#include "recognize/table.hpp"

#include <cctype>
#include <stdexcept>

namespace sp::recognize::detail {
namespace {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t pos = s.find(sep, start);
    out.push_back(trim(s.substr(start, pos - start)));  // to the end when pos == npos
    if (pos == std::string::npos) return out;
    start = pos + 1;
  }
}

bool is_symbol(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

Expr parse_expr(const std::string& text) {
  Expr e;
  for (const auto& term_text : split(text, '+')) {
    Term t;
    for (const auto& f : split(term_text, '*')) {
      if (is_symbol(f)) {
        t.syms.push_back(f);
      } else if (!f.empty() && f.find_first_not_of("0123456789") == std::string::npos) {
        t.coef *= std::stoll(f);
      } else {
        throw std::logic_error("recognize table: bad shape expression \"" + text + "\"");
      }
    }
    e.push_back(t);
  }
  return e;
}

}  // namespace

std::vector<Entry> with_biases(std::vector<Entry> entries) {
  const std::string weight = ".weight", marker = weight + "+bias";
  auto bias_of = [&](const std::string& name) { return name.substr(0, name.size() - weight.size()) + ".bias"; };
  std::vector<Entry> out;
  for (Entry& e : entries) {
    if (!e.name.ends_with(marker)) {
      out.push_back(std::move(e));
      continue;
    }
    e.name.resize(e.name.size() - marker.size() + weight.size());
    Entry b = e;
    b.name = bias_of(e.name);
    b.shape = e.shape.substr(0, e.shape.find(','));
    if (!b.canonical.empty()) b.canonical = bias_of(e.canonical);
    out.push_back(std::move(e));
    out.push_back(std::move(b));
  }
  return out;
}

void set_fields(FamilyConfig& c, const Symbols& s, std::span<const Field> fields) {
  for (const Field& f : fields) c.*f.field = s.at(f.symbol);
}

Symbols field_symbols(const FamilyConfig& c, std::span<const Field> fields) {
  Symbols s;
  for (const Field& f : fields) s[f.symbol] = c.*f.field;
  return s;
}

std::vector<Expr> parse_shape(const std::string& shape) {
  std::vector<Expr> dims;
  for (const auto& d : split(shape, ',')) dims.push_back(parse_expr(d));
  return dims;
}

std::optional<int64_t> evaluate(const Expr& e, const Symbols& syms) {
  int64_t sum = 0;
  for (const auto& t : e) {
    int64_t v = t.coef;
    for (const auto& s : t.syms) {
      auto it = syms.find(s);
      if (it == syms.end()) return std::nullopt;
      v *= it->second;
    }
    sum += v;
  }
  return sum;
}

std::string to_string(const Expr& e) {
  std::string out;
  for (const auto& t : e) {
    if (!out.empty()) out += "+";
    std::string term = (t.coef != 1 || t.syms.empty()) ? std::to_string(t.coef) : "";
    for (const auto& s : t.syms) term += (term.empty() ? "" : "*") + s;
    out += term;
  }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string placeholder(const std::string& pattern) {
  size_t b = pattern.find('{');
  if (b == std::string::npos) return "";
  size_t e = pattern.find('}', b);
  if (e == std::string::npos) throw std::logic_error("recognize table: bad pattern " + pattern);
  return pattern.substr(b + 1, e - b - 1);
}

std::string expand(const std::string& pattern, const std::string& value) {
  size_t b = pattern.find('{');
  if (b == std::string::npos) return pattern;
  size_t e = pattern.find('}', b);
  return pattern.substr(0, b) + value + pattern.substr(e + 1);
}

bool same_structure(const FamilyConfig& a, const FamilyConfig& b) {
  return a.family == b.family && a.dim == b.dim && a.heads == b.heads && a.head_dim == b.head_dim &&
         a.ffn == b.ffn && a.in_channels == b.in_channels && a.out_channels == b.out_channels &&
         a.text_dim == b.text_dim && a.freq_dim == b.freq_dim && a.vec_dim == b.vec_dim &&
         a.audio_dim == b.audio_dim && a.patch == b.patch && a.guidance == b.guidance &&
         a.qkv_bias == b.qkv_bias && a.time_dim == b.time_dim && a.time_table_rows == b.time_table_rows &&
         a.head_bank == b.head_bank && a.gate_compress == b.gate_compress &&
         a.segments.size() == b.segments.size();
}

void copy_conventions(const FamilyConfig& from, FamilyConfig& to) {
  to.eps = from.eps;
  to.rope_theta = from.rope_theta;
  to.rope_axes_dim = from.rope_axes_dim;
  to.rotary_dim = from.rotary_dim;
  to.text_tokens = from.text_tokens;
  to.timestep_scale = from.timestep_scale;
  to.segments = from.segments;
}

const std::vector<const Family*>& all_families() {
  static const std::vector<const Family*> families = {&wan_family(), &flux_family(), &avdit_family(),
                                                        &minimax_h3_family()};
  return families;
}

const Family* find_family(const std::string& name) {
  for (const Family* f : all_families())
    if (f->name == name) return f;
  return nullptr;
}

void check_whole_head_rope(const FamilyConfig& c, const std::string& family, const std::string& streams) {
  if (c.rotary_dim != c.head_dim)
    throw RecognizeError("rope.rotary_dim " + std::to_string(c.rotary_dim) + " must equal head_dim " +
                         std::to_string(c.head_dim) + " (" + family + " rotates the whole head)");
  if (!c.segments.empty())
    throw RecognizeError("sidecar field segments applies to avdit only (" + family + " " + streams + ")");
}

void check_sidecar_head_dim(const FamilyConfig& c, const Sidecar& sidecar, const std::string& width) {
  if (sidecar.head_dim && *sidecar.head_dim != c.head_dim)
    throw RecognizeError("sidecar head_dim " + std::to_string(*sidecar.head_dim) + " contradicts the checkpoint's " +
                         width + " width " + std::to_string(c.head_dim));
}

}  // namespace sp::recognize::detail
