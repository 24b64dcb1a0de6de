// Patches: in-place edits of a tensor the model computes, registered with their contracts.
//
// Design note. A patch is part of the effective model, so the naive and the planned
// schedules call the same implementation; the program only decides on which piece (slab,
// slice, or the complete tensor) it runs, as the patch's contract permits.
// Implementations allocate no full-size temporaries.
//
// Example:
//     sp::exec::apply_patches(reg, attention.patches, sp::contracts::TensorRole::Q, q32);
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>

#include "contracts/contracts.hpp"

namespace sp::exec {

struct PatchImpl : contracts::Impl {
  virtual void apply(at::Tensor& t) const = 0;
};
std::shared_ptr<const PatchImpl> patch_from(std::function<void(at::Tensor&)> fn);

// Applies every patch in `names` that modifies `role`, in order.
void apply_patches(const contracts::Registry& reg, const std::vector<std::string>& names, contracts::TensorRole role,
                   at::Tensor& t);

}  // namespace sp::exec
