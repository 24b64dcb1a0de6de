// "sparse": routed block-sparse INT8 attention (see sparse.hpp).
#include "exec/consumers/sparse.hpp"

#include <algorithm>
#include <stdexcept>

#include "exec/consumers/consumer.hpp"
#include "exec/consumers/int8_common.hpp"
#include "plan/kv_budget.hpp"

namespace sp::exec {

namespace {

// Scratch per (head, query tile, key tile) triple the routing may hold at once, an upper
// bound: the scores (fp32), top-k values and indices (fp32 + int64), the kept mask (bool), and
// each kept column's rank in its list (int32, int64 for the scatter, a bool complement) take
// 4 + 12 + 1 + 13 = 30; the bound stays that of an earlier routing, which also sorted.
constexpr int64_t kRouteBytesPerTriple = 4 + 12 + 16 + 4 + 1 + 4;

thread_local SparseTally* current_tally = nullptr;

int64_t sparse_call_bytes(const contracts::AttnShape& s) {
  const int64_t g = s.kv_heads > 0 ? s.kv_heads : s.heads, rows = s.q_rows * (s.heads / g);
  return int8c::call_bytes(s) + g * tiles_of(rows) * tiles_of(s.kv_rows) * kRouteBytesPerTriple;
}

// The share of the dense work of an attention call that routing leaves, over the whole
// sequence: a video query tile visits its kept video key tiles and every other key tile, any
// other query tile every key tile (route_slab).
double routed_share(const contracts::AttnShape& s, const contracts::AttnCall& call) {
  if (!call.routed(s.kv_rows)) return 1.0;
  const int64_t nk = tiles_of(s.kv_rows);
  const int64_t nkv = video_tiles(0, s.kv_rows, call.video).sum().item<int64_t>();
  if (nk == 0 || nkv == 0) return 1.0;
  const int64_t dropped = nkv - plan::kept_tiles(call.kv_budget, nkv);
  return 1.0 - double(nkv) / double(nk) * double(dropped) / double(nk);
}

}  // namespace

RoutedTiles route_slab(const at::Tensor& qm, const at::Tensor& km, int64_t q_rows, int64_t kv_rows,
                       const contracts::AttnCall& call) {
  const int64_t nq = tiles_of(q_rows), nk = tiles_of(kv_rows);
  if (qm.dim() != 3 || km.dim() != 3 || qm.size(1) != nq || km.size(1) != nk || km.size(0) != qm.size(0) ||
      km.size(2) != qm.size(2))
    throw std::invalid_argument(c10::str("route_slab: tile means q ", qm.sizes(), " and k ", km.sizes(), " do not fit ",
                                         q_rows, " query rows and ", kv_rows, " key rows in tiles of ", kSparseTile));
  const int64_t g = qm.size(0);
  RoutedTiles r;
  r.tiles = r.visited = g * nq * nk;
  if (!call.routed(kv_rows)) return r;
  // The video tiles of the queries and of the keys are one run each (the video rows are one
  // range), found on the host; the device gets only ranges, so that routing never waits for it.
  const at::Device d = qm.device();
  const at::Tensor qi = video_tiles(call.q_begin, q_rows, call.video).nonzero().view(-1);
  const at::Tensor ki = video_tiles(0, kv_rows, call.video).nonzero().view(-1);
  const int64_t nqv = qi.numel(), nkv = ki.numel(), nn = nk - nkv;
  const int64_t kept = plan::kept_tiles(call.kv_budget, std::max<int64_t>(nkv, 1));
  if (nqv == 0 || nkv == 0 || kept == nkv) return r;
  const int64_t qa = qi[0].item<int64_t>(), qb = qa + nqv, ka = ki[0].item<int64_t>(), kb = ka + nkv;
  if (qi[nqv - 1].item<int64_t>() != qb - 1 || ki[nkv - 1].item<int64_t>() != kb - 1)
    throw std::logic_error("route_slab: the video tiles are not one run of tiles");
  const auto i64 = at::TensorOptions().dtype(at::kLong).device(d), i32 = i64.dtype(at::kInt);
  const at::Tensor top = top_tiles(qm.index_select(1, at::arange(qa, qb, i64)),
                                   km.index_select(1, at::arange(ka, kb, i64)), call.kv_budget);
  // Per video query tile its routed video key tiles, then every key tile outside the video rows.
  const at::Tensor others = at::cat({at::arange(ka, i32), at::arange(kb, nk, i32)});
  const at::Tensor video_lists = at::cat({top + int32_t(ka), others.view({1, 1, nn}).expand({g, nqv, nn})}, 2);
  // The tiles before and after the video query tiles visit every key tile. The lists of a
  // head: before, video, after; heads one after another.
  const at::Tensor all = at::arange(nk, i32);
  r.indices = at::cat({all.repeat({qa}).view({1, qa * nk}).expand({g, qa * nk}), video_lists.view({g, nqv * (kept + nn)}),
                       all.repeat({nq - qb}).view({1, (nq - qb) * nk}).expand({g, (nq - qb) * nk})},
                      1)
                  .flatten();
  at::Tensor counts = at::full({nq}, nk, i32);
  counts.narrow(0, qa, nqv).fill_(kept + nn);
  const int64_t per_head = (nq - nqv) * nk + nqv * (kept + nn);
  const at::Tensor ends = at::arange(g, i32).mul_(per_head).view({g, 1}) + counts.cumsum(0).to(at::kInt).view({1, nq});
  r.offsets = at::cat({at::zeros({1}, i32), ends.flatten()});
  r.visited = g * (nq * nk - nqv * (nkv - kept));
  return r;
}

SparseTally::SparseTally() : outer_(current_tally) { current_tally = this; }
SparseTally::~SparseTally() { current_tally = outer_; }
SparseTally* SparseTally::current() { return current_tally; }

void SparseTally::add(const SparsePhase& call, uint64_t id) {
  if (phases_.empty() || ids_.back() != id) {
    phases_.push_back(call);
    ids_.push_back(id);
  } else {
    phases_.back().visited += call.visited;
    phases_.back().tiles += call.tiles;
  }
}

namespace consumers {

void register_sparse(contracts::Registry& reg) {
  contracts::ConsumerCaps c =
      int8c::caps("sparse", "routed block-sparse INT8 attention (64x64 tiles, --kv-budget; 1 is dense); CUDA sm_80+",
                  /*routed=*/true);
  c.q_align = kSparseTile;
  c.positions = contracts::Cap::Yes;  // its video query tiles are found from the rows' places
  c.call_bytes = sparse_call_bytes;
  c.call_allocations = 4;  // int8's, and the routed tile lists
  c.work_fraction = routed_share;
  reg.add(c);
}

}  // namespace consumers

}  // namespace sp::exec
