#include "ir/model.hpp"

#include <algorithm>
#include <functional>
#include <sstream>

namespace sp::ir {

const char* to_string(DType d) { return name_of(d, {"fp32", "bf16", "fp16", "fp64", "int8", "fp8_e4m3", "fp8_e5m2"}); }
const char* to_string(NormKind k) { return name_of(k, {"layernorm", "rmsnorm"}); }
const char* to_string(ActKind a) { return name_of(a, {"gelu", "gelu-tanh", "silu"}); }
const char* to_string(RopeStyle r) { return name_of(r, {"none", "interleaved", "split-half"}); }
const char* to_string(QkNormKind k) { return name_of(k, {"none", "per-head", "across-heads"}); }
const char* to_string(GateUpLayout l) { return name_of(l, {"none", "separate", "fused-halves", "interleaved"}); }
const char* to_string(AttnKind k) { return name_of(k, {"self", "cross"}); }
const char* to_string(ModScope s) { return name_of(s, {"none", "shared", "per-segment", "per-token"}); }

size_t dtype_size(DType d) {
  constexpr size_t kSizes[] = {4, 2, 2, 8, 1, 1, 1};
  return kSizes[static_cast<size_t>(d)];
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

ActKind parse_act(const std::string& s, const std::string& field) {
  for (ActKind a : {ActKind::Gelu, ActKind::GeluTanh, ActKind::Silu})
    if (s == to_string(a)) return a;
  throw IrError(field + ": unknown activation '" + s + "' (expected gelu, gelu-tanh or silu)");
}

namespace {
constexpr DType kActivationDtypes[] = {DType::F32, DType::BF16, DType::F16};

// The element of `range` whose `key` equals `name`; null if none.
template <class R, class K>
auto find_named(R& range, const std::string& name, K key) -> decltype(&*range.begin()) {
  for (auto& x : range)
    if (std::invoke(key, x) == name) return &x;
  return nullptr;
}

template <typename... Args>
[[noreturn]] void fail(const std::string& field, Args&&... parts) {
  std::ostringstream os;
  os << field << ": ";
  (os << ... << parts);
  throw IrError(os.str());
}

void check_regions(const std::string& field, const std::vector<Region>& regions, int64_t total) {
  if (regions.empty()) return;
  int64_t at = 0;
  for (const auto& r : regions) {
    if (r.size <= 0) fail(field + "." + r.name, "region size must be positive, got ", r.size);
    if (r.offset != at)
      fail(field + "." + r.name, "region offset ", r.offset, " leaves a gap or overlap (expected ", at, ")");
    at += r.size;
  }
  if (at != total) fail(field, "regions add up to ", at, " but the weight has ", total);
}

void check_linear(const std::string& field, const Linear& l, int64_t in, int64_t out) {
  if (l.weight.empty()) fail(field + ".weight", "missing weight name");
  if (l.in_features != in) fail(field + ".in_features", "expected ", in, ", got ", l.in_features);
  if (l.out_features != out) fail(field + ".out_features", "expected ", out, ", got ", l.out_features);
  check_regions(field + ".out_regions", l.out_regions, l.out_features);
  check_regions(field + ".in_regions", l.in_regions, l.in_features);
}

void check_norm(const std::string& field, const Norm& n) {
  if (!(n.eps > 0)) fail(field + ".eps", "must be positive, got ", n.eps);
  if (n.affine && n.weight.empty()) fail(field + ".weight", "affine norm without a weight name");
  if (n.kind == NormKind::RMSNorm && !n.bias.empty())
    fail(field + ".bias", "RMSNorm has no bias, got '", n.bias, "'");
}

void check_mod(const std::string& field, const ModRef& r, const Modulation& m) {
  for (int idx : {r.shift, r.scale, r.gate}) {
    if (idx < 0) continue;
    if (m.scope == ModScope::None)
      fail(field, "refers to modulation vector ", idx, " but the block has no modulation");
    if (idx >= m.count) fail(field, "modulation index ", idx, " out of range [0, ", m.count, ")");
  }
}

void check_proj(const std::string& f, const Attention& a, const AttnProj& p, int64_t dim, int64_t kv_in) {
  const int64_t qw = a.heads * a.head_dim, kvw = a.kv_heads * a.head_dim;
  const int64_t mlp = a.parallel ? a.parallel->hidden : 0;
  if (p.fused()) {
    if (p.q || p.k || p.v) fail(f, "both fused qkv and separate q/k/v given");
    if (a.kind == AttnKind::Cross) fail(f + ".qkv", "cross-attention needs separate q and k/v projections");
    check_linear(f + ".qkv", *p.qkv, dim, qw + 2 * kvw + mlp);
    const Linear& l = *p.qkv;
    const Region *q = l.out_region("q"), *k = l.out_region("k"), *v = l.out_region("v");
    if (!q || !k || !v) fail(f + ".qkv.out_regions", "fused qkv needs regions q, k and v");
    if (q->size != qw) fail(f + ".qkv.out_regions.q", "size ", q->size, " != heads*head_dim ", qw);
    if (k->size != kvw) fail(f + ".qkv.out_regions.k", "size ", k->size, " != kv_heads*head_dim ", kvw);
    if (v->size != kvw) fail(f + ".qkv.out_regions.v", "size ", v->size, " != kv_heads*head_dim ", kvw);
    if (a.parallel) {
      const Region* m = l.out_region("mlp");
      if (!m || m->size != mlp) fail(f + ".qkv.out_regions.mlp", "parallel MLP needs region mlp of size ", mlp);
    }
  } else {
    if (!p.q || !p.k || !p.v) fail(f, "needs fused qkv or all of q, k, v");
    if (a.parallel) fail(f, "a parallel MLP needs a fused input projection");
    check_linear(f + ".q", *p.q, dim, qw);
    check_linear(f + ".k", *p.k, kv_in, kvw);
    check_linear(f + ".v", *p.v, kv_in, kvw);
  }
  check_linear(f + ".out", p.out, qw + mlp, dim);
  if (a.parallel) {
    const Region* ia = find_named(p.out.in_regions, "attn", &Region::name);
    const Region* im = find_named(p.out.in_regions, "mlp", &Region::name);
    if (!ia || !im || ia->size != qw || im->size != mlp)
      fail(f + ".out.in_regions", "parallel MLP needs input regions attn (", qw, ") and mlp (", mlp, ")");
  }
  if (a.qk_norm.kind != QkNormKind::None && (p.q_norm.empty() || p.k_norm.empty()))
    fail(f + ".qk_norm", "needs q_norm and k_norm weight names");
}

void check_attention(const std::string& f, const Model& m, const Attention& a) {
  const int64_t dim = m.dim;
  if (a.heads <= 0 || a.kv_heads <= 0 || a.head_dim <= 0)
    fail(f, "heads, kv_heads and head_dim must be positive, got ", a.heads, ", ", a.kv_heads, ", ",
         a.head_dim);
  if (a.heads % a.kv_heads != 0)
    fail(f + ".kv_heads", "heads ", a.heads, " is not a multiple of kv_heads ", a.kv_heads);
  int64_t kv_in = dim;
  if (a.kind == AttnKind::Cross) {
    if (a.context.empty()) fail(f + ".context", "cross-attention without a context name");
    kv_in = m.context(a.context).dim;
    if (a.rope.style != RopeStyle::None) fail(f + ".rope", "cross-attention with RoPE is not supported");
    if (!a.segment_proj.empty()) fail(f + ".segment_proj", "cross-attention has one projection set");
  }
  if (a.parallel && a.parallel->hidden <= 0) fail(f + ".parallel.hidden", "must be positive, got ", a.parallel->hidden);
  check_proj(f, a, a.proj, dim, kv_in);
  for (const auto& [seg, p] : a.segment_proj) {
    m.segment(seg);
    check_proj(f + ".segment_proj." + seg, a, p, dim, kv_in);
  }
  if (a.rope.style != RopeStyle::None &&
      (a.rope.rotary_dim <= 0 || a.rope.rotary_dim > a.head_dim || a.rope.rotary_dim % 2 != 0))
    fail(f + ".rope.rotary_dim", "must be even and in (0, head_dim=", a.head_dim, "], got ", a.rope.rotary_dim);
  if (a.qk_norm.kind != QkNormKind::None && !(a.qk_norm.eps > 0))
    fail(f + ".qk_norm.eps", "must be positive, got ", a.qk_norm.eps);
  if (a.consumer.empty()) fail(f + ".consumer", "empty consumer name");
}

void check_mlp(const std::string& f, const Mlp& m, int64_t dim) {
  if (m.hidden <= 0) fail(f + ".hidden", "must be positive, got ", m.hidden);
  if (!m.up) fail(f + ".up", "missing up projection");
  const int64_t up_out = (m.layout == GateUpLayout::FusedHalves || m.layout == GateUpLayout::Interleaved)
                             ? 2 * m.hidden
                             : m.hidden;
  check_linear(f + ".up", *m.up, dim, up_out);
  if (m.layout == GateUpLayout::Separate) {
    if (!m.gate) fail(f + ".gate", "separate gate/up layout without a gate projection");
    check_linear(f + ".gate", *m.gate, dim, m.hidden);
  } else if (m.gate) {
    fail(f + ".gate", "gate projection given for layout ", to_string(m.layout));
  }
  check_linear(f + ".down", m.down, m.hidden, dim);
}

void check_rows(const std::string& field, const Model& m, const std::vector<std::string>& segs) {
  try {
    m.rows(segs);
  } catch (const IrError& e) {
    fail(field, e.what());
  }
}

// Every Linear of a block's sublayers, for a const or a mutable block.
template <class B, class F>
void block_linears(B& b, F&& fn) {
  auto proj = [&](auto& p) {
    for (auto* l : {&p.qkv, &p.q, &p.k, &p.v})
      if (l->has_value()) fn(**l);
    fn(p.out);
  };
  for (auto& s : b.sublayers) {
    if (auto* a = std::get_if<Attention>(&s.body)) {
      proj(a->proj);
      for (auto& [segment, p] : a->segment_proj) proj(p);
    } else {
      auto& mlp = std::get<Mlp>(s.body);
      for (auto* l : {&mlp.up, &mlp.gate})
        if (l->has_value()) fn(**l);
      fn(mlp.down);
    }
  }
}

// Calls fn on the names of the tensors a linear reads: its weight, bias and LoRA factors.
template <class L, class F>
void linear_tensors(L& l, F&& fn) {
  fn(l.weight), fn(l.bias);
  for (auto& a : l.loras) fn(a.a), fn(a.b);
}

// Calls fn on the names of the tensors a block reads, for a const or a mutable block: its linears',
// then per sublayer its norm's weight and bias and its Q/K norm weights, then its row norm's. A
// norm that is not affine reads no weights; `unread`: its names all the same.
template <class B, class F>
void block_tensors(B& b, F&& fn, bool unread = false) {
  block_linears(b, [&](auto& l) { linear_tensors(l, fn); });
  auto norm = [&](auto& n) {
    if (n.affine || unread) fn(n.weight), fn(n.bias);
  };
  for (auto& s : b.sublayers) {
    norm(s.norm);
    if (auto* a = std::get_if<Attention>(&s.body)) {
      fn(a->proj.q_norm), fn(a->proj.k_norm);
      for (auto& [segment, p] : a->segment_proj) fn(p.q_norm), fn(p.k_norm);
    }
  }
  if (b.post_norm) norm(b.post_norm->norm);
}

// Tensor names in first-seen order, without repeats or empty ones.
struct Names {
  std::vector<std::string> list;
  void operator()(const std::string& n) {
    if (!n.empty() && std::find(list.begin(), list.end(), n) == list.end()) list.push_back(n);
  }
};

}  // namespace

std::vector<std::string> activation_dtype_names() {
  std::vector<std::string> out;
  for (DType d : kActivationDtypes) out.push_back(to_string(d));
  return out;
}

DType parse_dtype(const std::string& s, const std::string& field) {
  for (DType d : kActivationDtypes)
    if (s == to_string(d)) return d;
  throw IrError(field + ": unknown dtype '" + s + "' (expected fp32, bf16 or fp16)");
}

const Region* Linear::out_region(const std::string& n) const { return find_named(out_regions, n, &Region::name); }

int64_t Model::tokens() const {
  int64_t t = 0;
  for (const auto& s : segments) t += s.length;
  return t;
}

const Segment& Model::segment(const std::string& n) const {
  if (const Segment* s = find_named(segments, n, &Segment::name)) return *s;
  throw IrError("model.segments: no segment named '" + n + "'");
}

int64_t Model::segment_begin(const std::string& n) const {
  int64_t at = 0;
  for (const auto& s : segments) {
    if (s.name == n) return at;
    at += s.length;
  }
  throw IrError("model.segments: no segment named '" + n + "'");
}

RowRange Model::rows(const std::vector<std::string>& names) const {
  if (names.empty()) return {0, tokens()};
  RowRange r{segment_begin(names.front()), 0};
  r.end = r.begin;
  for (const auto& n : names) {
    if (segment_begin(n) != r.end)
      throw IrError("segments: '" + n + "' does not follow the previous segment (rows must be contiguous)");
    r.end += segment(n).length;
  }
  return r;
}

const SegmentEmbed* Model::embed_for(const std::string& seg) const {
  return find_named(embeds, seg, &SegmentEmbed::segment);
}

const Linear& FinalLayer::proj_for(const std::string& segment) const {
  const auto* head = find_named(heads, segment, &std::pair<std::string, Linear>::first);
  return head ? head->second : proj;
}

int64_t Model::input_features(const std::string& seg) const {
  const SegmentEmbed* e = embed_for(seg);
  return e ? e->linear.in_features : dim;
}

int64_t Model::kv_rows(const Sublayer& s) const {
  const auto* a = std::get_if<Attention>(&s.body);
  if (a && a->kind == AttnKind::Cross) return context(a->context).length;
  return rows(s.segments).size();
}

int64_t Model::inner_boundaries(RowRange r) const {
  int64_t n = 0, start = 0;
  for (const auto& seg : segments) {
    if (start > r.begin && start < r.end) ++n;
    start += seg.length;
  }
  return n;
}

int64_t Model::output_tokens() const { return final_layer ? rows(final_layer->segments).size() : tokens(); }

const Context& Model::context(const std::string& n) const {
  if (const Context* c = find_named(contexts, n, &Context::name)) return *c;
  throw IrError("model.contexts: no context named '" + n + "'");
}

const AttnProj& Attention::proj_for(const std::string& segment) const {
  const auto* p = find_named(segment_proj, segment, &std::pair<std::string, AttnProj>::first);
  return p ? p->second : proj;
}

std::vector<const AttnProj*> Attention::all_proj() const {
  std::vector<const AttnProj*> out = {&proj};
  for (const auto& [name, p] : segment_proj) out.push_back(&p);
  return out;
}

void validate(const Model& m) {
  if (m.dim <= 0) fail("model.dim", "must be positive, got ", m.dim);
  if (m.dtype == DType::I8 || m.dtype == DType::F8E4M3 || m.dtype == DType::F8E5M2)
    fail("model.dtype", "activations must be floating point, got ", to_string(m.dtype));
  if (m.segments.empty()) fail("model.segments", "at least one token segment is required");
  for (size_t i = 0; i < m.segments.size(); ++i) {
    const Segment& s = m.segments[i];
    const std::string f = "model.segments[" + std::to_string(i) + "]";
    if (s.length <= 0) fail(f + "." + s.name, "length must be positive, got ", s.length);
    if (find_named(m.segments, s.name, &Segment::name) != &s) fail(f, "duplicate segment name '", s.name, "'");
  }
  for (const auto& c : m.contexts)
    if (c.length <= 0 || c.dim <= 0)
      fail("model.contexts." + c.name, "length and dim must be positive, got ", c.length, ", ", c.dim);
  for (const auto& e : m.embeds) {
    m.segment(e.segment);
    check_linear("model.embeds." + e.segment, e.linear, e.linear.in_features, m.dim);
  }
  for (size_t b = 0; b < m.blocks.size(); ++b) {
    const Block& blk = m.blocks[b];
    const std::string bf = "blocks[" + std::to_string(b) + "]";
    if (blk.modulation.scope != ModScope::None && blk.modulation.table.empty())
      fail(bf + ".modulation.table", "modulated block without a table name");
    for (size_t s = 0; s < blk.sublayers.size(); ++s) {
      const Sublayer& sl = blk.sublayers[s];
      const std::string f = bf + "." + (sl.name.empty() ? "sublayers[" + std::to_string(s) + "]" : sl.name);
      check_rows(f + ".segments", m, sl.segments);
      check_norm(f + ".norm", sl.norm);
      check_mod(f + ".mod", sl.mod, blk.modulation);
      if (const auto* a = std::get_if<Attention>(&sl.body)) check_attention(f, m, *a);
      else check_mlp(f, std::get<Mlp>(sl.body), m.dim);
    }
    if (blk.post_norm) {
      check_rows(bf + ".post_norm.segments", m, blk.post_norm->segments);
      check_norm(bf + ".post_norm.norm", blk.post_norm->norm);
    }
  }
  if (m.final_layer) {
    const FinalLayer& fl = *m.final_layer;
    check_rows("final.segments", m, fl.segments);
    check_norm("final.norm", fl.norm);
    check_mod("final.mod", fl.mod, fl.modulation);
    if (fl.proj.out_features <= 0) fail("final.proj.out_features", "must be positive, got ", fl.proj.out_features);
    check_linear("final.proj", fl.proj, m.dim, fl.proj.out_features);
    const RowRange rr = m.rows(fl.segments);
    for (const auto& [seg, l] : fl.heads) {
      const std::string f = "final.heads." + seg;
      const Segment* s = find_named(m.segments, seg, &Segment::name);
      if (!s || m.segment_begin(seg) < rr.begin || m.segment_begin(seg) + s->length > rr.end)
        fail(f, "names no segment among the final layer's rows, got '", seg, "'");
      if (l.out_features <= 0 || l.out_features > fl.proj.out_features)
        fail(f + ".out_features", "must be in 1..", fl.proj.out_features, " (the output width), got ", l.out_features);
      check_linear(f, l, m.dim, l.out_features);
    }
  }
}

void for_each_linear(Model& m, const std::function<void(Linear&)>& fn) {
  for (auto& e : m.embeds) fn(e.linear);
  for (auto& b : m.blocks) block_linears(b, fn);
  if (m.final_layer) {
    fn(m.final_layer->proj);
    for (auto& [segment, l] : m.final_layer->heads) fn(l);
  }
}

Block anonymous(Block b) {
  auto blank = [](std::string& n) {
    if (!n.empty()) n = "*";
  };
  block_tensors(b, blank, true);
  blank(b.name), blank(b.modulation.table);
  for (auto& s : b.sublayers) {
    blank(s.name);
    if (auto* a = std::get_if<Attention>(&s.body)) blank(a->rope.table);
  }
  return b;
}

void for_each_linear(const Block& b, const std::function<void(const Linear&)>& fn) { block_linears(b, fn); }

std::vector<std::string> tensor_names_outside_blocks(const Model& m) {
  Names names;
  for (const auto& e : m.embeds) linear_tensors(e.linear, names);
  if (const auto& f = m.final_layer) {
    if (f->norm.affine) names(f->norm.weight), names(f->norm.bias);
    linear_tensors(f->proj, names);
    for (const auto& [segment, l] : f->heads) linear_tensors(l, names);
  }
  return names.list;
}

std::vector<std::string> tensor_names(const Block& b) {
  Names names;
  block_tensors(b, names);
  return names.list;
}

}  // namespace sp::ir
