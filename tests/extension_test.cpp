// Extension: a consumer and a weight format defined, registered and used in this file
// alone. The planner, the cost model, the arena and the executor handle them through their
// registrations, with no other file knowing of them.
#include <gtest/gtest.h>

#include "exec/consumers/consumer.hpp"
#include "exec/device/device.hpp"
#include "exec/device/memory.hpp"
#include "exec/formats/weights.hpp"
#include "exec/registry.hpp"
#include "exec/run/executor.hpp"
#include "models/builder.hpp"
#include "plan/arena.hpp"
#include "plan/cost.hpp"
#include "plan/program.hpp"
#include "report/report.hpp"
#include "test_util.hpp"

namespace {

using namespace sp;

// softmax(q k^T s) v written out: the scores, their softmax, then the output, all in q's dtype.
struct ScoresConsumer : exec::ConsumerImpl {
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) const override {
    return at::matmul(at::softmax(at::matmul(q, k.transpose(-2, -1)).mul_(scale), -1), v);
  }
};

contracts::ConsumerCaps scores_consumer() {
  contracts::ConsumerCaps c;
  c.name = "toy-scores";
  c.description = "explicit scores in the activation dtype; Q slabs aligned to 16 rows";
  c.accepts_bounded_q = c.requires_global_k = c.requires_global_v = c.slab_output = contracts::Cap::Yes;
  c.dtypes = {ir::DType::F32};
  c.q_align = 16;
  // Scores and their softmax live together while the output is written.
  c.call_bytes = [](const contracts::AttnShape& s) {
    const int64_t esz = static_cast<int64_t>(ir::dtype_size(s.dtype));
    return 2 * s.heads * s.q_rows * s.kv_rows * esz + s.heads * s.q_rows * s.head_dim * esz;
  };
  c.impl = std::make_shared<ScoresConsumer>();
  return c;
}

// Weights stored in fp16 whatever the model computes in; an acquire converts the slice.
struct HalfStored : exec::FormatImpl {
  void store(exec::TensorWeights& into, const ir::Linear& l, const at::Tensor& w, at::ScalarType) const override {
    into.add(l.weight, w.to(at::kHalf));
  }
  at::Tensor acquire(const exec::WeightSource& src, const ir::Linear& l, exec::Slice rows, exec::Slice cols,
                     at::ScalarType dtype, const at::Tensor& out) const override {
    return exec::converted(exec::stored_slice(src, l, rows, cols), dtype, out);
  }
};

contracts::FormatCaps half_format() {
  contracts::FormatCaps f;
  f.name = "toy-half";
  f.description = "fp16 storage, converted per acquired slice";
  f.storage = ir::DType::F16;
  f.dense = false;
  f.out_slicing = f.in_slicing = f.held_execution = contracts::Cap::Yes;
  f.in_align = 32;
  f.impl = std::make_shared<HalfStored>();
  return f;
}

contracts::Registry extended() {
  contracts::Registry reg = exec::builtin_registry();
  reg.add(scores_consumer());
  reg.add(half_format());
  return reg;
}

TEST(Extension, ToyConsumerAndFormatArePlannedCostedPlacedAndRun) {
  const auto reg = extended();
  const auto dev = exec::describe_device(at::Device(at::kCPU));
  auto cfg = models::demo_config();
  cfg.layers = 1;
  models::set_total_tokens(cfg, 777);
  cfg.consumer = "toy-scores";
  cfg.format = "toy-half";
  const auto inst = models::instantiate(cfg, reg, at::kCPU);
  EXPECT_EQ(inst.weights->tensor(std::get<ir::Attention>(inst.model.blocks[0].sublayers[0].body).proj.q_linear().weight)
                .scalar_type(),
            at::kHalf);

  const plan::Plan p = plan::make_plan(inst.model, reg, dev, {.token_chunk = 100, .feature_slice = 64});
  const plan::SublayerPlan& a = p.blocks[0].sublayers[0];
  EXPECT_TRUE(a.chosen(legality::Transform::GlobalKvStreamedQ));
  EXPECT_EQ(a.q_chunk, 112);  // the consumer's alignment
  EXPECT_TRUE(p.blocks[0].sublayers[1].chosen(legality::Transform::FeatureSlicedMlp));

  // The program names the consumer and converts the format's slices into placed buffers.
  const plan::Program prog = plan::compile_sublayer(inst.model, inst.model.blocks[0], inst.model.blocks[0].sublayers[0], a, reg, dev);
  int attends = 0, converted = 0;
  for (const auto& s : prog.steps) {
    if (const auto* at = std::get_if<plan::AttendStep>(&s.body)) {
      ++attends;
      EXPECT_EQ(at->consumer, "toy-scores");
      EXPECT_GT(s.transient, 2 * 112 * 777 * 4);  // the declared scores of a Q slab
    }
    if (const auto* acq = std::get_if<plan::AcquireStep>(&s.body)) {
      EXPECT_FALSE(prog.buffers[size_t(acq->out)].view);
      EXPECT_GT(s.terms.bytes, 0);
      ++converted;
    }
  }
  EXPECT_GE(attends, 2);  // one per run of equal Q slabs (size, segment pieces)
  EXPECT_GT(converted, 0);
  const plan::Placement pl = plan::place(prog, dev);
  EXPECT_GT(pl.arena_bytes, 0);
  EXPECT_GT(plan::program_cost(prog, dev).seconds, 0);

  // Run: planned equals naive, and the estimate equals the measured peak.
  const auto r = report::compare(inst, p, reg, dev, {true, false});
  EXPECT_LE(*r.rel_l2, 1e-5);
  EXPECT_EQ(r.estimated_peak_bytes, r.planned.peak_bytes);
}

// A format whose input slices align to 32 is a legality fact the planner reads: a feature
// slice of 48 is refused, naming the alignment.
TEST(Extension, ToyFormatAlignmentIsLegality) {
  const auto reg = extended();
  const auto dev = exec::describe_device(at::Device(at::kCPU));
  auto cfg = models::demo_config();
  cfg.layers = 1;
  cfg.format = "toy-half";
  const ir::Model m = models::build_ir(cfg);
  try {
    plan::make_plan(m, reg, dev, {.token_chunk = 100, .feature_slice = 48});
    ADD_FAILURE() << "feature slice 48 accepted with alignment 32";
  } catch (const plan::PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("alignment 32"), std::string::npos) << e.what();
  }
}

}  // namespace
