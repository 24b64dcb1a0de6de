#include "models/families.hpp"

#include <stdexcept>

#include "models/family_table.hpp"

namespace sp::models {

namespace {

const detail::FamilyOps& ops(const std::string& family) {
  for (const detail::FamilyOps* f : {&detail::kWan, &detail::kFlux, &detail::kH3})
    if (family == f->family) return *f;
  throw std::invalid_argument("no forward pass for model family '" + family + "' (known: wan2.1, flux1, h3)");
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
