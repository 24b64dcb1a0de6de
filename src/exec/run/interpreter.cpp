// The planned schedule: programs (plan/program.hpp) interpreted step by step, one function per
// step kind, in the arena plan/arena.hpp placed (exec/run/README.md).
#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <numeric>

#include "exec/consumers/consumer.hpp"
#include "exec/device/device.hpp"
#include "exec/device/memory.hpp"
#include "exec/dist/exchange.hpp"
#include "exec/patches/lora.hpp"
#include "exec/patches/patch.hpp"
#include "exec/run/executor.hpp"
#include "exec/run/ops.hpp"
#include "plan/arena.hpp"
#include "plan/cost.hpp"

namespace sp::exec {

namespace {

using namespace plan;

// Token-major rows src [n, heads * rep * hd] into rows [first, first + n) of dst, folded
// [heads, rep * rows, hd] (each K/V head's query heads one after another).
void copy_folded(const at::Tensor& dst, const at::Tensor& src, int64_t heads, int64_t rep, int64_t hd,
                 int64_t first = 0) {
  const int64_t n = src.size(0), rows = dst.numel() / (heads * rep * hd);
  dst.view({heads, rep, rows, hd}).narrow(2, first, n).copy_(src.view({n, heads, rep, hd}).permute({1, 2, 0, 3}));
}

class Interpreter {
 public:
  // x: the residual stream's rows from x_base on (this rank's under a sequence split).
  Interpreter(const ir::Model& m, const Part& part, const WeightSource& w, const Inputs& in,
              const contracts::Registry& reg, const contracts::DeviceCaps& dev, at::Tensor& x, int64_t x_base,
              dist::Group group, StepProfile* profile)
      : m_(m), p_(part.program), w_(w), in_(in), reg_(reg), x_(x), x_base_(x_base), group_(std::move(group)), ops_(m, w, in),
        device_(in.device()), profile_(profile), rates_(rates_of(dev)) {
    const Placement& pl = part.placement;
    if (pl.arena_bytes > 0) arena_ = at::empty({pl.arena_bytes}, at::TensorOptions().dtype(at::kByte).device(device_));
    bufs_.resize(p_.buffers.size());
    for (size_t i = 0; i < p_.buffers.size(); ++i) {
      const Buffer& b = p_.buffers[i];
      // The program's output exists even where no step writes it (a rank without its rows).
      if (b.view || (pl.live[i].first < 0 && !separate(b))) continue;
      const auto opts = at::TensorOptions().dtype(to_aten(b.dtype)).device(device_);
      if (separate(b) || b.bytes() == 0) bufs_[i] = at::empty(b.shape, opts);  // empty: a rank without rows or heads
      else
        bufs_[i] = arena_.narrow(0, pl.offset[i], b.bytes()).view(to_aten(b.dtype)).view(b.shape);
    }
  }

  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;
  // A run that stopped early leaves no exchange writing into the arena it frees.
  ~Interpreter() {
    for (auto& [buf, pending] : inflight_) try {
        pending.first->wait();
      } catch (...) {
      }
  }

  // Runs the program; returns the buffer it returns (its model output), if any.
  at::Tensor run() {
    range(0, int(p_.steps.size()));
    if (profile_) settle();
    for (size_t i = 0; i < p_.buffers.size(); ++i)
      if (separate(p_.buffers[i])) return bufs_[i];
    return {};
  }

 private:
  struct Frame {
    int64_t token = 0, base = 0;  // relative index of the token slab, absolute row of index 0
    int64_t feature = 0;          // first feature of the feature slab
  };

  void range(int from, int to) {
    for (int i = from; i < to; ++i) {
      const Step& s = p_.steps[size_t(i)];
      if (const auto* l = std::get_if<LoopStep>(&s.body)) {
        const Frame saved = f_;
        for (int64_t k = 0; k < l->count; ++k) {
          if (l->axis == Axis::Tokens) {
            f_.token = l->begin + k * l->rows;
            f_.base = l->base;
          } else {
            f_.feature = l->begin + k * l->rows;
          }
          range(i + 1, l->end);
        }
        f_ = saved;
        i = l->end;
        continue;
      }
      if (profile_) timed(s);
      else std::visit([&](const auto& b) { step(b); }, s.body);
    }
  }

  // --- profiling (StepProfile) -------------------------------------------------------------

