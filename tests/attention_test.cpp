// The int8 and sparse attention consumers: against fp32 attention and the block-sparse
// reference on awkward shapes (GPU), and their errors where they cannot run (CPU).
#include <gtest/gtest.h>

#include <cmath>

#include "exec/consumers/block_sparse.hpp"
#include "exec/consumers/consumer.hpp"
#include "exec/consumers/sparse.hpp"
#include "exec/registry.hpp"
#include "test_util.hpp"

namespace {

using namespace sp;

double rel_l2(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor w = want.to(at::kFloat).cpu();
  return (got.to(at::kFloat).cpu() - w).norm().item<double>() / w.norm().item<double>();
}

struct Qkv {
  at::Tensor q, k, v;  // [heads, rows, head_dim] on the device, 16-bit
};

// K carries a per-feature offset, as real keys do (the smoothing removes it).
Qkv random_qkv(int64_t heads, int64_t q_rows, int64_t kv_rows, int64_t dim, at::ScalarType dt, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const auto f = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor offset = 3 * at::randn({1, 1, dim}, gen, f);
  const at::Device d = exec::pick_device("cuda");
  return {at::randn({heads, q_rows, dim}, gen, f).to(dt).to(d), (at::randn({heads, kv_rows, dim}, gen, f) + offset).to(dt).to(d),
          at::randn({heads, kv_rows, dim}, gen, f).to(dt).to(d)};
}

at::Tensor attend(const contracts::Registry& reg, const std::string& consumer, const Qkv& x, int64_t q_begin = 0,
                  const at::Tensor& q = {}) {
  const auto& impl = exec::impl_of<exec::ConsumerImpl>(reg.consumer(consumer));
  const at::Tensor qq = q.defined() ? q : x.q;
  return impl.attend_rows(qq.unsqueeze(0), x.k.unsqueeze(0), x.v.unsqueeze(0), 1.0 / std::sqrt(double(qq.size(2))), q_begin)
      .squeeze(0);
}

at::Tensor dense_reference(const Qkv& x) {
  const at::Tensor all = at::ones({x.q.size(0), (x.q.size(1) + 63) / 64, (x.k.size(1) + 63) / 64}, at::kBool);
  return exec::block_sparse_reference(x.q.cpu().to(at::kFloat), x.k.cpu().to(at::kFloat), x.v.cpu().to(at::kFloat), all,
                                      1.0 / std::sqrt(double(x.q.size(2))));
}

#define SKIP_WITHOUT_CUDA() \
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device: the int8 attention kernels run on CUDA only"

TEST(GpuInt8Attention, DenseMatchesFp32AttentionOnAwkwardShapes) {
  SKIP_WITHOUT_CUDA();
  const auto reg = exec::builtin_registry();
  struct Case { int64_t q_rows, kv_rows, dim; at::ScalarType dt; };
  for (const Case& c : {Case{130, 130, 64, at::kBFloat16}, Case{200, 200, 128, at::kBFloat16}, Case{77, 200, 128, at::kBFloat16},
                        Case{200, 77, 64, at::kHalf}, Case{1, 130, 128, at::kHalf}}) {
    const Qkv x = random_qkv(3, c.q_rows, c.kv_rows, c.dim, c.dt, uint64_t(c.q_rows * 1000 + c.kv_rows + c.dim));
    const at::Tensor o = attend(reg, "int8", x);
    ASSERT_EQ(o.sizes(), x.q.sizes());
    EXPECT_EQ(o.scalar_type(), c.dt);
    const double e = rel_l2(o, dense_reference(x));
    EXPECT_LE(e, 2e-2) << c.q_rows << " x " << c.kv_rows << " head_dim " << c.dim;
    EXPECT_GT(e, 0.0) << "int8 attention cannot be exact";
  }
}

TEST(GpuInt8Attention, TheKCarrierIsRenewedWhenKChangesInPlace) {
  SKIP_WITHOUT_CUDA();
  const auto reg = exec::builtin_registry();
  Qkv x = random_qkv(3, 130, 200, 128, at::kBFloat16, 7);
  EXPECT_LE(rel_l2(attend(reg, "int8", x), dense_reference(x)), 2e-2);
  // The next layer's K written into the same storage (the arena reuses buffers).
  const Qkv y = random_qkv(3, 130, 200, 128, at::kBFloat16, 8);
  x.k.copy_(y.k);
  EXPECT_LE(rel_l2(attend(reg, "int8", x), dense_reference(x)), 2e-2);
}

// Sparse against the routed mask of block_sparse.hpp: text rows first, then video rows.
TEST(GpuSparseAttention, MatchesTheMaskedReferenceWholeAndInSlabs) {
  SKIP_WITHOUT_CUDA();
  auto reg = exec::builtin_registry();
  for (int64_t rows : {130, 200, 600})
    for (int64_t dim : {64, 128})
      for (double budget : {0.3, 1.0}) {
        const std::string what = std::to_string(rows) + " rows, head_dim " + std::to_string(dim) + ", budget " + std::to_string(budget);
        const exec::VideoRows video{77, rows};
        exec::configure_sparse(reg, {.budget = budget, .video = video, .rows = rows});
        const Qkv x = random_qkv(3, rows, rows, dim, at::kBFloat16, uint64_t(rows + dim));
        const at::Tensor qf = x.q.cpu().to(at::kFloat), kf = x.k.cpu().to(at::kFloat), vf = x.v.cpu().to(at::kFloat);
        const at::Tensor keep = exec::route_tiles(qf, kf, video, budget);
        const at::Tensor want = exec::block_sparse_reference(qf, kf, vf, keep, 1.0 / std::sqrt(double(dim)));
        EXPECT_LE(rel_l2(attend(reg, "sparse", x), want), 2e-2) << what;
        // Streamed Q slabs of 128 rows against the same K/V.
        std::vector<at::Tensor> parts;
        for (int64_t b = 0; b < rows; b += 128) parts.push_back(attend(reg, "sparse", x, b, x.q.narrow(1, b, std::min<int64_t>(128, rows - b))));
        EXPECT_LE(rel_l2(at::cat(parts, 1), want), 2e-2) << what << " (slabs)";
        // The whole call ends its phase (its carrier is freed); the slabs share one carrier.
        const auto phases = exec::sparse_phases(reg);
        ASSERT_EQ(phases.size(), 2u) << what;
        const double kept = keep.to(at::kDouble).mean().item<double>();
        for (const auto& ph : phases) EXPECT_NEAR(ph.density(), kept, 1e-9) << what;
        EXPECT_EQ(phases[1].tiles, phases[0].tiles) << what << ": every slab counted in one phase";
        // 600 rows: 10 tiles, the first two text or mixed (dense); each of the 8 video query tiles
        // keeps ceil(0.3 x 8) = 3 video key tiles besides them: (2 x 10 + 8 x 5) / 100.
        if (rows == 600 && budget < 1) EXPECT_DOUBLE_EQ(kept, 0.6) << what << ": the routing keeps fewer tiles";
      }
}

TEST(Int8Attention, WithoutACudaTensorTheChoiceIsAClearError) {
  const auto reg = exec::builtin_registry();
  const auto opt = at::TensorOptions().dtype(at::kBFloat16);
  const at::Tensor q = at::randn({1, 3, 130, 64}, opt), k = at::randn({1, 3, 200, 64}, opt);
  for (const char* name : {"int8", "sparse"}) {
    try {
      exec::impl_of<exec::ConsumerImpl>(reg.consumer(name)).attend(q, k, k, 0.125);
      ADD_FAILURE() << name << " ran on CPU tensors";
    } catch (const contracts::ContractError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string("'") + name + "'"), std::string::npos) << m;
      EXPECT_NE(m.find("CUDA"), std::string::npos) << m;
    }
  }
}

