// The int8 and sparse attention consumers: against fp32 attention and the block-sparse
// reference on awkward shapes (GPU), and their errors where they cannot run (CPU).
#include <gtest/gtest.h>

#include <cmath>

#include "exec/consumers/block_sparse.hpp"
#include "exec/consumers/consumer.hpp"
#include "exec/consumers/sparse.hpp"
#include "exec/device/device.hpp"
#include "exec/kernels/int8_attn.hpp"
#include "exec/registry.hpp"
#include "models/builder.hpp"
#include "plan/program.hpp"
#include "report/attention_inputs.hpp"
#include "report/report.hpp"
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

// One call with the arguments `call` (a dense one by default) and its Q slab from row call.q_begin.
at::Tensor attend(const contracts::Registry& reg, const std::string& consumer, const Qkv& x,
                  const contracts::AttnCall& call = {}, const at::Tensor& q = {}) {
  const auto& impl = exec::impl_of<exec::ConsumerImpl>(reg.consumer(consumer));
  const at::Tensor qq = q.defined() ? q : x.q;
  return impl.attend_rows(qq.unsqueeze(0), x.k.unsqueeze(0), x.v.unsqueeze(0), 1.0 / std::sqrt(double(qq.size(2))), call)
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

// The sdpa consumer on CUDA (cuDNN's fused attention where it passed its self-test and ran
// faster, else ATen's own choice): token-major Q slabs of awkward lengths against the whole
// K/V, as the planner hands them over, against fp32 attention.
TEST(GpuSdpa, TokenMajorSlabsMatchFp32AttentionWhicheverKernelRuns) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device: the sdpa consumer's kernel choice is made on CUDA only";
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    const Qkv x = random_qkv(8, 3001, 5003, 128, dt, 11);
    // [heads, rows, d] as views of token-major [rows, heads * d] projections.
    auto token_major = [](const at::Tensor& t) { return t.transpose(0, 1).contiguous().transpose(0, 1); };
    const Qkv tm{token_major(x.q), token_major(x.k), token_major(x.v)};
    const at::Tensor want = dense_reference(x);
    const auto reg = exec::builtin_registry();
    const std::string kernel = exec::sdpa_kernel(x.q.device(), dt, 128);
    ASSERT_FALSE(kernel.empty());
    for (int64_t begin : {int64_t{0}, int64_t{1237}}) {
      const int64_t rows = std::min<int64_t>(1531, 3001 - begin);
      const at::Tensor got = attend(reg, "sdpa", tm, {}, tm.q.narrow(1, begin, rows));
      const double e = rel_l2(got, want.narrow(1, begin, rows));
      std::cerr << "sdpa " << dt << " rows [" << begin << ", " << begin + rows << "): rel L2 " << e << " (" << kernel
                << ")\n";
      EXPECT_LE(e, 1e-2);
    }
  }
}

// Every built-in consumer that declares the log-sum-exp (ConsumerCaps::lse) returns, beside its
// output, the log-sum-exp of each row's scaled scores: against fp64 attention on odd sizes.
void expect_the_lse_of_every_row(const at::Device& d, const std::vector<at::ScalarType>& dts) {
  const auto reg = exec::builtin_registry();
  size_t checked = 0;
  for (const std::string& name : reg.consumer_names()) {
    const auto& caps = reg.consumer(name);
    if (caps.lse != contracts::Cap::Yes) continue;
    for (at::ScalarType dt : dts) {
      SCOPED_TRACE(name + " " + std::string(c10::toString(dt)));
      at::Generator gen = at::detail::createCPUGenerator(7);
      const auto f = at::TensorOptions().dtype(at::kDouble);
      const at::Tensor q = at::randn({1, 3, 37, 16}, gen, f), k = at::randn({1, 3, 53, 16}, gen, f),
                       v = at::randn({1, 3, 53, 16}, gen, f);
      const at::Tensor s = at::matmul(q, k.transpose(-1, -2)) * 0.3;
      auto [o, l] = exec::impl_of<exec::ConsumerImpl>(caps).attend_lse(q.to(dt).to(d), k.to(dt).to(d), v.to(dt).to(d), 0.3);
      EXPECT_EQ(o.scalar_type(), dt);
      EXPECT_EQ(l.sizes(), at::IntArrayRef({1, 3, 37}));
      const bool f32 = dt == at::kFloat;
      EXPECT_LE(rel_l2(o, at::matmul(at::softmax(s, -1), v)), f32 ? 1e-5 : 2e-2);
      EXPECT_LE((l.cpu().to(at::kDouble) - at::logsumexp(s, -1)).abs().max().item<double>(), f32 ? 1e-4 : 5e-2);
      ++checked;
    }
  }
  EXPECT_GE(checked, 2 * dts.size());  // sdpa and math at least
}

