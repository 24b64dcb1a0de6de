#include "models/families.hpp"

#include <stdexcept>

#include "models/family_table.hpp"

namespace sp::models {

namespace {

const detail::FamilyOps& ops(const std::string& family) {
  static const detail::FamilyOps* const all[] = {&detail::kWan, &detail::kFlux, &detail::kH3, &detail::kMinimaxH3};
  std::string known;
  for (const detail::FamilyOps* f : all) {
    if (family == f->family) return *f;
    known += (known.empty() ? "" : ", ") + std::string(f->family);
  }
  throw std::invalid_argument("no forward pass for model family '" + family + "' (known: " + known + ")");
}

}  // namespace

TensorMap random_raw_inputs(const recognize::FamilyConfig& c, const Geometry& g, uint64_t seed) {
  return ops(c.family).random_inputs(c, g, seed);
}

FamilyRun prepare(const recognize::FamilyConfig& c, const exec::WeightSource& w, const TensorMap& raw, ir::DType dtype,
                  const std::string& consumer) {
  return ops(c.family).prepare(c, w, raw, dtype, consumer);
}

}  // namespace sp::models
