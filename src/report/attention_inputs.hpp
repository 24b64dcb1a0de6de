// Synthetic attention inputs for `streamplan bench-attention --distribution` (docs/attention.md).
//
// Design note. Real DiT activations are not Gaussian: K has outlier channels and an offset,
// some query rows put most of their weight on one key, qk-normalized models scale unit-RMS
// rows by a learned gain, and video tokens attend to their neighbours on the (t, h, w) grid.
// Each distribution makes one of these on purpose, from a fixed seed, on any device:
//   gaussian     Q, V ~ N(0, 1); K ~ N(0, 1) plus a per-channel offset ~ N(0, 1)
//   outlier-k    gaussian, with a per-channel K offset ~ 3 N(0, 1) and 4 K channels 20x larger
//   peaky        K, V ~ N(0, 1); each query row is 1.5 x a random key row plus N(0, 0.25) noise,
//                so that its largest softmax weight is close to 1
//   qk-norm      Q and K rows RMS-normalized over head_dim, times a per-channel gain ~ U(4, 8)
//   video-local  the video rows of Q and K are one smooth random field over the (t, h, w) grid
//                (trilinear from a grid 4x coarser, unit variance per channel) plus N(0, 0.25)
//                noise: neighbours are alike and attend to each other; other rows are Gaussian
// Rows are [text rows][video rows, t-major then h then w][any rest].
//
// Example:
//     sp::report::AttnInputs x = sp::report::attention_inputs("video-local", shape, opts);  // [1, H, N, D] each
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sp::report {

struct AttnShape {
  int64_t tokens = 0, heads = 0, head_dim = 0, text_rows = 0;
  std::array<int64_t, 3> grid{};  // the video rows' (t, h, w) after the text rows; t*h*w <= tokens - text_rows
};

struct AttnInputs {
  at::Tensor q, k, v;  // [1, heads, tokens, head_dim] in the options' dtype and device
};

const std::vector<std::string>& attention_distributions();
// Throws std::invalid_argument naming the distribution or the shape that does not fit.
AttnInputs attention_inputs(const std::string& distribution, const AttnShape& s, const at::TensorOptions& o,
                            uint64_t seed = 0);

// The video rows: [text rows, text rows + t*h*w).
std::pair<int64_t, int64_t> grid_rows(const AttnShape& s);
// Per `tile`-row tile of the tokens, the mean (t, h, w) of its rows on the video grid (0 where
// it has none): [ceil(tokens / tile), 3] fp32 on the CPU.
at::Tensor grid_tile_centres(const AttnShape& s, int64_t tile);
// A fixed local window on the video grid at the routed consumer's density: each query tile wholly
// inside the grid rows keeps the plan::kept_tiles(budget, such tiles) such key tiles whose
// centres lie nearest its own; every other pair stays dense, as routed. [heads, tiles, tiles] bool.
at::Tensor window_tiles(const AttnShape& s, double budget, const at::Device& device);

}  // namespace sp::report
