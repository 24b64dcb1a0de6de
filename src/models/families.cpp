#include "models/families.hpp"

#include <stdexcept>

#include "models/family_table.hpp"

namespace sp::models {

namespace {

// Every family with a forward, in one list.
constexpr const detail::FamilyOps* kFamilies[] = {&detail::kWan, &detail::kFlux, &detail::kAvdit, &detail::kMinimaxH3};

const detail::FamilyOps* find(const std::string& family) {
  for (const detail::FamilyOps* f : kFamilies)
    if (family == f->family) return f;
  return nullptr;
}

const detail::FamilyOps& ops(const std::string& family) {
  if (const detail::FamilyOps* f = find(family)) return *f;
  std::string known;
  for (const detail::FamilyOps* f : kFamilies) known += (known.empty() ? "" : ", ") + std::string(f->family);
  throw std::invalid_argument("no forward pass for model family '" + family + "' (known: " + known + ")");
}

}  // namespace

at::ScalarType weight_dtype(const recognize::FamilyConfig& c, const std::string& canonical, at::ScalarType dtype) {
  const detail::FamilyOps* f = find(c.family);
  const bool narrow = dtype == at::kBFloat16 || dtype == at::kHalf;
  return narrow && f && f->keeps_fp32 && f->keeps_fp32(c, canonical) ? at::kFloat : dtype;
}

TensorMap random_raw_inputs(const recognize::FamilyConfig& c, const Geometry& g, uint64_t seed) {
  return ops(c.family).random_inputs(c, g, seed);
}

FamilyRun prepare(const recognize::FamilyConfig& c, const exec::WeightSource& w, const TensorMap& raw, ir::DType dtype,
                  const std::string& consumer) {
  return ops(c.family).prepare(c, w, raw, dtype, consumer);
}

}  // namespace sp::models