  struct Timed {
    const Step* step;
    Mark begin, end;
    double host_ms;
    int64_t transient;  // bytes the step allocated at its peak
  };
  void timed(const Step& s) {
    const auto t0 = std::chrono::steady_clock::now();
    Mark begin(device_);
    const int64_t transient = peak_of(device_, [&] { std::visit([&](const auto& b) { step(b); }, s.body); });
    Mark end(device_);
    timed_.push_back({&s, begin, end, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                      transient});
  }
  void settle() {
    synchronize(device_);
    if (timed_.empty()) return;
    double inside = 0;
    for (const Timed& t : timed_) {
      StepProfile::Kind& k = profile_->kinds[step_name(t.step->body)];
      const double ms = t.begin.ms_until(t.end);
      ++k.count;
      k.device_ms += ms;
      k.host_ms += t.host_ms;
      k.estimated_ms += 1e3 * step_seconds(t.step->terms, rates_);
      k.transient_over = std::max(k.transient_over, t.transient - t.step->transient);
      inside += ms;
    }
    profile_->between_ms += std::max(0.0, timed_.front().begin.ms_until(timed_.back().end) - inside);
    timed_.clear();
  }

  int64_t row0() const { return f_.base + f_.token; }
  // The current slab's n rows of the residual stream.
  at::Tensor residual_rows(int64_t n) const { return x_.narrow(0, row0() - x_base_, n); }

  at::Tensor operand(const Operand& o) const {
    const int64_t n = o.shape.empty() ? 0 : o.shape[0];
    switch (o.src) {
      case Src::Residual: return residual_rows(n);
      case Src::Context: return in_.table(o.name).narrow(0, f_.token, n);
      case Src::Tokens: {
        const at::Tensor& t = in_.segment_tokens(o.name);
        return o.slab_dim == 0 ? t.narrow(0, f_.token, n) : t;
      }
      case Src::Buffer: break;
    }
    const at::Tensor& full = bufs_[size_t(o.buf)];
    if (o.slab_dim >= 0) {
      at::Tensor t = full.narrow(o.slab_dim, f_.token, o.shape[size_t(o.slab_dim)]);
      // A narrower view of the other dims: their leading entries (a head's columns).
      for (size_t d = 0; d < o.shape.size(); ++d)
        if (int(d) != o.slab_dim && o.shape[d] < t.size(int64_t(d))) t = t.narrow(int64_t(d), 0, o.shape[d]);
      return t;
    }
    return full.view(-1).narrow(0, 0, c10::multiply_integers(o.shape)).view(o.shape);
  }

  Slice resolve(const SliceExpr& e) const { return {e.base + e.per_feature * f_.feature, e.length, e.step}; }

  // Calls f(local_begin, length, entry) for the pieces of the current slab's n rows that use
  // the same entry of `ws` (one piece unless entries differ by segment).
  template <typename F>
  void by_segment(const std::vector<SegWeight>& ws, int64_t n, F&& f) const {
    if (ws.size() == 1) {
      f(int64_t{0}, n, ws.front());
      return;
    }
    const int64_t r0 = row0();
    int64_t start = 0;
    for (const auto& seg : m_.segments) {
      const int64_t lo = std::max(r0, start), hi = std::min(r0 + n, start + seg.length);
      if (lo < hi) {
        const SegWeight* pick = &ws.front();
        for (const auto& w : ws)
          if (w.segment == seg.name) pick = &w;
        f(lo - r0, hi - lo, *pick);
      }
      start += seg.length;
    }
  }

  // A bias read in place, in `dtype`: a host may hold a layer's bias in another dtype than the
  // model's (a 16-bit module keeping an input projection in fp32); converting a bias vector
  // allocates a few kilobytes outside the arena.
  at::Tensor bias_of(const SegWeight& w, at::ScalarType dtype) const {
    if (w.bias_buf >= 0) return bufs_[size_t(w.bias_buf)];
    if (w.bias.empty()) return at::Tensor();
    return slice(w_.tensor(w.bias), 0, resolve(w.bias_rows)).to(dtype);  // the tensor itself when in dtype
  }

  // --- one function per step kind --------------------------------------------------------

