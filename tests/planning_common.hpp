// Shared by the planning tests (planning_test.cpp, budget_planning_test.cpp): a compact
// avdit-like model builder whose knobs each test turns, a registry with test contracts, a CPU
// device, matchers for rejections, and the Legality fixture (verdicts and plans of a model).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <functional>
#include <optional>
#include <ostream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "example_patches.hpp"
#include "contracts/contracts.hpp"
#include "ir/model.hpp"
#include "legality/legality.hpp"
#include "plan/budget.hpp"
#include "plan/cost.hpp"
#include "plan/plan.hpp"
#include "exec/registry.hpp"
#include "plan/arena.hpp"
#include "plan/program.hpp"

namespace {

namespace ir = sp::ir;
namespace ct = sp::contracts;
namespace lg = sp::legality;
namespace pl = sp::plan;
using ct::Cap;
using lg::Transform;

// ---------------------------------------------------------------------------------------
// Model builder (fields in designated-initializer order)

struct Knobs {
  ir::DType dtype = ir::DType::F32;
  int64_t heads = 4, kv_heads = 4, head_dim = 32, rotary_dim = 24, hidden = 256;
  int layers = 1;
  std::string consumer = "sdpa";
  std::string qkv_format = "dense", up_format = "dense", down_format = "dense", final_format = "dense";
  std::vector<std::string> attn_patches = {}, mlp_patches = {};
  int64_t dim = 128, out_features = 16;
  std::vector<ir::Segment> segments = {{"text", 40}, {"video", 480}};
};

// bf16 with grouped-query attention: 8 query heads share 2 K/V heads.
Knobs gqa_bf16(int layers = 1) {
  return {.dtype = ir::DType::BF16, .heads = 8, .kv_heads = 2, .head_dim = 16, .rotary_dim = 12, .layers = layers};
}

ir::Linear linear(const std::string& name, int64_t in, int64_t out, const std::string& format) {
  ir::Linear l;
  l.weight = name + ".weight";
  l.in_features = in;
  l.out_features = out;
  l.format = format;
  return l;
}

ir::Model build(const Knobs& k) {
  ir::Model m;
  m.name = "avdit-test";
  m.dim = k.dim;
  m.dtype = k.dtype;
  m.segments = k.segments;
  const int64_t wq = k.heads * k.head_dim, wkv = k.kv_heads * k.head_dim;
  const ir::Norm norm{ir::NormKind::RMSNorm, false, "", "", 1e-5};
  for (int i = 0; i < k.layers; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    ir::Block b{std::to_string(i), {ir::ModScope::PerSegment, 6, p + "mod"}, {}};
    ir::Attention a;
    a.heads = k.heads;
    a.kv_heads = k.kv_heads;
    a.head_dim = k.head_dim;
    a.proj.qkv = linear(p + "attn.qkv", k.dim, wq + 2 * wkv, k.qkv_format);
    a.proj.qkv->out_regions = {{"q", 0, wq}, {"k", wq, wkv}, {"v", wq + wkv, wkv}};
    a.qk_norm = {ir::QkNormKind::PerHead, 1e-5};
    a.proj.q_norm = p + "attn.norm_q.weight";
    a.proj.k_norm = p + "attn.norm_k.weight";
    a.rope = {ir::RopeStyle::SplitHalf, k.rotary_dim, "rope"};
    a.consumer = k.consumer;
    a.proj.out = linear(p + "attn.out", wq, k.dim, "dense");
    a.patches = k.attn_patches;
    b.sublayers.push_back({"attn", {}, norm, {0, 1, 2}, a});
    ir::Mlp f;
    f.layout = ir::GateUpLayout::FusedHalves;
    f.act = ir::ActKind::Silu;
    f.hidden = k.hidden;
    f.up = linear(p + "mlp.fc1", k.dim, 2 * k.hidden, k.up_format);
    f.down = linear(p + "mlp.fc2", k.hidden, k.dim, k.down_format);
    f.patches = k.mlp_patches;
    b.sublayers.push_back({"mlp", {}, norm, {3, 4, 5}, f});
    m.blocks.push_back(std::move(b));
  }
  ir::FinalLayer fl{{}, norm, {ir::ModScope::PerSegment, 2, "final.mod"}, {0, 1, -1}, {}};
  fl.proj = linear("final.proj", k.dim, k.out_features, k.final_format);
  fl.proj.bias = "final.proj.bias";
  fl.proj.fp32_compute = true;
  m.final_layer = fl;
  return m;
}

ir::Attention& attn(ir::Model& m) { return std::get<ir::Attention>(m.blocks[0].sublayers[0].body); }
ir::Mlp& mlp(ir::Model& m) { return std::get<ir::Mlp>(m.blocks[0].sublayers[1].body); }

// ---------------------------------------------------------------------------------------
// Contracts: the device, and custom formats / patches / consumers

const std::set<ir::DType> kFloats = {ir::DType::F32, ir::DType::BF16, ir::DType::F16, ir::DType::F64};

ct::DeviceCaps cpu(std::set<ir::DType> dtypes = kFloats) {
  return {.name = "cpu", .kind = ct::DeviceKind::CPU, .memory_total = int64_t{64} << 30,
          .memory_free = int64_t{64} << 30, .dtypes = std::move(dtypes), .threads = 1, .alloc_round = 1};
}

ct::Registry registry_with_test_contracts() {
  ct::Registry reg = sp::test::example_registry();
  // Dense formats, each lacking one capability.
  reg.add(ct::FormatCaps{.name = "no-held", .description = "re-acquired for every slab", .out_slicing = Cap::Yes,
                         .in_slicing = Cap::Yes, .held_execution = Cap::No});
  reg.add(ct::FormatCaps{.name = "held-undeclared", .description = "declares no held execution",
                         .out_slicing = Cap::Yes, .in_slicing = Cap::Yes});
  reg.add(ct::FormatCaps{.name = "rows-undeclared", .description = "declares no row slicing",
                         .in_slicing = Cap::Yes, .held_execution = Cap::Yes});
  reg.add(ct::FormatCaps{.name = "no-col-slice", .description = "no column slices", .out_slicing = Cap::Yes,
                         .in_slicing = Cap::No, .held_execution = Cap::Yes});
  reg.add(ct::FormatCaps{.name = "rows128", .description = "row slices at multiples of 128",
                         .out_slicing = Cap::Yes, .in_slicing = Cap::Yes, .out_align = 128,
                         .held_execution = Cap::Yes});
  reg.add(ct::PatchCaps{.name = "q-global-norm", .description = "normalizes Q over all tokens",
                        .reads = {ct::TensorRole::Q}, .modifies = {ct::TensorRole::Q}, .row_local = Cap::No,
                        .feature_local = Cap::No});
  ct::ConsumerCaps fp32_only = reg.consumer("sdpa");
  fp32_only.name = "fp32-only";
  fp32_only.dtypes = {ir::DType::F32};
  reg.add(fp32_only);
  ct::ConsumerCaps q64 = reg.consumer("sdpa");
  q64.name = "sdpa-q64";
  q64.q_align = 64;
  reg.add(q64);
  ct::ConsumerCaps kv128 = reg.consumer("sdpa");
  kv128.name = "sdpa-kv128";
  kv128.kv_align = 128;
  reg.add(kv128);
  ct::ConsumerCaps no_lse = reg.consumer("sdpa");
  no_lse.name = "sdpa-no-lse";
  no_lse.lse = Cap::No;
  reg.add(no_lse);
  ct::ConsumerCaps keyed = reg.consumer("sdpa");
  keyed.name = "sdpa-keyed";
  keyed.positions = Cap::Unknown;  // does not declare that the order of its key rows is nothing to it
  reg.add(keyed);
  return reg;
}

// ---------------------------------------------------------------------------------------
// Matchers

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The plan's exchange steps of `kind`, part by part in program order, each with its step.
std::vector<std::pair<const pl::Step*, const pl::ExchangeStep*>> exchange_steps(const pl::Plan& p, pl::Exchange kind) {
  std::vector<std::pair<const pl::Step*, const pl::ExchangeStep*>> out;
  for (const pl::Part* part : pl::parts(p))
    for (const pl::Step& st : part->program.steps)
      if (const auto* x = std::get_if<pl::ExchangeStep>(&st.body); x && x->kind == kind) out.emplace_back(&st, x);
  return out;
}

using lg::Check;
using lg::ComponentKind;

// The component a rejection must name; unset or empty fields match anything.
struct Comp {
  std::optional<ComponentKind> kind;
  std::string name, format;
  std::optional<ct::TensorRole> role;
};
// Read as "rejected by consumer 'whole'".
namespace by {
Comp any() { return {}; }
Comp consumer(const std::string& name) { return {ComponentKind::Consumer, name, "", {}}; }
Comp weight(const std::string& name, const std::string& format = "") {
  return {ComponentKind::Weight, name, format, {}};
}
Comp patch(const std::string& name, std::optional<ct::TensorRole> role = {}) {
  return {ComponentKind::Patch, name, "", role};
}
Comp device(const std::string& name) { return {ComponentKind::Device, name, "", {}}; }
Comp model_quantity(const std::string& name) { return {ComponentKind::Model, name, "", {}}; }
Comp transformation(Transform t) { return {ComponentKind::Transformation, lg::to_string(t), "", {}}; }
}  // namespace by

// Every field matches exactly; an empty string or unset optional matches anything.
struct Want {
  Transform transform;
  Check check;
  Comp component;
  std::string required, actual;
  std::string region;
};

bool matches(const lg::Rejection& r, const Want& w) {
  const Comp& c = w.component;
  return r.transform == w.transform && r.check == w.check && (!c.kind || r.component_kind == *c.kind) &&
         (c.name.empty() || r.component_name == c.name) && (c.format.empty() || r.format == c.format) &&
         (!c.role || r.role == c.role) && (w.required.empty() || r.required == w.required) &&
         (w.actual.empty() || r.actual == w.actual) && (w.region.empty() || r.region == w.region);
}

::testing::AssertionResult Rejected(const std::vector<lg::Rejection>& rs, const Want& w) {
  for (const auto& r : rs)
    if (matches(r, w)) return ::testing::AssertionSuccess();
  const Comp& c = w.component;
  auto f = ::testing::AssertionFailure();
  f << "no rejection of '" << lg::to_string(w.transform) << "' with code " << lg::code_name(w.check) << " component "
    << (c.kind ? lg::to_string(*c.kind) : "any") << " name=\"" << c.name << "\" format=\"" << c.format << "\" role="
    << (c.role ? ct::to_string(*c.role) : "any") << " required=\"" << w.required << "\" actual=\"" << w.actual
    << "\" region=\"" << w.region << "\"; got:";
  for (const auto& r : rs) f << "\n  " << lg::describe(r);
  return f;
}

size_t count_of(const std::vector<lg::Rejection>& rs, Transform t) {
  return std::count_if(rs.begin(), rs.end(), [t](const lg::Rejection& r) { return r.transform == t; });
}

const pl::Decision& decision(const std::vector<pl::Decision>& ds, Transform t) {
  for (const auto& d : ds)
    if (d.transform == t) return d;
  throw std::logic_error(std::string("no decision for ") + lg::to_string(t));
}


class Legality : public ::testing::Test {
 protected:
  // Verdict for sublayer 0 (attention) or 1 (MLP) of block 0.
  lg::Verdict verdict(const ir::Model& m, size_t sublayer, const ct::DeviceCaps* device = nullptr) const {
    lg::Context ctx{&m, &reg, device ? device : &dev};
    return lg::check_sublayer(ctx, m.blocks.at(0).sublayers.at(sublayer));
  }
  pl::Plan plan(const ir::Model& m, pl::Options opt = {}) const { return pl::make_plan(m, reg, dev, opt); }
  // Small slabs fixed, so that every legal transformation runs on these small models.
  pl::Plan bounded(const ir::Model& m, int64_t feature_slice = 64) const {
    return plan(m, {.token_chunk = 128, .feature_slice = feature_slice});
  }

  ct::Registry reg = registry_with_test_contracts();
  ct::DeviceCaps dev = cpu();
};

}  // namespace
