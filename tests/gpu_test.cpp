// GPU runs (skipped without a CUDA device): planned vs naive in bf16 and fp16, and the
// estimate against the caching allocator's peak.
#include <gtest/gtest.h>

#include <random>

#ifdef STREAMPLAN_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>
#endif

#include "exec/device/device.hpp"
#include "exec/registry.hpp"
#include "exec/kernels/fused.hpp"
#include "models/builder.hpp"
#include "models/checkpoint.hpp"
#include "models/families.hpp"
#include "recognize/recognize.hpp"
#include "report/report.hpp"
#include "plan/budget.hpp"
#include "exec/run/retry.hpp"
#include "test_util.hpp"

namespace {

using namespace sp;

TEST(Gpu, ReducedPrecisionPlannedWithinTwiceNaiveErrorAndEstimateNotBelowMeasured) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device("cuda");
  const auto dev = exec::describe_device(d);
  struct V {
    ir::DType dtype;
    std::string consumer, format;
    int64_t tokens, chunk, kv_heads;
  };
  // Sizes large enough that the caching allocator's block reuse (up to 1 MiB a block that is
  // not split) stays small against the peak.
  const std::vector<V> vs = {{ir::DType::BF16, "sdpa", "dense", 8193, 1000, 12},
                             {ir::DType::F16, "sdpa", "dense", 6001, 777, 4},
                             {ir::DType::BF16, "math", "int8-rowwise", 4099, 512, 3},
                             {ir::DType::BF16, "whole", "dense", 5000, 640, 12}};
  for (const auto& v : vs) {
    auto cfg = models::demo_config();
    cfg.dtype = v.dtype;
    cfg.consumer = v.consumer;
    cfg.format = v.format;
    cfg.kv_heads = v.kv_heads;
    cfg.layers = 1;
    cfg.dim = 1536;
    cfg.heads = 12;
    cfg.head_dim = 128;
    cfg.rotary_dim = 96;
    cfg.hidden = 4096;
    models::set_total_tokens(cfg, v.tokens);
    SCOPED_TRACE(std::string(ir::to_string(v.dtype)) + " " + v.consumer + " " + v.format);
    const auto inst = models::instantiate(cfg, reg, d);
    const auto p = plan::make_plan(inst.model, reg, dev, {v.chunk, 0});
    const auto r = report::compare(inst, p, reg, dev, {true, false});
    const at::Tensor naive = exec::run_naive(inst.model, *inst.weights, inst.inputs, reg).cpu();
    const at::Tensor planned = exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, dev).cpu();
    const auto cpu_inst = models::instantiate(cfg, reg, at::kCPU);
    const auto ref_inst = models::upcast_f64(cpu_inst, reg);
    const at::Tensor ref = exec::run_naive(ref_inst.model, *ref_inst.weights, ref_inst.inputs, reg);
    const double en = test::rel_l2(naive, ref), ep = test::rel_l2(planned, ref);
    std::cout << ir::to_string(v.dtype) << " " << v.consumer << " " << v.format << ": naive err " << en
              << ", planned err " << ep << ", peak naive " << r.naive->peak_bytes << " planned "
              << r.planned.peak_bytes << " estimated " << r.estimated_peak_bytes << "\n";
    EXPECT_LE(ep, 2.0 * en);
    // Each step within the transient its program declares: where not, the step kind that
    // allocated more, and by how much.
    exec::StepProfile prof;
    exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, dev, {}, &prof);
    for (const auto& [kind, k] : prof.kinds)
      EXPECT_LE(k.transient_over, 0) << kind << ": a step allocated " << k.transient_over << " bytes beyond its declared transient";
    // Never below the measured peak (a budget holds), and not far above it.
    EXPECT_GE(r.estimated_peak_bytes, r.planned.peak_bytes);
    // Above it by 5% at most, besides the caching allocator's reuse slack the estimate allows
    // on the arena, the output, the residual stream and each of the consumer's allocations.
    const int64_t slack = dev.reuse_slack * (3 + reg.consumer(v.consumer).call_allocations);
    EXPECT_LE(double(r.estimated_peak_bytes), 1.05 * double(r.planned.peak_bytes) + double(slack));
    EXPECT_LT(r.planned.peak_bytes, r.naive->peak_bytes);
  }
}

}  // namespace