TEST(Consumers, AttendLseGivesTheLogSumExpOfEveryRow) { expect_the_lse_of_every_row(at::kCPU, {at::kFloat, at::kBFloat16}); }

TEST(GpuSdpa, AttendLseGivesTheLogSumExpOfEveryRow) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device: the CUDA kernels' log-sum-exp";
  expect_the_lse_of_every_row(exec::pick_device("cuda"), {at::kBFloat16, at::kHalf, at::kFloat});
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
      const ia::KCarrier k = ia::quantize_k(x.k);
      const ia::QTiles q = ia::quantize_q(x.q, scale, k);
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
      if (c.dt == at::kBFloat16)  // the bounded softmax held every row of these inputs
        EXPECT_EQ(q.check.count_nonzero().item<int64_t>(), 0) << what << ": rows redone";
    }
  // head_dim 64 keeps the portable kernel; forcing sm90 is an error that names head_dim.
  const Qkv x = random_qkv(3, 130, 130, 64, at::kBFloat16, 5);
  try {
    const ia::KCarrier k = ia::quantize_k(x.k);
    ia::attend(ia::quantize_q(x.q, 0.125, k), k, x.v, {}, ia::Kernel::Sm90);
    ADD_FAILURE() << "the sm90 kernel ran with head_dim 64";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim is 64"), std::string::npos) << e.what();
  }
}
#endif

// Rows whose Cauchy-Schwarz bound lies far above their scores (odd query tiles: a large
// component along one axis; keys: a large one of either sign along another; K's channel factors
// off, so that the keys keep it) are redone with the online softmax; every other row keeps the
// bounded result. Tile 1's bound (about 480 log2 units) is above kLooseBound: it arrives flagged
// and the bounded pass skips it. Tile 3's (about 220) is below: the bounded pass computes it and
// flags it. Both must agree with the portable kernel (the online softmax on the same quantized
// inputs) up to the order of sums.
TEST(GpuInt8Attention, TheBoundedSoftmaxRedoesTheRowsItsBoundDoesNotFit) {
  SKIP_WITHOUT_CUDA();
  namespace ia = exec::int8attn;
  if (ia::auto_kernel(128) != ia::Kernel::Sm90) GTEST_SKIP() << "the bounded softmax is the sm90 kernels'";
  const int64_t rows = 300, kv_rows = 517, qt = 5;
  Qkv x = random_qkv(3, rows, kv_rows, 128, at::kBFloat16, 11);
  for (int64_t t = 1; t < qt; t += 2)
    x.q.narrow(1, t * 64, std::min<int64_t>(64, rows - t * 64)).select(2, 0).add_(t == 1 ? 60 : 25);
  const at::Tensor sign = (at::arange(kv_rows, x.k.options().dtype(at::kFloat)).remainder(2) * 2 - 1) * 60;
  x.k.select(2, 1).add_(sign.to(at::kBFloat16).unsqueeze(0));
  for (const bool sparse : {false, true}) {
    ia::TileList list;
    if (sparse) {  // every other key tile, from the first
      const int64_t kt = (kv_rows + 63) / 64, per = (kt + 1) / 2;
      list.offsets = (at::arange(3 * qt + 1, at::kInt) * per).to(at::kInt).to(x.v.device());
      list.indices = (at::arange(per, at::kInt) * 2).repeat({3 * qt}).to(at::kInt).to(x.v.device());
    }
    const std::string what = sparse ? "every other key tile" : "dense";
    const ia::KCarrier k = ia::quantize_k(x.k, /*factors=*/false);
    const ia::QTiles q = ia::quantize_q(x.q, 1.0 / std::sqrt(128.0), k);
    const at::Tensor bound = (q.norm * k.norm.unsqueeze(1)).cpu();
    EXPECT_GT(bound.select(1, 1).min().item<double>(), ia::kLooseBound) << "tile 1 arrives flagged";
    EXPECT_LT(bound.select(1, 3).max().item<double>(), ia::kLooseBound) << "tile 3 is flagged by the bounded pass";
    const at::Tensor portable = ia::attend(q, k, x.v, list, ia::Kernel::Portable);
    const at::Tensor sm90 = ia::attend(q, k, x.v, list, ia::Kernel::Sm90);
    const at::Tensor flagged = q.check.view({3, qt, 4}).ne(0).any(2).cpu();
    for (int64_t t = 0; t < qt; ++t)
      EXPECT_EQ(flagged.select(1, t).all().item<bool>(), t % 2 == 1)
          << what << ": query tile " << t << (t % 2 ? " not redone" : " redone");
    EXPECT_LE(rel_l2(sm90, portable), 5e-3) << what;
    for (int64_t t = 1; t < qt; t += 2) {
      const auto far = [&](const at::Tensor& o) { return o.narrow(1, t * 64, std::min<int64_t>(64, rows - t * 64)); };
      EXPECT_LE(rel_l2(far(sm90), far(portable)), 5e-3) << what << ": the redone tile " << t;
    }
  }
}

