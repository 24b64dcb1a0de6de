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

TEST(Residency, PrologueWeightsAreKeptWhereTheyFitAndCopiedOnEachCallWhereTheyDoNot) {
  // Weights only the prologue reads (a host's per-call modulation projections), 3 blocks' worth.
  const auto reg = exec::builtin_registry();
  const auto dev = cpu_caps();
  const auto inst = instance(reg, 6);
  plan::ResidencyRequest rq = exec::residency_request(inst.model, *inst.weights, inst.inputs, reg, dev);
  const int64_t all = std::accumulate(rq.block_bytes.begin(), rq.block_bytes.end(), int64_t{0});
  const int64_t fixed = rq.fixed_bytes;
  rq.prologue_bytes = all / 2;
  rq.prologue_peak_bytes = rq.block_bytes.front();

  rq.device_memory = int64_t{1} << 34;  // room for everything: kept, no copy
  const plan::Residency roomy = plan::plan_with_residency(inst.model, reg, dev, {}, rq).residency;
  EXPECT_FALSE(roomy.prologue_copied);
  EXPECT_FALSE(roomy.streaming());
  EXPECT_EQ(roomy.fixed_bytes, fixed + rq.prologue_bytes);
  EXPECT_NE(plan::explain(roomy).find("kept on the device"), std::string::npos) << plan::explain(roomy);

  // Below what keeping them needs with a single block on the device: copied on each call, their
  // copy time in the prediction, their largest on the device while the prologue reads it.
  plan::ResidencyRequest kept_only = rq;
  kept_only.fixed_bytes += rq.prologue_bytes;
  kept_only.prologue_bytes = kept_only.prologue_peak_bytes = 0;
  int64_t kept_smallest = 0;
  try {
    kept_only.device_memory = 1;
    plan::plan_with_residency(inst.model, reg, dev, {}, kept_only);
  } catch (const plan::DeviceMemoryError& e) {
    kept_smallest = e.smallest_bytes;
  }
  ASSERT_GT(kept_smallest, 0);
  rq.device_memory = kept_smallest - 1;
  const plan::Residency tight = plan::plan_with_residency(inst.model, reg, dev, {}, rq).residency;
  EXPECT_TRUE(tight.prologue_copied);
  EXPECT_EQ(tight.fixed_bytes, fixed);
  EXPECT_LE(tight.device_bytes(), rq.device_memory);
  EXPECT_GE(tight.activation_bytes, rq.prologue_peak_bytes);
  const double copy_ms = 1e3 * double(rq.prologue_bytes) / dev.rates.host_bytes_per_s;
  EXPECT_GE(tight.copy_ms, copy_ms);
  EXPECT_GE(tight.predicted_ms, tight.resident_ms + copy_ms * 0.999);
  EXPECT_NE(plan::explain(tight).find("copied to the device as the prologue reads them"), std::string::npos)
      << plan::explain(tight);

  // The smallest size named counts the prologue's largest weight, not all of them.
  rq.device_memory = 1;
  try {
    plan::plan_with_residency(inst.model, reg, dev, {}, rq);
    ADD_FAILURE() << "expected DeviceMemoryError";
  } catch (const plan::DeviceMemoryError& e) {
    EXPECT_LT(e.smallest_bytes, kept_smallest);
    rq.device_memory = e.smallest_bytes;
  }
  EXPECT_TRUE(plan::plan_with_residency(inst.model, reg, dev, {}, rq).residency.prologue_copied);
}

