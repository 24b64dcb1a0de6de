// Weight residency: the planner's arithmetic (plan/residency.hpp) and streamed weights
// (exec/residency/streamed.hpp) against every weight resident, exactly.
#include <gtest/gtest.h>

#include <numeric>

#include "exec/device/device.hpp"
#include "exec/registry.hpp"
#include "exec/residency/streamed.hpp"
#include "models/builder.hpp"
#include "plan/budget.hpp"
#include "plan/residency.hpp"
#include "test_util.hpp"

namespace {

using namespace sp;

TEST(Residency, CopiesHiddenBehindComputeTwoSlots) {
  // Four streamed blocks of 10 ms, copies of 5 ms, two slots: every copy but the first of the
  // first call overlaps a block, and in steady state a call takes its compute alone.
  const std::vector<double> ms(4, 10.0), copy(4, 5.0);
  EXPECT_DOUBLE_EQ(plan::streamed_call_ms(ms, std::vector<bool>(4, true), 2, copy, 0.0, true), 40.0);
}

TEST(Residency, CopyBoundWhenCopiesOutweighCompute) {
  // Copies of 20 ms against blocks of 10 ms run back to back: a call takes the copies' time.
  const std::vector<double> ms(4, 10.0), copy(4, 20.0);
  EXPECT_DOUBLE_EQ(plan::streamed_call_ms(ms, std::vector<bool>(4, true), 2, copy, 0.0, true), 80.0);
}

TEST(Residency, OneSlotWaitsForItsBlock) {
  // One slot: a load starts when the block before finished, so blocks and copies alternate:
  // 4 x (5 + 10). The 2 ms before the blocks (embedding) run while the first load copies.
  const std::vector<double> ms(4, 10.0), copy(4, 5.0);
  EXPECT_DOUBLE_EQ(plan::streamed_call_ms(ms, std::vector<bool>(4, true), 1, copy, 2.0, true), 60.0);
}

TEST(Residency, KeptBlocksHideTheCopiesOfStreamedOnes) {
  // Blocks 0 and 2 streamed through one slot, 1 and 3 kept: each copy runs while a kept block
  // computes, so a call takes its compute alone.
  const std::vector<double> ms(4, 10.0), copy(4, 10.0);
  EXPECT_DOUBLE_EQ(plan::streamed_call_ms(ms, {true, false, true, false}, 1, copy, 0.0, true), 40.0);
}

TEST(Residency, WithoutOverlapCopiesAddUp) {
  const std::vector<double> ms(4, 10.0), copy(4, 3.0);
  EXPECT_DOUBLE_EQ(plan::streamed_call_ms(ms, {true, false, true, true}, 2, copy, 1.0, false), 50.0);
  EXPECT_DOUBLE_EQ(plan::streamed_call_ms(ms, std::vector<bool>(4, false), 0, copy, 1.0, true), 41.0);
}

TEST(Residency, KeptPatternSpreadsTheKeptBlocks) {
  const std::vector<bool> k = plan::kept_pattern(10, 3);
  EXPECT_EQ(std::count(k.begin(), k.end(), true), 3);
  EXPECT_TRUE(k[1] && k[5] && k[8]);
  const std::vector<bool> none = plan::kept_pattern(5, 0);
  EXPECT_EQ(std::count(none.begin(), none.end(), true), 0);
  const std::vector<bool> all = plan::kept_pattern(5, 5);
  EXPECT_EQ(std::count(all.begin(), all.end(), true), 5);
}

// A model of `layers` blocks on the CPU, one block's weights in int8 (scales beside them).
models::Instance instance(const contracts::Registry& reg, int layers, const std::string& format = "dense") {
  models::ModelConfig c = models::demo_config();
  c.dim = 48;
  c.heads = c.kv_heads = 3;
  c.head_dim = 16;
  c.rotary_dim = 12;
  c.hidden = 96;
  c.layers = layers;
  c.format = format;
  c.segments = {{"text", 7}, {"video", 53}};
  c.video_t = c.video_h = c.video_w = 0;
  return models::instantiate(c, reg, at::kCPU);
}

contracts::DeviceCaps cpu_caps() {
  contracts::DeviceCaps dev = exec::describe_device(at::Device(at::kCPU));
  dev.rates.host_bytes_per_s = 1e9;  // fixed rates: the arithmetic below does not depend on a probe
  return dev;
}

TEST(Residency, PlannerKeepsAsManyBlocksAsFitAndStaysWithinTheDeviceMemory) {
  const auto reg = exec::builtin_registry();
  const auto dev = cpu_caps();
  const auto inst = instance(reg, 6);
  plan::ResidencyRequest rq = exec::residency_request(inst.model, *inst.weights, inst.inputs, reg, dev);
  ASSERT_EQ(rq.block_bytes.size(), 6u);
  for (int64_t b : rq.block_bytes) EXPECT_GT(b, 0);
  const int64_t all = std::accumulate(rq.block_bytes.begin(), rq.block_bytes.end(), int64_t{0});

  // Plenty of memory: every weight resident, nothing streams.
  rq.device_memory = int64_t{1} << 34;
  const plan::ResidentPlan roomy = plan::plan_with_residency(inst.model, reg, dev, {}, rq);
  EXPECT_FALSE(roomy.residency.streaming());
  EXPECT_EQ(roomy.residency.kept_bytes, all);

  // Too small: the error names the smallest size that works, and that size does work.
  rq.device_memory = rq.fixed_bytes;
  int64_t smallest = 0;
  try {
    plan::plan_with_residency(inst.model, reg, dev, {}, rq);
    ADD_FAILURE() << "expected DeviceMemoryError";
  } catch (const plan::DeviceMemoryError& e) {
    smallest = e.smallest_bytes;
    EXPECT_NE(std::string(e.what()).find("smallest device memory that works is"), std::string::npos) << e.what();
  }
  ASSERT_GT(smallest, rq.fixed_bytes);
  rq.device_memory = smallest;
  const plan::ResidentPlan tight = plan::plan_with_residency(inst.model, reg, dev, {}, rq);
  EXPECT_TRUE(tight.residency.streaming());
  EXPECT_LE(tight.residency.device_bytes(), smallest);

  // Between the two: within the memory, and no further block would fit beside the others.
  rq.device_memory = rq.fixed_bytes + all / 2 + tight.residency.activation_bytes + tight.residency.slack_bytes;
  const plan::ResidentPlan half = plan::plan_with_residency(inst.model, reg, dev, {}, rq);
  const plan::Residency& r = half.residency;
  ASSERT_TRUE(r.streaming());
  EXPECT_LE(r.device_bytes(), rq.device_memory);
  EXPECT_GT(r.kept_count(), 0);
  EXPECT_GT(r.device_bytes() + rq.block_bytes.front(), rq.device_memory) << plan::explain(r);
  EXPECT_GE(r.predicted_ms, r.resident_ms);

  // A fixed count of blocks on the device.
  rq.device_memory = 0;
  rq.resident_blocks = 3;
  const plan::ResidentPlan three = plan::plan_with_residency(inst.model, reg, dev, {}, rq);
  EXPECT_EQ(three.residency.resident_blocks(), 3);
  EXPECT_TRUE(three.residency.streaming());
}

// The planned (and naive) output with the blocks of `r` streamed equals the all-resident one
// bit for bit, on two calls in a row (the second starts from the previous call's prefetch).
void expect_streamed_equal(const models::Instance& inst, const contracts::Registry& reg,
                           const contracts::DeviceCaps& dev, const plan::Residency& r, const plan::Plan& p) {
  const at::Tensor ref = exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, dev);
  const at::Tensor naive_ref = exec::run_naive(inst.model, *inst.weights, inst.inputs, reg);
  auto copy = std::make_shared<exec::TensorWeights>(*inst.weights);  // the instance keeps its own
  exec::StreamedWeights w(inst.model, copy, r, reg, at::kCPU);
  EXPECT_GT(w.host_bytes(), 0);
  for (int call = 0; call < 2; ++call) {
    EXPECT_TRUE(at::equal(exec::run_planned(inst.model, p, w, inst.inputs, reg, dev), ref)) << "call " << call;
    EXPECT_TRUE(at::equal(exec::run_naive(inst.model, w, inst.inputs, reg), naive_ref)) << "call " << call;
  }
  EXPECT_GE(w.loads(), int64_t(4 * r.streamed_count()));
}