// The CSR lists the sparse consumer hands the kernel, as a mask: the routed mask of
// block_sparse.hpp, for the whole Q and for slabs starting at multiples of 64.
at::Tensor mask_of(const exec::RoutedTiles& r, int64_t heads, int64_t q_tiles, int64_t k_tiles) {
  at::Tensor m = at::zeros({heads * q_tiles, k_tiles}, at::kBool);
  if (!r.offsets.defined()) return m.fill_(true).view({heads, q_tiles, k_tiles});
  const auto off = r.offsets.accessor<int32_t, 1>();
  const auto idx = r.indices.accessor<int32_t, 1>();
  for (int64_t row = 0; row < heads * q_tiles; ++row)
    for (int32_t i = off[row]; i < off[row + 1]; ++i) m[row][idx[i]] = true;
  return m.view({heads, q_tiles, k_tiles});
}

TEST(SparseAttention, TileListsAreTheRoutedMaskWholeAndPerSlab) {
  at::manual_seed(3);
  for (int64_t rows : {130, 600, 1000})
    for (double budget : {0.3, 0.75, 1.0}) {
      const std::string what = std::to_string(rows) + " rows, budget " + std::to_string(budget);
      const at::Tensor q = at::randn({3, rows, 64}), k = at::randn({3, rows, 64});
      const exec::VideoRows video{77, rows};
      const exec::SparseOptions o{.budget = budget, .video = video, .rows = rows};
      const at::Tensor want = exec::route_tiles(q, k, video, budget);
      const at::Tensor km = exec::tile_means(k);
      const int64_t nk = km.size(1);
      const auto whole = exec::route_slab(exec::tile_means(q), km, 0, rows, rows, o);
      EXPECT_TRUE(at::equal(mask_of(whole, 3, nk, nk), want)) << what;
      EXPECT_EQ(whole.visited, want.sum().item<int64_t>()) << what;
      EXPECT_EQ(whole.tiles, want.numel()) << what;
      EXPECT_EQ(whole.offsets.defined(), budget < 1 && rows > 130) << what << ": routed only where tiles are dropped";
      for (int64_t b = 0; b < rows; b += 192) {
        const int64_t n = std::min<int64_t>(192, rows - b);
        const auto slab = exec::route_slab(exec::tile_means(q.narrow(1, b, n)), km, b, n, rows, o);
        const int64_t nq = (n + 63) / 64;
        EXPECT_TRUE(at::equal(mask_of(slab, 3, nq, nk), want.narrow(1, b / 64, nq))) << what << ", slab at " << b;
      }
      // Cross-attention (K/V of another length) is not routed.
      const at::Tensor ctx = at::randn({3, 77, 64});
      EXPECT_FALSE(exec::route_slab(exec::tile_means(q), exec::tile_means(ctx), 0, rows, 77, o).offsets.defined()) << what;
    }
  EXPECT_THROW(exec::route_slab(at::zeros({3, 2, 64}), at::zeros({3, 5, 64}), 0, 130, 130, {}), std::invalid_argument);
}

TEST(Int8Attention, CapsDeclareStreamingSixteenBitAndCountTheCarrier) {
  const auto reg = exec::builtin_registry();
  for (const char* name : {"int8", "sparse"}) {
    const auto& c = reg.consumer(name);
    EXPECT_EQ(c.accepts_bounded_q, contracts::Cap::Yes) << name;
    EXPECT_EQ(c.dtypes, (std::set<ir::DType>{ir::DType::BF16, ir::DType::F16})) << name;
    contracts::AttnShape s{.q_rows = 1024, .kv_rows = 75600, .heads = 40, .kv_heads = 40, .head_dim = 128,
                           .dtype = ir::DType::BF16, .device = contracts::DeviceKind::CUDA};
    // At least the output and the int8 K of all kv rows.
    EXPECT_GE(c.call_bytes(s), 40 * 1024 * 128 * 2 + 40 * 75600 * 128) << name;
  }
}

}  // namespace
