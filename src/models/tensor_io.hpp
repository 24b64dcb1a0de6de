// Safetensors <-> ATen: named tensor maps read from and written to safetensors files.
//
// Example:
//     auto inputs = sp::models::read_tensors("inputs.safetensors");      // name -> tensor (CPU)
//     sp::models::write_tensors("out.safetensors", {{"output", out}});   // atomic write
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>

#include "io/safetensors.hpp"

namespace sp::models {

using TensorMap = std::map<std::string, at::Tensor>;

// A copy of one tensor of an opened file, on the CPU, in its stored dtype.
at::Tensor read_tensor(const io::SafetensorsFile& f, const std::string& name);
TensorMap read_tensors(const std::string& path);
// Writes every tensor (moved to the CPU, made contiguous); metadata goes to __metadata__.
void write_tensors(const std::string& path, const TensorMap& tensors,
                   const std::map<std::string, std::string>& metadata = {});
// The safetensors dtype storing `t`; throws std::invalid_argument naming `name` if none does.
io::DType to_io(at::ScalarType t, const std::string& name);
// The ATen dtype of a stored one; throws std::invalid_argument naming `name` if none.
at::ScalarType to_aten(io::DType d, const std::string& name);

}  // namespace sp::models
