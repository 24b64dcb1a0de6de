// Sidecar parsing and validation. Every error names the source, the field and the value.
#include "recognize/sidecar.hpp"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <numeric>

#include "recognize/table.hpp"

namespace sp::recognize {
namespace {

using json = nlohmann::json;

using detail::join;

class Parser {
 public:
  explicit Parser(std::string_view source) : source_(source) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw SidecarError("sidecar " + source_ + ": field \"" + field + "\" " + what);
  }

  // Throws on a key of `obj` that is not in `known`.
  void only_known(const json& obj, const std::string& where,
                  const std::vector<std::string>& known) const {
    for (const auto& [key, value] : obj.items())
      if (std::find(known.begin(), known.end(), key) == known.end())
        fail(where + key, "is unknown (value " + value.dump() + "); known fields: " + join(known));
  }

  int64_t positive_int(const json& v, const std::string& field) const {
    if (!v.is_number_integer() || v.get<int64_t>() <= 0)
      fail(field, "must be a positive integer, got " + v.dump());
    return v.get<int64_t>();
  }

  double positive_number(const json& v, const std::string& field) const {
    if (!v.is_number() || v.get<double>() <= 0)
      fail(field, "must be a positive number, got " + v.dump());
    return v.get<double>();
  }

 private:
  std::string source_;
};

}  // namespace

Sidecar parse_sidecar(std::string_view json_text, std::string_view source) {
  Parser p(source);
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw SidecarError("sidecar " + std::string(source) + ": invalid JSON: " + e.what());
  }
  if (!j.is_object())
    throw SidecarError("sidecar " + std::string(source) + ": must be a JSON object, got " +
                       j.dump());
  p.only_known(j, "", {"version", "family", "head_dim", "eps", "rope", "text_tokens", "segments"});

  Sidecar s;
  if (j.contains("version")) {
    const json& v = j["version"];
    if (!v.is_number_integer() || v.get<int64_t>() != 1)
      p.fail("version", "must be 1, got " + v.dump());
  }
  if (j.contains("family")) {
    const json& v = j["family"];
    if (!v.is_string()) p.fail("family", "must be a string, got " + v.dump());
    s.family = v.get<std::string>();
    if (!detail::find_family(*s.family))
      p.fail("family", "is an unknown family \"" + *s.family + "\"; known: " + join(families()));
  }
  if (j.contains("head_dim")) {
    s.head_dim = p.positive_int(j["head_dim"], "head_dim");
    if (*s.head_dim % 2 != 0)
      p.fail("head_dim", "must be even (rotary pairs), got " + j["head_dim"].dump());
  }
  if (j.contains("eps")) {
    s.eps = p.positive_number(j["eps"], "eps");
    if (*s.eps >= 1) p.fail("eps", "must be in (0, 1), got " + j["eps"].dump());
  }
  if (j.contains("text_tokens")) s.text_tokens = p.positive_int(j["text_tokens"], "text_tokens");
  if (j.contains("rope")) {
    const json& r = j["rope"];
    if (!r.is_object()) p.fail("rope", "must be an object, got " + r.dump());
    p.only_known(r, "rope.", {"theta", "axes_dim", "rotary_dim"});
    if (r.contains("theta")) s.rope_theta = p.positive_number(r["theta"], "rope.theta");
    if (r.contains("rotary_dim")) {
      s.rotary_dim = p.positive_int(r["rotary_dim"], "rope.rotary_dim");
      if (*s.rotary_dim % 2 != 0)
        p.fail("rope.rotary_dim", "must be even, got " + r["rotary_dim"].dump());
    }
    if (r.contains("axes_dim")) {
      const json& a = r["axes_dim"];
      if (!a.is_array() || a.empty())
        p.fail("rope.axes_dim",
               "must be a non-empty array of positive even integers, got " + a.dump());
      s.rope_axes_dim.emplace();
      for (const auto& x : a) {
        if (!x.is_number_integer() || x.get<int64_t>() <= 0 || x.get<int64_t>() % 2 != 0)
          p.fail("rope.axes_dim", "must hold positive even integers, got " + a.dump());
        s.rope_axes_dim->push_back(x.get<int64_t>());
      }
    }
  }
  if (j.contains("segments")) {
    const json& a = j["segments"];
    if (!a.is_array() || a.empty())
      p.fail("segments", "must be a non-empty array of names, got " + a.dump());
    std::vector<std::string>& segs = s.segments.emplace();
    for (const auto& x : a) {
      if (!x.is_string() || x.get<std::string>().empty())
        p.fail("segments", "must hold non-empty strings, got " + a.dump());
      if (std::find(segs.begin(), segs.end(), x.get<std::string>()) != segs.end())
        p.fail("segments", "names " + x.dump() + " twice: " + a.dump());
      segs.push_back(x.get<std::string>());
    }
  }

  // Cross-field checks the sidecar alone can decide.
  if (s.rope_axes_dim) {
    const int64_t sum = std::accumulate(s.rope_axes_dim->begin(), s.rope_axes_dim->end(), int64_t{0});
    const std::string axes = j["rope"]["axes_dim"].dump();
    if (s.rotary_dim && sum != *s.rotary_dim)
      p.fail("rope.axes_dim", axes + " sums to " + std::to_string(sum) +
                                  " but rope.rotary_dim is " + std::to_string(*s.rotary_dim));
    if (!s.rotary_dim && s.head_dim && sum != *s.head_dim)
      p.fail("rope.axes_dim", axes + " sums to " + std::to_string(sum) + " but head_dim is " +
                                  std::to_string(*s.head_dim));
  }
  if (s.rotary_dim && s.head_dim && *s.rotary_dim > *s.head_dim)
    p.fail("rope.rotary_dim",
           std::to_string(*s.rotary_dim) + " exceeds head_dim " + std::to_string(*s.head_dim));
  return s;
}

Sidecar load_sidecar(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw SidecarError("sidecar " + path + ": cannot open file");
  return parse_sidecar(std::string(std::istreambuf_iterator<char>(in), {}), path);
}

std::string to_json(const Sidecar& s) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["version"] = 1;
  if (s.family) j["family"] = *s.family;
  if (s.head_dim) j["head_dim"] = *s.head_dim;
  if (s.eps) j["eps"] = *s.eps;
  nlohmann::ordered_json rope = nlohmann::ordered_json::object();
  if (s.rope_theta) rope["theta"] = *s.rope_theta;
  if (s.rope_axes_dim) rope["axes_dim"] = *s.rope_axes_dim;
  if (s.rotary_dim) rope["rotary_dim"] = *s.rotary_dim;
  if (!rope.empty()) j["rope"] = rope;
  if (s.text_tokens) j["text_tokens"] = *s.text_tokens;
  if (s.segments) j["segments"] = *s.segments;
  return j.dump(2) + "\n";
}

}  // namespace sp::recognize