TEST(Residency, StreamedOutputsEqualAllResidentExactly) {
  const auto reg = exec::builtin_registry();
  const auto dev = cpu_caps();
  for (const std::string format : {"dense", "int8-rowwise"}) {
    SCOPED_TRACE(format);
    const auto inst = instance(reg, 5, format);
    plan::Options o;
    o.token_chunk = 17;  // slabs that do not divide the 60 rows
    const plan::Plan p = plan::make_plan(inst.model, reg, dev, o);
    for (int slots : {1, 2, 3})
      for (int kept : {0, 2}) {
        SCOPED_TRACE("slots " + std::to_string(slots) + ", kept " + std::to_string(kept));
        plan::Residency r;
        r.streamed = plan::kept_pattern(5, kept);
        r.streamed.flip();
        r.slots = slots;
        expect_streamed_equal(inst, reg, dev, r, p);
      }
  }
}

TEST(Residency, StreamedWeightsRecoverFromARunThatStoppedHalfWay) {
  const auto reg = exec::builtin_registry();
  const auto dev = cpu_caps();
  const auto inst = instance(reg, 4);
  const plan::Plan p = plan::make_plan(inst.model, reg, dev, {});
  const at::Tensor ref = exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, dev);
  plan::Residency r;
  r.streamed = {true, true, false, true};
  r.slots = 2;
  exec::StreamedWeights w(inst.model, std::make_shared<exec::TensorWeights>(*inst.weights), r, reg, at::kCPU);
  // A block's weights outside its work are an error, not a stale slot.
  const auto names = exec::block_tensors(inst.model, *inst.weights, reg);
  ASSERT_FALSE(names[1].empty());
  EXPECT_THROW(w.tensor(names[1].front()), std::logic_error);
  // A run abandoned inside block 1, then a whole run.
  w.begin_block(0);
  w.end_block(0);
  w.begin_block(1);
  EXPECT_NO_THROW(w.tensor(names[1].front()));
  EXPECT_TRUE(at::equal(exec::run_planned(inst.model, p, w, inst.inputs, reg, dev), ref));
}

