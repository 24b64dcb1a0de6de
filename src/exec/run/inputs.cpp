// Inputs of a run and their validation against the model.
#include <stdexcept>

#include "exec/run/executor.hpp"

namespace sp::exec {

const at::Tensor& Inputs::table(const std::string& name) const {
  auto it = tables.find(name);
  if (it == tables.end()) throw std::invalid_argument("input table '" + name + "' is missing");
  return it->second;
}

const at::Tensor& Inputs::segment_tokens(const std::string& segment) const {
  auto it = tokens.find(segment);
  if (it == tokens.end()) throw std::invalid_argument("input tokens of segment '" + segment + "' are missing");
  return it->second;
}

at::Device Inputs::device() const {
  if (tokens.empty()) throw std::invalid_argument("inputs hold no tokens");
  return tokens.begin()->second.device();
}

namespace {

void expect_shape(const std::string& what, const at::Tensor& t, std::vector<int64_t> shape) {
  if (!t.defined()) throw std::invalid_argument(what + ": missing");
  if (t.sizes().vec() != shape)
    throw std::invalid_argument(what + ": expected shape " + ir::shape_text(shape) + ", got " + shape_text(t));
}

}  // namespace

void validate_inputs(const ir::Model& m, const Inputs& in) {
  const at::ScalarType dt = to_aten(m.dtype);
  for (const auto& seg : m.segments) {
    const at::Tensor& t = in.segment_tokens(seg.name);
    expect_shape("input tokens of segment '" + seg.name + "'", t, {seg.length, m.input_features(seg.name)});
    // An embedding computed in fp32 (ir::SegmentEmbed) takes its tokens in the accumulation dtype.
    const ir::SegmentEmbed* e = m.embed_for(seg.name);
    const bool wide = e && e->linear.fp32_compute;
    const at::ScalarType want = wide ? to_aten(plan::accumulation_dtype(m.dtype)) : dt;
    if (t.scalar_type() != want)
      throw std::invalid_argument("input tokens of segment '" + seg.name + "': dtype " +
                                  std::string(c10::toString(t.scalar_type())) + " does not match " +
                                  (wide ? "the accumulation dtype of its fp32 embedding, " : "the model dtype ") +
                                  ir::to_string(wide ? plan::accumulation_dtype(m.dtype) : m.dtype));
  }
  for (const auto& ctx : m.contexts) expect_shape("context '" + ctx.name + "'", in.table(ctx.name), {ctx.length, ctx.dim});
  const int64_t T = m.tokens();
  auto check_mod = [&](const ir::Modulation& mod, const std::string& where) {
    if (mod.scope == ir::ModScope::None) return;
    const int64_t rows = mod.scope == ir::ModScope::Shared       ? 1
                         : mod.scope == ir::ModScope::PerSegment ? int64_t(m.segments.size())
                                                                 : T;
    expect_shape(where + " modulation table '" + mod.table + "'", in.table(mod.table), {rows, mod.count, m.dim});
  };
  for (const auto& b : m.blocks) {
    check_mod(b.modulation, "block " + b.name);
    for (const auto& s : b.sublayers)
      if (const auto* a = std::get_if<ir::Attention>(&s.body); a && a->rope.style != ir::RopeStyle::None)
        for (const std::string& t : {a->rope.table + ".cos", a->rope.table + ".sin"})
          expect_shape("rope table '" + t + "'", in.table(t), {T, a->rope.rotary_dim / 2});
  }
  if (m.final_layer) check_mod(m.final_layer->modulation, "final layer");
}

}  // namespace sp::exec
