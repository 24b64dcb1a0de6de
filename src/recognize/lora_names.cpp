#include "recognize/lora_names.hpp"

#include <algorithm>
#include <array>

namespace sp::recognize {

namespace {

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
    if (key.ends_with(suffix)) return LoraKey{key.substr(0, key.size() - std::string(suffix).size()), part};
  return std::nullopt;
}

LoraNames::LoraNames(const FamilyConfig& config) {
  for (const std::string& layout : layouts(config.family)) {
    for (const TensorSpec& t : checkpoint_tensors(config, layout)) {
      if (!t.name.ends_with(".weight")) continue;
      const std::string module = t.name.substr(0, t.name.size() - 7);
      LoraTarget target{t.canonical, t.name, t.op, t.row_offset, t.shape};
      dotted_.emplace(module, target);  // the first layout (original) wins a shared name
      std::string under = module;
      std::replace(under.begin(), under.end(), '.', '_');
      underscored_.emplace(under, std::move(target));
    }
  }
}

std::optional<LoraTarget> LoraNames::find(const std::string& module) const {
  auto lookup = [&](const auto& prefixes, const std::map<std::string, LoraTarget>& names) -> const LoraTarget* {
    for (const std::string_view p : prefixes)
      if (module.starts_with(p))
        if (auto it = names.find(module.substr(p.size())); it != names.end()) return &it->second;
    return nullptr;
  };
  const LoraTarget* t = lookup(kUnderscored, underscored_);
  if (!t) t = lookup(kDotted, dotted_);
  return t ? std::optional<LoraTarget>(*t) : std::nullopt;
}

}  // namespace sp::recognize
