// Model families: from a recognized checkpoint to an IR model plus its runtime inputs.
//
// Design note. Each family (Wan 2.1, Flux.1, avdit, MiniMax H3) has a prologue and an epilogue
// around the transformer: embeddings of timestep, guidance, pooled and context text,
// modulation tables, RoPE tables, patchification — and unpatchification at the end. They
// run once per forward on small tensors and are shared by the naive and planned runs;
// everything the planner schedules (patch embedding into the residual, every block, the
// final layer) is IR. Families are found by name in a table here; nothing outside
// src/models knows them.
//
// Raw inputs (a name -> tensor map, the format of `streamplan run --inputs`):
//   wan:  latents [C, F, H, W], timestep [1], text [L, text_dim]
//   flux: latents [N, in_channels] (packed), img_ids [N, 3], text [L, context], txt_ids [L, 3],
//         pooled [vec_dim], timestep [1] (sigma in [0, 1]), guidance [1] (dev)
//   avdit: video [N, patch features], grid [3] (frames, rows, cols of video tokens),
//         text [L, text_dim], audio [A, audio_dim], timestep [1]
//   minimax-h3: video [C, T, H, W] latents, audio [C_a, 2, T_a] latents, text [L, text_dim]
//         (or [L, dim] already refined), sigma [1], text_tags [L] (optional)
// The output has the layout of the family's reference implementation (Wan: [C, F, H, W];
// Flux: [N, out_channels]; avdit: [N, patch features]; MiniMax H3: the video [C, T, H, W], and
// FamilyRun::named_outputs gives video and audio [C_a, 2, T_a]).
//
// Example:
//     auto raw = sp::models::random_raw_inputs(rec.config, {.frames = 81, .height = 720, .width = 1280}, 0);
//     sp::models::FamilyRun run = sp::models::prepare(rec.config, *weights, raw, ir::DType::BF16, "sdpa");
//     at::Tensor out = run.finish(sp::exec::run_naive(run.model, *weights, run.inputs, reg));
#pragma once

#include <ATen/ATen.h>

#include <functional>

#include "exec/run/executor.hpp"
#include "models/tensor_io.hpp"
#include "recognize/recognize.hpp"

namespace sp::models {

// Pixel-space geometry (Wan: frames 4k+1, sides multiples of 16; Flux: sides multiples of 16;
// avdit and MiniMax H3: latent frames, sides multiples of 32), or a token count along one axis.
struct Geometry {
  int64_t frames = 0, height = 0, width = 0;
  int64_t tokens = 0;        // > 0: this many video/image tokens in one row (overrides the above)
  int64_t text_tokens = 0;   // 0: the family's default
  int64_t audio_tokens = 0;  // avdit, MiniMax H3; 0: the family's default
};

struct FamilyRun {
  ir::Model model;
  exec::Inputs inputs;
  // Output rows -> reference layout; the rows as they are where that is the layout (Flux, avdit).
  std::function<at::Tensor(const at::Tensor&)> finish = [](const at::Tensor& out) { return out; };
  // Families with several outputs (MiniMax H3: video and audio): each, by name; may be empty.
  std::function<TensorMap(const at::Tensor&)> named_outputs;
};

TensorMap random_raw_inputs(const recognize::FamilyConfig& c, const Geometry& g, uint64_t seed);
// The dtype a canonical tensor is held in for a model in `dtype`: `dtype`, or fp32 for what the
// family's reference implementation keeps in fp32 whatever the model dtype (MiniMax H3: the
// patch projections, the time embedding, the output heads, the curve form's adaln linears).
at::ScalarType weight_dtype(const recognize::FamilyConfig& c, const std::string& canonical, at::ScalarType dtype);
// Builds the IR and runs the prologue. `w` holds canonical weights in `dtype` on the device.
FamilyRun prepare(const recognize::FamilyConfig& c, const exec::WeightSource& w, const TensorMap& raw,
                  ir::DType dtype, const std::string& consumer);

}  // namespace sp::models
