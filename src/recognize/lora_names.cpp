#include "recognize/lora_names.hpp"

#include <algorithm>
#include <array>

namespace sp::recognize {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// Prefixes a module name may carry before the layout's own name: PEFT's wrapper, the
// checkpoint prefixes recognition strips, the diffusers pipeline component.
const std::array<const char*, 6> kDotted = {"base_model.model.", "model.diffusion_model.", "diffusion_model.",
                                            "transformer.", "unet.", ""};
// Kohya: the network's prefix for the denoiser.
const std::array<const char*, 2> kUnderscored = {"lora_unet_", "lora_transformer_"};

}  // namespace

std::optional<LoraKey> parse_lora_key(const std::string& key) {
  static const std::array<std::pair<const char*, LoraPart>, 7> suffixes = {{
      {".lora_A.weight", LoraPart::Down},
      {".lora_B.weight", LoraPart::Up},
      {".lora_down.weight", LoraPart::Down},
      {".lora_up.weight", LoraPart::Up},
      {".lora.down.weight", LoraPart::Down},
      {".lora.up.weight", LoraPart::Up},
      {".alpha", LoraPart::Alpha},
  }};
  for (const auto& [suffix, part] : suffixes)
    if (ends_with(key, suffix)) return LoraKey{key.substr(0, key.size() - std::string(suffix).size()), part};
  return std::nullopt;
}

LoraNames::LoraNames(const FamilyConfig& config) {
  for (const std::string& layout : layouts(config.family)) {
    for (const TensorSpec& t : checkpoint_tensors(config, layout)) {
      if (!ends_with(t.name, ".weight")) continue;
      const std::string module = t.name.substr(0, t.name.size() - 7);
      LoraTarget target{t.canonical, t.name, layout, t.op, t.row_offset, t.shape};
      dotted_.emplace(module, target);  // the first layout (original) wins a shared name
      std::string under = module;
      std::replace(under.begin(), under.end(), '.', '_');
      underscored_.emplace(under, std::move(target));
    }
  }
}

std::optional<LoraTarget> LoraNames::find(const std::string& module) const {
  for (const char* p : kUnderscored)
    if (starts_with(module, p)) {
      auto it = underscored_.find(module.substr(std::string(p).size()));
      if (it != underscored_.end()) return it->second;
    }
  for (const char* p : kDotted)
    if (starts_with(module, p)) {
      auto it = dotted_.find(module.substr(std::string(p).size()));
      if (it != dotted_.end()) return it->second;
    }
  return std::nullopt;
}

}  // namespace sp::recognize
