// "sparse": routed block-sparse INT8 attention (see sparse.hpp).
#include "exec/consumers/sparse.hpp"

#include <algorithm>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "exec/consumers/consumer.hpp"
#include "exec/consumers/int8_common.hpp"
#include "plan/kv_budget.hpp"

namespace sp::exec {

namespace {

int64_t tiles(int64_t rows) { return (rows + kSparseTile - 1) / kSparseTile; }

// Scratch per (head, query tile, key tile) triple the routing may hold at once, an upper
// bound: the scores (fp32), top-k values and indices (fp32 + int64), the kept mask (bool),
// masked_select's positions (int64) and the ascending lists (int32) and their concatenation
// (int32) take 4 + 12 + 1 + 8 + 4 + 4 = 33; the bound stays that of the earlier routing, which
// also sorted and padded.
constexpr int64_t kRouteBytesPerTriple = 4 + 12 + 16 + 4 + 1 + 4;

struct SparseConsumer : ConsumerImpl {
  explicit SparseConsumer(SparseOptions o) : opt(o) {}

  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) const override {
    return attend_rows(q, k, v, scale, 0);
  }
  at::Tensor attend_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                         int64_t q_begin) const override {
    const at::Tensor q3 = int8c::heads_rows(q, "q", "sparse");
    int8c::require("sparse", q3);
    const int8c::Carrier kc = int8c::carrier_for(int8c::heads_rows(k, "k", "sparse"));
    at::Tensor o = attend_with(q3, kc, v, scale, q_begin);
    int8c::after_slab(q_begin, q3.size(1), kc.k.rows);
    return o;
  }
  void carry_k(const at::Tensor& k, const at::Tensor& carrier, int64_t row0, int64_t kv_rows) const override {
    int8c::carry_k("sparse", k, carrier, row0, kv_rows);
  }
  at::Tensor attend_carried(const at::Tensor& q, const at::Tensor& carrier, const at::Tensor& v, double scale,
                            int64_t q_begin, int64_t kv_rows) const override {
    const at::Tensor q3 = int8c::heads_rows(q, "q", "sparse");
    int8c::require("sparse", q3);
    return attend_with(q3, int8c::carried(carrier, kv_rows, q3.size(2)), v, scale, q_begin);
  }

  // The routed attention of q3 [G, rows, D] against a K carrier, its phase's figures counted.
  at::Tensor attend_with(const at::Tensor& q3, const int8c::Carrier& kc, const at::Tensor& v, double scale,
                         int64_t q_begin) const {
    const SparseOptions opt = options();
    const int8attn::QTiles qt = int8attn::quantize_q(q3, scale);
    const RoutedTiles r = route_slab(qt.tile_mean, kc.k.tile_mean, q_begin, qt.rows, kc.k.rows, opt);
    at::Tensor o = int8attn::attend(qt, kc.k, int8c::heads_rows(v, "v", "sparse"), {r.offsets, r.indices}).unsqueeze(0);
    SparsePhase call;
    call.kv_rows = kc.k.rows;
    call.budget = opt.budget;
    call.visited = r.visited;
    call.tiles = r.tiles;
    std::lock_guard<std::mutex> lock(mu);
    if (phases.empty() || phase_ids.back() != kc.phase) {
      phases.push_back(call);
      phase_ids.push_back(kc.phase);
    } else {
      phases.back().visited += call.visited;
      phases.back().tiles += call.tiles;
    }
    return o;
  }

  SparseOptions options() const {
    std::lock_guard<std::mutex> lock(mu);
    return opt;
  }

  mutable SparseOptions opt;  // guarded by mu
  mutable std::mutex mu;
  mutable std::vector<SparsePhase> phases;
  mutable std::vector<uint64_t> phase_ids;
};

int64_t sparse_call_bytes(const contracts::AttnShape& s) {
  const int64_t g = s.kv_heads > 0 ? s.kv_heads : s.heads, rows = s.q_rows * (s.heads / g);
  return int8c::call_bytes(s) + g * tiles(rows) * tiles(s.kv_rows) * kRouteBytesPerTriple;
}

// The share of the dense work of a self-attention over o.rows that routing leaves, over the
// whole sequence: a video query tile visits its kept video key tiles and every other key tile,
// any other query tile every key tile (route_slab). Other attentions are not routed.
double routed_share(const SparseOptions& o, const contracts::AttnShape& s) {
  if (o.budget >= 1.0 || s.kv_rows != o.rows || o.video.end <= o.video.begin) return 1.0;
  const int64_t nk = tiles(s.kv_rows);
  const int64_t nkv = video_tiles(0, s.kv_rows, o.video).sum().item<int64_t>();
  if (nk == 0 || nkv == 0) return 1.0;
  const int64_t dropped = nkv - plan::kept_tiles(o.budget, nkv);
  return 1.0 - double(nkv) / double(nk) * double(dropped) / double(nk);
}