// The fused row kernels against the formulas they implement, in float64 on the CPU: every
// element within one unit in the last place of the output dtype (fp32: 1e-5 relative).
namespace fusedk {

using namespace sp;

double ulp_of(at::ScalarType t) { return t == at::kBFloat16 ? 0x1p-7 : t == at::kHalf ? 0x1p-10 : 1e-5; }

void expect_close(const at::Tensor& got, const at::Tensor& want64, at::ScalarType dt, const std::string& what) {
  const at::Tensor g = got.cpu().to(at::kDouble);
  const at::Tensor bound = want64.abs() * ulp_of(dt) + 1e-5;
  const at::Tensor bad = (g - want64).abs() > bound;
  EXPECT_EQ(bad.sum().item<int64_t>(), 0) << what << ": max |diff| " << (g - want64).abs().max().item<double>();
}

TEST(Gpu, FusedNormModulateMatchesFormula) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const at::Device d = exec::pick_device("cuda");
  at::manual_seed(7);
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf, at::kFloat})
    for (int64_t dim : {77, 1000, 5120})
      for (bool ln : {true, false})
        for (int mode : {0, 1, 2})  // modulation: none, one row for all, per row
          for (int64_t off : {0, 1}) {  // 0: rows aligned for 8-element accesses (where dim allows)
            const int64_t rows = 37;
            const std::string what = std::string(c10::toString(dt)) + " dim " + std::to_string(dim) +
                                     (ln ? " layernorm" : " rmsnorm") + " mod " + std::to_string(mode) + " offset " +
                                     std::to_string(off);
            // x as a strided row view of a wider tensor, modulation rows strided too.
            const at::Tensor xw = at::randn({rows, dim + 8}).to(dt), x = xw.narrow(1, off, dim);
            const at::Tensor w = at::randn({dim}), b = ln ? at::randn({dim}) : at::Tensor();
            at::Tensor scale, shift;
            if (mode == 1) scale = at::randn({dim}) * 0.1, shift = at::randn({dim});
            if (mode == 2) {
              const at::Tensor table = at::randn({rows, 2, dim});
              scale = table.select(1, 0) * 0.1, shift = table.select(1, 1);
            }
            const at::Tensor x64 = x.to(at::kDouble);
            const at::Tensor mean = ln ? x64.mean(-1, true) : at::zeros({rows, 1}, at::kDouble);
            const at::Tensor var = (x64 - mean).pow(2).mean(-1, true);
            at::Tensor want = (x64 - mean) * at::rsqrt(var + 1e-6) * w.to(at::kDouble);
            if (ln) want = want + b.to(at::kDouble);
            if (mode) want = want * (1 + scale.to(at::kDouble)) + shift.to(at::kDouble);
            const at::Tensor out = at::empty({rows, dim}, at::TensorOptions().dtype(dt).device(d));
            auto cuda = [&](const at::Tensor& t) { return t.defined() ? t.to(d) : t; };
            exec::fused::norm_modulate(xw.to(d).narrow(1, off, dim), out, {ln, 1e-6, cuda(w), cuda(b)},
                                       mode == 2 ? scale.to(d) : cuda(scale), cuda(shift));
            expect_close(out, want, dt, what);
          }
}

