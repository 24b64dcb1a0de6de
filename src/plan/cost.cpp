#include "plan/cost.hpp"

#include <algorithm>

#include "plan/plan.hpp"
#include "plan/schedule.hpp"

namespace sp::plan {

using ir::DType;

double Rates::flops(DType dt) const {
  switch (dt) {
    case DType::F32: return flops_f32;
    case DType::F64: return flops_f32 / 2;
    default: return flops_f16;
  }
}

Rates default_rates(contracts::DeviceKind kind) {
  if (kind == contracts::DeviceKind::CUDA) return {700e12, 50e12, 3.5e12, 8e-6, 256};
  return {50e9, 50e9, 10e9, 5e-6, 32};
}

Rates rates_of(const contracts::DeviceCaps& dev) {
  Rates r = default_rates(dev.kind);
  auto take = [](double measured, double& into) {
    if (measured > 0) into = measured;
  };
  take(dev.flops_per_s, r.flops_f16);
  take(dev.flops_per_s_f32, r.flops_f32);
  take(dev.bytes_per_s, r.bytes_per_s);
  take(dev.launch_s, r.launch_s);
  take(dev.gemm_half_rows, r.gemm_half_rows);
  return r;
}

double gemm_efficiency(int64_t rows, double half_rows) {
  if (half_rows <= 0 || rows <= 0) return 1.0;
  return double(rows) / (double(rows) + half_rows);
}

namespace {

// Calls f(rows, count) for the slabs of `total` rows cut `chunk` at a time: the full
// slabs, then the remainder — the executor's for_slabs loop, by size.
template <typename F>
void for_slab_sizes(int64_t total, int64_t chunk, F&& f) {
  if (total <= 0) return;
  chunk = std::clamp<int64_t>(chunk, 1, total);
  if (total / chunk > 0) f(chunk, total / chunk);
  if (total % chunk > 0) f(total % chunk, int64_t{1});
}

// Segment boundaries strictly inside the rows: each splits one slab into one more piece
// for per-segment modulation and per-segment projections.
int64_t inner_boundaries(const ir::Model& m, ir::RowRange rr) {
  int64_t n = 0, start = 0;
  for (const auto& seg : m.segments) {
    if (start > rr.begin && start < rr.end) ++n;
    start += seg.length;
  }
  return n;
}

// Time of a sequence of operations on one device, in one compute dtype.
class Tally {
 public:
  Tally(const Rates& r, DType dt) : r_(r), dt_(dt) {}

  // An elementwise operation or copy that reads and writes `bytes` in all, `times` times.
  void op(double bytes, int64_t times = 1) {
    cost_.seconds += double(times) * (bytes / r_.bytes_per_s + r_.launch_s);
    cost_.launches += times;
  }
  // Launches whose traffic is counted elsewhere (row statistics, per-piece splits).
  void launches(int64_t n) { op(0, n); }
  // out[rows, out] = in[rows, in] @ W[out, in]^T: compute- or bandwidth-bound, whichever is slower.
  void gemm(int64_t rows, int64_t in, int64_t out, int64_t times = 1) { gemm_in(dt_, rows, in, out, times); }
  void gemm_in(DType dt, int64_t rows, int64_t in, int64_t out, int64_t times = 1) {
    const double esz = double(ir::dtype_size(dt));
    const double flops = 2.0 * double(rows) * double(in) * double(out);
    const double compute = flops / (r_.flops(dt) * gemm_efficiency(rows, r_.gemm_half_rows));
    const double memory = (double(rows) * in + double(in) * out + double(rows) * out) * esz / r_.bytes_per_s;
    cost_.seconds += double(times) * (std::max(compute, memory) + r_.launch_s);
    cost_.launches += times;
  }
  // softmax(Q K^T) V of q_rows rows per K/V head against kv_rows keys; `scratch`: what the
  // consumer declares it allocates, written and read once.
  void attention(int64_t q_rows, int64_t kv_rows, int64_t kv_heads, int64_t head_dim, int64_t scratch,
                 int64_t times = 1) {
    const double esz = double(ir::dtype_size(dt_));
    const double flops = 4.0 * double(q_rows) * double(kv_rows) * double(kv_heads) * double(head_dim);
    const double compute = flops / (r_.flops(dt_) * gemm_efficiency(q_rows, r_.gemm_half_rows));
    const double bytes = (2.0 * q_rows + 2.0 * kv_rows) * double(kv_heads * head_dim) * esz + 2.0 * double(scratch);
    cost_.seconds += double(times) * (std::max(compute, bytes / r_.bytes_per_s) + r_.launch_s);
    cost_.launches += times;
  }
  Cost cost() const { return cost_; }