  void step(const LoopStep&) {}
  void step(const EndLoopStep&) {}
  void step(const AcquireStep& a) {
    const Buffer& b = p_.buffers[size_t(a.out)];
    const at::Tensor out = b.view ? at::Tensor() : bufs_[size_t(a.out)];
    const Slice rows = resolve(a.rows);
    if (a.native) {  // the stored slice, for the format's own GEMM
      bufs_[size_t(a.out)] = stored_slice(w_, *a.linear, rows, resolve(a.cols));
      native_[a.out] = {a.linear, rows, resolve(a.cols)};
      return;
    }
    if (a.linear) {
      bufs_[size_t(a.out)] = w_.acquire(*a.linear, rows, resolve(a.cols), to_aten(a.dtype), out);
      return;
    }
    const at::Tensor raw = slice(w_.tensor(a.tensor), 0, rows);
    if (b.view) bufs_[size_t(a.out)] = raw;
    else out.copy_(raw);
  }
  void step(const ReleaseStep& r) {
    if (p_.buffers[size_t(r.weight)].view) bufs_[size_t(r.weight)] = at::Tensor();
    native_.erase(r.weight);
  }
  void step(const ZeroStep& z) {
    const at::Tensor t = operand(z.t);
    t.narrow(0, z.from, t.size(0) - z.from).zero_();
  }
  void step(const NormStep& s) {
    const at::Tensor rows = residual_rows(s.out.shape[0]);
    if (s.fused) ops_.norm_modulate_fused(rows, *s.norm, *s.mod, s.ref, row0(), operand(s.out));
    else ops_.norm_modulate(rows, *s.norm, *s.mod, s.ref, row0(), operand(s.out), operand(s.stats));
  }
  void step(const CopyStep& c) {
    const at::Tensor src = operand(c.src), dst = operand(c.dst);
    const int64_t n = src.size(0);
    switch (c.layout) {
      case Layout::Same: dst.copy_(src); return;
      case Layout::HeadMajor: dst.copy_(src.view({n, c.heads, c.head_dim}).transpose(0, 1)); return;
      case Layout::Folded: copy_folded(dst, src, c.heads, c.rep, c.head_dim); return;
    }
  }
  void step(const ProjectStep& s) {
    const at::Tensor in = operand(s.in), out = operand(s.out);
    by_segment(s.weights, in.size(0), [&](int64_t lb, int64_t len, const SegWeight& w) {
      at::Tensor wt = bufs_[size_t(w.weight)];
      if (s.col_len >= 0) wt = wt.narrow(1, s.col_begin, s.col_len);
      at::Tensor y = out.narrow(0, lb, len);
      const at::Tensor x = in.narrow(0, lb, len), bias = bias_of(w, y.scalar_type());
      if (s.native) {
        const NativeWeight& nw = native_.at(w.weight);
        Slice cols = nw.cols;
        if (s.col_len >= 0) cols = {cols.begin + s.col_begin * cols.step, s.col_len, cols.step};
        impl_of<FormatImpl>(reg_.format(nw.linear->format))
            .gemm(w_, *nw.linear, nw.rows, cols, wt, x, y, s.accumulate ? at::Tensor() : bias, s.accumulate);
        return;
      }
      if (s.accumulate) y.addmm_(x, wt.t());
      else if (bias.defined()) at::addmm_out(y, bias, x, wt.t());
      else at::mm_out(y, x, wt.t());
    });
  }
  void step(const QkNormStep& s) {
    const at::Tensor t = operand(s.t);
    const at::Tensor stats = operand(s.stats);
    by_segment(s.weights, t.size(0), [&](int64_t lb, int64_t len, const SegWeight& w) {
      ops_.qk_norm_(t.narrow(0, lb, len), s.qk, w.norm_weight, s.heads, s.head_dim, stats.narrow(0, lb, len));
    });
  }
  void step(const RopeStep& s) {
    const at::Tensor t = operand(s.t);
    const int64_t n = t.size(0);
    const at::Tensor cos = in_.table(s.rope->table + ".cos").narrow(0, row0(), n);
    const at::Tensor sin = in_.table(s.rope->table + ".sin").narrow(0, row0(), n);
    ops_.rope_(t.view({n, s.heads, s.head_dim}), *s.rope, cos, sin, operand(s.tmp));
  }
  void step(const QkNormRopeStep& s) {
    const at::Tensor in = operand(s.in), dst = operand(s.dst);
    const int64_t n = in.size(0);
    // [n, heads, hd] view of the destination: token-major rows, K rows (head-major) or the
    // folded Q slab.
    const at::Tensor out3 = s.layout == Layout::Same        ? dst.view({n, s.heads, s.head_dim})
                            : s.layout == Layout::HeadMajor ? dst.transpose(0, 1)
                                                            : dst.view({s.heads, n, s.head_dim}).transpose(0, 1);
    const bool roped = s.rope->style != ir::RopeStyle::None;
    by_segment(s.weights, n, [&](int64_t lb, int64_t len, const SegWeight& w) {
      at::Tensor cos, sin;
      if (roped) {
        cos = in_.table(s.rope->table + ".cos").narrow(0, row0() + lb, len);
        sin = in_.table(s.rope->table + ".sin").narrow(0, row0() + lb, len);
      }
      ops_.qk_norm_rope_fused(in.narrow(0, lb, len), s.qk, w.norm_weight, *s.rope, cos, sin, out3.narrow(0, lb, len));
    });
  }
  void step(const PatchStep& s) {
    at::Tensor t = operand(s.t);
    impl_of<PatchImpl>(reg_.patch(s.patch)).apply(t);
  }
  void step(const CarryKStep& s) {
    impl_of<ConsumerImpl>(reg_.consumer(s.consumer))
        .carry_k(operand(s.k).unsqueeze(0), operand(s.carrier), f_.token, s.kv_rows);
  }
  void step(const AttendStep& s) {
    if (s.pieces.ranks.empty()) return attend_rows(s, 0, operand(s.out).size(0), row0());
    for (size_t r = 0; r < s.pieces.ranks.size(); ++r) attend_piece(s, int64_t(r));
  }
  // Rows [first, first + n) of an attend step's Q slab, at row `at` of the model, into the same
  // rows of its output.
  void attend_rows(const AttendStep& s, int64_t first, int64_t n, int64_t at) {
    const at::Tensor out = operand(s.out);
    // [1, G, rows, hd]: as stored (head-major, folded), or a view of token-major rows.
    auto heads4 = [&](const at::Tensor& t, Layout layout) {
      return (layout == Layout::Same ? t.view({t.size(0), s.kv_heads, s.head_dim}).transpose(0, 1) : t).unsqueeze(0);
    };
    const at::Tensor q = operand(s.q), v = heads4(operand(s.v), s.kv_layout);
    const at::Tensor k = s.carried ? bufs_[size_t(s.k.buf)] : heads4(operand(s.k), s.kv_layout);
    const auto& consumer = impl_of<ConsumerImpl>(reg_.consumer(s.consumer));
    contracts::AttnCall call = s.call;
    at::Tensor qs;
    if (s.q_layout == Layout::Same) qs = heads4(q.narrow(0, first, n), s.q_layout);
    else if (n == out.size(0)) qs = q.unsqueeze(0);
    else  // folded [G, rep * rows, hd]: the n rows of each of the rep heads, gathered
      qs = q.view({s.kv_heads, s.rep, out.size(0), s.head_dim})
               .narrow(2, first, n)
               .reshape({1, s.kv_heads, s.rep * n, s.head_dim});
    call.q_begin = at;
    at::Tensor o4 = s.carried ? consumer.attend_carried(qs, k, v, s.scale, call, s.kv_rows)
                              : consumer.attend_rows(qs, k, v, s.scale, call);
    // [G, rep*n, hd] -> [n, G, rep, hd]: strides of whatever layout the consumer returned.
    const at::Tensor o = s.rep == 1 ? o4[0].unsqueeze(1) : o4[0].view({s.kv_heads, s.rep, n, s.head_dim});
    out.narrow(0, first, n).view({n, s.kv_heads, s.rep, s.head_dim}).copy_(o.permute({2, 0, 1, 3}));
  }
  // Rank r's piece of a ulysses Q slab (AttendStep::pieces): its rows attended at their place in
  // the model; the rows past the rank's own are left zero (padding). Without pieces: the piece
  // of `each` rows, attended at the slab's row.
  void attend_piece(const AttendStep& s, int64_t r, int64_t each = 0) {
    if (s.pieces.ranks.empty()) return attend_rows(s, r * each, each, row0());
    const int64_t slab = row0() - s.pieces.ranks[size_t(s.pieces.me)].begin, rows = s.pieces.rows;
    const int64_t n = std::clamp<int64_t>(s.pieces.ranks[size_t(r)].size() - slab, 0, rows);
    if (n < rows) operand(s.out).narrow(0, r * rows + n, rows - n).zero_();
    if (n > 0) attend_rows(s, r * rows, n, s.pieces.ranks[size_t(r)].begin + slab);
  }
  // ExchangeStep Ulysses: this rank's Q rows out to the ranks holding their heads and each
  // piece attended as it arrives (in round r, rank me - r's), its output sent straight back.
  // The output may overwrite the Q buffers (the step's `out` its `in`, the attend step's `out`
  // its Q heads): each piece of `ql` is copied out before any output arrives, and each Q piece
  // is attended before its output is written.
  void ulysses(const ExchangeStep& s) {
    const int64_t P = group_->getSize(), me = group_->getRank(), each = s.rows[size_t(me)], unit = s.unit;
    const at::Tensor ql = operand(s.in), o = operand(s.out), qh = operand(s.q_heads);
    std::vector<int64_t> first(static_cast<size_t>(P), 0);  // each rank's first head
    for (size_t j = 1; j < size_t(P); ++j) first[j] = first[j - 1] + s.heads[j - 1];
    auto heads_of = [&](const at::Tensor& rows, int64_t j) {
      return rows.narrow(1, first[size_t(j)] * unit, s.heads[size_t(j)] * unit);
    };
    auto piece = [&](const at::Tensor& t, int64_t j) { return t.narrow(0, j * each, each); };
    const AttendStep* a = s.attend ? &*s.attend : nullptr;
    // Folds rank j's piece of Q into the attend step's head-major Q.
    auto fold = [&](int64_t j) {
      if (a && a->q_layout == Layout::Folded)
        copy_folded(operand(a->q), piece(qh, j), a->kv_heads, a->rep, a->head_dim, j * each);
    };
    piece(qh, me).copy_(heads_of(ql, me));
    const size_t ranks = static_cast<size_t>(P);
    // Round r's piece in the packed buffer, the rounds one after another: this rank's rows of
    // rank me + r's heads, out, and its output back in the same place: received after the Q
    // piece has gone (q_work[r] waited, and on one communicator in order).
    std::vector<at::Tensor> sent(ranks);
    const at::Tensor packed = operand(s.sent).view(-1);
    for (int64_t r = 1, at_ = 0; r < P; ++r) {
      const int64_t width = s.heads[size_t((me + r) % P)] * unit;
      sent[size_t(r)] = packed.narrow(0, at_, each * width).view({each, width});
      at_ += each * width;
    }
    std::vector<c10::intrusive_ptr<c10d::Work>> q_work(ranks), o_work(ranks);
    for (int64_t r = 1; r < P; ++r) {
      const int64_t to = (me + r) % P, from = (me - r + P) % P;
      sent[size_t(r)].copy_(heads_of(ql, to));  // a copy of its own: the output rows come back into `ql`
      q_work[size_t(r)] = dist::start_pair(group_, sent[size_t(r)], to, piece(qh, from), from);
    }
    for (int64_t r = 0; r < P; ++r) {
      const int64_t from = (me - r + P) % P, to = (me + r) % P;
      if (r > 0) q_work[size_t(r)]->wait();
      if (a) {
        fold(from);
        attend_piece(*a, from, each);
      }
      if (r == 0) {
        if (a) heads_of(o, me).copy_(piece(operand(a->out), me));
        continue;
      }
      // This piece's output back to its rank; this rank's rows of rank `to`'s heads in.
      const at::Tensor back = a ? piece(operand(a->out), from) : at::empty({0}, o.options());
      o_work[size_t(r)] = dist::start_pair(group_, back, from, sent[size_t(r)], to);
    }
    for (int64_t r = 1; r < P; ++r) {
      o_work[size_t(r)]->wait();
      heads_of(o, (me + r) % P).copy_(sent[size_t(r)]);
    }
  }
  void step(const LoraStep& s) {
    const at::Tensor in = operand(s.in), out = operand(s.out), ax = operand(s.ax);
    const auto& lora = impl_of<LoraImpl>(reg_.patch(s.patch));
    by_segment(s.weights, in.size(0), [&](int64_t lb, int64_t len, const SegWeight& w) {
      for (const LoraUse& u : s.uses[size_t(&w - s.weights.data())])
        lora.apply(w_, *u.adapter, resolve(u.rows), resolve(u.cols), in.narrow(0, lb, len), out.narrow(0, lb, len), ax);
    });
  }
  void step(const ActivateStep& s) { ops_.activate_(operand(s.t), s.act); }
  void step(const MulStep& s) { operand(s.dst).mul_(operand(s.src)); }
  void step(const AddStep& s) { operand(s.dst).add_(operand(s.src)); }
  void step(const AddBiasStep& s) { operand(s.t).add_(w_.tensor(s.bias)); }
  void step(const ResidualAddStep& s) {
    const at::Tensor y = operand(s.y);
    ops_.gated_add(residual_rows(y.size(0)), y, *s.mod, s.ref, row0(), s.fused);
  }
  void step(const ExchangeStep& s) {
    if (!group_) throw std::logic_error("an exchange step without a process group");
    if (s.kind == Exchange::Ulysses) return ulysses(s);
    const at::Tensor in = operand(s.in), out = operand(s.out);
    const int64_t me = group_->getRank();
    if (s.kind == Exchange::Ring) {
      const at::Tensor k = operand(s.k), v = operand(s.v);
      const int64_t n = in.size(0), G = k.size(1) / s.unit;
      out.view({n, G * s.rep, s.unit})
          .copy_(dist::ring_attention(group_, in.view({n, G * s.rep, s.unit}), k.view({n, G, s.unit}),
                                      v.view({n, G, s.unit}), s.rows, s.scale, s.q_chunk,
                                      &impl_of<ConsumerImpl>(reg_.consumer(s.consumer))));
      return;
    }
    if (s.kind == Exchange::Complete) {
      complete(s.received.buf);
      return;
    }
    const int64_t heads = std::accumulate(s.heads.begin(), s.heads.end(), int64_t{0});
    const at::Tensor x = in.view({in.size(0), heads, s.unit});
    const int64_t slab = f_.token / s.chunk;
    std::vector<int64_t> real;  // each rank's real rows of this slab: the first of the `chunk` it sends
    for (int64_t held : s.held) real.push_back(std::clamp<int64_t>(held - slab * s.chunk, 0, s.chunk));
    complete(s.received.buf);  // the exchange before through the same buffers
    if (s.arrival) return arrive(s, x, out, slab, real);
    // One slab of every rank's rows of this rank's heads [rows, heads[me], unit] into `out`,
    // token-major or head-major: its real ones at theirs.
    auto place = [&s, out, slab, real](const at::Tensor& t) {
      auto put = [&](const at::Tensor& block, int64_t first) {
        const int64_t m = block.size(0);
        if (s.out_layout == Layout::HeadMajor) out.narrow(1, first, m).copy_(block.transpose(0, 1));
        else out.narrow(0, first, m).view(block.sizes()).copy_(block);
      };
      for (size_t i = 0, first = 0, at = 0; i < s.held.size(); first += size_t(s.held[i]), at += size_t(s.rows[i]), ++i)
        if (real[i] > 0) put(t.narrow(0, int64_t(at), real[i]), int64_t(first) + slab * s.chunk);
    };
    const at::Tensor recv = operand(s.received).view({-1});
    const int64_t total = std::accumulate(s.rows.begin(), s.rows.end(), int64_t{0}), mine = s.heads[size_t(me)];
    auto work = dist::start_rows_to_heads(group_, x, s.rows, s.heads, operand(s.sent).view({-1}), recv);
    inflight_[s.received.buf] = {work, [place, recv, total, mine, unit = s.unit] {
                                   place(recv.narrow(0, 0, total * mine * unit).view({total, mine, unit}));
                                 }};
  }
  // ExchangeStep::arrival: slab `slab`'s real rows of every rank (`real`) straight into `out`
  // [every row, heads[me] * unit] after the slabs before, in rank order.
  void arrive(const ExchangeStep& s, const at::Tensor& x, const at::Tensor& out, int64_t slab,
              const std::vector<int64_t>& real) {
    const int64_t me = group_->getRank(), width = s.heads[size_t(me)] * s.unit;
    int64_t before = 0;  // every rank's rows in the slabs before
    for (int64_t held : s.held) before += std::clamp<int64_t>(held, 0, slab * s.chunk);
    const int64_t rows = std::accumulate(real.begin(), real.end(), int64_t{0});
    const at::Tensor recv = out.view({-1}).narrow(0, before * width, rows * width);
    auto work = dist::start_rows_to_heads(group_, x.narrow(0, 0, real[size_t(me)]), real, s.heads,
                                          operand(s.sent).view({-1}), recv);
    inflight_[s.received.buf] = {work, [] {}};  // nothing to place
  }
  // Waits for the exchange in flight through buffer `received` (if any) and places its rows.
  void complete(int received) {
    const auto it = inflight_.find(received);
    if (it == inflight_.end()) return;
    const auto [work, place] = std::move(it->second);
    inflight_.erase(it);
    work->wait();
    place();
  }