// Sparse against the routed mask of block_sparse.hpp: text rows first, then video rows.
TEST(GpuSparseAttention, MatchesTheMaskedReferenceWholeAndInSlabs) {
  SKIP_WITHOUT_CUDA();
  auto reg = exec::builtin_registry();
  exec::SparseTally tally;
  for (int64_t rows : {130, 200, 600})
    for (int64_t dim : {64, 128})
      for (double budget : {0.3, 1.0}) {
        const std::string what = std::to_string(rows) + " rows, head_dim " + std::to_string(dim) + ", budget " + std::to_string(budget);
        const exec::VideoRows video{77, rows};
        contracts::AttnCall call{.kv_budget = budget, .video = video};
        const Qkv x = random_qkv(3, rows, rows, dim, at::kBFloat16, uint64_t(rows + dim));
        const at::Tensor qf = x.q.cpu().to(at::kFloat), kf = x.k.cpu().to(at::kFloat), vf = x.v.cpu().to(at::kFloat);
        const at::Tensor keep = exec::route_tiles(qf, kf, video, budget);
        const at::Tensor want = exec::block_sparse_reference(qf, kf, vf, keep, 1.0 / std::sqrt(double(dim)));
        EXPECT_LE(rel_l2(attend(reg, "sparse", x, call), want), 2e-2) << what;
        // Streamed Q slabs of 128 rows against the same K/V.
        std::vector<at::Tensor> parts;
        for (call.q_begin = 0; call.q_begin < rows; call.q_begin += 128)
          parts.push_back(attend(reg, "sparse", x, call, x.q.narrow(1, call.q_begin, std::min<int64_t>(128, rows - call.q_begin))));
        EXPECT_LE(rel_l2(at::cat(parts, 1), want), 2e-2) << what << " (slabs)";
        // The whole call ends its phase (its carrier is freed); the slabs share one carrier.
        const auto& all = tally.phases();
        ASSERT_GE(all.size(), 2u) << what;
        const std::vector<exec::SparsePhase> phases(all.end() - 2, all.end());
        const double kept = keep.to(at::kDouble).mean().item<double>();
        for (const auto& ph : phases) EXPECT_NEAR(ph.density(), kept, 1e-9) << what;
        EXPECT_EQ(phases[1].tiles, phases[0].tiles) << what << ": every slab counted in one phase";
        // 600 rows: 10 tiles, the first two text or mixed (dense); each of the 8 video query tiles
        // keeps ceil(0.3 x 8) = 3 video key tiles besides them: (2 x 10 + 8 x 5) / 100.
        if (rows == 600 && budget < 1) EXPECT_DOUBLE_EQ(kept, 0.6) << what << ": the routing keeps fewer tiles";
      }
}

