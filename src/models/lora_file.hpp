// LoRA files: read, matched onto a recognized model's canonical weights, checked, and
// attached to the IR as lazy adapters (ir::LoraAdapter, applied by exec/patches/lora.hpp).
//
// Design note. Each file's keys are grouped by module (recognize/lora_names.hpp maps a module
// onto a canonical weight, or a row range of a fused one). Every key is used by an adapter or
// listed in `unmatched` or `unapplied`; input that cannot be a LoRA for this model throws
// std::invalid_argument naming the file, the tensor and the shapes (docs/lora.md). A and B are
// kept in the model's dtype on its device, under names of their own that the run's weight
// source serves.
//
// Example:
//     auto set = sp::models::load_loras({sp::models::read_lora("style.safetensors:0.8")}, rec.config,
//                                       at::kBFloat16, at::kCUDA);
//     for (const auto& [name, t] : set.tensors) weights->add(name, t);
//     auto unapplied = set.attach(model);   // Linear::loras; what found no Linear, listed
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "exec/formats/weights.hpp"
#include "ir/model.hpp"
#include "recognize/recognize.hpp"

namespace sp::models {

struct LoraInput {
  std::string name;  // the file, or a caller's label for a state dict
  std::map<std::string, at::Tensor> tensors;
  double strength = 1;
};
// "FILE" or "FILE:STRENGTH" (a number after the last ':'), read from a safetensors file. A
// spec naming an existing file is that file, colons and all; otherwise a ':' with a tail
// that is not a number is std::invalid_argument ("--lora: strength 'abc' is not a number in
// 'F:abc'").
LoraInput read_lora(const std::string& spec);

// "; 'F' looks like a LoRA (lora_A/lora_down tensors); pass it with --lora" when most tensors
// of the safetensors file `path` are LoRA parts (recognize::parse_lora_key); else "".
std::string lora_hint(const std::string& path);
// f() (which recognizes `path` as a model); a recognize::RecognizeError for a LoRA file comes
// back with lora_hint appended.
template <class F>
auto with_lora_hint(const std::string& path, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const recognize::RecognizeError& e) {
    const std::string hint = lora_hint(path);
    if (hint.empty()) throw;
    throw recognize::RecognizeError(e.what() + hint);
  }
}

struct LoraSet {
  std::map<std::string, std::vector<ir::LoraAdapter>> adapters;  // by canonical weight name
  std::map<std::string, at::Tensor> tensors;                     // A and B by the adapters' names
  std::vector<std::string> unmatched;  // "FILE: KEY": names no weight of the model
  std::vector<std::string> unapplied;  // "FILE: KEY (why)": a weight, but not one the plan projects
  // Sets Linear::loras of every Linear whose weight has adapters. Canonical weights with
  // adapters that no Linear of `m` projects are added to `unapplied` (once) and returned.
  std::vector<std::string> attach(ir::Model& m);
  int64_t adapter_count() const;
  // "2 LoRA adapters on 2 weights; 1 key unmatched" and the unmatched/unapplied keys, one a line.
  std::string summary() const;
  // {"adapters": N, "unmatched": [...], "unapplied": [...]}: the run report's "lora".
  nlohmann::json json() const;
};

// Random rank-`rank` adapters (strength 1, no alpha) on every Linear of `m`, their A/B added to
// `w` in `dtype` on `device` (benchmarks of the LoRA overhead: `streamplan bench --lora-rank`).
void add_random_loras(ir::Model& m, exec::TensorWeights& w, int64_t rank, at::ScalarType dtype,
                      const at::Device& device, uint64_t seed);

LoraSet load_loras(const std::vector<LoraInput>& inputs, const recognize::FamilyConfig& config, at::ScalarType dtype,
                   const at::Device& device);

}  // namespace sp::models