 private:
  const Rates& r_;
  DType dt_;
  Cost cost_;
};

// The bounded executor's operations, one function per helper of exec/bounded.cpp and
// exec/ops.cpp, each charged to a Tally `times` times.
class Walker {
 public:
  Walker(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev)
      : m_(m), reg_(reg), dev_(dev), rates_(rates_of(dev)), t_(rates_, m.dtype),
        esz_(double(ir::dtype_size(m.dtype))), acc_(double(ir::dtype_size(accumulation_dtype(m.dtype)))),
        fused_(fused_norm(m, dev)) {}

  // Ops::norm_modulate on n rows (one modulation piece), then the copy into H when `to_h`.
  void norm(const ir::Norm& nm, const ir::Modulation& mod, const ir::ModRef& r, int64_t n, int64_t times, bool to_h) {
    const double nd = double(n) * double(m_.dim);
    if (fused_) {  // one kernel: rows in, H (or the fp32 rows of the final layer) out
      t_.op(nd * (esz_ + (to_h ? esz_ : acc_)), times);
      return;
    }
    double bytes = nd * (esz_ + acc_) + nd * acc_ + 2 * nd * acc_;  // copy in, vector norm, scale by 1/rms
    int64_t ops = 7;                                                // + 4 on the row statistics
    if (nm.kind == ir::NormKind::LayerNorm) bytes += 3 * nd * acc_, ops += 2;
    if (nm.affine) bytes += 2 * nd * acc_, ops += 1;
    if (nm.affine && !nm.bias.empty()) bytes += 2 * nd * acc_, ops += 1;
    if (mod.scope != ir::ModScope::None) {
      if (r.scale >= 0) bytes += 3 * nd * acc_, ops += 1;
      if (r.shift >= 0) bytes += 2 * nd * acc_, ops += 1;
    }
    t_.op(bytes / double(ops), ops * times);
    if (to_h) t_.op(nd * (acc_ + esz_), times);
  }
  // Extra launches of per-segment modulation where a slab spans `pieces` more segments.
  void mod_pieces(const ir::Modulation& mod, const ir::ModRef& r, int64_t pieces) {
    if (mod.scope != ir::ModScope::PerSegment) return;
    t_.launches(pieces * ((r.scale >= 0) + (r.shift >= 0) + (r.gate >= 0)));
  }
  // y += bias (when present) over n x w, as its own pass; projections add theirs in the GEMM.
  void bias(const ir::Linear& l, int64_t n, int64_t w, int64_t times) {
    if (!l.bias.empty()) t_.op(2 * double(n) * double(w) * esz_, times);
  }
  // A projection: one GEMM, its bias (if any) added in the GEMM epilogue.
  void project(const ir::Linear&, int64_t n, int64_t in, int64_t out, int64_t times) { t_.gemm(n, in, out, times); }
  // Ops::qk_norm_ on n x (heads*head_dim) fp32 values.
  void qk_norm(const ir::QkNorm& q, int64_t n, int64_t width, int64_t times) {
    if (q.kind == ir::QkNormKind::None) return;
    t_.op(5 * double(n) * double(width) * acc_ / 7, 7 * times);
  }
  // n projected Q (or K) rows of `heads` heads to the attention layout: the fused kernel (one
  // pass), or the staged path — to fp32, Q/K norm, RoPE, the role's patches, back (folded).
  void qk_rows(const ir::Attention& a, bool fused, int64_t n, int64_t heads, contracts::TensorRole role, int64_t times) {
    const int64_t width = heads * a.head_dim;
    if (fused) {
      t_.op(2 * double(n) * double(width) * esz_, times);
      return;
    }
    copy(double(n) * width, esz_, acc_, times);
    qk_norm(a.qk_norm, n, width, times);
    rope(a.rope, n, heads, times);
    patches(a.patches, role, double(n) * width, times);
    copy(double(n) * width, acc_, esz_, times);
  }
  // Ops::rope_ on n x heads x rotary_dim/2 pairs.
  void rope(const ir::Rope& r, int64_t n, int64_t heads, int64_t times) {
    if (r.style == ir::RopeStyle::None) return;
    t_.op(12 * double(n) * double(heads) * double(r.rotary_dim / 2) * acc_ / 5, 5 * times);
  }
  void patches(const std::vector<std::string>& names, contracts::TensorRole role, double elems, int64_t times) {
    for (const auto& name : names)
      if (reg_.patch(name).touches(role)) t_.op(2 * elems * esz_, 2 * times);
  }
  // WeightSource::acquire of rows x cols of a non-dense weight: convert, then scale.
  void acquire(const ir::Linear& l, int64_t rows, int64_t cols, int64_t times) {
    const auto& f = reg_.format(l.format);
    if (f.dense) return;
    const double n = double(rows) * double(cols);
    t_.op(n * (double(ir::dtype_size(f.storage)) + esz_), times);
    t_.op(2 * n * esz_, times);
  }
  void gated_add(int64_t n, int64_t times) { t_.op(3 * double(n) * double(m_.dim) * esz_, times); }
  void copy(double elems_in, double esz_in, double esz_out, int64_t times) {
    t_.op(elems_in * (esz_in + esz_out), times);
  }

