// Sidecar descriptor: the few facts a checkpoint's names and shapes cannot tell.
//
// Usage:
//   sp::recognize::Sidecar s = sp::recognize::load_sidecar("model.streamplan.json");
//   // or from text:
//   auto s2 = sp::recognize::parse_sidecar(R"({"family": "wan2.1", "head_dim": 64})");
//   auto r = sp::recognize::recognize(infos, s2);
//   std::string text = sp::recognize::to_json(s2);   // parse_sidecar(text) == s2
//
// Format (every field optional, unknown fields rejected):
//   {
//     "version": 1,
//     "family": "wan2.1" | "flux1" | "avdit" | "minimax-h3", // restrict recognition to this family
//     "head_dim": 128,                       // Wan: heads = dim / head_dim; others: must agree
//     "eps": 1e-6,                           // every norm's epsilon
//     "rope": {"theta": 10000, "axes_dim": [44, 42, 42], "rotary_dim": 128},
//     "text_tokens": 512,                    // default text length
//     "segments": ["video", "text", "audio"] // avdit: order of the per-segment modulation rows
//   }
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