  const ir::Model& m_;
  const Program& p_;
  const WeightSource& w_;
  const Inputs& in_;
  const contracts::Registry& reg_;
  at::Tensor& x_;
  int64_t x_base_;
  dist::Group group_;  // a sequence-parallel run's; null otherwise
  Ops ops_;
  at::Device device_;
  at::Tensor arena_;
  std::vector<at::Tensor> bufs_;
  // Weight buffers acquired natively: which linear and slice they hold (the format's GEMM
  // reads the scales of that slice).
  struct NativeWeight {
    const ir::Linear* linear;
    Slice rows, cols;
  };
  std::map<int, NativeWeight> native_;
  // Exchanges in flight (ExchangeStep with `received`), by that buffer: the work and what
  // places its rows when it is done.
  std::map<int, std::pair<c10::intrusive_ptr<c10d::Work>, std::function<void()>>> inflight_;
  Frame f_;
  StepProfile* profile_;
  Rates rates_;
  std::vector<Timed> timed_;
};

}  // namespace

at::Tensor run_planned(const ir::Model& m, const plan::Plan& p, const WeightSource& w, const Inputs& in,
                       const contracts::Registry& reg, const contracts::DeviceCaps& dev, const Progress& progress,
                       StepProfile* profile, c10d::ProcessGroup* group) {
  validate_inputs(m, in);
  check_match(p, m, reg, dev);
  const plan::Sequence& seq = p.sequence;
  dist::Group pg;
  if (group) pg = dist::Group::unsafe_reclaim_from_nonowning(group);
  if (seq.split() != bool(group) || (group && (group->getSize() != seq.ranks || group->getRank() != seq.rank)))
    throw plan::PlanMismatch(plan::Mismatch::Sequence,
                             "the plan was made for " + (seq.split() ? plan::sequence_text(seq, m.tokens()) : "one rank") +
                                 ", the run has " + (group ? "rank " + std::to_string(group->getRank()) + " of " +
                                                                 std::to_string(group->getSize())
                                                           : std::string("no process group")));
  const ir::RowRange own = plan::own_rows(seq, m.tokens());
  at::Tensor x = at::empty({own.size(), m.dim}, at::TensorOptions().dtype(to_aten(m.dtype)).device(in.device()));
  if (profile) ++profile->runs;
  // One part on the residual stream x (modified in place): the program's output buffer (the
  // final layer's), else an undefined tensor.
  auto run_part = [&](const plan::Part& part) {
    return Interpreter(m, part, w, in, reg, dev, x, own.begin, pg, profile).run();
  };
  run_part(p.embed);
  int64_t done = 0, total = 0;
  for (const auto& b : m.blocks) total += int64_t(b.sublayers.size());
  for (size_t bi = 0; bi < m.blocks.size(); ++bi) {
    const ir::Block& b = m.blocks[bi];
    w.begin_block(bi);
    for (size_t si = 0; si < b.sublayers.size(); ++si) {
      run_part(p.blocks[bi].sublayers[si].part);
      if (progress) progress(++done, total);
    }
    if (const auto& pn = p.blocks[bi].post_norm) run_part(*pn);
    w.end_block(bi);
  }
  at::Tensor out = m.final_layer ? run_part(p.final_layer.part) : x.to(to_aten(accumulation_dtype(m.dtype)));
  if (!pg) return out;
  // Every rank's output rows, in order.
  const ir::RowRange rows = m.final_layer ? m.rows(m.final_layer->segments) : ir::RowRange{0, m.tokens()};
  return dist::gather_rows(pg, out, plan::rows_per_rank(seq, m.tokens(), rows));
}

std::string consumer_unusable(const contracts::Registry& reg, const std::string& name, const at::Device& device,
                              ir::DType dtype) {
  return impl_of<ConsumerImpl>(reg.consumer(name)).unusable(device, to_aten(dtype));
}

}  // namespace sp::exec