// K quantized slab by slab into a carrier (as a K/V phase fills it), then attended: the first
// slab's mean is the one subtracted, which leaves softmax unchanged.
TEST(GpuInt8Attention, KCarrierFilledSlabBySlabMatchesTheReferences) {
  SKIP_WITHOUT_CUDA();
  auto reg = exec::builtin_registry();
  for (int64_t rows : {77, 200, 600})
    for (int64_t dim : {64, 128})
      for (const char* name : {"int8", "sparse"}) {
        const std::string what = std::string(name) + ", " + std::to_string(rows) + " rows, head_dim " + std::to_string(dim);
        const exec::VideoRows video{std::min<int64_t>(77, rows - 1), rows};
        const double budget = 0.3;
        const Qkv x = random_qkv(3, rows, rows, dim, at::kBFloat16, uint64_t(rows * 7 + dim));
        const auto& caps = reg.consumer(name);
        ASSERT_TRUE(bool(caps.k_carrier_bytes)) << what;
        const int64_t bytes = caps.k_carrier_bytes(3, rows, dim);
        EXPECT_EQ(bytes, exec::int8attn::k_carrier_bytes(3, rows, dim));
        // One byte per K element in whole tiles, and the tiles' statistics besides.
        EXPECT_LT(bytes, 3 * rows * dim * 2) << what << ": the carrier is smaller than 16-bit K";
        const at::Tensor carrier = at::full({3, bytes / 3}, 77, x.k.options().dtype(at::kChar));
        const auto& impl = exec::impl_of<exec::ConsumerImpl>(caps);
        const int64_t slab = 128;
        for (int64_t b = 0; b < rows; b += slab)
          impl.carry_k(x.k.narrow(1, b, std::min(slab, rows - b)).unsqueeze(0), carrier, b, rows);
        const double scale = 1.0 / std::sqrt(double(dim));
        const contracts::AttnCall call{.kv_budget = budget, .video = video};
        const at::Tensor o = impl.attend_carried(x.q.unsqueeze(0), carrier, x.v.unsqueeze(0), scale, call, rows).squeeze(0);
        const at::Tensor qf = x.q.cpu().to(at::kFloat), kf = x.k.cpu().to(at::kFloat), vf = x.v.cpu().to(at::kFloat);
        const at::Tensor keep = std::string(name) == "int8" ? at::ones({3, (rows + 63) / 64, (rows + 63) / 64}, at::kBool)
                                                             : exec::route_tiles(qf, kf, video, budget);
        const double e = rel_l2(o, exec::block_sparse_reference(qf, kf, vf, keep, scale));
        EXPECT_LE(e, 2e-2) << what;
        EXPECT_GT(e, 0.0) << what;
        // A slab that does not start at a tile is refused with the rows named.
        EXPECT_THROW(impl.carry_k(x.k.narrow(1, 0, 10).unsqueeze(0), carrier, 10, rows), c10::Error) << what;
      }
}

// A planned run whose K/V phase fills the carrier, against the naive run of the same consumer
// (K quantized at once), and its measured peak against the estimate.
TEST(GpuInt8Attention, PlannedWithTheKCarrierMatchesNaiveAndTheEstimatedPeak) {
  SKIP_WITHOUT_CUDA();
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device("cuda");
  const auto dev = exec::describe_device(d);
  auto cfg = models::demo_config();
  cfg.dtype = ir::DType::BF16;
  cfg.consumer = "int8";
  cfg.layers = 1;
  cfg.dim = 1536;
  cfg.heads = 12;
  cfg.kv_heads = 4;
  cfg.head_dim = 128;
  cfg.rotary_dim = 96;
  cfg.hidden = 4096;
  models::set_total_tokens(cfg, 8193);
  const auto inst = models::instantiate(cfg, reg, d);
  const auto p = plan::make_plan(inst.model, reg, dev, {1000, 0});
  const auto r = report::compare(inst, p, reg, dev, {true, false});
  const at::Tensor naive = exec::run_naive(inst.model, *inst.weights, inst.inputs, reg).cpu();
  const at::Tensor planned = exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, dev).cpu();
  const double e = test::rel_l2(planned, naive);
  std::cout << "int8 planned (K carrier) vs naive rel_l2 " << e << ", peak " << r.planned.peak_bytes << " estimated "
            << r.estimated_peak_bytes << "\n";
  EXPECT_LE(e, 2e-2);
  // Never below the measured peak; above it by 5% at most besides the allocator's reuse slack.
  EXPECT_GE(r.estimated_peak_bytes, r.planned.peak_bytes);
  EXPECT_LE(double(r.estimated_peak_bytes),
            1.05 * double(r.planned.peak_bytes) + double(dev.reuse_slack * (3 + reg.consumer("int8").call_allocations)));
  // The same plan with 16-bit K needs more bytes (the allocator's reuse slack aside, which
  // counts allocations rather than bytes).
  auto sdpa = cfg;
  sdpa.consumer = "sdpa";
  const auto inst16 = models::instantiate(sdpa, reg, d);
  auto exact = dev;
  exact.reuse_slack = 0;
  EXPECT_LT(plan::make_plan(inst.model, reg, exact, {1000, 0}).estimated_peak_bytes,
            plan::make_plan(inst16.model, reg, exact, {1000, 0}).estimated_peak_bytes);
}

