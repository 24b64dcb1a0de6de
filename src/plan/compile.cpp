// The schedule compiler: plan decisions -> typed steps with buffers and cost terms; the only
// place that knows the order of steps inside a sublayer (compile_ends.cpp: the embedding and
// the final layer; plan/compiler.hpp: the Compiler both build programs with).
#include "plan/compiler.hpp"
#include "plan/kv_budget.hpp"

namespace sp::plan {

using contracts::TensorRole;
using detail::Compiler;
using ir::DType;

namespace {

// Output-row range of a projection set's region (a fused weight's q|k|v|mlp rows).
SliceExpr region_rows(const ir::AttnProj& p, const char* name, int64_t width) {
  return {p.fused() ? p.qkv->out_region(name)->offset : 0, 0, width, 1};
}

// One acquired weight per projection set, by segment (the default set: every other segment).
using Held = std::vector<SegWeight>;

template <typename F>
Held hold(Compiler& c, const ir::Attention& a, F&& pick) {
  Held h;
  auto add = [&](const std::string& seg, const ir::AttnProj& pr) {
    auto [linear, rows, norm_weight] = pick(pr);
    h.push_back({seg, c.acquire(*linear, rows, {}, c.dt()), linear->bias, rows, norm_weight});
  };
  add("", a.proj);
  for (const auto& [seg, pr] : a.segment_proj) add(seg, pr);
  return h;
}

void release_all(Compiler& c, std::initializer_list<const Held*> hs) {
  for (const Held* h : hs)
    for (const SegWeight& w : *h) c.release(w.weight);
}

void compile_attention(Compiler& c, const ir::Block& b, const ir::Sublayer& s, const ir::Attention& a,
                       const Schedule& p, double kv_budget) {
  const ir::Model& m = c.m();
  const ir::RowRange rr = m.rows(s.segments);
  const int64_t T = rr.size(), D = m.dim, H = a.heads, G = a.kv_heads, hd = a.head_dim;
  const int64_t wq = H * hd, wkv = G * hd, rep = H / G, mlp = a.parallel ? a.parallel->hidden : 0;
  const bool cross = a.kind == ir::AttnKind::Cross;
  const int64_t L = m.kv_rows(s), kv_in = cross ? m.context(a.context).dim : D;
  const bool fq = fused_qk(m, a, c.reg(), c.dev());
  const bool streamed = p.streamed_out;
  const DType dt = c.dt(), acc = c.acc();
  const contracts::AttnCall call = attn_call(m, b, s, kv_budget);
  using Pick = std::tuple<const ir::Linear*, SliceExpr, std::string>;  // weight, its rows, Q/K norm

  // Projected Q or K rows [n, heads*hd] into the attention layout `dst`: Q/K norm and RoPE in
  // one fused kernel, or staged in fp32 with the role's patches in between.
  auto qk_rows = [&](const Operand& src, const Operand& dst, Layout layout, const std::vector<SegWeight>& ws,
                     int64_t groups, int64_t rep, TensorRole role, int64_t n, int64_t pieces) {
    const int64_t heads = groups * rep;
    if (fq) {
      c.qk_fused(src, dst, layout, a, ws, heads, rep, n, pieces);
      return;
    }
    const Operand s32 = c.whole(c.buffer(BufRole::Staged32, role == TensorRole::Q ? "Q32" : "K32", {n, heads * hd}, acc));
    c.copy(src, s32);
    c.qk_norm(s32, a.qk_norm, ws, heads, hd, n, pieces);
    c.rope(s32, a.rope, heads, hd, n);
    c.patches(a.patches, role, s32);
    c.copy(s32, dst, layout, groups, rep, hd);
  };
  // y = [o | u] @ out^T (+ bias), then the gated residual add; u: the parallel MLP (Flux single
  // blocks) of the rows normed() returns, their activated "mlp" region rows.
  auto project_out = [&](const Held& wo, const Held& wm, const Operand& o, auto&& normed, int64_t n, int64_t pieces) {
    Operand u;
    if (mlp) {
      const Operand h = normed();
      u = c.whole(c.buffer(BufRole::Hidden, "U", {n, mlp}, dt));
      c.project(h, u, wm, D, mlp, n, pieces);
      c.activate(u, a.parallel->act);
      c.patches(a.patches, TensorRole::MlpHidden, u);
    }
    const Operand y = c.whole(c.buffer(BufRole::Proj, "Y", {n, D}, dt));
    c.project(o, y, wo, wq, D, n, pieces, 0, mlp ? wq : -1);
    if (mlp) {
      std::vector<SegWeight> no_bias = wo;
      for (auto& w : no_bias) w.bias.clear();
      c.project(u, y, no_bias, mlp, D, n, pieces, wq, mlp, true);
    }
    c.residual_add(y, b.modulation, s.mod, n, pieces);
  };
  // What hold() acquires of each projection set: the output projection, or the rows of a region.
  auto out_of = [](const ir::AttnProj& pr) { return Pick{&pr.out, {}, {}}; };
  auto mlp_of = [&](const ir::AttnProj& pr) { return Pick{&*pr.qkv, region_rows(pr, "mlp", mlp), {}}; };
  auto k_of = [&](const ir::AttnProj& pr) { return Pick{&pr.k_linear(), region_rows(pr, "k", wkv), pr.k_norm}; };
  auto v_of = [&](const ir::AttnProj& pr) { return Pick{&pr.v_linear(), region_rows(pr, "v", wkv), {}}; };
  auto q_of = [&](const ir::AttnProj& pr) { return Pick{&pr.q_linear(), region_rows(pr, "q", wq), pr.q_norm}; };
  // The complete attention output of this rank's rows (patched) projected slab by slab; a
  // parallel MLP is recomputed from the residual rows, which no write has touched yet.
  auto project_all = [&](int ofull) {
    c.patches(a.patches, TensorRole::AttnOut, c.whole(ofull));
    const Held wo = hold(c, a, out_of);
    const Held wm = mlp ? hold(c, a, mlp_of) : Held{};
    c.own_loop(rr, p.token_chunk, true, [&](int64_t n, int64_t pieces) {
      auto normed = [&] { return c.normed(s.norm, b.modulation, s.mod, n, pieces); };
      project_out(wo, wm, c.slab_of(ofull, 0, n), normed, n, pieces);
    });
    release_all(c, {&wo, &wm});
  };
  const int64_t Tl = c.rows_of(rr)[size_t(c.seq().rank)];  // this rank's rows (all of them on one rank)
  // K and V of `groups` K/V heads over L rows: token-major for a consumer that takes strided
  // heads (`tm`), else head-major; Q token-major where, besides, no heads fold.
  struct KvLayout {
    Layout kv, q;
    std::vector<int64_t> shape;
  };
  auto kv_layout_of = [&](bool tm, int64_t groups) {
    return KvLayout{tm ? Layout::Same : Layout::HeadMajor, tm && rep == 1 ? Layout::Same : Layout::Folded,
                    tm ? std::vector<int64_t>{L, groups * hd} : std::vector<int64_t>{groups, L, hd}};
  };
  const bool strided = c.reg().consumer(a.consumer).strided_heads == contracts::Cap::Yes;

  // Sequence parallel self-attention: this rank's rows of Q, K and V projected token-major,
  // then exchanged (plan::Sequence).
  if (c.seq().split() && !cross) {
    if (L != T)
      throw std::invalid_argument("sequence parallel: " + b.name + "." + s.name + " attends " + std::to_string(L) +
                                  " key rows from " + std::to_string(T) + " query rows; only attention over its own rows splits");
    if (c.seq().mode == SeqMode::Ring && call.routed(L))
      throw std::invalid_argument("sequence parallel: routed attention (kv budget " + std::to_string(call.kv_budget) +
                                  ") routes each query tile over every key tile of its heads, which a ring passes "
                                  "around in blocks; use the ulysses split");
    const std::vector<int64_t> rows = c.rows_of(rr);
    // A slab of n of this rank's rows: K and V (K normed and rotated) into kdst and vdst, or Q
    // into qdst, token-major; the normed rows back.
    auto kv_rows = [&](const Held& wk, const Held& wv, const Operand& kdst, const Operand& vdst, int64_t n,
                       int64_t pieces) {
      const Operand h = c.normed(s.norm, b.modulation, s.mod, n, pieces);
      const Operand k = c.whole(c.buffer(BufRole::KV, "k", {n, wkv}, dt));
      c.project(h, k, wk, D, wkv, n, pieces);
      c.project(h, vdst, wv, D, wkv, n, pieces);
      qk_rows(k, kdst, Layout::Same, wk, G, 1, TensorRole::K, n, pieces);
      c.patches(a.patches, TensorRole::V, vdst);
    };
    auto q_rows = [&](const Held& wqh, const Operand& qdst, int64_t n, int64_t pieces) {
      const Operand h = c.normed(s.norm, b.modulation, s.mod, n, pieces);
      const Operand q = c.whole(c.buffer(BufRole::Q, "Q", {n, wq}, dt));
      c.project(h, q, wqh, D, wq, n, pieces);
      qk_rows(q, qdst, Layout::Same, wqh, G, rep, TensorRole::Q, n, pieces);
      return h;
    };
    if (c.seq().mode == SeqMode::Ring) {
      // Ring: this rank's rows of Q, K and V whole, then attended against every rank's K/V.
      const int KL = c.buffer(BufRole::SeqRows, "K rows", {Tl, wkv}, dt);
      const int VL = c.buffer(BufRole::SeqRows, "V rows", {Tl, wkv}, dt);
      const int QL = c.buffer(BufRole::SeqRows, "Q rows", {Tl, wq}, dt);
      {
        const Held wk = hold(c, a, k_of), wv = hold(c, a, v_of);
        c.own_loop(rr, p.token_chunk, true, [&](int64_t n, int64_t pieces) {
          kv_rows(wk, wv, c.slab_of(KL, 0, n), c.slab_of(VL, 0, n), n, pieces);
        });
        release_all(c, {&wk, &wv});
      }
      {
        const Held wqh = hold(c, a, q_of);
        c.own_loop(rr, p.q_chunk, true,
                   [&](int64_t n, int64_t pieces) { q_rows(wqh, c.slab_of(QL, 0, n), n, pieces); });
        release_all(c, {&wqh});
      }
      const int ofull = c.buffer(BufRole::AttnOutFull, "OFull", {Tl, wq}, dt);
      c.ring(ring_consumer(c.reg(), a), c.whole(QL), c.whole(KL), c.whole(VL), c.whole(ofull), rows, a.heads, G, hd,
             p.q_chunk);
      project_all(ofull);
      return;
    }
    // Ulysses, slab by slab: each exchange trades a slab of `chunk` rows of every rank (padded
    // where a rank holds fewer) for this rank's share of the K/V head groups, each with its
    // query heads; every rank runs as many slabs as the rank with the most rows. The K/V slabs
    // land at their rows of this rank's K and V (or as they arrive: `arrival` below); each Q slab
    // goes out to the ranks piece by piece, each piece attended as it arrives and its output sent
    // back at once, then projected into the residual rows.
    const int64_t P = c.seq().ranks, most = most_rows(c.seq(), m.tokens(), rr);
    const auto& cc = c.reg().consumer(a.consumer);
    // A consumer that reads its rows' places gets each rank's rows in slabs at its Q alignment.
    const bool by_place = cc.positions == contracts::Cap::Yes;
    const auto [kc, q_each] = ulysses_slabs(p, most, P);
    const int64_t qc = by_place ? std::min(ir::round_up(q_each, cc.q_align), std::max<int64_t>(most, 1)) : q_each;
    const std::vector<int64_t> groups = shares(G, P);
    const int64_t Gr = groups[size_t(c.seq().rank)];
    const bool carries = bool(cc.k_carrier_bytes);  // K head-major for its carrier
    const auto [kv_layout, q_layout, kv_shape] = kv_layout_of(strided && !carries, Gr);
    const int K = c.buffer(BufRole::GlobalK, "K", kv_shape, dt), V = c.buffer(BufRole::GlobalV, "V", kv_shape, dt);
    // Token-major K/V of a consumer to which their rows' order is nothing, unrouted: each slab's
    // rows received straight into K and V in the order they arrive, not through buffers of their own.
    const bool arrival = kv_layout == Layout::Same && cc.positions == contracts::Cap::No && !call.routed(L);
    auto rows_of = [&](int buf, int64_t n) {  // the first n rows of a slab buffer
      Operand o = c.whole(buf);
      o.shape[0] = n;
      return o;
    };
    {
      // Each slab's K and V exchanges stay in flight while the next slab is projected: packed
      // into and received through buffers that live across the slab loops, completed after them.
      const Operand ksent = c.whole(c.buffer(BufRole::SeqRows, "K sent", {kc, wkv}, dt)),
                    vsent = c.whole(c.buffer(BufRole::SeqRows, "V sent", {kc, wkv}, dt)),
                    krecv = c.whole(arrival ? K : c.buffer(BufRole::SeqHeads, "K received", {P * kc, Gr * hd}, dt)),
                    vrecv = c.whole(arrival ? V : c.buffer(BufRole::SeqHeads, "V received", {P * kc, Gr * hd}, dt));
      const Held wk = hold(c, a, k_of), wv = hold(c, a, v_of);
      auto slab = [&](int64_t n, int64_t pieces) {
        const int ks = c.buffer(BufRole::SeqRows, "K slab", {kc, wkv}, dt);
        const int vs = c.buffer(BufRole::SeqRows, "V slab", {kc, wkv}, dt);
        if (n > 0) kv_rows(wk, wv, rows_of(ks, n), rows_of(vs, n), n, pieces);
        c.exchange(c.whole(ks), c.whole(K), groups, hd, kv_layout, rows, kc, ksent, krecv, arrival);
        c.exchange(c.whole(vs), c.whole(V), groups, hd, kv_layout, rows, kc, vsent, vrecv, arrival);
      };
      c.own_loop(rr, kc, true, slab);
      c.pad_loop(rr, kc, slab);
      c.complete(krecv, c.whole(K));
      c.complete(vrecv, c.whole(V));
      release_all(c, {&wk, &wv});
    }
    // A consumer's K carrier is filled from every key row of this rank's heads at once.
    const int carrier = carries && Gr > 0 ? c.k_carrier(a.consumer, Gr, L, hd) : -1;
    if (carrier >= 0) c.carry_k(a.consumer, c.whole(K), carrier, L);
    AttendStep::Pieces by_rank;  // a Q slab's rows of each rank, attended one rank's at a time
    if (by_place) by_rank = {ranges_per_rank(c.seq(), m.tokens(), rr), qc, c.seq().rank};
    // The output projected slab by slab where it streams, else gathered into OFull first.
    const int ofull = streamed ? -1 : c.buffer(BufRole::AttnOutFull, "OFull", {Tl, wq}, dt);
    const Held wqh = hold(c, a, q_of), wo = streamed ? hold(c, a, out_of) : Held{},
               wm = streamed && mlp ? hold(c, a, mlp_of) : Held{};
    // Q slabs of q_chunk / P rows per rank: attention calls of about q_chunk rows, as on one rank.
    const int64_t width = Gr * rep * hd;
    auto slab = [&](int64_t n, int64_t pieces) {
      const int ql = c.buffer(BufRole::SeqRows, "Q slab, then O slab", {qc, wq}, dt);
      Operand h;
      if (n > 0) h = q_rows(wqh, rows_of(ql, n), n, pieces);
      if (n < qc) c.zero(c.whole(ql), n);  // padding rows attend too: zeros, not leftovers
      // Q out to the ranks and the output back, piece by piece, each piece attended as it arrives.
      // Each piece's output takes the place of its Q, and the output rows come back into the Q
      // slab, whose rows have all gone out (or into the Q heads) by then: a Q slab holds two
      // buffers of its size, not four.
      const Operand qh = c.whole(c.buffer(BufRole::SeqHeads, "Q heads, then O heads", {P * qc, width}, dt));
      const Operand qf = Gr > 0 && q_layout == Layout::Folded
                             ? c.whole(c.buffer(BufRole::QFolded, "QF", {Gr, rep * P * qc, hd}, dt))
                             : qh;
      c.ulysses_attend(a, c.whole(ql), qh, qf, qh, c.whole(ql), carrier >= 0 ? carrier : K, V, qc, L, q_layout,
                       kv_layout, call, groups, by_rank);
      if (n == 0) return;
      if (!streamed) {
        c.copy(rows_of(ql, n), c.slab_of(ofull, 0, n));
        return;
      }
      c.patches(a.patches, TensorRole::AttnOut, rows_of(ql, n));
      project_out(wo, wm, rows_of(ql, n), [&] { return h; }, n, pieces);
    };
    c.own_loop(rr, qc, true, slab);
    c.pad_loop(rr, qc, slab);
    release_all(c, {&wqh, &wo, &wm});
    if (!streamed) project_all(ofull);
    return;
  }

  // K as it is, or the consumer's carrier of it, filled slab by slab at its row alignment.
  // Token-major K/V (and Q where no heads fold) for a consumer that takes strided heads: the
  // projections write V in place and the Q/K kernels write rows as they are.
  const int carrier = c.k_carrier(a.consumer, G, L, hd);
  const bool tm = carrier < 0 && strided;
  const auto [kv_layout, q_layout, kv_shape] = kv_layout_of(tm, G);
  const int kv_dim = tm ? 0 : 1;  // the rows' dimension in K and V
  const int K = carrier >= 0 ? carrier : c.buffer(BufRole::GlobalK, "K", kv_shape, dt);
  const int V = c.buffer(BufRole::GlobalV, "V", kv_shape, dt);
  int64_t kv_chunk = p.token_chunk;
  if (carrier >= 0) {
    const int64_t align = c.reg().consumer(a.consumer).k_carrier_align;
    kv_chunk = std::max(align, kv_chunk / align * align);
  }

  // K/V: every row (or context row) projected, normed and rotated into the global buffers.
  {
    const Held wk = hold(c, a, k_of), wv = hold(c, a, v_of);
    // Cross-attention projects the context rows as they are (with its one projection set: ir::validate).
    c.token_loop(rr.begin, L, kv_chunk, !cross, [&](int64_t n, int64_t pieces) {
      const Operand h = cross ? Operand{Src::Context, -1, a.context, -1, {n, kv_in}}
                              : c.normed(s.norm, b.modulation, s.mod, n, pieces);
      const Operand k = c.whole(c.buffer(BufRole::KV, "k", {n, wkv}, dt));
      const Operand vdst = c.slab_of(V, kv_dim, n);
      const Operand v = tm ? vdst : c.whole(c.buffer(BufRole::KV, "v", {n, wkv}, dt));
      c.project(h, k, wk, kv_in, wkv, n, pieces);
      c.project(h, v, wv, kv_in, wkv, n, pieces);
      const Operand kdst =
          carrier >= 0 ? c.whole(c.buffer(BufRole::KSlab, "KS", {G, n, hd}, dt)) : c.slab_of(K, kv_dim, n);
      qk_rows(k, kdst, kv_layout, wk, G, 1, TensorRole::K, n, pieces);
      if (carrier >= 0) c.carry_k(a.consumer, kdst, carrier, L);
      c.patches(a.patches, TensorRole::V, v);
      if (!tm) c.copy(v, vdst, Layout::HeadMajor, G, 1, hd);
    });
    release_all(c, {&wk, &wv});
  }

  // Q: each slab normed, projected, rotated, attended against the complete K/V; streamed, its
  // output is projected and added into its residual rows at once.
  const int ofull = streamed ? -1 : c.buffer(BufRole::AttnOutFull, "OFull", {Tl, wq}, dt);
  {
    const Held wqh = hold(c, a, q_of), wo = streamed ? hold(c, a, out_of) : Held{},
               wm = streamed && mlp ? hold(c, a, mlp_of) : Held{};
    c.own_loop(rr, p.q_chunk, true, [&](int64_t n, int64_t pieces) {
      const Operand h = c.normed(s.norm, b.modulation, s.mod, n, pieces);
      const Operand q = c.whole(c.buffer(BufRole::Q, "Q", {n, wq}, dt));
      c.project(h, q, wqh, D, wq, n, pieces);
      const Operand qf = c.whole(c.buffer(BufRole::QFolded, "QF",
                                          q_layout == Layout::Same ? std::vector<int64_t>{n, wq}
                                                                   : std::vector<int64_t>{G, rep * n, hd},
                                          dt));
      qk_rows(q, qf, q_layout, wqh, G, rep, TensorRole::Q, n, pieces);
      const Operand o = streamed ? c.whole(c.buffer(BufRole::AttnOut, "O", {n, wq}, dt)) : c.slab_of(ofull, 0, n);
      c.attend(a, qf, K, V, o, n, L, q_layout, kv_layout, call);
      if (!streamed) return;
      c.patches(a.patches, TensorRole::AttnOut, o);
      project_out(wo, wm, o, [&] { return h; }, n, pieces);
    });
    release_all(c, {&wqh, &wo, &wm});
  }
  if (!streamed) project_all(ofull);
}

// Rows of the gate and up projections for hidden features [f0, f0 + fn): f0 is the feature
// slab's first feature where per_feature is 1, 0 where it is 0 (no feature loop).
struct GateUp {
  const ir::Linear* gate;
  SliceExpr gate_rows;
  const ir::Linear* up;
  SliceExpr up_rows;
};

GateUp gate_up_rows(const ir::Mlp& m, int64_t per_feature, int64_t fn) {
  switch (m.layout) {
    case ir::GateUpLayout::None: return {nullptr, {}, &*m.up, {0, per_feature, fn, 1}};
    case ir::GateUpLayout::Separate: return {&*m.gate, {0, per_feature, fn, 1}, &*m.up, {0, per_feature, fn, 1}};
    case ir::GateUpLayout::FusedHalves:
      return {&*m.up, {0, per_feature, fn, 1}, &*m.up, {m.hidden, per_feature, fn, 1}};
    case ir::GateUpLayout::Interleaved:
      return {&*m.up, {0, 2 * per_feature, fn, 2}, &*m.up, {1, 2 * per_feature, fn, 2}};
  }
  throw std::logic_error("gate/up layout");
}

void compile_mlp(Compiler& c, const ir::Block& b, const ir::Sublayer& s, const ir::Mlp& f, const Schedule& p) {
  const ir::Model& m = c.m();
  const ir::RowRange rr = m.rows(s.segments);
  const int64_t D = m.dim, F = f.hidden, fs = p.feature_slice;
  const bool sliced = fs < F;
  const DType dt = c.dt();

  // The weights of hidden features [f0, f0 + fn) (f0 = per_feature * the slab's first feature):
  // gate (gated layouts only), up and down, down without its bias.
  struct Weights {
    std::optional<SegWeight> gate;
    SegWeight up, down;
  };
  auto acquire = [&](int64_t per_feature, int64_t fn) {
    const GateUp r = gate_up_rows(f, per_feature, fn);
    Weights w;
    if (r.gate) w.gate = SegWeight{"", c.acquire(*r.gate, r.gate_rows, {}, dt), r.gate->bias, r.gate_rows, {}};
    w.up = {"", c.acquire(*r.up, r.up_rows, {}, dt), r.up->bias, r.up_rows, {}};
    w.down = {"", c.acquire(f.down, {}, {0, per_feature, fn, 1}, dt), {}, {}, {}};
    return w;
  };
  auto release = [&](const Weights& w) {
    if (w.gate) c.release(w.gate->weight);
    c.release(w.up.weight);
    c.release(w.down.weight);
  };
  // One feature slice of a slab: gate/up, activation, down into y.
  auto slice = [&](const Weights& w, const Operand& h, const Operand& y, int64_t n, int64_t fn, bool down_bias) {
    const Operand g = c.whole(c.buffer(BufRole::Hidden, "U gate", {n, fn}, dt));
    const Operand u = w.gate ? c.whole(c.buffer(BufRole::Hidden, "U up", {n, fn}, dt)) : g;
    c.project(h, g, {w.gate.value_or(w.up)}, D, fn, n, 1);
    if (w.gate) c.project(h, u, {w.up}, D, fn, n, 1);
    c.activate(g, f.act);
    if (w.gate) c.mul(g, u);
    c.patches(f.patches, TensorRole::MlpHidden, g);
    SegWeight down = w.down;
    if (down_bias) down.bias = f.down.bias;
    c.project(g, y, {down}, fn, D, n, 1);
  };

  Weights held;
  if (!sliced) held = acquire(0, F);
  c.own_loop(rr, p.token_chunk, true, [&](int64_t n, int64_t pieces) {
    const Operand h = c.normed(s.norm, b.modulation, s.mod, n, pieces);
    if (!sliced) {
      const Operand y = c.whole(c.buffer(BufRole::Proj, "Y", {n, D}, dt));
      slice(held, h, y, n, F, true);
      c.residual_add(y, b.modulation, s.mod, n, pieces);
      return;
    }
    const Operand acc = c.whole(c.buffer(BufRole::Acc, "Acc", {n, D}, c.acc()));
    c.zero(acc);
    c.feature_loop(F, fs, [&](int64_t fn) {
      const Weights w = acquire(1, fn);
      const Operand y = c.whole(c.buffer(BufRole::Proj, "Y", {n, D}, dt));
      slice(w, h, y, n, fn, false);
      c.add(acc, y);
      release(w);
    });
    if (!f.down.bias.empty()) c.add_bias(acc, f.down.bias);
    c.residual_add(acc, b.modulation, s.mod, n, pieces);
  });
  if (!sliced) release(held);
}

}  // namespace

int64_t programs_compiled() { return detail::compiled; }

Program compile_sublayer(const ir::Model& m, const ir::Block& b, const ir::Sublayer& s, const Schedule& p,
                         const contracts::Registry& reg, const contracts::DeviceCaps& dev, double kv_budget,
                         const Sequence& seq) {
  Compiler c(m, reg, dev, b.name + "." + s.name, m.rows(s.segments), seq);
  if (const auto* a = std::get_if<ir::Attention>(&s.body)) compile_attention(c, b, s, *a, p, kv_budget);
  else compile_mlp(c, b, s, std::get<ir::Mlp>(s.body), p);
  return c.take();
}

}  // namespace sp::plan