contracts::ConsumerCaps sparse_caps(const SparseOptions& o) {
  using contracts::Cap;
  contracts::ConsumerCaps c;
  c.name = "sparse";
  c.description = "routed block-sparse INT8 attention (64x64 tiles, --kv-budget; 1 is dense); CUDA sm_80+";
  c.accepts_bounded_q = c.requires_global_k = c.requires_global_v = c.slab_output = Cap::Yes;
  c.dtypes = {ir::DType::BF16, ir::DType::F16};
  c.q_align = kSparseTile;
  c.call_bytes = sparse_call_bytes;
  int8c::declare_carrier(c);
  const auto impl = std::make_shared<SparseConsumer>(o);
  // The budget of the call's time (set_sparse_budget changes it after registration).
  const std::weak_ptr<SparseConsumer> weak = impl;
  c.work_fraction = [weak](const contracts::AttnShape& s) {
    const auto live = weak.lock();
    return live ? routed_share(live->options(), s) : 1.0;
  };
  c.impl = impl;
  return c;
}

}  // namespace

RoutedTiles route_slab(const at::Tensor& qm, const at::Tensor& km, int64_t q_begin, int64_t q_rows, int64_t kv_rows,
                       const SparseOptions& o) {
  const int64_t nq = tiles(q_rows), nk = tiles(kv_rows);
  if (qm.dim() != 3 || km.dim() != 3 || qm.size(1) != nq || km.size(1) != nk || km.size(0) != qm.size(0) ||
      km.size(2) != qm.size(2)) {
    std::ostringstream os;
    os << "route_slab: tile means q " << qm.sizes() << " and k " << km.sizes() << " do not fit " << q_rows
       << " query rows and " << kv_rows << " key rows in tiles of " << kSparseTile;
    throw std::invalid_argument(os.str());
  }
  const int64_t g = qm.size(0);
  RoutedTiles r;
  r.tiles = r.visited = g * nq * nk;
  if (o.budget >= 1.0 || kv_rows != o.rows || o.video.end <= o.video.begin) return r;
  const at::Device d = qm.device();
  const at::Tensor vk = video_tiles(0, kv_rows, o.video);
  const at::Tensor qi = video_tiles(q_begin, q_rows, o.video).nonzero().view(-1);
  const at::Tensor ki = vk.nonzero().view(-1), ni = vk.logical_not().nonzero().view(-1);
  const int64_t nqv = qi.numel(), nkv = ki.numel(), nn = ni.numel();
  const int64_t kept = plan::kept_tiles(o.budget, std::max<int64_t>(nkv, 1));
  if (nqv == 0 || nkv == 0 || kept == nkv) return r;
  const at::Tensor qid = qi.to(d), kid = ki.to(d);
  const at::Tensor top = top_tiles(qm.index_select(1, qid), km.index_select(1, kid), o.budget);
  const auto i32 = at::TensorOptions().dtype(at::kInt).device(d);
  // Per video query tile its routed video key tiles, then every key tile outside the video rows.
  const at::Tensor routed = kid.to(at::kInt).index_select(0, top.flatten()).view(top.sizes());
  const at::Tensor video_lists = at::cat({routed, ni.to(i32).view({1, 1, nn}).expand({g, nqv, nn})}, 2);
  // The video query tiles are one run [qa, qb) (the video rows are); the tiles before and after
  // it visit every key tile. The lists of a head: before, video, after; heads one after another.
  const int64_t qa = qi[0].item<int64_t>(), qb = qa + nqv;
  if (qi[nqv - 1].item<int64_t>() != qb - 1)
    throw std::logic_error("route_slab: the video query tiles are not one run of tiles");
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

SparseOptions sparse_options(const ir::Model& m, double budget) {
  const auto video = std::find_if(m.segments.begin(), m.segments.end(), [](const ir::Segment& s) { return s.name == "video"; });
  if (video == m.segments.end()) {
    std::string names;
    for (const auto& s : m.segments) names += (names.empty() ? "" : ", ") + s.name;
    throw std::invalid_argument("consumer 'sparse': the model has no 'video' segment to route (segments: " + names + ")");
  }
  SparseOptions o;
  o.budget = budget;
  o.video.begin = m.segment_begin("video");
  o.video.end = o.video.begin + video->length;
  o.rows = m.tokens();
  return o;
}

void configure_sparse(contracts::Registry& reg, const SparseOptions& o) { reg.add(sparse_caps(o)); }

namespace {
const SparseConsumer& sparse_impl(const contracts::ConsumerCaps& sparse) {
  auto* impl = dynamic_cast<const SparseConsumer*>(sparse.impl.get());
  if (!impl) throw contracts::ContractError("consumer '" + sparse.name + "' is not the sparse attention consumer");
  return *impl;
}
}  // namespace

void set_sparse_budget(const contracts::ConsumerCaps& sparse, double budget) {
  if (!(budget > 0.0 && budget <= 1.0))
    throw std::invalid_argument("kv_budget: a fraction in (0, 1], got " + std::to_string(budget));
  const SparseConsumer& c = sparse_impl(sparse);
  std::lock_guard<std::mutex> lock(c.mu);
  c.opt.budget = budget;
}

void set_sparse_model(const contracts::ConsumerCaps& sparse, const ir::Model& m) {
  const SparseConsumer& c = sparse_impl(sparse);
  std::lock_guard<std::mutex> lock(c.mu);
  c.opt = sparse_options(m, c.opt.budget);
}

std::vector<SparsePhase> sparse_phases(const contracts::Registry& reg) {
  const auto* impl = dynamic_cast<const SparseConsumer*>(reg.consumer("sparse").impl.get());
  if (!impl) return {};
  std::lock_guard<std::mutex> lock(impl->mu);
  return impl->phases;
}

namespace consumers {
void register_sparse(contracts::Registry& reg) { configure_sparse(reg, {}); }
}  // namespace consumers

}  // namespace sp::exec