// A sequence-parallel split of 2 ranks: replicated, host-streamed and sharded arrangements are
// weighed by their predicted time; the chosen one fits, its shares are what ShardedWeights keeps,
// and the reasons are printed.
TEST(Residency, SplitRunsWeighReplicatedAndShardedWeights) {
  const auto reg = exec::builtin_registry();
  auto dev = cpu_caps();
  const auto inst = instance(reg, 6);
  plan::Options opt;
  opt.sequence = {0, 2, plan::SeqMode::Ulysses};
  plan::ResidencyRequest rq = exec::residency_request(inst.model, *inst.weights, inst.inputs, reg, dev);
  const int64_t all = std::accumulate(rq.block_bytes.begin(), rq.block_bytes.end(), int64_t{0});
  const int64_t largest = *std::max_element(rq.block_bytes.begin(), rq.block_bytes.end());

  // No limit: every block whole on each rank, the other arrangements slower or equal.
  const plan::ResidentPlan roomy = plan::plan_with_residency(inst.model, reg, dev, opt, rq);
  EXPECT_FALSE(roomy.residency.streaming());
  EXPECT_FALSE(roomy.plan.sequence.sharded);
  EXPECT_NE(roomy.residency.why.find("replicated, every block on each rank: "), std::string::npos) << roomy.residency.why;
  EXPECT_NE(roomy.residency.why.find(", taken"), std::string::npos) << roomy.residency.why;

  // Sharded on request, no limit: every block sharded; this rank's shares as ShardedWeights
  // packs them, two slots of the largest.
  rq.split = plan::WeightSplit::Sharded;
  const plan::ResidentPlan all_sharded = plan::plan_with_residency(inst.model, reg, dev, opt, rq);
  const plan::Residency& s = all_sharded.residency;
  ASSERT_TRUE(s.sharded);
  EXPECT_TRUE(all_sharded.plan.sequence.sharded);
  EXPECT_EQ(s.kept_count(), 0);
  EXPECT_EQ(s.slots, 2);
  int64_t shares = 0;
  for (int64_t b : rq.block_bytes) shares += plan::shard_of(b, 2);
  EXPECT_EQ(s.shard_bytes, shares);
  EXPECT_GE(2 * s.shard_bytes, all);
  EXPECT_EQ(s.slot_bytes, 2 * plan::shard_of(largest, 2));
  EXPECT_NE(plan::explain(s).find("sharded over 2 ranks"), std::string::npos) << plan::explain(s);
  EXPECT_NE(s.why.find("replicated, every block on each rank: excluded by the request"), std::string::npos) << s.why;

  // Between sharded and replicated: room for about 5.5 of the 6 blocks. With a slow host and a
  // fast link, sharded (blocks kept whole where they fit); with a fast host and a slow link, the
  // blocks stream from host memory.
  rq.split = plan::WeightSplit::Auto;
  const int64_t rest = roomy.residency.fixed_bytes + roomy.residency.activation_bytes + roomy.residency.slack_bytes;
  rq.device_memory = rest + s.shard_bytes + 2 * s.slot_bytes + largest / 2;  // below every block resident
  ASSERT_LT(rq.device_memory, roomy.residency.device_bytes());
  dev.rates.host_bytes_per_s = 1e3;
  dev.rates.link_bytes_per_s = 1e12;
  const plan::ResidentPlan fast_link = plan::plan_with_residency(inst.model, reg, dev, opt, rq);
  const plan::Residency& f = fast_link.residency;
  ASSERT_TRUE(f.sharded) << plan::explain(f);
  EXPECT_TRUE(fast_link.plan.sequence.sharded);
  EXPECT_LE(f.device_bytes(), rq.device_memory);
  EXPECT_GT(f.kept_count(), 0) << plan::explain(f);
  EXPECT_NE(f.why.find("over the device memory"), std::string::npos) << f.why;
  EXPECT_NE(f.why.find("sharded over the ranks: "), std::string::npos) << f.why;
  EXPECT_NE(plan::explain(f).find("gathers per call"), std::string::npos) << plan::explain(f);

  dev.rates.host_bytes_per_s = 1e12;
  dev.rates.link_bytes_per_s = 1e3;
  const plan::Residency slow_link = plan::plan_with_residency(inst.model, reg, dev, opt, rq).residency;
  EXPECT_FALSE(slow_link.sharded) << plan::explain(slow_link);
  EXPECT_TRUE(slow_link.streaming());
  EXPECT_LE(slow_link.device_bytes(), rq.device_memory);

  // Replicated on request: never sharded, however fast the link.
  dev.rates.host_bytes_per_s = 1e3;
  dev.rates.link_bytes_per_s = 1e12;
  rq.split = plan::WeightSplit::Replicated;
  EXPECT_FALSE(plan::plan_with_residency(inst.model, reg, dev, opt, rq).residency.sharded);

  // Below every arrangement: the smallest named is the sharded one where it is the smaller,
  // and it works.
  rq.split = plan::WeightSplit::Sharded;
  rq.device_memory = rq.fixed_bytes;
  try {
    plan::plan_with_residency(inst.model, reg, dev, opt, rq);
    ADD_FAILURE() << "expected DeviceMemoryError";
  } catch (const plan::DeviceMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("with the weights sharded over 2 ranks"), std::string::npos) << e.what();
    rq.device_memory = e.smallest_bytes;
  }
  EXPECT_TRUE(plan::plan_with_residency(inst.model, reg, dev, opt, rq).residency.sharded);

  // One rank cannot shard.
  EXPECT_THROW(plan::plan_with_residency(inst.model, reg, dev, {}, rq), plan::PlanError);
}