TEST(Gpu, FusedQkNormRopeMatchesFormula) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const at::Device d = exec::pick_device("cuda");
  at::manual_seed(11);
  struct C {
    int64_t heads, hd, rot;
  };
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf, at::kFloat})
    // The first three fit 8-element accesses; 72 / 36 does not (a rotation half of 18).
    for (C c : {C{3, 64, 32}, C{40, 128, 128}, C{5, 96, 0}, C{2, 72, 36}})
      for (auto norm : {ir::QkNormKind::None, ir::QkNormKind::PerHead, ir::QkNormKind::AcrossHeads})
        for (auto style : {ir::RopeStyle::None, ir::RopeStyle::SplitHalf, ir::RopeStyle::Interleaved}) {
          if ((style == ir::RopeStyle::None) != (c.rot == 0)) continue;
          const int64_t n = 19, H = c.heads, hd = c.hd, half = c.rot / 2;
          const std::string what = std::string(c10::toString(dt)) + " heads " + std::to_string(H) + " hd " +
                                   std::to_string(hd) + " rot " + std::to_string(c.rot) + " norm " + ir::to_string(norm) +
                                   " rope " + std::to_string(int(style));
          const at::Tensor in = at::randn({n, H * hd}).to(dt);
          const at::Tensor w = norm == ir::QkNormKind::PerHead ? at::randn({hd}) : at::randn({H * hd});
          const at::Tensor ang = at::randn({n, std::max<int64_t>(half, 1)});
          const at::Tensor cs = at::cos(ang).narrow(1, 0, half), sn = at::sin(ang).narrow(1, 0, half);
          at::Tensor v = in.to(at::kDouble).view({n, H, hd});
          if (norm == ir::QkNormKind::PerHead)
            v = v * at::rsqrt(v.pow(2).mean(-1, true) + 1e-6) * w.to(at::kDouble);
          if (norm == ir::QkNormKind::AcrossHeads) {
            const at::Tensor f = v.flatten(1);
            v = (f * at::rsqrt(f.pow(2).mean(-1, true) + 1e-6) * w.to(at::kDouble)).view({n, H, hd});
          }
          at::Tensor want = v.clone();
          if (style != ir::RopeStyle::None) {
            at::Tensor a, b, wa, wb;
            if (style == ir::RopeStyle::SplitHalf) {
              a = v.narrow(-1, 0, half), b = v.narrow(-1, half, half);
              wa = want.narrow(-1, 0, half), wb = want.narrow(-1, half, half);
            } else {
              a = v.narrow(-1, 0, c.rot).unflatten(-1, {half, 2}).select(-1, 0);
              b = v.narrow(-1, 0, c.rot).unflatten(-1, {half, 2}).select(-1, 1);
              wa = want.narrow(-1, 0, c.rot).unflatten(-1, {half, 2}).select(-1, 0);
              wb = want.narrow(-1, 0, c.rot).unflatten(-1, {half, 2}).select(-1, 1);
            }
            const at::Tensor c64 = cs.to(at::kDouble).unsqueeze(1), s64 = sn.to(at::kDouble).unsqueeze(1);
            const at::Tensor na = a * c64 - b * s64, nb = b * c64 + a * s64;
            wa.copy_(na);
            wb.copy_(nb);
          }
          // Written head-major ([H, n, hd]), the folded layout of the Q slab.
          const at::Tensor out = at::full({H, n, hd}, 7.0, at::TensorOptions().dtype(dt).device(d));
          exec::fused::qk_norm_rope(in.to(d), out.transpose(0, 1), norm, 1e-6,
                                    norm == ir::QkNormKind::None ? at::Tensor() : w.to(d),
                                    {style, c.rot, style == ir::RopeStyle::None ? at::Tensor() : cs.to(d),
                                     style == ir::RopeStyle::None ? at::Tensor() : sn.to(d)});
          expect_close(out.transpose(0, 1), want, dt, what);
        }
}

