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

#include "exec/consumers.hpp"
#include "exec/executor.hpp"
#include "exec/ops.hpp"
#include "exec/patches.hpp"
#include "exec/workspace.hpp"

namespace sp::exec {

using plan::Buf;
using legality::Transform;

at::Tensor Workspace::get(Buf id, at::IntArrayRef shape) const {
  const at::Tensor& b = bufs_[static_cast<size_t>(id)];
  TORCH_CHECK(b.defined(), "workspace buffer ", plan::to_string(id), " was not planned for this phase");
  const int64_t n = c10::multiply_integers(shape);
  TORCH_CHECK(n <= b.numel(), "workspace buffer ", plan::to_string(id), " holds ", b.numel(), " elements, ", n,
              " requested");
  return b.view(-1).narrow(0, 0, n).view(shape);
}

at::Tensor Workspace::full(Buf id) const { return get(id, bufs_[static_cast<size_t>(id)].sizes()); }

void Workspace::allocate(const plan::PhaseSpec& spec) {
  for (const auto& b : spec.buffers) {
    at::Tensor& slot = bufs_[static_cast<size_t>(b.id)];
    if (!slot.defined()) slot = at::empty(b.shape, at::TensorOptions().dtype(to_aten(b.dtype)).device(device_));
  }
}

Workspace Workspace::handoff(const plan::PhaseSpec& next) {
  Workspace out(device_);
  for (const auto& b : next.buffers) {
    at::Tensor& mine = bufs_[static_cast<size_t>(b.id)];
    if (mine.defined() && mine.sizes().vec() == b.shape && mine.scalar_type() == to_aten(b.dtype))
      out.bufs_[static_cast<size_t>(b.id)] = std::move(mine);
  }
  for (auto& t : bufs_) t.reset();
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
};

template <typename F>
void for_slabs(int64_t total, int64_t chunk, F&& f) {
  for (int64_t r0 = 0; r0 < total; r0 += chunk) f(r0, std::min(chunk, total - r0));
}

// y = h @ W[rows]^T (+ bias[rows]) into `out`.
void project(const Run& r, const ir::Linear& l, const at::Tensor& weight_rows, Slice rows, const at::Tensor& h,
             at::Tensor out) {
  at::mm_out(out, h, weight_rows.t());
  if (!l.bias.empty()) out.add_(slice(r.w.tensor(l.bias), 0, rows));
}

void attention(Run& r, const ir::Block& b, const ir::Sublayer& s, const ir::Attention& a, const plan::SublayerPlan& p,
               at::Tensor& x, const contracts::DeviceCaps& dev) {
  const int64_t T = r.m.tokens(), D = r.m.dim, H = a.heads, G = a.kv_heads, hd = a.head_dim;
  const int64_t wq = H * hd, wkv = G * hd, rep = H / G;
  const auto phases = plan::sublayer_phases(r.m, s, p, r.reg, dev);
  const ir::Linear& ql = a.fused() ? *a.qkv : *a.q;
  const ir::Linear& kl = a.fused() ? *a.qkv : *a.k;
  const ir::Linear& vl = a.fused() ? *a.qkv : *a.v;
  const Slice qrows{a.fused() ? a.qkv->out_region("q")->offset : 0, wq};
  const Slice krows{a.fused() ? a.qkv->out_region("k")->offset : 0, wkv};
  const Slice vrows{a.fused() ? a.qkv->out_region("v")->offset : 0, wkv};
  const bool roped = a.rope.style != ir::RopeStyle::None;
  at::Tensor cos, sin;
  if (roped) {
    cos = r.in.table(a.rope.table + ".cos");
    sin = r.in.table(a.rope.table + ".sin");
  }
  auto rotate = [&](at::Tensor t3, const Workspace& ws, int64_t r0, int64_t n, int64_t heads) {
    if (roped)
      r.ops.rope_(t3, a.rope, cos.narrow(0, r0, n), sin.narrow(0, r0, n),
                  ws.get(Buf::RopeTmp, {n, heads, a.rope.rotary_dim / 2}));
  };

  // Phase kv: K and V for every token into the global buffers.
  Workspace ws(r.device, phases[0]);
  {
    at::Tensor wk = r.w.acquire(kl, krows, {}, r.dt), wv = r.w.acquire(vl, vrows, {}, r.dt);
    at::Tensor K = ws.full(Buf::K), V = ws.full(Buf::V);
    for_slabs(T, p.token_chunk, [&](int64_t r0, int64_t n) {
      at::Tensor n32 = ws.get(Buf::N32, {n, D}), h = ws.get(Buf::H, {n, D});
      r.ops.norm_modulate(x.narrow(0, r0, n), s.norm, b.modulation, s.mod, r0, n32);
      h.copy_(n32);
      at::Tensor kv = ws.get(Buf::KV, {2, n, wkv});
      at::Tensor k = kv.select(0, 0), v = kv.select(0, 1);
      project(r, kl, wk, krows, h, k);
      project(r, vl, wv, vrows, h, v);
      at::Tensor k32 = ws.get(Buf::K32, {n, wkv});
      k32.copy_(k);
      r.ops.qk_norm_(k32, a.qk_norm, a.qk_norm.k_weight, G, hd);
      rotate(k32.view({n, G, hd}), ws, r0, n, G);
      apply_patches(r.reg, a.patches, contracts::TensorRole::K, k32);
      apply_patches(r.reg, a.patches, contracts::TensorRole::V, v);
      K.narrow(1, r0, n).copy_(k32.view({n, G, hd}).transpose(0, 1));
      V.narrow(1, r0, n).copy_(v.view({n, G, hd}).transpose(0, 1));
    });
  }

  // Phase q: each Q slab against the complete K/V.
  const bool streamed = p.chosen(Transform::StreamedOutProj);
  ws = ws.handoff(phases[1]);
  {
    at::Tensor wqt = r.w.acquire(ql, qrows, {}, r.dt);
    at::Tensor wo = streamed ? r.w.acquire(a.out, {}, {}, r.dt) : at::Tensor();
    at::Tensor K = ws.full(Buf::K).unsqueeze(0), V = ws.full(Buf::V).unsqueeze(0);
    const auto& attend = consumer_impl(a.consumer);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    for_slabs(T, p.q_chunk, [&](int64_t r0, int64_t n) {
      at::Tensor n32 = ws.get(Buf::N32, {n, D}), h = ws.get(Buf::H, {n, D});
      at::Tensor xr = x.narrow(0, r0, n);
      r.ops.norm_modulate(xr, s.norm, b.modulation, s.mod, r0, n32);
      h.copy_(n32);
      at::Tensor q = ws.get(Buf::Q, {n, wq});
      project(r, ql, wqt, qrows, h, q);
      at::Tensor q32 = ws.get(Buf::Q32, {n, wq});
      q32.copy_(q);
      r.ops.qk_norm_(q32, a.qk_norm, a.qk_norm.q_weight, H, hd);
      rotate(q32.view({n, H, hd}), ws, r0, n, H);
      apply_patches(r.reg, a.patches, contracts::TensorRole::Q, q32);
      // Fold each KV group's query heads into rows: [G, rep, n, hd] head-major.
      at::Tensor qf = ws.get(Buf::QF, {G, rep * n, hd});
      qf.view({G, rep, n, hd}).copy_(q32.view({n, G, rep, hd}).permute({1, 2, 0, 3}));
      at::Tensor o4 = attend(qf.unsqueeze(0), K, V, scale);
      at::Tensor o = streamed ? ws.get(Buf::O, {n, wq}) : ws.full(Buf::OFull).narrow(0, r0, n);
      o.view({n, G, rep, hd}).copy_(o4.view({G, rep, n, hd}).permute({2, 0, 1, 3}));
      o4.reset();
      if (streamed) {
        apply_patches(r.reg, a.patches, contracts::TensorRole::AttnOut, o);
        at::Tensor y = ws.get(Buf::Y, {n, D});
        project(r, a.out, wo, {}, o, y);
        r.ops.gated_add(xr, y, b.modulation, s.mod, r0);
      }
    });
  }
  if (streamed) return;

  // Phase out: the complete attention output (patched) projected slab by slab.
  ws = ws.handoff(phases[2]);
  at::Tensor of = ws.full(Buf::OFull);
  apply_patches(r.reg, a.patches, contracts::TensorRole::AttnOut, of);
  at::Tensor wo = r.w.acquire(a.out, {}, {}, r.dt);
  for_slabs(T, p.token_chunk, [&](int64_t r0, int64_t n) {
    at::Tensor y = ws.get(Buf::Y, {n, D});
    project(r, a.out, wo, {}, of.narrow(0, r0, n), y);
    r.ops.gated_add(x.narrow(0, r0, n), y, b.modulation, s.mod, r0);
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
  const int64_t T = r.m.tokens(), D = r.m.dim, F = m.hidden, fs = p.feature_slice;
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
  for_slabs(T, p.token_chunk, [&](int64_t r0, int64_t n) {
    at::Tensor n32 = ws.get(Buf::N32, {n, D}), h = ws.get(Buf::H, {n, D});
    at::Tensor xr = x.narrow(0, r0, n);
    r.ops.norm_modulate(xr, s.norm, b.modulation, s.mod, r0, n32);
    h.copy_(n32);
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
      at::mm_out(y, act, wt.down.t());
      if (sliced) acc.add_(y);
    });
    at::Tensor out = sliced ? acc : y;
    if (!m.down.bias.empty()) out.add_(r.w.tensor(m.down.bias));
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
  Run r{m, w, in, reg, in.x.device(), dt, acc, Ops(m, w, in)};
  const int64_t T = m.tokens(), D = m.dim;

  at::Tensor x;
  if (m.embed) {
    x = at::empty({T, D}, in.x.options());
    at::Tensor we = w.acquire(*m.embed, {}, {}, dt);
    project(r, *m.embed, we, {}, in.x, x);
  } else {
    x = in.x.clone();
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
  Workspace ws(r.device, plan::final_phase(m, p.final_layer.chunk, reg));
  at::Tensor w32 = w.acquire(f.proj, {}, {}, reg.format(f.proj.format).dense ? dt : acc).to(acc);
  at::Tensor b32 = f.proj.bias.empty() ? at::Tensor() : w.tensor(f.proj.bias).to(acc);
  at::Tensor out = ws.full(Buf::Out);
  for_slabs(T, p.final_layer.chunk, [&](int64_t r0, int64_t n) {
    at::Tensor n32 = ws.get(Buf::N32, {n, D});
    r.ops.norm_modulate(x.narrow(0, r0, n), f.norm, f.modulation, f.mod, r0, n32);
    at::Tensor o = out.narrow(0, r0, n);
    at::mm_out(o, n32, w32.t());
    if (b32.defined()) o.add_(b32);
  });
  return out;
}

}  // namespace sp::exec
