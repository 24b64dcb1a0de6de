// The int8 and sparse attention consumers: against fp32 attention and the block-sparse
// reference on awkward shapes (GPU), and their errors where they cannot run (CPU).
#include <gtest/gtest.h>

#include <cmath>

#include "exec/consumers/block_sparse.hpp"
#include "exec/consumers/consumer.hpp"
#include "exec/consumers/sparse.hpp"
#include "exec/kernels/int8_attn.hpp"
#include "exec/registry.hpp"
#include "test_util.hpp"

#ifdef STREAMPLAN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

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

#ifdef STREAMPLAN_WITH_CUDA
// Both kernels (the portable one and, on compute capability 9.0, the sm90 one) against fp32
// attention, dense and with random tile lists, on awkward shapes; Auto picks sm90 exactly on
// 9.0 devices for head_dim 128, and a forced sm90 elsewhere is an error naming why.
TEST(GpuInt8Attention, BothKernelsMatchFp32AttentionDenseAndWithTileLists) {
  SKIP_WITHOUT_CUDA();
  namespace ia = exec::int8attn;
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  const bool hopper = prop->major == 9 && prop->minor == 0;
  EXPECT_EQ(ia::auto_kernel(128) == ia::Kernel::Sm90, hopper)
      << "compute capability " << prop->major << "." << prop->minor << ": the sm90 kernel is picked exactly on 9.0";
  EXPECT_EQ(ia::auto_kernel(64), ia::Kernel::Portable);
  struct Case { int64_t q_rows, kv_rows; at::ScalarType dt; };
  for (const Case& c : {Case{130, 130, at::kBFloat16}, Case{200, 200, at::kBFloat16}, Case{77, 200, at::kBFloat16},
                        Case{577, 77, at::kBFloat16}, Case{1, 130, at::kHalf}, Case{200, 333, at::kHalf}})
    for (double budget : {1.0, 0.3}) {
      const std::string what = std::to_string(c.q_rows) + " x " + std::to_string(c.kv_rows) + ", budget " +
                               std::to_string(budget) + (c.dt == at::kHalf ? ", fp16" : ", bf16");
      const uint64_t seed = uint64_t(c.q_rows * 1000 + c.kv_rows) + (budget < 1 ? 7 : 0);
      const Qkv x = random_qkv(3, c.q_rows, c.kv_rows, 128, c.dt, seed);
      const int64_t qt = (c.q_rows + 63) / 64, kt = (c.kv_rows + 63) / 64;
      at::Tensor keep = at::ones({3, qt, kt}, at::kBool);
      ia::TileList list;
      if (budget < 1) {  // a random subset of the key tiles, at least one per query tile
        at::Generator gen = at::detail::createCPUGenerator(seed);
        keep = at::rand({3, qt, kt}, gen) < budget;
        keep.select(2, kt / 2).fill_(true);
        const at::Tensor flat = keep.view({3 * qt, kt});
        list.offsets = at::cat({at::zeros({1}, at::kInt), flat.sum(1).cumsum(0).to(at::kInt)}).to(x.v.device());
        list.indices = flat.nonzero().select(1, 1).to(at::kInt).contiguous().to(x.v.device());
      }
      const double scale = 1.0 / std::sqrt(128.0);
      const at::Tensor want = exec::block_sparse_reference(x.q.cpu().to(at::kFloat), x.k.cpu().to(at::kFloat),
                                                           x.v.cpu().to(at::kFloat), keep, scale);
      const ia::QTiles q = ia::quantize_q(x.q, scale);
      const ia::KCarrier k = ia::quantize_k(x.k);
      const at::Tensor portable = ia::attend(q, k, x.v, list, ia::Kernel::Portable);
      EXPECT_LE(rel_l2(portable, want), 2e-2) << what << ", portable kernel";
      if (!hopper) {
        EXPECT_THROW(ia::attend(q, k, x.v, list, ia::Kernel::Sm90), c10::Error) << what;
        continue;
      }
      const at::Tensor sm90 = ia::attend(q, k, x.v, list, ia::Kernel::Sm90);
      EXPECT_LE(rel_l2(sm90, want), 2e-2) << what << ", sm90 kernel";
      // The same quantized inputs and arithmetic: only the order of sums and roundings differ.
      EXPECT_LE(rel_l2(sm90, portable), 5e-3) << what << ", sm90 against portable";
      EXPECT_TRUE(at::equal(ia::attend(q, k, x.v, list), sm90)) << what << ": Auto runs the sm90 kernel";
    }
  // head_dim 64 keeps the portable kernel; forcing sm90 is an error that names head_dim.
  const Qkv x = random_qkv(3, 130, 130, 64, at::kBFloat16, 5);
  try {
    ia::attend(ia::quantize_q(x.q, 0.125), ia::quantize_k(x.k), x.v, {}, ia::Kernel::Sm90);
    ADD_FAILURE() << "the sm90 kernel ran with head_dim 64";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim is 64"), std::string::npos) << e.what();
  }
}
#endif

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
