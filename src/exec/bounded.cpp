// The bounded schedule. Per sublayer it walks the phases of plan/schedule.hpp:
//   attention: kv (project K/V slab by slab into the global buffers),
//              q (each Q slab: project, norm, rotate, attend, and — when streamed —
//                 project the output and add it into the residual rows in place),
//              out (only when the output projection is not streamed);
//   mlp:       per token slab, per feature slice: gate/up, activation, down,
//              accumulated in fp32 when sliced, then added into the residual rows.
// In-place residual writes happen only after every reader of the old rows has run:
// K/V are complete before any row of x changes, and a Q slab reads only its own rows.
#include <cmath>
#include <tuple>

#include "exec/consumers.hpp"
#include "exec/executor.hpp"
#include "exec/ops.hpp"
#include "exec/patches.hpp"
#include "exec/workspace.hpp"

namespace sp::exec {

using plan::Buf;
using legality::Transform;

at::Tensor Workspace::get(Buf id, at::IntArrayRef shape) const {
  const Slot& s = slots_[static_cast<size_t>(id)];
  TORCH_CHECK(s.storage.defined(), "workspace buffer ", plan::to_string(id), " was not planned for this phase");
  const int64_t n = c10::multiply_integers(shape), esz = static_cast<int64_t>(c10::elementSize(s.dtype));
  const int64_t capacity = c10::multiply_integers(s.shape);
  TORCH_CHECK(n <= capacity, "workspace buffer ", plan::to_string(id), " holds ", capacity, " elements, ", n,
              " requested");
  return s.storage.narrow(0, 0, n * esz).view(s.dtype).view(shape);
}

at::Tensor Workspace::full(Buf id) const { return get(id, slots_[static_cast<size_t>(id)].shape); }

void Workspace::allocate(const plan::PhaseSpec& spec) {
  for (const auto& b : spec.buffers) {
    if (b.share != Buf::Count) continue;
    Slot& slot = slots_[static_cast<size_t>(b.id)];
    if (!slot.storage.defined())
      slot.storage = at::empty({spec.storage_bytes(b.id)}, at::TensorOptions().dtype(at::kByte).device(device_));
    slot.dtype = to_aten(b.dtype);
    slot.shape = b.shape;
    slot.owner = true;
  }
  for (const auto& b : spec.buffers) {
    if (b.share == Buf::Count) continue;
    Slot& slot = slots_[static_cast<size_t>(b.id)];
    slot.storage = slots_[static_cast<size_t>(b.share)].storage;
    TORCH_CHECK(slot.storage.defined(), "buffer ", plan::to_string(b.id), " shares ", plan::to_string(b.share),
                ", which the phase does not own");
    slot.dtype = to_aten(b.dtype);
    slot.shape = b.shape;
    slot.owner = false;
  }
}

Workspace Workspace::handoff(const plan::PhaseSpec& next) {
  Workspace out(device_);
  for (const auto& b : next.buffers) {
    Slot& mine = slots_[static_cast<size_t>(b.id)];
    if (b.share == Buf::Count && mine.owner && mine.storage.defined() && mine.shape == b.shape &&
        mine.dtype == to_aten(b.dtype) && mine.storage.numel() == next.storage_bytes(b.id))
      out.slots_[static_cast<size_t>(b.id)] = std::move(mine);
  }
  for (auto& s : slots_) s = Slot{};
  out.allocate(next);
  return out;
}

namespace {

struct Run {
  const ir::Model& m;
  const WeightSource& w;
  const Inputs& in;
  const contracts::Registry& reg;
  at::Device device;
  at::ScalarType dt, acc;
  Ops ops;
  bool fused;  // plan::fused_norm: norm + modulation in one kernel, straight into H
};

// H [n, D] := modulate(norm(rows [row0, row0 + n) of x)), in the activation dtype.
at::Tensor normed_rows(const Run& r, const Workspace& ws, const at::Tensor& x, const ir::Norm& norm,
                       const ir::Modulation& mod, const ir::ModRef& ref, int64_t row0, int64_t n) {
  at::Tensor h = ws.get(Buf::H, {n, r.m.dim});
  if (r.fused) {
    r.ops.norm_modulate_fused(x.narrow(0, row0, n), norm, mod, ref, row0, h);
    return h;
  }
  at::Tensor n32 = ws.get(Buf::N32, {n, r.m.dim});
  r.ops.norm_modulate(x.narrow(0, row0, n), norm, mod, ref, row0, n32);
  h.copy_(n32);
  return h;
}

template <typename F>
void for_slabs(int64_t total, int64_t chunk, F&& f) {
  for (int64_t r0 = 0; r0 < total; r0 += chunk) f(r0, std::min(chunk, total - r0));
}

// out = h @ w^T (+ bias): one GEMM, the bias in its epilogue (as at::linear does).
void gemm_into(at::Tensor out, const at::Tensor& h, const at::Tensor& w, const at::Tensor& bias) {
  if (bias.defined()) at::addmm_out(out, bias, h, w.t());
  else at::mm_out(out, h, w.t());
}

// y = h @ W[rows]^T (+ bias[rows]) into `out`.
void project(const Run& r, const ir::Linear& l, const at::Tensor& weight_rows, Slice rows, const at::Tensor& h,
             at::Tensor out) {
  gemm_into(out, h, weight_rows, l.bias.empty() ? at::Tensor() : slice(r.w.tensor(l.bias), 0, rows));
}

// Calls f(local_begin, length, projections) for the pieces of absolute rows [r0, r0+n)
// that use the same projection set (one piece unless the attention is joint).
template <typename F>
void proj_pieces(const ir::Model& m, const ir::Attention& a, int64_t r0, int64_t n, F&& f) {
  if (a.segment_proj.empty()) {
    f(0, n, a.proj);
    return;
  }
  int64_t start = 0;
  for (const auto& seg : m.segments) {
    const int64_t lo = std::max(r0, start), hi = std::min(r0 + n, start + seg.length);
    if (lo < hi) f(lo - r0, hi - lo, a.proj_for(seg.name));
    start += seg.length;
  }
}

// Region rows of a projection set: fused regions are row ranges of the one weight.
Slice region_rows(const ir::AttnProj& p, const char* name, int64_t width) {
  return {p.fused() ? p.qkv->out_region(name)->offset : 0, width};
}

// The acquired weight of each projection set (held for a phase).
struct HeldProj {
  std::vector<std::pair<const ir::AttnProj*, at::Tensor>> w;
  const at::Tensor& of(const ir::AttnProj& p) const {
    for (const auto& [k, t] : w)
      if (k == &p) return t;
    throw std::logic_error("projection not held");
  }
};

template <typename F>
HeldProj hold(const Run& r, const ir::Attention& a, F&& linear_and_rows) {
  HeldProj h;
  for (const ir::AttnProj* p : a.all_proj()) {
    auto [l, rows, cols] = linear_and_rows(*p);
    h.w.push_back({p, r.w.acquire(*l, rows, cols, r.dt)});
  }
  return h;
}

void attention(Run& r, const ir::Block& b, const ir::Sublayer& s, const ir::Attention& a, const plan::SublayerPlan& p,
               at::Tensor& x, const contracts::DeviceCaps& dev) {
  const ir::RowRange rr = r.m.rows(s.segments);
  const int64_t T = rr.size(), D = r.m.dim, H = a.heads, G = a.kv_heads, hd = a.head_dim;
  const int64_t wq = H * hd, wkv = G * hd, rep = H / G, mlp = a.parallel ? a.parallel->hidden : 0;
  const bool cross = a.kind == ir::AttnKind::Cross;
  const at::Tensor ctx = cross ? r.in.table(a.context) : at::Tensor();
  const int64_t L = cross ? ctx.size(0) : T;
  const auto phases = plan::sublayer_phases(r.m, s, p, r.reg, dev);
  const bool roped = a.rope.style != ir::RopeStyle::None;
  const bool fq = plan::fused_qk(r.m, a, r.reg, dev);
  at::Tensor cos, sin;
  if (roped) {
    cos = r.in.table(a.rope.table + ".cos");
    sin = r.in.table(a.rope.table + ".sin");
  }
  // Rows are absolute row numbers of the residual stream.
  auto rotate = [&](at::Tensor t3, const Workspace& ws, int64_t row0, int64_t n, int64_t heads) {
    if (roped)
      r.ops.rope_(t3, a.rope, cos.narrow(0, row0, n), sin.narrow(0, row0, n),
                  ws.get(Buf::RopeTmp, {n, heads, a.rope.rotary_dim / 2}));
  };
  // Q/K norm and RoPE of t [n, heads*hd] (absolute rows from row0) in one kernel, into out3 [n, heads, hd].
  auto norm_rotate_into = [&](const at::Tensor& t, const std::string& weight, int64_t row0, const at::Tensor& out3) {
    const int64_t n = t.size(0);
    r.ops.qk_norm_rope_fused(t, a.qk_norm, weight, a.rope, roped ? cos.narrow(0, row0, n) : at::Tensor(),
                             roped ? sin.narrow(0, row0, n) : at::Tensor(), out3);
  };
  using Acq = std::tuple<const ir::Linear*, Slice, Slice>;
  auto normed = [&](const Workspace& ws, int64_t row0, int64_t n) {
    return normed_rows(r, ws, x, s.norm, b.modulation, s.mod, row0, n);
  };

  // Phase kv: K and V for every row (or every context row) into the global buffers.
  Workspace ws(r.device, phases[0]);
  {
    const HeldProj wk = hold(r, a, [&](const ir::AttnProj& pr) { return Acq{&pr.k_linear(), region_rows(pr, "k", wkv), {}}; });
    const HeldProj wv = hold(r, a, [&](const ir::AttnProj& pr) { return Acq{&pr.v_linear(), region_rows(pr, "v", wkv), {}}; });
    at::Tensor K = ws.full(Buf::K), V = ws.full(Buf::V);
    for_slabs(L, p.token_chunk, [&](int64_t l0, int64_t n) {
      const int64_t row0 = rr.begin + l0;
      at::Tensor h = cross ? ctx.narrow(0, l0, n) : normed(ws, row0, n);
      at::Tensor kv = ws.get(Buf::KV, {2, n, wkv});
      at::Tensor k = kv.select(0, 0), v = kv.select(0, 1), k32 = fq ? at::Tensor() : ws.get(Buf::K32, {n, wkv});
      auto project_kv = [&](int64_t lb, int64_t len, const ir::AttnProj& pr) {
        project(r, pr.k_linear(), wk.of(pr), region_rows(pr, "k", wkv), h.narrow(0, lb, len), k.narrow(0, lb, len));
        project(r, pr.v_linear(), wv.of(pr), region_rows(pr, "v", wkv), h.narrow(0, lb, len), v.narrow(0, lb, len));
        if (fq) {  // straight into the global K rows
          norm_rotate_into(k.narrow(0, lb, len), pr.k_norm, row0 + lb, K.narrow(1, l0 + lb, len).transpose(0, 1));
          return;
        }
        at::Tensor kp = k32.narrow(0, lb, len);
        kp.copy_(k.narrow(0, lb, len));
        r.ops.qk_norm_(kp, a.qk_norm, pr.k_norm, G, hd);
      };
      if (cross) project_kv(0, n, a.proj);
      else proj_pieces(r.m, a, row0, n, project_kv);
      if (!fq) {
        rotate(k32.view({n, G, hd}), ws, row0, n, G);
        apply_patches(r.reg, a.patches, contracts::TensorRole::K, k32);
        K.narrow(1, l0, n).copy_(k32.view({n, G, hd}).transpose(0, 1));
      }
      apply_patches(r.reg, a.patches, contracts::TensorRole::V, v);
      V.narrow(1, l0, n).copy_(v.view({n, G, hd}).transpose(0, 1));
    });
  }

  // The parallel MLP of a slab: activated "mlp" region rows into U.
  auto parallel_mlp = [&](const Workspace& ws, const HeldProj& wm, const at::Tensor& h, int64_t row0, int64_t n) {
    at::Tensor u = ws.get(Buf::U, {1, n, mlp}).select(0, 0);
    proj_pieces(r.m, a, row0, n, [&](int64_t lb, int64_t len, const ir::AttnProj& pr) {
      project(r, *pr.qkv, wm.of(pr), region_rows(pr, "mlp", mlp), h.narrow(0, lb, len), u.narrow(0, lb, len));
    });
    r.ops.activate_(u, a.parallel->act);
    apply_patches(r.reg, a.patches, contracts::TensorRole::MlpHidden, u);
    return u;
  };
  // y = [o | u] @ out^T (+ bias), per projection set, then the gated residual add.
  auto project_out = [&](const Workspace& ws, const HeldProj& wo, const at::Tensor& o, const at::Tensor& u,
                         int64_t row0, int64_t n) {
    at::Tensor y = ws.get(Buf::Y, {n, D});
    proj_pieces(r.m, a, row0, n, [&](int64_t lb, int64_t len, const ir::AttnProj& pr) {
      const at::Tensor& w = wo.of(pr);
      at::Tensor yp = y.narrow(0, lb, len);
      gemm_into(yp, o.narrow(0, lb, len), w.narrow(1, 0, wq), pr.out.bias.empty() ? at::Tensor() : r.w.tensor(pr.out.bias));
      if (mlp) yp.addmm_(u.narrow(0, lb, len), w.narrow(1, wq, mlp).t());
    });
    r.ops.gated_add(x.narrow(0, row0, n), y, b.modulation, s.mod, row0);
  };
  auto hold_out = [&] { return hold(r, a, [&](const ir::AttnProj& pr) { return Acq{&pr.out, {}, {}}; }); };
  auto hold_mlp = [&] {
    return mlp ? hold(r, a, [&](const ir::AttnProj& pr) { return Acq{&*pr.qkv, region_rows(pr, "mlp", mlp), {}}; })
               : HeldProj{};
  };

  // Phase q: each Q slab against the complete K/V.
  const bool streamed = p.chosen(Transform::StreamedOutProj);
  ws = ws.handoff(phases[1]);
  {
    const HeldProj wqt = hold(r, a, [&](const ir::AttnProj& pr) { return Acq{&pr.q_linear(), region_rows(pr, "q", wq), {}}; });
    const HeldProj wo = streamed ? hold_out() : HeldProj{};
    const HeldProj wm = streamed ? hold_mlp() : HeldProj{};
    at::Tensor K = ws.full(Buf::K).unsqueeze(0), V = ws.full(Buf::V).unsqueeze(0);
    const auto& attend = consumer_impl(a.consumer);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    for_slabs(T, p.q_chunk, [&](int64_t t0, int64_t n) {
      const int64_t row0 = rr.begin + t0;
      at::Tensor h = normed(ws, row0, n);
      at::Tensor q = ws.get(Buf::Q, {n, wq}), q32 = fq ? at::Tensor() : ws.get(Buf::Q32, {n, wq});
      // Each KV group's query heads folded into rows: [G, rep, n, hd] head-major.
      at::Tensor qf = ws.get(Buf::QF, {G, rep * n, hd});
      proj_pieces(r.m, a, row0, n, [&](int64_t lb, int64_t len, const ir::AttnProj& pr) {
        project(r, pr.q_linear(), wqt.of(pr), region_rows(pr, "q", wq), h.narrow(0, lb, len), q.narrow(0, lb, len));
        if (fq) {  // straight into the folded layout
          norm_rotate_into(q.narrow(0, lb, len), pr.q_norm, row0 + lb, qf.view({H, n, hd}).narrow(1, lb, len).transpose(0, 1));
          return;
        }
        at::Tensor qp = q32.narrow(0, lb, len);
        qp.copy_(q.narrow(0, lb, len));
        r.ops.qk_norm_(qp, a.qk_norm, pr.q_norm, H, hd);
      });
      if (!fq) {
        rotate(q32.view({n, H, hd}), ws, row0, n, H);
        apply_patches(r.reg, a.patches, contracts::TensorRole::Q, q32);
        qf.view({G, rep, n, hd}).copy_(q32.view({n, G, rep, hd}).permute({1, 2, 0, 3}));
      }
      at::Tensor o4 = attend(qf.unsqueeze(0), K, V, scale);
      at::Tensor o = streamed ? ws.get(Buf::O, {n, wq}) : ws.full(Buf::OFull).narrow(0, t0, n);
      o.view({n, G, rep, hd}).copy_(o4.view({G, rep, n, hd}).permute({2, 0, 1, 3}));
      o4.reset();
      if (streamed) {
        apply_patches(r.reg, a.patches, contracts::TensorRole::AttnOut, o);
        const at::Tensor u = mlp ? parallel_mlp(ws, wm, h, row0, n) : at::Tensor();
        project_out(ws, wo, o, u, row0, n);
      }
    });
  }
  if (streamed) return;

  // Phase out: the complete attention output (patched) projected slab by slab; a parallel
  // MLP is recomputed from the residual rows, which no write has touched yet.
  ws = ws.handoff(phases[2]);
  at::Tensor of = ws.full(Buf::OFull);
  apply_patches(r.reg, a.patches, contracts::TensorRole::AttnOut, of);
  const HeldProj wo = hold_out(), wm = hold_mlp();
  for_slabs(T, p.token_chunk, [&](int64_t t0, int64_t n) {
    const int64_t row0 = rr.begin + t0;
    const at::Tensor u = mlp ? parallel_mlp(ws, wm, normed(ws, row0, n), row0, n) : at::Tensor();
    project_out(ws, wo, of.narrow(0, t0, n), u, row0, n);
  });
}

// Rows of the gate and up projections for hidden features [f0, f0+fn).
struct GateUpRows {
  const ir::Linear* gate;
  Slice gate_rows;
  const ir::Linear* up;
  Slice up_rows;
};

GateUpRows gate_up_rows(const ir::Mlp& m, int64_t f0, int64_t fn) {
  switch (m.layout) {
    case ir::GateUpLayout::None: return {nullptr, {}, &*m.up, {f0, fn}};
    case ir::GateUpLayout::Separate: return {&*m.gate, {f0, fn}, &*m.up, {f0, fn}};
    case ir::GateUpLayout::FusedHalves: return {&*m.up, {f0, fn}, &*m.up, {m.hidden + f0, fn}};
    case ir::GateUpLayout::Interleaved: return {&*m.up, {2 * f0, fn, 2}, &*m.up, {2 * f0 + 1, fn, 2}};
  }
  throw std::logic_error("layout");
}

void mlp(Run& r, const ir::Block& b, const ir::Sublayer& s, const ir::Mlp& m, const plan::SublayerPlan& p,
         at::Tensor& x, const contracts::DeviceCaps& dev) {
  const ir::RowRange rr = r.m.rows(s.segments);
  const int64_t T = rr.size(), D = r.m.dim, F = m.hidden, fs = p.feature_slice;
  const bool sliced = fs < F;
  Workspace ws(r.device, plan::sublayer_phases(r.m, s, p, r.reg, dev)[0]);
  // Unsliced, every weight is acquired once and held for all slabs.
  struct Held {
    at::Tensor gate, up, down;
  } held;
  auto acquire = [&](int64_t f0, int64_t fn) {
    GateUpRows g = gate_up_rows(m, f0, fn);
    Held h;
    if (g.gate) h.gate = r.w.acquire(*g.gate, g.gate_rows, {}, r.dt);
    h.up = r.w.acquire(*g.up, g.up_rows, {}, r.dt);
    h.down = r.w.acquire(m.down, {}, {f0, fn}, r.dt);
    return h;
  };
  if (!sliced) held = acquire(0, F);
  const at::Tensor bias = m.down.bias.empty() ? at::Tensor() : r.w.tensor(m.down.bias);
  for_slabs(T, p.token_chunk, [&](int64_t t0, int64_t n) {
    const int64_t r0 = rr.begin + t0;
    at::Tensor xr = x.narrow(0, r0, n);
    const at::Tensor h = normed_rows(r, ws, x, s.norm, b.modulation, s.mod, r0, n);
    at::Tensor acc = sliced ? ws.get(Buf::Acc, {n, D}) : at::Tensor();
    if (sliced) acc.zero_();
    at::Tensor y = ws.get(Buf::Y, {n, D});
    for_slabs(F, fs, [&](int64_t f0, int64_t fn) {
      Held wt = sliced ? acquire(f0, fn) : held;
      GateUpRows g = gate_up_rows(m, f0, fn);
      at::Tensor u = ws.get(Buf::U, {m.gated() ? 2 : 1, n, fn});
      at::Tensor act = u.select(0, 0);
      if (m.gated()) {
        project(r, *g.gate, wt.gate, g.gate_rows, h, act);
        project(r, *g.up, wt.up, g.up_rows, h, u.select(0, 1));
        r.ops.activate_(act, m.act);
        act.mul_(u.select(0, 1));
      } else {
        project(r, *g.up, wt.up, g.up_rows, h, act);
        r.ops.activate_(act, m.act);
      }
      apply_patches(r.reg, m.patches, contracts::TensorRole::MlpHidden, act);
      gemm_into(y, act, wt.down, sliced ? at::Tensor() : bias);  // sliced: the bias is added once, below
      if (sliced) acc.add_(y);
    });
    at::Tensor out = sliced ? acc : y;
    if (sliced && bias.defined()) out.add_(bias);
    r.ops.gated_add(xr, out, b.modulation, s.mod, r0);
  });
}

}  // namespace

at::Tensor run_planned(const ir::Model& m, const plan::Plan& p, const WeightSource& w, const Inputs& in,
                       const contracts::Registry& reg, const contracts::DeviceCaps& dev, const Progress& progress) {
  validate_inputs(m, in);
  if (p.blocks.size() != m.blocks.size() || p.tokens != m.tokens())
    throw std::invalid_argument("plan does not belong to this model: " + std::to_string(p.blocks.size()) +
                                " blocks / " + std::to_string(p.tokens) + " tokens vs " +
                                std::to_string(m.blocks.size()) + " / " + std::to_string(m.tokens()));
  const at::ScalarType dt = to_aten(m.dtype), acc = to_aten(plan::accumulation_dtype(m.dtype));
  const at::Device device = in.device();
  Run r{m, w, in, reg, device, dt, acc, Ops(m, w, in), plan::fused_norm(m, dev)};
  const int64_t T = m.tokens(), D = m.dim;

  at::Tensor x = at::empty({T, D}, at::TensorOptions().dtype(dt).device(device));
  for (const auto& seg : m.segments) {
    at::Tensor rows = x.narrow(0, m.segment_begin(seg.name), seg.length);
    const at::Tensor& tokens = in.segment_tokens(seg.name);
    if (const ir::SegmentEmbed* e = m.embed_for(seg.name)) {
      at::Tensor we = w.acquire(e->linear, {}, {}, dt);
      project(r, e->linear, we, {}, tokens, rows);
    } else {
      rows.copy_(tokens);
    }
  }
  int64_t done = 0, total = 0;
  for (const auto& b : m.blocks) total += int64_t(b.sublayers.size());
  for (size_t bi = 0; bi < m.blocks.size(); ++bi) {
    const ir::Block& b = m.blocks[bi];
    for (size_t si = 0; si < b.sublayers.size(); ++si) {
      const ir::Sublayer& s = b.sublayers[si];
      const plan::SublayerPlan& sp = p.blocks[bi].sublayers[si];
      if (const auto* a = std::get_if<ir::Attention>(&s.body)) attention(r, b, s, *a, sp, x, dev);
      else mlp(r, b, s, std::get<ir::Mlp>(s.body), sp, x, dev);
      if (progress) progress(++done, total);
    }
  }
  if (!m.final_layer) return x.to(acc);

  const ir::FinalLayer& f = *m.final_layer;
  const ir::RowRange fr = m.rows(f.segments);
  Workspace ws(r.device, plan::final_phase(m, p.final_layer.chunk, reg));
  at::Tensor w32 = w.acquire(f.proj, {}, {}, reg.format(f.proj.format).dense ? dt : acc).to(acc);
  at::Tensor b32 = f.proj.bias.empty() ? at::Tensor() : w.tensor(f.proj.bias).to(acc);
  at::Tensor out = ws.full(Buf::Out);
  for_slabs(fr.size(), p.final_layer.chunk, [&](int64_t t0, int64_t n) {
    const int64_t r0 = fr.begin + t0;
    at::Tensor n32 = ws.get(Buf::N32, {n, D});
    if (r.fused) r.ops.norm_modulate_fused(x.narrow(0, r0, n), f.norm, f.modulation, f.mod, r0, n32);
    else r.ops.norm_modulate(x.narrow(0, r0, n), f.norm, f.modulation, f.mod, r0, n32);
    at::Tensor o = out.narrow(0, t0, n);
    at::mm_out(o, n32, w32.t());
    if (b32.defined()) o.add_(b32);
  });
  return out;
}

}  // namespace sp::exec
