// Host integration (src/host): a module's own tensors in the diffusers layout serve as the
// weights without copies, and an attached planner computes what the canonical weights do.
#include <gtest/gtest.h>

#include "exec/registry.hpp"
#include "host/attached.hpp"
#include "host/slab_positions.hpp"
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

TEST_F(Flux, SlabPositionsFollowTheSublayersOfTheConsumer) {
  auto w = std::make_shared<exec::TensorWeights>(&reg);
  for (const auto& [name, t] : canonical) w->add(name, t);
  const auto fr = models::prepare(config, *w, models::random_raw_inputs(config, {.tokens = 20, .text_tokens = 5}, 1),
                                  ir::DType::F32, "sdpa");
  host::SlabPositions pos("sdpa");
  pos.reset(fr.model);  // 1 double + 2 single blocks, 25 query rows each
  for (int64_t layer = 0; layer < 3; ++layer) {
    const auto a = pos.next(16), b = pos.next(9);
    EXPECT_EQ(a.layer, layer);
    EXPECT_EQ(a.q_start, 0);
    EXPECT_EQ(b.q_start, 16);
    EXPECT_EQ(b.q_total, 25);
  }
  pos.finish();
  EXPECT_THROW(pos.next(1), std::logic_error);
  pos.reset(fr.model);
  pos.next(20);
  EXPECT_THROW(pos.next(10), std::logic_error);  // past the sublayer's 25 rows
  EXPECT_THROW(pos.finish(), std::logic_error);
  host::SlabPositions other("math");
  other.reset(fr.model);
  other.finish();  // no sublayer uses it
}

}  // namespace
