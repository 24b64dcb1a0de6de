// patch_from and apply_patches (patch.hpp).
#include "exec/consumers/consumer.hpp"
#include "exec/patches/patch.hpp"

namespace sp::exec {

namespace {

struct FnPatch : PatchImpl {
  explicit FnPatch(std::function<void(at::Tensor&)> f) : fn(std::move(f)) {}
  void apply(at::Tensor& t) const override { fn(t); }
  std::function<void(at::Tensor&)> fn;
};

}  // namespace

std::shared_ptr<const PatchImpl> patch_from(std::function<void(at::Tensor&)> fn) {
  return std::make_shared<FnPatch>(std::move(fn));
}

void apply_patches(const contracts::Registry& reg, const std::vector<std::string>& names, contracts::TensorRole role,
                   at::Tensor& t) {
  for (const auto& n : names) {
    const auto& p = reg.patch(n);
    if (p.modifies.count(role)) impl_of<PatchImpl>(p).apply(t);
  }
}

}  // namespace sp::exec