TEST(Residency, RestoreBringsEveryWeightBack) {
  const auto reg = exec::builtin_registry();
  const auto dev = cpu_caps();
  const auto inst = instance(reg, 3, "int8-rowwise");
  auto weights = std::make_shared<exec::TensorWeights>(*inst.weights);
  const size_t count = weights->all().size();
  plan::Residency r;
  r.streamed = {true, true, true};
  r.slots = 1;
  {
    exec::StreamedWeights w(inst.model, weights, r, reg, at::kCPU);
    EXPECT_LT(weights->all().size(), count);  // the streamed tensors left, scales included
    w.restore();
  }
  ASSERT_EQ(weights->all().size(), count);
  for (const auto& [name, t] : inst.weights->all()) EXPECT_TRUE(at::equal(weights->tensor(name), t)) << name;
}

// On a GPU: loads on the side stream, ordered by events, give the same output bit for bit.
TEST(GpuResidency, StreamedOutputsEqualAllResidentOnTheDevice) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device("cuda");
  const auto dev = exec::describe_device(d);
  models::ModelConfig c = models::demo_config();
  c.layers = 6;
  c.dtype = ir::DType::BF16;
  c.segments = {{"text", 77}, {"video", 1901}};
  c.video_t = c.video_h = c.video_w = 0;
  const auto inst = models::instantiate(c, reg, d);
  const plan::Plan p = plan::make_plan(inst.model, reg, dev, {});
  const at::Tensor ref = exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, dev);
  for (int slots : {1, 2}) {
    plan::Residency r;
    r.streamed = {true, true, false, true, true, true};
    r.slots = slots;
    exec::StreamedWeights w(inst.model, std::make_shared<exec::TensorWeights>(*inst.weights), r, reg, d);
    for (int call = 0; call < 3; ++call)
      EXPECT_TRUE(at::equal(exec::run_planned(inst.model, p, w, inst.inputs, reg, dev), ref))
          << "slots " << slots << ", call " << call;
  }
}

// The cap is real: beyond it an allocation is an out-of-memory error; lifted afterwards.
TEST(GpuResidency, DeviceMemoryCapRefusesWhatExceedsIt) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const at::Device d = exec::pick_device("cuda");
  const auto opts = at::TensorOptions().dtype(at::kByte).device(d);
  {
    const auto cap = exec::cap_device_memory(d, int64_t{1} << 30);
    at::Tensor fits = at::empty({int64_t{256} << 20}, opts);
    EXPECT_THROW(at::empty({int64_t{2} << 30}, opts), c10::OutOfMemoryError);
  }
  EXPECT_NO_THROW(at::empty({int64_t{2} << 30}, opts));
}

}  // namespace
