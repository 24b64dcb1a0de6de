#include "exec/consumers/block_sparse.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "exec/formats/weights.hpp"
#include "plan/kv_budget.hpp"

namespace sp::exec {

at::Tensor tile_means(const at::Tensor& x, int64_t tile) {
  const int64_t heads = x.size(0), rows = x.size(1), n = tiles_of(rows, tile);
  at::Tensor padded = at::zeros({heads, n * tile, x.size(2)}, x.options().dtype(at::kFloat));
  padded.narrow(1, 0, rows).copy_(x);
  at::Tensor counts = at::full({n}, double(tile), padded.options());
  counts[n - 1] = double(rows - (n - 1) * tile);
  return padded.view({heads, n, tile, x.size(2)}).sum(2).div_(counts.view({1, n, 1}));
}

at::Tensor video_tiles(int64_t first, int64_t rows, VideoRows video, int64_t tile) {
  const int64_t n = tiles_of(rows, tile);
  at::Tensor inside = at::zeros({n}, at::TensorOptions().dtype(at::kBool));
  auto a = inside.accessor<bool, 1>();
  for (int64_t t = 0; t < n; ++t)
    a[t] = first + t * tile >= video.begin && first + std::min(rows, (t + 1) * tile) <= video.end;
  return inside;
}

namespace {

// top_tiles' kept key tiles as a bool mask [heads, query tiles, key tiles].
at::Tensor top_mask(const at::Tensor& qm, const at::Tensor& km, double budget) {
  const int64_t kept = plan::kept_tiles(budget, km.size(1));
  const at::Tensor scores = at::bmm(qm, km.transpose(1, 2));  // [heads, query tiles, key tiles]
  // Which tiles, in no order: sorting the top values and then their indices cost more than
  // the rest of the routing.
  const at::Tensor top = std::get<1>(scores.topk(kept, 2, /*largest=*/true, /*sorted=*/false));
  return at::zeros(scores.sizes(), scores.options().dtype(at::kBool)).scatter_(2, top, true);
}

}  // namespace

at::Tensor top_tiles(const at::Tensor& qm, const at::Tensor& km, double budget) {
  const at::Tensor mask = top_mask(qm, km, budget);
  const int64_t kept = plan::kept_tiles(budget, km.size(1));
  // Each kept column to its rank among its row's kept columns, the others to a column past
  // them: ascending lists whose length is known, so nothing waits for the device to count.
  at::Tensor slot = mask.to(at::kInt).cumsum_(2).sub_(1).masked_fill_(mask.logical_not(), int32_t(kept)).to(at::kLong);
  const at::Tensor cols = at::arange(km.size(1), mask.options().dtype(at::kInt)).view({1, 1, -1});
  at::Tensor lists = at::empty({mask.size(0), mask.size(1), kept + 1}, cols.options());
  lists.scatter_(2, slot, cols.expand(mask.sizes()));
  return lists.narrow(2, 0, kept).contiguous();
}

at::Tensor route_tiles(const at::Tensor& q, const at::Tensor& k, VideoRows video, double budget, int64_t tile) {
  if (q.dim() != 3 || k.dim() != 3 || q.sizes() != k.sizes())
    throw std::invalid_argument("route_tiles: q and k must both be [heads, rows, head_dim], got " + shape_text(q) +
                                " and " + shape_text(k));
  const int64_t rows = q.size(1);
  if (video.begin < 0 || video.begin > video.end || video.end > rows)
    throw std::invalid_argument("route_tiles: video rows [" + std::to_string(video.begin) + ", " +
                                std::to_string(video.end) + ") outside the " + std::to_string(rows) + " rows");
  if (!(budget > 0 && budget <= 1)) throw std::invalid_argument("route_tiles: budget in (0, 1], got " + std::to_string(budget));
  if (tile < 1) throw std::invalid_argument("route_tiles: tile must be >= 1, got " + std::to_string(tile));
  return route_by(tile_means(q, tile), tile_means(k, tile), rows, video, budget, tile);
}

at::Tensor route_by(const at::Tensor& qf, const at::Tensor& kf, int64_t rows, VideoRows video, double budget,
                    int64_t tile) {
  const int64_t heads = qf.size(0), n = tiles_of(rows, tile);
  const at::Tensor vid = video_tiles(0, rows, video, tile).to(qf.device());
  at::Tensor keep = at::ones({heads, n, n}, at::TensorOptions().dtype(at::kBool).device(qf.device()));
  const at::Tensor vidx = vid.nonzero().view(-1);
  const int64_t vt = vidx.numel();
  const int64_t kept = plan::kept_tiles(budget, vt);
  if (vt == 0 || kept == vt) return keep;
  // Scores of video query tiles against video key tiles; the top `kept` per row stay.
  const at::Tensor routed = top_mask(qf.index_select(1, vidx), kf.index_select(1, vidx), budget);
  // Into the video x video block of the mask; every other pair stays dense.
  at::Tensor block = keep.index_select(1, vidx);
  block.index_copy_(2, vidx, routed);
  keep.index_copy_(1, vidx, block);
  return keep;
}

at::Tensor block_sparse_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& keep,
                                  double scale, int64_t tile) {
  const int64_t rows = q.size(1), kv = k.size(1);
  const int64_t qt = tiles_of(rows, tile), kt = tiles_of(kv, tile);
  if (keep.dim() != 3 || keep.size(0) != q.size(0) || keep.size(1) != qt || keep.size(2) != kt)
    throw std::invalid_argument("block_sparse_reference: mask " + shape_text(keep) + " does not fit q " +
                                shape_text(q) + " and k " + shape_text(k) + " in tiles of " + std::to_string(tile));
  // The tile mask per element: [heads, rows, kv].
  const at::Tensor mask = keep.repeat_interleave(tile, 1)
                              .narrow(1, 0, rows)
                              .repeat_interleave(tile, 2)
                              .narrow(2, 0, kv);
  at::Tensor s = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(1, 2)).mul_(scale);
  s.masked_fill_(mask.logical_not(), -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(s, 2), v.to(at::kFloat)).to(q.scalar_type());
}

}  // namespace sp::exec
