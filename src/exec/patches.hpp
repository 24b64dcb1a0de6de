// Patch implementations: in-place edits of a tensor the model computes.
//
// Design note. A patch is part of the effective model, so the naive and the bounded
// schedules call the same implementation; the schedule only decides on which piece
// (slab, slice, or the complete tensor) it runs, as the patch's contract permits.
// Implementations allocate no full-size temporaries.
//
// Example:
//     sp::exec::apply_patch(reg.patch("q-temperature"), q32);   // q32 *= 1.25
#pragma once

#include <ATen/ATen.h>

#include "contracts/contracts.hpp"

namespace sp::exec {

void apply_patch(const contracts::PatchCaps& p, at::Tensor& t);

// Applies every patch in `names` that modifies `role`, in order.
void apply_patches(const contracts::Registry& reg, const std::vector<std::string>& names, contracts::TensorRole role,
                   at::Tensor& t);

}  // namespace sp::exec