  void attention(const ir::Block& b, const ir::Sublayer& s, const ir::Attention& a, const SublayerPlan& p);
  void mlp(const ir::Block& b, const ir::Sublayer& s, const ir::Mlp& f, const SublayerPlan& p);
  void final_layer(int64_t chunk);
  void embed();
  Cost cost() const { return t_.cost(); }

 private:
  const ir::Model& m_;
  const contracts::Registry& reg_;
  const contracts::DeviceCaps& dev_;
  Rates rates_;
  Tally t_;
  double esz_, acc_;
  bool fused_;
};

void Walker::attention(const ir::Block& b, const ir::Sublayer& s, const ir::Attention& a, const SublayerPlan& p) {
  using contracts::TensorRole;
  const ir::RowRange rr = m_.rows(s.segments);
  const int64_t T = rr.size(), D = m_.dim, H = a.heads, G = a.kv_heads, hd = a.head_dim;
  const int64_t wq = H * hd, wkv = G * hd, rep = H / G, mlp = a.parallel ? a.parallel->hidden : 0;
  const bool cross = a.kind == ir::AttnKind::Cross;
  const int64_t L = cross ? m_.context(a.context).length : T, kv_in = cross ? m_.context(a.context).dim : D;
  const bool joint = !a.segment_proj.empty();
  const int64_t pieces = inner_boundaries(m_, rr);
  const auto projs = a.all_proj();
  const bool streamed = p.chosen(legality::Transform::StreamedOutProj);
  const bool fq = fused_qk(m_, a, reg_, dev_);

  // Phase kv.
  for (const ir::AttnProj* pr : projs) {
    acquire(pr->k_linear(), wkv, kv_in, 1);
    acquire(pr->v_linear(), wkv, kv_in, 1);
  }
  for_slab_sizes(L, p.token_chunk, [&](int64_t n, int64_t times) {
    if (!cross) norm(s.norm, b.modulation, s.mod, n, times, true);
    project(a.proj.k_linear(), n, kv_in, wkv, times);
    project(a.proj.v_linear(), n, kv_in, wkv, times);
    qk_rows(a, fq, n, G, TensorRole::K, times);
    patches(a.patches, TensorRole::V, double(n) * wkv, times);
    copy(double(n) * wkv, esz_, esz_, times);
  });
  if (!cross) mod_pieces(b.modulation, s.mod, pieces);
  if (joint) t_.launches(pieces * 12);  // k, v, bias, copy and Q/K norm once more per piece

  // Phase q.
  for (const ir::AttnProj* pr : projs) acquire(pr->q_linear(), wq, D, 1);
  const auto& consumer = reg_.consumer(a.consumer);
  auto out_projection = [&](int64_t n, int64_t times) {
    if (mlp) {
      project(*a.proj.qkv, n, D, mlp, times);
      t_.op(2 * double(n) * mlp * esz_, times);
      patches(a.patches, TensorRole::MlpHidden, double(n) * mlp, times);
    }
    t_.gemm(n, wq, D, times);
    if (mlp) t_.gemm(n, mlp, D, times);
    gated_add(n, times);
  };
  auto acquire_out = [&] {
    for (const ir::AttnProj* pr : projs) {
      if (mlp) acquire(*pr->qkv, mlp, D, 1);
      acquire(pr->out, D, wq + mlp, 1);
    }
  };
  if (streamed) acquire_out();
  for_slab_sizes(T, p.q_chunk, [&](int64_t n, int64_t times) {
    norm(s.norm, b.modulation, s.mod, n, times, true);
    project(a.proj.q_linear(), n, D, wq, times);
    qk_rows(a, fq, n, H, TensorRole::Q, times);
    const contracts::AttnShape sh{rep * n, L, G, G, hd, m_.dtype, dev_.kind, dev_.threads};
    t_.attention(rep * n, L, G, hd, consumer.call_bytes(sh), times);
    copy(double(n) * wq, esz_, esz_, times);  // unfold into O
    if (streamed) {
      patches(a.patches, TensorRole::AttnOut, double(n) * wq, times);
      out_projection(n, times);
    }
  });
  mod_pieces(b.modulation, s.mod, pieces);
  if (joint) t_.launches(pieces * 8);
  if (streamed) return;

  // Phase out.
  patches(a.patches, TensorRole::AttnOut, double(T) * wq, 1);
  acquire_out();
  for_slab_sizes(T, p.token_chunk, [&](int64_t n, int64_t times) {
    if (mlp) norm(s.norm, b.modulation, s.mod, n, times, true);
    out_projection(n, times);
  });
  mod_pieces(b.modulation, s.mod, pieces);
}

void Walker::mlp(const ir::Block& b, const ir::Sublayer& s, const ir::Mlp& f, const SublayerPlan& p) {
  const ir::RowRange rr = m_.rows(s.segments);
  const int64_t T = rr.size(), D = m_.dim, F = f.hidden, fs = p.feature_slice;
  const bool sliced = fs < F;
  // Acquisitions: the whole weights once (held), or each slice once per token slab.
  auto acquire_slice = [&](int64_t fn, int64_t times) {
    const int64_t up_rows = (f.gated() && !f.gate) ? 2 * fn : fn;
    if (f.gate) acquire(*f.gate, fn, D, times);
    acquire(*f.up, up_rows, D, times);
    acquire(f.down, D, fn, times);
  };
  if (!sliced) acquire_slice(F, 1);
  for_slab_sizes(T, p.token_chunk, [&](int64_t n, int64_t times) {
    norm(s.norm, b.modulation, s.mod, n, times, true);
    if (sliced) t_.op(double(n) * D * acc_, times);  // zero the accumulator
    for_slab_sizes(F, fs, [&](int64_t fn, int64_t ftimes) {
      const int64_t k = times * ftimes;
      if (sliced) acquire_slice(fn, k);
      if (f.gated()) {
        project(f.gate ? *f.gate : *f.up, n, D, fn, k);
        project(*f.up, n, D, fn, k);
        t_.op(2 * double(n) * fn * esz_, k);  // activation
        t_.op(3 * double(n) * fn * esz_, k);  // gate * up
      } else {
        project(*f.up, n, D, fn, k);
        t_.op(2 * double(n) * fn * esz_, k);
      }
      patches(f.patches, contracts::TensorRole::MlpHidden, double(n) * fn, k);
      t_.gemm(n, fn, D, k);
      if (sliced) t_.op(double(n) * D * (2 * acc_ + esz_), k);  // accumulate
    });
    if (sliced) bias(f.down, n, D, times);
    gated_add(n, times);
  });
  mod_pieces(b.modulation, s.mod, inner_boundaries(m_, rr));
}

void Walker::final_layer(int64_t chunk) {
  const ir::FinalLayer& fl = *m_.final_layer;
  const ir::RowRange rr = m_.rows(fl.segments);
  const DType acc = accumulation_dtype(m_.dtype);
  const int64_t out = fl.proj.out_features;
  if (!(reg_.format(fl.proj.format).dense && m_.dtype == acc)) copy(double(out) * m_.dim, esz_, acc_, 1);
  for_slab_sizes(rr.size(), chunk, [&](int64_t n, int64_t times) {
    norm(fl.norm, fl.modulation, fl.mod, n, times, false);
    t_.gemm_in(acc, n, m_.dim, out, times);
    if (!fl.proj.bias.empty()) t_.op(2 * double(n) * out * acc_, times);
  });
  mod_pieces(fl.modulation, fl.mod, inner_boundaries(m_, rr));
}

void Walker::embed() {
  for (const auto& seg : m_.segments) {
    if (const ir::SegmentEmbed* e = m_.embed_for(seg.name)) {
      acquire(e->linear, m_.dim, e->linear.in_features, 1);
      project(e->linear, seg.length, e->linear.in_features, m_.dim, 1);
    } else {
      copy(double(seg.length) * m_.dim, esz_, esz_, 1);
    }
  }
}

}  // namespace

Cost sublayer_cost(const ir::Model& m, const ir::Block& b, const ir::Sublayer& s, const SublayerPlan& p,
                   const contracts::Registry& reg, const contracts::DeviceCaps& dev) {
  Walker w(m, reg, dev);
  if (const auto* a = std::get_if<ir::Attention>(&s.body)) w.attention(b, s, *a, p);
  else w.mlp(b, s, std::get<ir::Mlp>(s.body), p);
  Cost c = w.cost();
  for (const auto& ph : sublayer_phases(m, s, p, reg, dev)) c.peak_bytes = std::max(c.peak_bytes, ph.total_bytes(dev));
  return c;
}

Cost final_cost(const ir::Model& m, int64_t chunk, const contracts::Registry& reg, const contracts::DeviceCaps& dev) {
  Walker w(m, reg, dev);
  w.final_layer(chunk);
  Cost c = w.cost();
  c.peak_bytes = final_phase(m, chunk, reg).total_bytes(dev);
  return c;
}

Cost embed_cost(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev) {
  Walker w(m, reg, dev);
  w.embed();
  Cost c = w.cost();
  c.peak_bytes = embed_phase(m, reg).total_bytes(dev);
  return c;
}

}  // namespace sp::plan
