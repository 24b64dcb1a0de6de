// Host integration (src/host): a module's own tensors in the diffusers layout serve as the
// weights without copies, and an attached planner computes what the canonical weights do.
#include <gtest/gtest.h>

#include "exec/consumers/consumer.hpp"
#include "exec/registry.hpp"
#include "host/attached.hpp"
#include "models/checkpoint.hpp"
#include "models/families.hpp"
#include "report/report.hpp"

namespace {

using namespace sp;

// The tensors of `layout` for `config`, cut from the canonical weights as a module holds them.
host::NamedTensors module_tensors(const recognize::FamilyConfig& config, const std::string& layout,
                                  const std::map<std::string, at::Tensor>& canonical) {
  const auto originals = recognize::checkpoint_tensors(config, "original");
  std::map<std::string, std::vector<int64_t>> canonical_shape;
  for (const auto& o : originals) canonical_shape[o.name] = o.shape;
  host::NamedTensors out;
  for (const auto& spec : recognize::checkpoint_tensors(config, layout)) {
    at::Tensor t = canonical.at(spec.canonical).reshape(canonical_shape.at(spec.canonical));
    if (spec.op == recognize::Source::Op::Concat0) t = t.narrow(0, spec.row_offset, spec.shape.at(0));
    if (spec.op == recognize::Source::Op::SwapHalves0) t = at::cat({t.chunk(2, 0)[1], t.chunk(2, 0)[0]}, 0);
    out.emplace_back(spec.name, t.reshape(spec.shape).clone());
  }
  return out;
}

const at::Tensor& named(const host::NamedTensors& t, const std::string& name) {
  for (const auto& [n, x] : t)
    if (n == name) return x;
  throw std::out_of_range(name);
}

struct Flux : ::testing::Test {
  recognize::FamilyConfig config = recognize::preset("flux1-dev", 1, true);
  std::map<std::string, at::Tensor> canonical = models::random_canonical(config, 7);
  host::NamedTensors tensors = module_tensors(config, "diffusers", canonical);
  contracts::Registry reg = exec::builtin_registry();
};

TEST_F(Flux, RecognizesTheModuleAndAcquiresViewsOfItsTensors) {
  const auto rec = host::recognize_module(tensors, recognize::sidecar_for(config));
  EXPECT_EQ(rec.layout, "diffusers");
  host::ModuleWeights w(tensors, rec, &reg, ir::DType::F32);
  const int64_t dim = config.dim;
  ir::Linear qkv;
  qkv.weight = "double_blocks.0.img_attn.qkv.weight";
  qkv.in_features = dim;
  qkv.out_features = 3 * dim;
  // Each region is one module tensor: a view of it.
  const at::Tensor k = w.acquire(qkv, {dim, dim}, {}, at::kFloat);
  EXPECT_EQ(k.data_ptr(), named(tensors, "transformer_blocks.0.attn.to_k.weight").data_ptr());
  const at::Tensor v_rows = w.acquire(qkv, {2 * dim + 3, 5}, {2, 7}, at::kFloat);
  EXPECT_TRUE(v_rows.is_alias_of(named(tensors, "transformer_blocks.0.attn.to_v.weight")));
  EXPECT_TRUE(at::equal(v_rows, canonical.at(qkv.weight).slice(0, 2 * dim + 3, 2 * dim + 8).slice(1, 2, 9)));
  // Rows across parts, strided: assembled, into the placed buffer when there is one.
  const exec::Slice across{dim - 3, 9, 2};
  const at::Tensor expect = exec::slice(canonical.at(qkv.weight), 0, across);
  EXPECT_TRUE(at::equal(w.acquire(qkv, across, {}, at::kFloat), expect));
  at::Tensor out = at::empty({9, dim});
  EXPECT_EQ(w.acquire(qkv, across, {}, at::kFloat, out).data_ptr(), out.data_ptr());
  EXPECT_TRUE(at::equal(out, expect));
  // Whole tensors the module does not hold as such are copies, listed and refreshed.
  const std::string bias = "double_blocks.0.img_attn.qkv.bias";
  EXPECT_TRUE(at::equal(w.tensor(bias), canonical.at(bias)));
  ASSERT_EQ(w.copies().size(), 1u);
  EXPECT_EQ(w.copies()[0].name, bias);
  named(tensors, "transformer_blocks.0.attn.to_v.bias").mul_(2);
  w.refresh();
  EXPECT_TRUE(at::equal(w.tensor(bias).narrow(0, 2 * dim, dim), canonical.at(bias).narrow(0, 2 * dim, dim) * 2));
  EXPECT_EQ(w.storage().count(bias), 0u);
  EXPECT_EQ(w.storage().at(qkv.weight).size(), 3u);
}

TEST_F(Flux, AttachedRunsWhatTheCanonicalWeightsCompute) {
  host::AttachOptions o;
  o.token_chunk = 16;
  host::Attached a(tensors, recognize::sidecar_for(config), o, reg);
  EXPECT_EQ(a.dtype(), ir::DType::F32);
  const auto raw = models::random_raw_inputs(config, {.tokens = 40, .text_tokens = 9}, 3);
  const at::Tensor out = a.forward(raw);

  auto w = std::make_shared<exec::TensorWeights>(&reg);
  for (const auto& [name, t] : canonical) w->add(name, t);
  auto fr = models::prepare(config, *w, raw, ir::DType::F32, "sdpa");
  const at::Tensor ref = fr.finish(exec::run_naive(fr.model, *w, fr.inputs, reg));
  EXPECT_LT(report::rel_l2(out, ref), 1e-5);

  ASSERT_NE(a.last(), nullptr);
  EXPECT_EQ(a.last()->key, "txt 9, img 40 (fp32)");
  EXPECT_EQ(a.document(*a.last())["plan"]["blocks"][0]["sublayers"][0]["token_chunk"], 16);
  a.forward(raw);
  a.forward(models::random_raw_inputs(config, {.tokens = 24, .text_tokens = 9}, 4));
  ASSERT_EQ(a.plans().size(), 2u);
  EXPECT_EQ(a.plans()[0]->calls, 2);
}

TEST_F(Flux, BadOptionsAndModulesNameWhatIsWrong) {
  host::AttachOptions o;
  o.budget = "twelve";
  EXPECT_THROW(host::Attached(tensors, {}, o, reg), std::invalid_argument);
  o.budget = "";
  o.consumer = "nonesuch";
  EXPECT_THROW(host::Attached(tensors, {}, o, reg), contracts::ContractError);
  host::NamedTensors extra = tensors;
  extra.emplace_back("stray.weight", at::zeros({2}));
  try {
    host::recognize_module(extra, {});
    FAIL() << "recognized a module with a stray tensor";
  } catch (const recognize::RecognizeError& e) {
    EXPECT_NE(std::string(e.what()).find("stray.weight"), std::string::npos) << e.what();
  }
}

// A consumer that records the arguments of its calls and attends as "math" does; a cost model
// reading its work as the call's KV budget where the call routes video rows.
struct Recording : exec::ConsumerImpl {
  explicit Recording(const contracts::Registry& reg) : math(reg.consumer("math").impl) {}
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) const override {
    return dynamic_cast<const exec::ConsumerImpl&>(*math).attend(q, k, v, scale);
  }
  at::Tensor attend_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                         const contracts::AttnCall& call) const override {
    calls.push_back(call);
    rows.push_back(q.size(2));
    return attend(q, k, v, scale);
  }
  std::shared_ptr<const contracts::Impl> math;
  mutable std::vector<contracts::AttnCall> calls;
  mutable std::vector<int64_t> rows;
};

