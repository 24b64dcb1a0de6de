// Routed block-sparse attention: the KV budget over a denoising run (plan/kv_budget.hpp), the
// tile routing and the math reference (exec/consumers/block_sparse.hpp).
#include <gtest/gtest.h>

#include <cmath>

#include "exec/consumers/block_sparse.hpp"
#include "plan/kv_budget.hpp"
#include "plan/plan.hpp"
#include "test_util.hpp"

namespace {

using namespace sp;

TEST(KvBudget, WindowsAndTheDensestBudgetWins) {
  const plan::KvSchedule s{.budget = 0.3, .early_steps = 2, .early_kv = 0.5, .late_steps = 3, .late_kv = 0.7};
  const double want[] = {0.5, 0.5, 0.3, 0.3, 0.3, 0.3, 0.3, 0.7, 0.7, 0.7};
  for (int step = 0; step < 10; ++step) EXPECT_DOUBLE_EQ(plan::kv_budget_at(s, step, 10), want[step]) << step;
  // Overlapping windows: the denser one; a window sparser than the base keeps the base.
  const plan::KvSchedule o{.budget = 0.3, .early_steps = 2, .early_kv = 0.6, .late_steps = 2, .late_kv = 0.8};
  EXPECT_DOUBLE_EQ(plan::kv_budget_at(o, 0, 3), 0.6);
  EXPECT_DOUBLE_EQ(plan::kv_budget_at(o, 1, 3), 0.8);
  const plan::KvSchedule sparse_window{.budget = 0.4, .early_steps = 1, .early_kv = 0.2};
  EXPECT_DOUBLE_EQ(plan::kv_budget_at(sparse_window, 0, 5), 0.4);
}

TEST(KvBudget, BadValuesNameTheOption) {
  auto message = [](const plan::KvSchedule& s, int step, int steps) {
    try {
      plan::kv_budget_at(s, step, steps);
    } catch (const plan::PlanError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({.budget = 0}, 0, 1).find("--kv-budget"), std::string::npos);
  EXPECT_NE(message({.budget = 1.5}, 0, 1).find("--kv-budget"), std::string::npos);
  EXPECT_NE(message({.early_steps = -1}, 0, 1).find("--early-steps"), std::string::npos);
  EXPECT_NE(message({.late_kv = -0.1}, 0, 1).find("--late-kv"), std::string::npos);
  EXPECT_NE(message({}, 5, 5).find("--step 5 of --steps 5"), std::string::npos);
}

TEST(KvBudget, KeptTiles) {
  EXPECT_EQ(plan::kept_tiles(0.3, 10), 3);
  EXPECT_EQ(plan::kept_tiles(0.31, 10), 4);
  EXPECT_EQ(plan::kept_tiles(1.0, 7), 7);
  EXPECT_EQ(plan::kept_tiles(0.01, 5), 1);
  EXPECT_EQ(plan::kept_tiles(0.5, 0), 0);
}

// 203 rows: 17 text rows, then video rows 17..203; tiles of 16 (13 tiles, the last partial).
struct Case {
  int64_t heads = 3, rows = 203, dim = 8, tile = 16;
  exec::VideoRows video{17, 203};
  at::Tensor q, k, v;
  Case() {
    at::manual_seed(7);
    q = at::randn({heads, rows, dim});
    k = at::randn({heads, rows, dim});
    v = at::randn({heads, rows, dim});
  }
};

TEST(BlockSparse, RoutingKeepsTopTilesOfVideoAndEverythingElseDense) {
  const Case c;
  const double budget = 0.3;
  const at::Tensor keep = exec::route_tiles(c.q, c.k, c.video, budget, c.tile);
  ASSERT_EQ(keep.sizes(), (at::IntArrayRef{3, 13, 13}));
  // Tile 0 (rows 0..15) is text, tile 1 (16..31) mixes text and video; tiles 2..12 are video
  // (the last one partial: rows 192..202).
  const int64_t video_tiles = 11, kept = plan::kept_tiles(budget, video_tiles);
  auto a = keep.accessor<bool, 3>();
  for (int64_t h = 0; h < 3; ++h)
    for (int64_t i = 0; i < 13; ++i) {
      int64_t routed = 0;
      for (int64_t j = 0; j < 13; ++j) {
        if (i < 2 || j < 2) EXPECT_TRUE(a[h][i][j]) << h << " " << i << " " << j;  // text and mixed: dense
        else routed += a[h][i][j];
      }
      if (i >= 2) EXPECT_EQ(routed, kept) << "head " << h << " tile " << i;
    }
  // A budget of 1 keeps every tile.
  EXPECT_TRUE(exec::route_tiles(c.q, c.k, c.video, 1.0, c.tile).all().item<bool>());
}

TEST(BlockSparse, RoutingPrefersTheKeyTileAlignedWithTheQueryTile) {
  Case c;
  // Query tile 5 and key tile 9 share a large direction; key tile 9 must be kept for it,
  // and with one kept tile, only it.
  c.q.narrow(1, 5 * 16, 16).select(2, 0).add_(50.0);
  c.k.narrow(1, 9 * 16, 16).select(2, 0).add_(50.0);
  const at::Tensor keep = exec::route_tiles(c.q, c.k, c.video, 0.05, c.tile);
  for (int64_t h = 0; h < 3; ++h) {
    EXPECT_TRUE(keep[h][5][9].item<bool>());
    EXPECT_EQ(keep[h][5].narrow(0, 2, 11).sum().item<int64_t>(), 1);
  }
}

TEST(BlockSparse, ReferenceMatchesDenseAttentionAtFullBudgetAndAMaskedOracleBelow) {
  const Case c;
  const double scale = 1.0 / std::sqrt(8.0);
  const at::Tensor dense = at::matmul(at::softmax(at::matmul(c.q, c.k.transpose(1, 2)).mul(scale), 2), c.v);
  const at::Tensor full = exec::route_tiles(c.q, c.k, c.video, 1.0, c.tile);
  EXPECT_LT(test::rel_l2(exec::block_sparse_reference(c.q, c.k, c.v, full, scale, c.tile), dense), 1e-6);
  // Below: each query row against exactly the keys of its kept tiles, one row at a time.
  const at::Tensor keep = exec::route_tiles(c.q, c.k, c.video, 0.3, c.tile);
  const at::Tensor got = exec::block_sparse_reference(c.q, c.k, c.v, keep, scale, c.tile);
  for (int64_t h = 0; h < c.heads; ++h)
    for (int64_t r = 0; r < c.rows; r += 7) {
      std::vector<int64_t> keys;
      for (int64_t j = 0; j < c.rows; ++j)
        if (keep[h][r / c.tile][j / c.tile].item<bool>()) keys.push_back(j);
      const at::Tensor idx = at::tensor(keys);
      const at::Tensor s = at::mv(c.k[h].index_select(0, idx), c.q[h][r]).mul(scale);
      const at::Tensor want = at::mv(c.v[h].index_select(0, idx).t(), at::softmax(s, 0));
      EXPECT_LT(test::rel_l2(got[h][r], want), 1e-5) << "head " << h << " row " << r;
    }
  EXPECT_GT(test::rel_l2(got, dense), 1e-3);  // the mask changed the result
}

TEST(BlockSparse, BadInputNamesTheShapes) {
  const Case c;
  EXPECT_THROW(exec::route_tiles(c.q, c.k.narrow(1, 0, 100), c.video, 0.3), std::invalid_argument);
  EXPECT_THROW(exec::route_tiles(c.q, c.k, {50, 300}, 0.3), std::invalid_argument);
  EXPECT_THROW(exec::route_tiles(c.q, c.k, c.video, 0.0), std::invalid_argument);
  EXPECT_THROW(exec::block_sparse_reference(c.q, c.k, c.v, at::ones({3, 2, 2}, at::kBool), 1.0), std::invalid_argument);
}

}  // namespace
