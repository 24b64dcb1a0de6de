// A checkpoint's model at a geometry, without its weight data: what `plan --checkpoint`
// prints and what `run` checks against the device before it reads a weight.
//
// Design note. The weights are meta tensors of the shapes and dtypes the file's header gives,
// assembled and converted as loading would (quantized ones with their format noted, so the
// IR carries the formats the run will have); the family's prologue builds the IR on them and
// allocates nothing of the model's size. Only the raw inputs are real (made on the CPU, or
// read with --inputs): latents are small next to the model, and `run` goes on with the same
// ones. Where even they cannot be allocated (a --tokens count far beyond any memory), the IR
// is built at three small token counts instead and its lengths extrapolated, which holds
// where every segment and context grows linearly with --tokens (checked at the third).
//
// Example:
//     const auto file = sp::io::SafetensorsFile::open(path);
//     const auto rec = sp::recognize::recognize(file, sp::models::sidecar_of(file));
//     sp::cli::MetaModel mm = sp::cli::meta_model(file, rec, {}, geom, 0, ir::DType::BF16, "sdpa", reg);
//     auto p = sp::plan::make_plan(mm.model, reg, dev, {});
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "exec/formats/weights.hpp"
#include "models/families.hpp"
#include "recognize/recognize.hpp"

namespace sp::cli {

// --frames, --height, --width, --tokens, --text-tokens, --audio-tokens (run, plan --checkpoint:
// without --tokens, which plan has for the demo model too).
void add_geometry_options(CLI::App* cmd, models::Geometry& g, bool tokens = true);
// "auto": bf16 on CUDA, fp32 on the CPU; else the named activation dtype.
ir::DType run_dtype(const std::string& option, const at::Device& d);

struct MetaModel {
  ir::Model model;
  std::shared_ptr<exec::TensorWeights> weights;  // meta tensors: shapes, dtypes, formats
  int64_t weight_bytes = 0;  // the weights once loaded in the run's dtype
  int64_t input_bytes = 0;   // the prepared inputs (tokens, tables) on the device
  models::TensorMap raw;     // the raw inputs it was built from (CPU); empty where extrapolated
  std::string note;          // how it was built, where not from `raw`
};

// The model at the inputs of `inputs` (a safetensors file) or else of geometry g (random,
// seeded). Throws std::invalid_argument for a bad geometry and, where the inputs cannot be
// allocated and no extrapolation holds, plan::BudgetError naming them.
MetaModel meta_model(const io::SafetensorsFile& f, const recognize::Recognized& rec, const std::string& inputs,
                     const models::Geometry& g, uint64_t seed, ir::DType dtype, const std::string& consumer,
                     const contracts::Registry& reg);

}  // namespace sp::cli