// The planned (and naive) output with the blocks of `r` streamed equals the all-resident one
// bit for bit, on two calls in a row (the second starts from the previous call's prefetch).
// In place, the blocks load from the weights' own tensors, with no host buffer of its own.
void expect_streamed_equal(const models::Instance& inst, const contracts::Registry& reg,
                           const contracts::DeviceCaps& dev, const plan::Residency& r, const plan::Plan& p,
                           bool in_place = false) {
  const at::Tensor ref = exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, dev);
  const at::Tensor naive_ref = exec::run_naive(inst.model, *inst.weights, inst.inputs, reg);
  auto copy = std::make_shared<exec::TensorWeights>(*inst.weights);  // the instance keeps its own
  exec::StreamedWeights w(inst.model, copy, r, reg, at::kCPU, exec::Prologue::Host, in_place);
  EXPECT_EQ(w.host_bytes() > 0, !in_place);
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
        expect_streamed_equal(inst, reg, dev, r, p, /*in_place=*/true);
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

// A bf16 demo model of `layers` blocks on the GPU `d`.
models::Instance gpu_instance(const contracts::Registry& reg, const at::Device& d, int layers, int64_t video) {
  models::ModelConfig c = models::demo_config();
  c.layers = layers;
  c.dtype = ir::DType::BF16;
  c.segments = {{"text", 77}, {"video", video}};
  c.video_t = c.video_h = c.video_w = 0;
  return models::instantiate(c, reg, d);
}

// On a GPU: loads on the side stream, ordered by events, give the same output bit for bit.
TEST(GpuResidency, StreamedOutputsEqualAllResidentOnTheDevice) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device("cuda");
  const auto dev = exec::describe_device(d);
  const auto inst = gpu_instance(reg, d, 6, 1901);
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

// A host that put part of the weights on the device itself (ComfyUI's partial loading): those
// are read where they are and count in no block's bytes; the others stream from host memory in
// place; the output is the all-resident one bit for bit.
TEST(GpuResidency, InPlaceReadsWhatTheHostPutOnTheDevice) {
  if (!test::have_cuda()) GTEST_SKIP() << "no CUDA device";
  const auto reg = exec::builtin_registry();
  const at::Device d = exec::pick_device("cuda");
  const auto dev = exec::describe_device(d);
  const auto inst = gpu_instance(reg, d, 4, 901);
  const plan::Plan p = plan::make_plan(inst.model, reg, dev, {});
  const at::Tensor ref = exec::run_planned(inst.model, p, *inst.weights, inst.inputs, reg, dev);
  // Every other tensor of each block in host memory (pinned, as a host pins what it offloads),
  // and the whole of block 2; the rest stays on the device.
  const auto names = exec::block_tensors(inst.model, *inst.weights, reg);
  auto mixed = std::make_shared<exec::TensorWeights>(*inst.weights);
  for (size_t b = 0; b < names.size(); ++b)
    for (size_t i = 0; i < names[b].size(); ++i)
      if (b == 2 || i % 2 == 0) mixed->add(names[b][i], mixed->take(names[b][i]).to(at::kCPU).pin_memory());
  const auto all_host = exec::residency_request(inst.model, *inst.weights, {}, reg, dev);
  const auto rq = exec::residency_request(inst.model, *mixed, {}, reg, dev, exec::Prologue::Host, d);
  for (size_t b = 0; b < names.size(); ++b) {
    EXPECT_GT(rq.block_bytes[b], 0);
    if (b == 2) EXPECT_EQ(rq.block_bytes[b], all_host.block_bytes[b]);
    else EXPECT_LT(rq.block_bytes[b], all_host.block_bytes[b]);
  }
  const at::Tensor held = mixed->tensor(names[0][1]);  // on the device: read in place
  plan::Residency r;
  r.streamed = {true, true, false, true};
  r.slots = 2;
  exec::StreamedWeights w(inst.model, mixed, r, reg, d, exec::Prologue::Host, /*in_place=*/true);
  EXPECT_EQ(w.host_bytes(), 0);
  for (int call = 0; call < 3; ++call)
    EXPECT_TRUE(at::equal(exec::run_planned(inst.model, p, w, inst.inputs, reg, dev), ref)) << "call " << call;
  EXPECT_EQ(mixed->tensor(names[0][1]).data_ptr(), held.data_ptr());
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
