// Example patches, one of each kind of contract legality distinguishes: row- and
// feature-local (q-temperature, mlp-hidden-clamp), row-local only (mlp-hidden-rownorm),
// and one that needs the complete tensor (attn-out-renorm).
#include <cmath>

#include "example_patches.hpp"
#include "exec/patches/patch.hpp"

namespace sp::test {

using exec::patch_from;

void register_example_patches(contracts::Registry& reg) {
  using contracts::Cap;
  using contracts::TensorRole;
  // A number operand while the patch runs.
  const auto scalar = [](int64_t, int64_t, ir::DType dt, contracts::DeviceKind d) {
    return contracts::scalar_operand_bytes(dt, d);
  };
  contracts::PatchCaps qt;
  qt.name = "q-temperature";
  qt.description = "multiplies Q by a constant (attention temperature)";
  qt.reads = qt.modifies = {TensorRole::Q};
  qt.row_local = qt.feature_local = Cap::Yes;
  qt.impl = patch_from([](at::Tensor& t) { t.mul_(1.25); });
  qt.scratch_bytes = scalar;
  reg.add(qt);

  contracts::PatchCaps renorm;
  renorm.name = "attn-out-renorm";
  renorm.description = "divides the attention output by its RMS over all tokens (needs the complete tensor)";
  renorm.reads = renorm.modifies = {TensorRole::AttnOut};
  renorm.row_local = renorm.feature_local = Cap::No;
  renorm.impl = patch_from([](at::Tensor& t) {
    // Global RMS over every element: one reduction, no full-size temporary.
    const double rms = at::linalg_vector_norm(t, 2).item<double>() / std::sqrt(static_cast<double>(t.numel()));
    t.div_(rms + 1e-6);
  });
  renorm.scratch_bytes = scalar;
  reg.add(renorm);

  contracts::PatchCaps clamp;
  clamp.name = "mlp-hidden-clamp";
  clamp.description = "clamps the activated MLP hidden values to [-0.5, 0.5]";
  clamp.reads = clamp.modifies = {TensorRole::MlpHidden};
  clamp.row_local = clamp.feature_local = Cap::Yes;
  clamp.impl = patch_from([](at::Tensor& t) { t.clamp_(-0.5, 0.5); });
  reg.add(clamp);

  contracts::PatchCaps rownorm;
  rownorm.name = "mlp-hidden-rownorm";
  rownorm.description = "RMS-normalizes each token's activated MLP hidden row (needs whole rows)";
  rownorm.reads = rownorm.modifies = {TensorRole::MlpHidden};
  rownorm.row_local = Cap::Yes;
  rownorm.feature_local = Cap::No;
  rownorm.impl = patch_from([](at::Tensor& t) {
    at::Tensor r = at::linalg_vector_norm(t, 2, {-1}, true);
    r.div_(std::sqrt(static_cast<double>(t.size(-1)))).add_(1e-6);
    t.div_(r);
  });
  // The per-row norms [rows, 1], and a number operand beside them.
  rownorm.scratch_bytes = [](int64_t rows, int64_t, ir::DType dt, contracts::DeviceKind d) {
    return rows * static_cast<int64_t>(ir::dtype_size(dt)) + contracts::scalar_operand_bytes(dt, d);
  };
  reg.add(rownorm);
}

contracts::Registry example_registry() {
  contracts::Registry reg = exec::builtin_registry();
  register_example_patches(reg);
  return reg;
}

}  // namespace sp::test
