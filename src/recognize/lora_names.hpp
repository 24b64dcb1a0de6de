// LoRA key names -> the canonical weights they patch, through the recognition tables.
//
// Design note. A LoRA file names each adapted layer by a module name of some layout of the
// family, in one of several spellings, plus a part suffix:
//   kohya        lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight / .lora_up.weight / .alpha
//   diffusers    transformer.transformer_blocks.0.attn.to_q.lora_A.weight / .lora_B.weight
//   PEFT         base_model.model.blocks.0.attn1.to_q.lora_A.weight
//   trainers     diffusion_model.blocks.0.self_attn.q.lora_A.weight (Wan; ComfyUI layout)
//                (also .lora.down.weight / .lora.up.weight, the older diffusers spelling)
// parse_lora_key splits off the part; LoraNames resolves the module against the tensor lists
// that the family's recognition tables give for every layout (checkpoint_tensors), so a name
// maps onto a canonical weight exactly as a checkpoint tensor of that name would: a part of a
// fused weight (diffusers to_q of Flux's qkv) becomes a row range of it. Kohya names are the
// same module names with '.' written as '_', matched against that spelling of each name.
//
// Example:
//     sp::recognize::LoraNames names(rec.config);
//     auto key = sp::recognize::parse_lora_key("transformer.transformer_blocks.0.attn.to_k.lora_B.weight");
//     auto t = names.find(key->module);  // canonical "double_blocks.0.img_attn.qkv.weight",
//                                         // rows [dim, 2*dim)
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "recognize/recognize.hpp"

namespace sp::recognize {

enum class LoraPart { Down, Up, Alpha };  // A [rank, in], B [out, rank], alpha (a scalar)

struct LoraKey {
  std::string module;  // the key without its part suffix, prefixes kept
  LoraPart part;
};
// nullopt: the key has none of the part suffixes above.
std::optional<LoraKey> parse_lora_key(const std::string& key);

struct LoraTarget {
  std::string canonical;     // canonical weight name ("blocks.0.self_attn.q.weight")
  std::string tensor;        // the name it matched, in its layout ("blocks.0.attn1.to_q.weight")
  Source::Op op = Source::Op::Copy;
  int64_t row_offset = 0;    // first canonical row the matched tensor holds
  std::vector<int64_t> shape;  // the matched tensor's shape in its layout
};

class LoraNames {
 public:
  explicit LoraNames(const FamilyConfig& config);
  // The weight a module name patches; nullopt when no layout of the family has it.
  std::optional<LoraTarget> find(const std::string& module) const;

 private:
  std::map<std::string, LoraTarget> dotted_, underscored_;
};

}  // namespace sp::recognize
