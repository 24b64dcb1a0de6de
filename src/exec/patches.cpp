#include "exec/patches.hpp"

#include <cmath>
#include <stdexcept>

namespace sp::exec {

void apply_patch(const contracts::PatchCaps& p, at::Tensor& t) {
  if (p.kind == "scale-q") {
    t.mul_(p.param);
  } else if (p.kind == "clamp-hidden") {
    t.clamp_(-p.param, p.param);
  } else if (p.kind == "renorm-attn-out") {
    // Global RMS over every element: one reduction, no full-size temporary.
    const double rms = at::linalg_vector_norm(t, 2).item<double>() / std::sqrt(static_cast<double>(t.numel()));
    t.div_(rms + 1e-6);
  } else if (p.kind == "rownorm-hidden") {
    at::Tensor r = at::linalg_vector_norm(t, 2, {-1}, true);
    r.div_(std::sqrt(static_cast<double>(t.size(-1)))).add_(1e-6);
    t.div_(r);
  } else {
    throw std::invalid_argument("patch '" + p.name + "': no implementation for kind '" + p.kind + "'");
  }
}

void apply_patches(const contracts::Registry& reg, const std::vector<std::string>& names, contracts::TensorRole role,
                   at::Tensor& t) {
  for (const auto& n : names) {
    const auto& p = reg.patch(n);
    if (p.modifies.count(role)) apply_patch(p, t);
  }
}

}  // namespace sp::exec
