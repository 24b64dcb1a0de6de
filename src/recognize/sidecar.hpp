// Sidecar descriptor: the few facts a checkpoint's names and shapes cannot tell.
//
// Usage:
//   auto s = sp::recognize::parse_sidecar(R"({"family": "wan2.1", "head_dim": 64})");  // or load_sidecar(path)
//   auto r = sp::recognize::recognize(infos, s);
//   std::string text = sp::recognize::to_json(s);   // parse_sidecar(text) == s
//
// Format (every field optional, unknown fields rejected): docs/checkpoints.md, "Sidecar".
// Field-level problems throw SidecarError naming the field and the value; checks against the
// checkpoint (axes vs the inferred head_dim, ...) happen in recognize().
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sp::recognize {

class SidecarError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Sidecar {
  std::optional<std::string> family;
  std::optional<int64_t> head_dim;
  std::optional<double> eps;
  std::optional<double> rope_theta;
  std::optional<std::vector<int64_t>> rope_axes_dim;
  std::optional<int64_t> rotary_dim;
  std::optional<int64_t> text_tokens;
  std::optional<std::vector<std::string>> segments;
  bool operator==(const Sidecar&) const = default;
};

// Parses and validates sidecar JSON; `source` (a path) prefixes every error message.
Sidecar parse_sidecar(std::string_view json_text, std::string_view source = "<sidecar>");
// Reads and parses a sidecar file.
Sidecar load_sidecar(const std::string& path);
// Serializes (2-space indented JSON, fields that are set only).
std::string to_json(const Sidecar& sidecar);

}  // namespace sp::recognize