// The K/V phase of a consumer with a carrier fills it in slabs of whole tiles, and no 16-bit
// global K exists (planning only: runs on the CPU).
TEST(Int8Attention, TheKvPhaseFillsTheCarrierInSlabsOfWholeTiles) {
  const auto reg = exec::builtin_registry();
  contracts::DeviceCaps dev = exec::describe_device(at::Device(at::kCPU));
  auto cfg = models::demo_config();
  cfg.dtype = ir::DType::BF16;
  cfg.consumer = "int8";
  cfg.layers = 1;
  models::set_total_tokens(cfg, 1001);
  const auto inst = models::instantiate(cfg, reg, at::kCPU);
  for (int64_t chunk : {100, 64, 1001}) {
    const auto p = plan::make_plan(inst.model, reg, dev, {chunk, 0});
    const auto& b = inst.model.blocks[0];
    const auto& s = b.sublayers[0];
    ASSERT_TRUE(s.is_attention());
    const plan::Program prog = plan::compile_sublayer(inst.model, b, s, p.blocks[0].sublayers[0], reg, dev);
    const auto& a = std::get<ir::Attention>(s.body);
    int carrier = -1;
    for (size_t i = 0; i < prog.buffers.size(); ++i)
      if (prog.buffers[i].role == plan::BufRole::GlobalK) {
        EXPECT_EQ(carrier, -1) << "one K";
        carrier = int(i);
        EXPECT_EQ(prog.buffers[i].dtype, ir::DType::I8);
        EXPECT_EQ(prog.buffers[i].bytes(), exec::int8attn::k_carrier_bytes(a.kv_heads, 1001, a.head_dim));
      }
    ASSERT_GE(carrier, 0);
    int64_t covered = 0, carries = 0;
    for (const auto& st : prog.steps) {
      if (const auto* l = std::get_if<plan::LoopStep>(&st.body)) {
        const bool kv = std::any_of(prog.steps.begin() + (&st - prog.steps.data()), prog.steps.begin() + l->end,
                                    [](const plan::Step& x) { return std::holds_alternative<plan::CarryKStep>(x.body); });
        if (!kv) continue;
        EXPECT_EQ(l->begin, covered) << "chunk " << chunk;
        if (l->begin + l->rows * l->count < 1001) EXPECT_EQ(l->rows % 64, 0) << "chunk " << chunk;
        covered += l->rows * l->count;
      }
      if (std::holds_alternative<plan::CarryKStep>(st.body)) ++carries;
      if (const auto* at = std::get_if<plan::AttendStep>(&st.body)) {
        EXPECT_TRUE(at->carried);
        EXPECT_EQ(at->k.buf, carrier);
      }
    }
    EXPECT_EQ(covered, 1001) << "chunk " << chunk;
    EXPECT_GT(carries, 0);
  }
}