std::shared_ptr<Recording> add_recording(contracts::Registry& reg) {
  auto impl = std::make_shared<Recording>(reg);
  contracts::ConsumerCaps c = reg.consumer("math");
  c.name = "recording";
  c.impl = impl;
  c.work_fraction = [](const contracts::AttnShape& s, const contracts::AttnCall& call) {
    return call.routed(s.kv_rows) ? call.kv_budget : 1.0;
  };
  reg.add(c);
  return impl;
}

// A host's consumer learns where each call lies from the attend step: the slab's first row
// among its sublayer's query rows, their number and the block.
TEST_F(Flux, ConsumersGetTheirSlabsPlaceFromTheAttendStep) {
  const auto rec = add_recording(reg);
  host::AttachOptions o;
  o.consumer = "recording";
  o.token_chunk = 16;
  host::Attached a(tensors, recognize::sidecar_for(config), o, reg);
  a.forward(models::random_raw_inputs(config, {.tokens = 20, .text_tokens = 5}, 1));
  // 1 double + 2 single blocks, 25 query rows each, in slabs of 16 and 9.
  ASSERT_EQ(rec->calls.size(), 6u);
  for (int64_t layer = 0; layer < 3; ++layer)
    for (int64_t i = 0; i < 2; ++i) {
      const contracts::AttnCall& c = rec->calls[size_t(2 * layer + i)];
      EXPECT_EQ(c.layer, layer);
      EXPECT_EQ(c.q_begin - c.queries.begin, 16 * i);
      EXPECT_EQ(rec->rows[size_t(2 * layer + i)], i == 0 ? 16 : 9);
      EXPECT_EQ(c.queries.size(), 25);
      EXPECT_EQ(c.kv_budget, 1.0);
    }
}

