// Routed block-sparse attention: which tiles a query tile attends to, and the math reference.
//
// Design note. Tiles are `tile` query rows by `tile` key rows; only tiles wholly inside the
// video rows are routed (per head, each video query tile keeps the plan::kept_tiles(budget,
// video key tiles) video key tiles whose mean best matches its own mean by dot product); every
// other pair stays dense, and a budget of 1 keeps every tile. The reference applies that mask
// per element in fp32: the oracle of the CUDA consumer, also on lengths not a multiple of the tile.
//
// Example:
//     at::Tensor keep = sp::exec::route_tiles(q, k, {512, 75584}, 0.3);   // [heads, qt, kt] bool
//     at::Tensor o = sp::exec::block_sparse_reference(q, k, v, keep, 1 / std::sqrt(128.0));
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "ir/model.hpp"

namespace sp::exec {

inline constexpr int64_t kSparseTile = 64;

// Tiles of `tile` rows that cover `rows` rows.
inline int64_t tiles_of(int64_t rows, int64_t tile = kSparseTile) { return (rows + tile - 1) / tile; }

// Rows [begin, end) of the video segment, in the attention's row order.
using VideoRows = ir::RowRange;

// Per tile of the `rows` rows that start at row `first` (tiles counted from `first`): whether
// it lies wholly inside the video rows, [ceil(rows / tile)] bool on the CPU.
at::Tensor video_tiles(int64_t first, int64_t rows, VideoRows video, int64_t tile = kSparseTile);

// [heads, ceil(rows / tile), head_dim] fp32: the mean of each tile's rows of x [heads, rows,
// head_dim] (a partial last tile: of its rows). The int8 quantization writes the same means.
at::Tensor tile_means(const at::Tensor& x, int64_t tile = kSparseTile);

// The routing itself: qm [heads, query tiles, head_dim] and km [heads, key tiles, head_dim]
// tile means of video tiles only; per query tile the plan::kept_tiles(budget, key tiles) key
// tiles of highest mean dot product, as their indices (into km's tiles), [heads, query tiles,
// kept] int32, ascending.
at::Tensor top_tiles(const at::Tensor& qm, const at::Tensor& km, double budget);

// q, k [heads, rows, head_dim] (self-attention over the same rows): the tiles each query
// tile keeps, [heads, ceil(rows / tile), ceil(rows / tile)] bool. Throws std::invalid_argument
// naming the shapes, the video rows or the budget where they do not fit.
at::Tensor route_tiles(const at::Tensor& q, const at::Tensor& k, VideoRows video, double budget,
                       int64_t tile = kSparseTile);

// route_tiles' mask from any per-tile features whose dot products rank the key tiles (route_tiles
// passes the tile means): qf, kf [heads, ceil(rows / tile), f] over the tiles of all rows.
at::Tensor route_by(const at::Tensor& qf, const at::Tensor& kf, int64_t rows, VideoRows video, double budget,
                    int64_t tile = kSparseTile);

// softmax(q k^T * scale) v in fp32 over the kept tiles only (keep from route_tiles), returned
// in q's dtype, [heads, rows, head_dim].
at::Tensor block_sparse_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& keep,
                                  double scale, int64_t tile = kSparseTile);

}  // namespace sp::exec
