// The family table (internal to src/models): one entry per family.
#pragma once

#include "models/families.hpp"

namespace sp::models::detail {

struct FamilyOps {
  const char* family;
  TensorMap (*random_inputs)(const recognize::FamilyConfig&, const Geometry&, uint64_t);
  FamilyRun (*prepare)(const recognize::FamilyConfig&, const exec::WeightSource&, const TensorMap&, ir::DType,
                       const std::string&);
  // Tensors held in fp32 whatever the model dtype (families.hpp weight_dtype); may be null.
  bool (*keeps_fp32)(const recognize::FamilyConfig&, const std::string& canonical) = nullptr;
};

extern const FamilyOps kWan, kFlux, kAvdit, kMinimaxH3;

}  // namespace sp::models::detail