// The KV budget is a plan input and part of the plan cache's key: each budget gets its own plan,
// whose estimate follows it, and its calls get that budget; a budget used before finds its plan.
TEST(AttachedWan, EachKvBudgetHasItsPlan) {
  const auto config = recognize::preset("wan2.1-1.3b", 1, true);
  const auto tensors = module_tensors(config, "diffusers", models::random_canonical(config, 5));
  contracts::Registry reg = exec::builtin_registry();
  const auto rec = add_recording(reg);
  host::AttachOptions o;
  o.consumer = "recording";
  host::Attached a(tensors, recognize::sidecar_for(config), o, reg);
  const auto raw = models::random_raw_inputs(config, {.tokens = 2048, .text_tokens = 4}, 2);
  a.forward(raw);
  EXPECT_THROW(a.set_kv_budget(0.0), std::invalid_argument);
  a.set_kv_budget(0.25);
  a.forward(raw);
  ASSERT_EQ(a.plans().size(), 2u);
  const host::GeometryPlan& dense = *a.plans()[0];
  const host::GeometryPlan& routed = *a.plans()[1];
  EXPECT_NE(dense.key, routed.key);
  EXPECT_NE(routed.key.find("kv budget 0.25"), std::string::npos) << routed.key;
  EXPECT_EQ(routed.plan.kv_budget, 0.25);
  // Never above the dense estimate. That it falls with the budget is checked under fixed device
  // caps (SparseAttention.TheKvBudgetIsAPlanInputTheAttendStepsCarry): the rates probed here
  // depend on the machine's load, and where memory bounds attention the two are equal.
  EXPECT_LE(routed.plan.estimated_ms, dense.plan.estimated_ms);
  // The self-attention calls of the second run route the video rows under 0.25.
  bool routed_call = false;
  for (size_t i = rec->calls.size() / 2; i < rec->calls.size(); ++i)
    routed_call |= rec->calls[i].kv_budget == 0.25 && rec->calls[i].video.size() > 0;
  EXPECT_TRUE(routed_call);
  a.set_kv_budget(1.0);
  a.forward(raw);
  ASSERT_EQ(a.plans().size(), 2u);
  EXPECT_EQ(a.last(), &dense);
  EXPECT_EQ(dense.calls, 2);
}

}  // namespace
