// Model families end to end: tiny random checkpoints of every family and layout are written,
// recognized and run; planned == naive, both layouts give the same output, and the plan's
// estimate matches the measured peak.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "exec/device/device.hpp"
#include "exec/registry.hpp"
#include "models/checkpoint.hpp"
#include "models/families.hpp"
#include "report/bench.hpp"
#include "report/bench_common.hpp"
#include "report/report.hpp"
#include "test_util.hpp"

namespace {

using namespace sp;

struct Loaded {
  recognize::Recognized rec;
  models::Instance inst;
  std::function<at::Tensor(const at::Tensor&)> finish;
};

Loaded load(const std::string& path, const models::Geometry& g, const contracts::Registry& reg, ir::DType dt) {
  const auto f = io::SafetensorsFile::open(path);
  Loaded l;
  l.rec = recognize::recognize(f, models::sidecar_of(f));
  auto w = models::load_canonical(f, l.rec, exec::to_aten(dt), at::kCPU, reg);
  auto run = models::prepare(l.rec.config, *w, models::random_raw_inputs(l.rec.config, g, 3), dt, "sdpa");
  l.inst = {run.model, w, run.inputs};
  l.finish = run.finish;
  return l;
}

struct Case {
  std::string variant;
  models::Geometry geom;
};

const std::vector<Case> kCases = {{"wan2.1-1.3b", {.frames = 5, .height = 48, .width = 80, .text_tokens = 9}},
                                  {"flux1-dev", {.height = 112, .width = 80, .text_tokens = 7}},
                                  {"flux1-schnell", {.height = 64, .width = 48, .text_tokens = 5}},
                                  {"avdit", {.frames = 3, .height = 96, .width = 160, .text_tokens = 11, .audio_tokens = 5}},
                                  // text as encoder states: the refiner's blocks over 29 text rows
                                  // (chunks of 13 do not divide them) and its row norm
                                  {"minimax-h3", {.frames = 3, .height = 96, .width = 128, .text_tokens = 29}}};

TEST(Families, EveryLayoutRecognizedPlannedMatchesNaiveAndLayoutsAgree) {
  const auto reg = exec::builtin_registry();
  const auto dev = exec::describe_device(at::Device(at::kCPU));
  // (std::filesystem is avoided here: libtorch exports conflicting definitions of some of it.)
  char tmpl[] = "/tmp/streamplan-families-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  std::vector<std::string> written;
  for (const auto& c : kCases) {
    const auto cfg = recognize::preset(c.variant, 2, true);
    at::Tensor first;
    for (const auto& layout : recognize::layouts(cfg.family)) {
      SCOPED_TRACE(c.variant + " " + layout);
      const std::string path = dir + "/" + c.variant + "." + layout + ".safetensors";
      models::write_random_checkpoint(cfg, layout, path, 11, at::kFloat);
      written.push_back(path);
      const Loaded l = load(path, c.geom, reg, ir::DType::F32);
      EXPECT_EQ(l.rec.layout, layout);
      EXPECT_EQ(l.rec.config.family, cfg.family);
      const at::Tensor naive = exec::run_naive(l.inst.model, *l.inst.weights, l.inst.inputs, reg);
      // Token-chunked everywhere (no feature slices): within 1e-5 of naive.
      const auto p = plan::make_plan(l.inst.model, reg, dev, {13, -1});
      const at::Tensor planned = exec::run_planned(l.inst.model, p, *l.inst.weights, l.inst.inputs, reg, dev);
      EXPECT_LE(test::rel_l2(planned, naive), 1e-5);
      // With feature slices: no worse than twice the naive error against float64.
      const auto ps = plan::make_plan(l.inst.model, reg, dev, {17, 0});
      const at::Tensor sliced = exec::run_planned(l.inst.model, ps, *l.inst.weights, l.inst.inputs, reg, dev);
      const auto ref = models::upcast_f64(l.inst, reg);
      const at::Tensor r64 = exec::run_naive(ref.model, *ref.weights, ref.inputs, reg);
      EXPECT_LE(test::rel_l2(sliced, r64), 2 * test::rel_l2(naive, r64));
      // The reference layout of the output, and the same output from every layout.
      const at::Tensor out = l.finish(planned);
      if (!first.defined()) first = out;
      else EXPECT_LE(test::rel_l2(out, first), 1e-6);
      // The estimate against the measured peak.
      const auto rep = report::compare(l.inst, p, reg, dev, {false, false});
      EXPECT_LE(std::abs(double(rep.estimated_peak_bytes - rep.planned.peak_bytes)),
                0.05 * double(rep.planned.peak_bytes))
          << "estimated " << rep.estimated_peak_bytes << " measured " << rep.planned.peak_bytes;
    }
  }
  for (const auto& p : written) std::remove(p.c_str());
  ::rmdir(dir.c_str());
}

TEST(Families, WanOutputKeepsTheLatentLayout) {
  const auto reg = exec::builtin_registry();
  const auto cfg = recognize::preset("wan2.1-1.3b", 1, true);
  const std::string path = "/tmp/streamplan-wan-layout-" + std::to_string(::getpid()) + ".safetensors";
  models::write_random_checkpoint(cfg, "original", path, 1, at::kFloat);
  const Loaded l = load(path, {.frames = 5, .height = 32, .width = 48, .text_tokens = 4}, reg, ir::DType::F32);
  const at::Tensor out = l.finish(exec::run_naive(l.inst.model, *l.inst.weights, l.inst.inputs, reg));
  EXPECT_EQ(out.sizes().vec(), (std::vector<int64_t>{cfg.out_channels, 2, 4, 6}));
  std::remove(path.c_str());
}

TEST(Families, BadInputsAreNamed) {
  const auto reg = exec::builtin_registry();
  const auto cfg = recognize::preset("flux1-dev", 1, true);
  try {
    models::random_raw_inputs(cfg, {.height = 100, .width = 64}, 0);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 16, got 100x64"), std::string::npos) << e.what();
  }
  auto raw = models::random_raw_inputs(cfg, {.height = 64, .width = 64}, 0);
  raw.erase("pooled");
  exec::TensorWeights w(&reg);
  for (const auto& [k, v] : models::random_canonical(cfg, 0)) w.add(k, v.dim() > 2 ? v.reshape({v.size(0), -1}) : v);
  try {
    models::prepare(cfg, w, raw, ir::DType::F32, "sdpa");
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'pooled' is missing"), std::string::npos) << e.what();
  }
}

// Planning a real model is quick: the 50 blocks of MiniMax H3 at 10 s of 1376x768 video (74,304
// video tokens, built on the meta device) on this CPU and on an H200-like device.
TEST(Families, FiftyBlockMiniMaxH3PlansWithinAFifthOfASecond) {
  const auto reg = exec::builtin_registry();
  report::BenchCase c;
  for (const auto& k : report::bench_cases(false))
    if (k.name == "minimax-h3-model-10s") c = k;
  const report::CaseModel cm = report::build_case(c, reg, at::Device(at::kMeta), {});
  ASSERT_GE(cm.inst.model.blocks.size(), 50u);  // and the text refiner's
  contracts::DeviceCaps h200 = exec::describe_device(at::kCPU);
  h200.name = "cuda:0 (H200-like)";
  h200.kind = contracts::DeviceKind::CUDA;
  h200.compute_units = 132;
  h200.alloc_round = 512;
  for (const auto& dev : {exec::describe_device(at::kCPU), h200}) {
    const auto t0 = std::chrono::steady_clock::now();
    const plan::Plan p = plan::make_plan(cm.inst.model, reg, dev, {});
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << dev.name << ": planned " << p.blocks.size() << " blocks in " << s << " s\n";
    EXPECT_LE(s, 0.2);
  }
}

}  // namespace
