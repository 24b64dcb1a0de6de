// Checkpoints: canonical weights loaded from a recognized safetensors file, and random
// checkpoints of a family preset written in any of its layouts.
//
// Design note. Recognition (src/recognize) says where each canonical tensor comes from; this
// file assembles them and converts them to the run's dtype and device. Random checkpoints draw
// every canonical tensor from a generator seeded by its name, so the same seed gives the same
// weights in every layout. The sidecar travels in the file's metadata under kSidecarKey.
//
// Example:
//     sp::models::write_random_checkpoint(sp::recognize::preset("wan2.1-1.3b", 2), "diffusers",
//                                         "wan.safetensors", /*seed=*/0, at::kBFloat16);
//     auto file = sp::io::SafetensorsFile::open("wan.safetensors");
//     auto rec = sp::recognize::recognize(file, sp::models::sidecar_of(file));
//     auto w = sp::models::load_canonical(file, rec, at::kBFloat16, at::kCUDA, reg);
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <optional>

#include "exec/formats/weights.hpp"
#include "recognize/recognize.hpp"

namespace sp::models {

inline constexpr const char* kSidecarKey = "streamplan.sidecar";

// The sidecar stored in the file's metadata, if any.
std::optional<recognize::Sidecar> sidecar_of(const io::SafetensorsFile& f);

// One canonical tensor from the tensors its Source names (`parts`, in that order): the one
// tensor (Copy), their concatenation along dim 0, or the one with its halves along dim 0
// exchanged; a convolution kernel that acts as a linear (a patch embedding with stride ==
// kernel) comes flattened to [out, in]. A Copy of a contiguous tensor is a view of it.
at::Tensor assemble(const std::string& canonical, const recognize::Source& src, const std::vector<at::Tensor>& parts);
// The same tensor in the shape the original layout stores it (a convolution kernel stays a kernel).
at::Tensor assemble_stored(const std::string& canonical, const recognize::Source& src,
                           const std::vector<at::Tensor>& parts);
// assemble's inverse for one part: the stored tensor of `shape` whose rows start at
// `row_offset` of the canonical tensor `t` (Concat0; 0 otherwise), its halves exchanged back
// for SwapHalves0.
at::Tensor stored_part(const std::string& canonical, recognize::Source::Op op, const at::Tensor& t, int64_t row_offset,
                       at::IntArrayRef shape);

std::shared_ptr<exec::TensorWeights> load_canonical(const io::SafetensorsFile& f, const recognize::Recognized& r,
                                                    at::ScalarType dtype, const at::Device& device,
                                                    const contracts::Registry& reg);

// Random canonical weights of `config` (deterministic per tensor name and seed).
std::map<std::string, at::Tensor> random_canonical(const recognize::FamilyConfig& config, uint64_t seed);

// Random canonical weights generated directly on `device` in `dtype` (benchmarks of real
// dimensions: no checkpoint file, no host copy), flattened for use as linears.
std::shared_ptr<exec::TensorWeights> random_weights_on(const recognize::FamilyConfig& config, const at::Device& device,
                                                       at::ScalarType dtype, uint64_t seed,
                                                       const contracts::Registry& reg);

// Progress of a checkpoint write; bytes include the header.
struct WriteProgress {
  size_t tensors = 0, total_tensors = 0;
  uint64_t bytes = 0, total_bytes = 0;
};

// Streams the checkpoint: the header is computed from `config` first, then each tensor is
// generated, converted and written in turn, so memory is bounded by the largest canonical
// tensor, not by the file. The bytes depend only on the arguments. Throws
// io::SafetensorsError, having written nothing, when the file would not fit in the free
// space of its filesystem or its header would pass io::kMaxHeaderBytes; a failed write
// leaves no file behind. `progress`, if set, is called after each tensor.
void write_random_checkpoint(const recognize::FamilyConfig& config, const std::string& layout,
                             const std::string& path, uint64_t seed, at::ScalarType dtype,
                             const std::function<void(const WriteProgress&)>& progress = {});

}  // namespace sp::models
