// The schedule compiler's ends and the steps between blocks: the embedding (every segment's
// tokens into the residual stream), a block's row norm after its sublayers, and the final layer
// (norm, modulation and the output projections of its rows).
#include "plan/compiler.hpp"

namespace sp::plan {

using detail::Compiler;
using ir::DType;

Program compile_final(const ir::Model& m, int64_t chunk, const contracts::Registry& reg,
                      const contracts::DeviceCaps& dev, const Sequence& seq) {
  const ir::FinalLayer& fl = *m.final_layer;
  const ir::RowRange rr = m.rows(fl.segments);
  Compiler c(m, reg, dev, "final", rr, seq);
  const DType acc = c.acc();
  const int64_t out = fl.proj.out_features;
  // This rank's output rows [lo, hi) of rr (all of them on one rank); slabs count from lo.
  const auto [lo, hi] = c.local(rr);
  const int o = c.buffer(BufRole::Output, "Out", {hi - lo, out}, acc);
  // The projection runs in fp32 (fp64 for an fp64 model), the weight converted on acquire unless
  // stored so. Row ranges (from the first output row) with one projection each: all rows, or one per
  // segment where segments have heads of their own.
  struct Part {
    int64_t from, to;
    const ir::Linear* proj;
  };
  std::vector<Part> parts;
  if (fl.heads.empty()) parts.push_back({0, rr.size(), &fl.proj});
  else
    for (const auto& s : m.segments) {
      const int64_t b = m.segment_begin(s.name) - rr.begin;
      if (b >= 0 && b + s.length <= rr.size() && s.length > 0) parts.push_back({b, b + s.length, &fl.proj_for(s.name)});
    }
  if (std::any_of(parts.begin(), parts.end(), [&](const Part& p) { return p.proj->out_features < out; }))
    c.zero(c.whole(o));  // the columns a narrower head leaves are 0
  for (const Part& part : parts) {
    const int64_t from = std::max(part.from, lo), to = std::min(part.to, hi);
    if (from >= to) continue;
    const ir::Linear& l = *part.proj;
    const int w = c.acquire(l, {}, {}, acc);
    const int bias = l.bias.empty() ? -1 : c.acquire_tensor(l.bias, l.out_features, acc);
    const SegWeight sw{"", w, l.bias, {}, {}, bias};
    c.token_loop(rr.begin + lo, to - lo, chunk, true, [&](int64_t n, int64_t pieces) {
      const Operand n32 = c.whole(c.buffer(BufRole::Normed32, "N32", {n, m.dim}, acc));
      c.norm(fl.norm, fl.modulation, fl.mod, n32, n, pieces);
      if (l.out_features == out) {
        c.project(n32, c.slab_of(o, 0, n), {sw}, m.dim, out, n, 1);
        return;
      }
      // A narrower head: into its own rows, then into the leading columns of the output.
      const Operand head = c.whole(c.buffer(BufRole::Normed32, "Head", {n, l.out_features}, acc));
      c.project(n32, head, {sw}, m.dim, l.out_features, n, 1);
      Operand dst = c.slab_of(o, 0, n);
      dst.shape[1] = l.out_features;
      c.copy(head, dst);
    }, from - lo);
    c.release(w);
    if (bias >= 0) c.release(bias);
  }
  return c.take();
}

Program compile_post_norm(const ir::Model& m, const ir::Block& b, const contracts::Registry& reg,
                          const contracts::DeviceCaps& dev, const Sequence& seq) {
  static const ir::Modulation kNone;  // a row norm is not modulated
  const ir::RowNorm& pn = *b.post_norm;
  const ir::RowRange rr = m.rows(pn.segments);
  Compiler c(m, reg, dev, "blocks." + b.name + ".post_norm", rr, seq);
  c.own_loop(rr, rr.size(), false, [&](int64_t n, int64_t pieces) {
    const Operand h = c.normed(pn.norm, kNone, {}, n, pieces);
    c.copy(h, Compiler::residual(n, m.dim));
  });
  return c.take();
}

// Rows per slab of an embedding computed in the accumulation dtype (its staging buffer).
constexpr int64_t kEmbedSlabRows = 4096;

Program compile_embed(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev,
                      const Sequence& seq) {
  Compiler c(m, reg, dev, "embed", {0, m.tokens()}, seq);
  for (const auto& seg : m.segments) {
    const int64_t begin = m.segment_begin(seg.name);
    // This rank's tokens [from, to) of the segment; slabs count from the segment's first.
    const auto [from, to] = c.local({begin, begin + seg.length});
    if (from >= to) continue;
    const ir::SegmentEmbed* e = m.embed_for(seg.name);
    const int64_t in = e ? e->linear.in_features : m.dim;
    auto tokens = [&](int64_t n) { return Operand{Src::Tokens, -1, seg.name, 0, {n, in}}; };
    if (!e) {
      c.token_loop(begin, to, to - from, false,
                   [&](int64_t n, int64_t) { c.copy(tokens(n), Compiler::residual(n, m.dim)); }, from);
      continue;
    }
    // fp32_compute: tokens in the accumulation dtype, projected in it slab by slab, then rounded.
    const bool wide = e->linear.fp32_compute && c.dt() != c.acc();
    const int w = c.acquire(e->linear, {}, {}, wide ? c.acc() : c.dt());
    const SegWeight sw{"", w, e->linear.bias, {}, {}};
    const int64_t chunk = wide ? std::min(to - from, kEmbedSlabRows) : to - from;
    c.token_loop(begin, to, chunk, false, [&](int64_t n, int64_t) {
      if (!wide) {
        c.project(tokens(n), Compiler::residual(n, m.dim), {sw}, in, m.dim, n, 1);
        return;
      }
      const Operand e32 = c.whole(c.buffer(BufRole::Normed32, "E32", {n, m.dim}, c.acc()));
      c.project(tokens(n), e32, {sw}, in, m.dim, n, 1);
      c.copy(e32, Compiler::residual(n, m.dim));
    }, from);
    c.release(w);
  }
  return c.take();
}

}  // namespace sp::plan