TEST(Gpu, FusedResidualAddMatchesFormula) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const at::Device d = exec::pick_device("cuda");
  at::manual_seed(13);
  const int64_t rows = 29;
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf, at::kFloat})
    for (bool y32 : {false, true})
      for (int64_t dim : {77, 1024})
        for (int gate : {0, 1, 2})  // none, one row for all, per row
          for (int64_t off : {0, 1}) {
            const std::string what = std::string(c10::toString(dt)) + (y32 ? " y fp32" : "") + " dim " +
                                     std::to_string(dim) + " gate " + std::to_string(gate) + " offset " +
                                     std::to_string(off);
            const at::Tensor xw = at::randn({rows, dim + 8}).to(dt);
            const at::Tensor y = at::randn({rows, dim + 8}).to(y32 ? at::kFloat : dt).narrow(1, off, dim);
            at::Tensor g;
            if (gate == 1) g = at::randn({dim});
            if (gate == 2) g = at::randn({rows, 3, dim}).select(1, 1);
            at::Tensor want = y.to(at::kDouble);
            if (g.defined()) want = want * g.to(at::kDouble);
            want = want + xw.narrow(1, off, dim).to(at::kDouble);
            const at::Tensor xd = xw.to(d);
            exec::fused::residual_add(xd.narrow(1, off, dim), y.to(d), g.defined() ? g.to(d) : g);
            expect_close(xd.narrow(1, off, dim), want, dt, what);
            // Columns outside the view are untouched.
            if (off == 1) EXPECT_TRUE(at::equal(xd.narrow(1, 0, 1).cpu(), xw.narrow(1, 0, 1))) << what;
          }
}

}  // namespace fusedk

// Every family's structure on the GPU in bf16 (Wan: LayerNorm, Q/K RMSNorm across heads,
// cross-attention; Flux: joint attention, parallel MLP; avdit: GQA, partial RoPE): planned with
// the fused row kernels, with a chunk that divides nothing, within twice naive's error
// against an fp64 run of the same weights.
TEST(Gpu, FamiliesWithFusedRowKernelsWithinTwiceNaiveError) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device("cuda");
  const auto dev = exec::describe_device(d);
  ASSERT_EQ(dev.fused_row_kernels, contracts::Cap::Yes);
  const std::vector<std::pair<std::string, models::Geometry>> cases = {
      {"wan2.1-14b", {.frames = 9, .height = 192, .width = 320, .text_tokens = 9}},
      {"flux1-dev", {.height = 256, .width = 320, .text_tokens = 7}},
      {"avdit", {.frames = 3, .height = 192, .width = 320, .text_tokens = 11, .audio_tokens = 5}}};
  for (const auto& [variant, geom] : cases) {
    SCOPED_TRACE(variant);
    const auto cfg = recognize::preset(variant, 2, true);
    auto weights = models::random_weights_on(cfg, d, at::kBFloat16, 5, reg);
    const auto fr = models::prepare(cfg, *weights, models::random_raw_inputs(cfg, geom, 5), ir::DType::BF16, "sdpa");
    const models::Instance inst{fr.model, weights, fr.inputs};
    const auto ref_inst = models::upcast_f64(inst, reg);
    const at::Tensor ref = exec::run_naive(ref_inst.model, *ref_inst.weights, ref_inst.inputs, reg).cpu();
    const at::Tensor naive = exec::run_naive(inst.model, *inst.weights, inst.inputs, reg).cpu();
    const auto p = plan::make_plan(inst.model, reg, dev, {37, 0});
    const at::Tensor planned = exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, dev).cpu();
    const double en = test::rel_l2(naive, ref), ep = test::rel_l2(planned, ref);
    std::cout << variant << " (" << inst.model.tokens() << " tokens): naive err " << en << ", planned (fused) err "
              << ep << "\n";
    EXPECT_GT(en, 0.0);
    EXPECT_GT(inst.model.tokens(), 4 * 37);  // many slabs, segment boundaries inside some
    EXPECT_LE(ep, 2.0 * en);
  }
}