// The KV budget is an input of the plan: its attend steps carry it with their block, query rows
// and the video rows they route, and the estimate follows it. Below 1 for a model without video
// rows it is an error naming the option (planning only: runs on the CPU).
TEST(SparseAttention, TheKvBudgetIsAPlanInputTheAttendStepsCarry) {
  const auto reg = exec::builtin_registry();
  const contracts::DeviceCaps dev = exec::describe_device(at::Device(at::kCPU));
  auto cfg = models::demo_config();
  cfg.dtype = ir::DType::BF16;
  cfg.consumer = "sparse";
  cfg.layers = 2;
  models::set_total_tokens(cfg, 1001);
  const ir::Model m = models::build_ir(cfg);
  const ir::RowRange video = m.rows({"video"});
  const plan::Plan dense = plan::make_plan(m, reg, dev, {});
  const plan::Plan sparse = plan::make_plan(m, reg, dev, {.kv_budget = 0.3});
  EXPECT_EQ(sparse.kv_budget, 0.3);
  EXPECT_LT(sparse.estimated_ms, dense.estimated_ms);
  int attends = 0;
  for (size_t b = 0; b < m.blocks.size(); ++b)
    for (const auto& sub : sparse.blocks[b].sublayers)
      for (const auto& st : sub.part.program.steps)
        if (const auto* at = std::get_if<plan::AttendStep>(&st.body)) {
          ++attends;
          EXPECT_EQ(at->call.layer, int64_t(b));
          EXPECT_EQ(at->call.kv_budget, 0.3);
          EXPECT_EQ(at->call.queries.begin, 0);
          EXPECT_EQ(at->call.queries.end, m.tokens());
          EXPECT_EQ(at->call.video.begin, video.begin);
          EXPECT_EQ(at->call.video.end, video.end);
          EXPECT_TRUE(at->call.routed(at->kv_rows));
          EXPECT_NE(st.what.find("kv budget 0.3"), std::string::npos) << st.what;
        }
  EXPECT_GE(attends, 2);
  auto img = cfg;
  img.segments = {{"text", 128}, {"img", 873}};
  const ir::Model no_video = models::build_ir(img);
  EXPECT_NO_THROW(plan::make_plan(no_video, reg, dev, {}));
  try {
    plan::make_plan(no_video, reg, dev, {.kv_budget = 0.3});
    ADD_FAILURE() << "a KV budget for a model without video rows";
  } catch (const plan::PlanError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--kv-budget"), std::string::npos) << msg;
    EXPECT_NE(msg.find("no 'video' segment"), std::string::npos) << msg;
  }
}

