// GPU runs (skipped without a CUDA device): planned vs naive in bf16 and fp16, and the
// estimate against the caching allocator's peak.
#include <gtest/gtest.h>

#include <random>

#include "exec/device.hpp"
#include "models/builder.hpp"
#include "report/report.hpp"
#include "test_util.hpp"

namespace {

using namespace sp;

bool have_cuda() {
  try {
    return exec::pick_device("auto").is_cuda();
  } catch (const std::exception&) {
    return false;
  }
}

TEST(Gpu, ReducedPrecisionPlannedWithinTwiceNaiveErrorAndEstimateWithinFivePercent) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto reg = contracts::Registry::builtin();
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
    EXPECT_LE(std::abs(double(r.estimated_peak_bytes - r.planned.peak_bytes)), 0.05 * double(r.planned.peak_bytes));
    EXPECT_LT(r.planned.peak_bytes, r.naive->peak_bytes);
  }
}

}  // namespace