#ifdef STREAMPLAN_WITH_CUDA
namespace {

using namespace sp;

// Free blocks inside a segment that still holds a live tensor are fragments: describe_device
// does not count them as free (a plan sized on them could run out of memory under a cap).
TEST(Gpu, MemoryFreeLeavesOutFragmentsOfLiveSegments) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  namespace cca = c10::cuda::CUDACachingAllocator;
  const at::Device d = exec::pick_device("cuda");
  cca::emptyCache();
  // Two 4 MiB tensors share one of the allocator's 20 MiB segments; freeing one leaves 16 MiB
  // of free blocks in a segment that cannot be released.
  at::Tensor a = at::empty({4 << 20}, at::TensorOptions().dtype(at::kByte).device(d));
  at::Tensor b = at::empty({4 << 20}, at::TensorOptions().dtype(at::kByte).device(d));
  a.reset();
  cca::emptyCache();
  const auto st = cca::getDeviceStats(d.index());
  const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  ASSERT_GE(st.inactive_split_bytes[agg].current, int64_t{4} << 20);
  size_t free_b = 0, total_b = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const auto caps = exec::describe_device(d);
  EXPECT_LE(caps.memory_free, static_cast<int64_t>(free_b));
  EXPECT_GT(caps.memory_free, 0);
}

// Out of memory in the middle of a planned run, under a cap of the caching allocator: one
// retry with the fastest plan that fits what is free; with too little, OutOfMemory naming
// what was needed.
TEST(Gpu, OutOfMemoryRetriesOnceWithASmallerPlan) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  namespace cca = c10::cuda::CUDACachingAllocator;
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device("cuda");
  auto cfg = models::demo_config();
  cfg.dtype = ir::DType::BF16;
  cfg.layers = 2;
  models::set_total_tokens(cfg, 16384);
  const auto inst = models::instantiate(cfg, reg, d);
  auto dev = exec::describe_device(d);
  const plan::Plan fast = plan::make_plan(inst.model, reg, dev, {.budget_bytes = int64_t{1} << 40});
  int64_t least = 0;
  try {
    plan::make_plan(inst.model, reg, dev, {.budget_bytes = 1});
  } catch (const plan::BudgetError& e) {
    least = e.smallest_peak_bytes;
  }
  ASSERT_GT(fast.estimated_peak_bytes, least + (int64_t{16} << 20));
  const at::Tensor naive = exec::run_naive(inst.model, *inst.weights, inst.inputs, reg);

  // The cap is lifted however the test ends: a later test in this process must not inherit it.
  struct Uncap {
    int index;
    ~Uncap() { c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, index); }
  } uncap{d.index()};
  auto cap = [&](int64_t activations) {  // what may be reserved besides what is now
    cca::emptyCache();
    const auto st = cca::getDeviceStats(d.index());
    // The cap counts reserved memory: segments that earlier tests left partly used stay
    // reserved after emptyCache; describe_device does not count their free blocks (fragments),
    // so what it calls free under this cap is the new room.
    const int64_t reserved =
        st.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
    cca::setMemoryFraction(double(reserved + activations) / double(dev.memory_total), d.index());
  };
  // Room for the leanest plan (and the twentieth the retry leaves), not for the fastest.
  ASSERT_LT(least * 21 / 20, (least + fast.estimated_peak_bytes) / 2);
  cap((least + fast.estimated_peak_bytes) / 2);
  const exec::Retried r = exec::run_planned_retrying(inst.model, *inst.weights, inst.inputs, fast, reg, dev, d);
  EXPECT_TRUE(r.retried);
  EXPECT_LT(r.plan.estimated_peak_bytes, fast.estimated_peak_bytes);
  std::cout << r.note << "\n";
  EXPECT_LT(test::rel_l2(r.out, naive), 2e-2);

  // Too little for any plan: OutOfMemory, naming what was needed.
  cap(least / 2);
  try {
    exec::run_planned_retrying(inst.model, *inst.weights, inst.inputs, fast, reg, dev, d);
    ADD_FAILURE() << "ran with less memory than its smallest peak";
  } catch (const exec::OutOfMemory& e) {
    std::cout << e.what() << "\n";
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos);
  }
  cca::setMemoryFraction(1.0, d.index());
}

}  // namespace
#endif