// The cost model's share of dense work for the sparse consumer is the density of the routed
// mask (every tile pair of a self-attention over the routed rows), and follows the call's budget.
TEST(SparseAttention, WorkFractionIsTheRoutedMasksDensity) {
  const auto reg = exec::builtin_registry();
  at::manual_seed(5);
  for (int64_t rows : {200, 600, 1001})
    for (double budget : {0.3, 0.5}) {
      const exec::VideoRows video{77, rows};
      contracts::AttnCall call{.kv_budget = budget, .video = video};
      const auto& caps = reg.consumer("sparse");
      ASSERT_TRUE(bool(caps.work_fraction));
      const at::Tensor q = at::randn({3, rows, 64}), k = at::randn({3, rows, 64});
      const double density = exec::route_tiles(q, k, video, budget).to(at::kDouble).mean().item<double>();
      contracts::AttnShape s{.q_rows = rows, .kv_rows = rows, .heads = 3, .kv_heads = 3, .head_dim = 64,
                             .dtype = ir::DType::BF16, .device = contracts::DeviceKind::CUDA};
      const std::string what = std::to_string(rows) + " rows, budget " + std::to_string(budget);
      EXPECT_NEAR(caps.work_fraction(s, call), density, 1e-12) << what;
      EXPECT_LT(caps.work_fraction(s, call), 1.0) << what;
      // Attention over other rows (cross-attention) is not routed; budget 1 is dense.
      s.kv_rows = 77;
      EXPECT_EQ(caps.work_fraction(s, call), 1.0) << what;
      s.kv_rows = rows;
      call.kv_budget = 1.0;
      EXPECT_EQ(caps.work_fraction(s, call), 1.0) << what;
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
      contracts::AttnCall call{.kv_budget = budget, .video = video};
      const at::Tensor want = exec::route_tiles(q, k, video, budget);
      const at::Tensor km = exec::tile_means(k);
      const int64_t nk = km.size(1);
      const auto whole = exec::route_slab(exec::tile_means(q), km, rows, rows, call);
      EXPECT_TRUE(at::equal(mask_of(whole, 3, nk, nk), want)) << what;
      EXPECT_EQ(whole.visited, want.sum().item<int64_t>()) << what;
      EXPECT_EQ(whole.tiles, want.numel()) << what;
      EXPECT_EQ(whole.offsets.defined(), budget < 1 && rows > 130) << what << ": routed only where tiles are dropped";
      for (int64_t b = 0; b < rows; b += 192) {
        const int64_t n = std::min<int64_t>(192, rows - b);
        call.q_begin = b;
        const auto slab = exec::route_slab(exec::tile_means(q.narrow(1, b, n)), km, n, rows, call);
        const int64_t nq = (n + 63) / 64;
        EXPECT_TRUE(at::equal(mask_of(slab, 3, nq, nk), want.narrow(1, b / 64, nq))) << what << ", slab at " << b;
      }
      call.q_begin = 0;
      // Cross-attention (K/V of another length) is not routed.
      const at::Tensor ctx = at::randn({3, 77, 64});
      EXPECT_FALSE(exec::route_slab(exec::tile_means(q), exec::tile_means(ctx), rows, 77, call).offsets.defined()) << what;
    }
  EXPECT_THROW(exec::route_slab(at::zeros({3, 2, 64}), at::zeros({3, 5, 64}), 130, 130, {}), std::invalid_argument);
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

namespace sp_attention_inputs {

using namespace sp;

const report::AttnShape kSmall{1200, 2, 128, 48, {2, 12, 48}};  // 48 text rows, 1,152 grid rows

double cosine(const at::Tensor& a, const at::Tensor& b) {
  return (a * b).sum().item<double>() / (a.norm() * b.norm()).item<double>();
}

TEST(AttentionInputs, EachDistributionHasItsPropertyAndIsReproducible) {
  const auto o = at::TensorOptions().dtype(at::kFloat);
  for (const std::string& dist : report::attention_distributions()) {
    const report::AttnInputs x = report::attention_inputs(dist, kSmall, o, 3);
    EXPECT_EQ(x.q.sizes(), (std::vector<int64_t>{1, 2, 1200, 128})) << dist;
    EXPECT_TRUE(at::equal(x.k, report::attention_inputs(dist, kSmall, o, 3).k)) << dist;
    const at::Tensor q = x.q[0], k = x.k[0];
    const at::Tensor p = at::softmax(at::matmul(q, k.transpose(1, 2)) / std::sqrt(128.0), 2);
    const double peaked = std::get<0>(p.max(2)).ge(0.5).to(at::kFloat).mean().item<double>();
    if (dist == "outlier-k") {
      const at::Tensor sd = k.std(1).mean(0);  // per channel
      EXPECT_GE(std::get<0>(at::topk(sd, 4)).min().item<double>(), 10 * sd.median().item<double>()) << dist;
    } else if (dist == "peaky") {
      EXPECT_GE(peaked, 0.95) << "rows whose largest softmax weight is at least 0.5";
    } else if (dist == "qk-norm") {
      const at::Tensor rms = q.pow(2).mean(2).sqrt();
      EXPECT_GE(rms.min().item<double>(), 4.0);
      EXPECT_LE(rms.max().item<double>(), 8.0);
    } else if (dist == "video-local") {
      // Neighbours on the grid (w + 1) are alike; tokens 24 apart in w are not.
      const at::Tensor g = q.narrow(1, 48, 1152).reshape({2, 2, 12, 48, 128});
      EXPECT_GE(cosine(g.narrow(3, 0, 47), g.narrow(3, 1, 47)), 0.6);
      EXPECT_LE(std::abs(cosine(g.narrow(3, 0, 24), g.narrow(3, 24, 24))), 0.2);
    } else {
      EXPECT_LE(peaked, 0.05) << dist;
    }
  }
  EXPECT_THROW(report::attention_inputs("uniform", kSmall, o), std::invalid_argument);
  EXPECT_THROW(report::attention_inputs("gaussian", {100, 1, 64, 10, {1, 10, 10}}, o), std::invalid_argument);
}

// K with a few channels 20x the others (bench-attention's outlier-k): the carrier divides K's
// channels by factors that Q's are multiplied by, so the outliers no longer take the int8 range
// of every other channel. Without the factors the error is about 9e-2; with them about 3.5e-2,
// whole and with the factors taken from the first slab of a carried K.
TEST(GpuInt8Attention, KChannelFactorsKeepOutlierChannelsFromTakingTheRange) {
  SKIP_WITHOUT_CUDA();
  const at::Device d = exec::pick_device("cuda");
  const report::AttnInputs in = report::attention_inputs("outlier-k", kSmall, at::TensorOptions().dtype(at::kFloat), 5);
  const at::Tensor q = in.q[0].to(at::kBFloat16).to(d), k = in.k[0].to(at::kBFloat16).to(d),
                   v = in.v[0].to(at::kBFloat16).to(d);
  const double scale = 1.0 / std::sqrt(128.0);
  const int64_t rows = k.size(1), kt = (rows + 63) / 64;
  const at::Tensor want = exec::block_sparse_reference(q.cpu().to(at::kFloat), k.cpu().to(at::kFloat),
                                                       v.cpu().to(at::kFloat), at::ones({2, kt, kt}, at::kBool), scale);
  namespace ia = exec::int8attn;
  const ia::KCarrier whole = ia::quantize_k(k);
  // The factors: Q's times K's is one in every channel, and the outlier channels are shrunk.
  EXPECT_TRUE(at::allclose(whole.q_factor * whole.k_factor, at::ones_like(whole.q_factor), 1e-5, 1e-5));
  EXPECT_LT(whole.k_factor.select(1, 3).max().item<double>(), 0.5 * whole.k_factor.median().item<double>());
  EXPECT_LE(rel_l2(ia::attend(ia::quantize_q(q, scale, whole), whole, v, {}), want), 5e-2) << "whole K";
  const at::Tensor bytes = at::empty({2, ia::k_carrier_bytes(2, rows, 128) / 2}, k.options().dtype(at::kChar));
  const ia::KCarrier carried = ia::carrier_view(bytes, 2, rows, 128);
  for (int64_t b = 0; b < rows; b += 256) ia::quantize_k_rows(k.narrow(1, b, std::min<int64_t>(256, rows - b)), carried, b);
  EXPECT_LE(rel_l2(ia::attend(ia::quantize_q(q, scale, carried), carried, v, {}), want), 5e-2) << "carried K";
}

TEST(AttentionInputs, TileCentresAndTheFixedWindowKeepTheNearestTiles) {
  // 2 text rows, then a 1 x 2 x 4 grid, in tiles of 4 rows.
  const at::Tensor c = report::grid_tile_centres({10, 1, 64, 2, {1, 2, 4}}, 4);
  EXPECT_TRUE(at::allclose(c, at::tensor({0.f, 0.f, 0.5f, 0.f, 0.5f, 1.5f, 0.f, 1.f, 2.5f}).view({3, 3})));
  // 64 tiles of one grid row (w only) after a text tile: each video query tile keeps the
  // kept_tiles(0.1, 64) = 7 nearest video key tiles (itself and 3 each side, away from the
  // ends), the text tile and its pairs stay dense.
  const report::AttnShape line{65 * 64, 3, 64, 64, {1, 1, 64 * 64}};
  const at::Tensor keep = report::window_tiles(line, 0.1, at::kCPU);
  ASSERT_EQ(keep.sizes(), (std::vector<int64_t>{3, 65, 65}));
  EXPECT_TRUE(keep.select(1, 0).all().item<bool>() && keep.select(2, 0).all().item<bool>());
  const at::Tensor video = keep.narrow(1, 1, 64).narrow(2, 1, 64);
  EXPECT_TRUE(video.sum(2).eq(7).all().item<bool>());
  const at::Tensor row = video[0][30];
  EXPECT_TRUE(row.narrow(0, 27, 7).all().item<bool>() && row.sum().item<int64_t>() == 7);
}

}  // namespace sp_attention_inputs
