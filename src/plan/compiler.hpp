// Internal to src/plan: the Compiler that builds one schedule program for compile.cpp and
// compile_ends.cpp. Each emit function adds one step with the buffers it reads and writes and
// its cost terms, all that the executor, the cost model and the arena read.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>

#include "plan/program.hpp"

namespace sp::plan::detail {

using contracts::TensorRole;
using ir::DType;

inline std::string range_text(const SliceExpr& s) {
  if (s.length < 0 && s.per_feature == 0 && s.base == 0) return "";
  std::ostringstream t;
  t << " [" << s.base;
  if (s.per_feature == 1) t << "+f";
  else if (s.per_feature) t << "+" << s.per_feature << "f";
  t << ", +" << s.length;
  if (s.step != 1) t << " step " << s.step;
  t << ")";
  return t.str();
}

inline std::atomic<int64_t> compiled{0};  // programs_compiled()

// Builds one program: buffers and steps at the current loop depth.
class Compiler {
 public:
  Compiler(const ir::Model& m, const contracts::Registry& reg, const contracts::DeviceCaps& dev, std::string name,
           ir::RowRange rows, const Sequence& seq = {})
      : m_(m), reg_(reg), dev_(dev), seq_(seq), own_(own_rows(seq, m.tokens())), dt_(m.dtype),
        acc_(accumulation_dtype(m.dtype)), esz_(double(ir::dtype_size(m.dtype))), asz_(double(ir::dtype_size(acc_))),
        fused_(fused_norm(m, dev)) {
    p_.name = std::move(name);
    p_.rows = rows;
    ++compiled;
  }

  const ir::Model& m() const { return m_; }
  const contracts::Registry& reg() const { return reg_; }
  const contracts::DeviceCaps& dev() const { return dev_; }
  DType dt() const { return dt_; }
  DType acc() const { return acc_; }
  const Sequence& seq() const { return seq_; }
  // The rows of `rr` this rank holds, from rr.begin: [from, to).
  std::pair<int64_t, int64_t> local(ir::RowRange rr) const {
    const int64_t from = std::clamp(own_.begin - rr.begin, int64_t{0}, rr.size());
    return {from, std::clamp(own_.end - rr.begin, from, rr.size())};
  }
  // How many rows of `rr` each rank holds.
  std::vector<int64_t> rows_of(ir::RowRange rr) const { return rows_per_rank(seq_, m_.tokens(), rr); }

  int buffer(BufRole role, std::string label, std::vector<int64_t> shape, DType dtype, bool view = false) {
    p_.buffers.push_back({role, std::move(label), std::move(shape), dtype, view, depth_});
    return int(p_.buffers.size()) - 1;
  }
  Operand whole(int buf) const { return {Src::Buffer, buf, {}, -1, p_.buffers[size_t(buf)].shape}; }
  // The current token slab's rows along `dim` of a buffer that holds every row.
  Operand slab_of(int buf, int dim, int64_t n) const {
    auto shape = p_.buffers[size_t(buf)].shape;
    shape[size_t(dim)] = n;
    return {Src::Buffer, buf, {}, dim, shape};
  }
  static Operand residual(int64_t n, int64_t dim) { return {Src::Residual, -1, {}, -1, {n, dim}}; }

  void emit(StepBody body, std::string what, Terms t, int64_t transient = 0) {
    Step s{std::move(body), std::move(what), {}, {}, t, transient, depth_};
    collect(s);
    p_.steps.push_back(std::move(s));
  }

  // Calls body(n, pieces) inside a Loop step for every run of slabs of rows [base + from,
  // base + total) (absolute; slab indices count from base) cut `chunk` at a time: slabs of one
  // size spanning the same number of segment pieces form one run. `segments` false: one piece per
  // slab (context rows).
  template <typename F>
  void token_loop(int64_t base, int64_t total, int64_t chunk, bool segments, F&& body, int64_t from = 0) {
    chunk = std::clamp<int64_t>(chunk, 1, std::max<int64_t>(total - from, 1));
    int64_t i0 = from;
    while (i0 < total) {
      const int64_t n = std::min(chunk, total - i0);
      const int64_t pieces = segments ? 1 + m_.inner_boundaries({base + i0, base + i0 + n}) : 1;
      // Slabs of n rows follow while whole ones fit; of those, the ones before the first that
      // a segment boundary cuts span one piece each (found from the boundaries, not slab by
      // slab: a run of a million tokens in slabs of 64 is one step). Slabs spanning several
      // pieces are compared one at a time (at most one per boundary).
      const int64_t same = n == chunk ? (total - i0) / chunk : 1;
      int64_t count = 1;
      if (!segments) {
        count = same;
      } else if (pieces == 1) {
        // slab 0 is uncut, so the first cut one is at least slab 1 (a lone slab: itself)
        count = same > 1 ? first_cut_slab(base + i0, chunk, same) : 1;
      } else {
        while (count < same && 1 + m_.inner_boundaries({base + i0 + count * chunk, base + i0 + (count + 1) * chunk}) == pieces)
          ++count;
      }
      loop(Axis::Tokens, base, i0, n, count, [&] { body(n, pieces); });
      i0 += count * n;
    }
  }
  // token_loop over this rank's rows of `rr`; slab indices count from the first of them (a
  // buffer of this rank's rows holds them).
  template <typename F>
  void own_loop(ir::RowRange rr, int64_t chunk, bool segments, F&& body) {
    const auto [from, to] = local(rr);
    token_loop(rr.begin + from, to - from, chunk, segments, std::forward<F>(body));
  }
  // After own_loop(rr, chunk, ...): the slabs that this rank has no rows for, up to the most
  // any rank's rows of `rr` make (every rank runs as many), body(0, 1) each (its part in the
  // exchanges of the ranks that have).
  template <typename F>
  void pad_loop(ir::RowRange rr, int64_t chunk, F&& body) {
    const auto [from, to] = local(rr);
    const int64_t mine = (to - from + chunk - 1) / chunk;
    const int64_t total = (most_rows(seq_, m_.tokens(), rr) + chunk - 1) / chunk;
    if (total > mine) loop(Axis::Tokens, rr.begin + from, mine * chunk, chunk, total - mine, [&] { body(int64_t{0}, int64_t{1}); });
  }
  // The index of the first of `limit` slabs of `chunk` rows from absolute row `start` that a
  // segment boundary falls strictly inside; `limit` when none does.
  int64_t first_cut_slab(int64_t start, int64_t chunk, int64_t limit) const {
    int64_t first = limit, b = 0;
    for (const auto& seg : m_.segments) {
      if (b > start && (b - start) % chunk != 0) first = std::min(first, (b - start) / chunk);
      b += seg.length;
    }
    return first;
  }
  template <typename F>
  void feature_loop(int64_t total, int64_t chunk, F&& body) {
    const int64_t full = total / chunk, rest = total % chunk;
    if (full > 0) loop(Axis::Features, 0, 0, chunk, full, [&] { body(chunk); });
    if (rest > 0) loop(Axis::Features, 0, full * chunk, rest, 1, [&] { body(rest); });
  }

  // --- steps ---------------------------------------------------------------------------

  int acquire(const ir::Linear& l, SliceExpr rows, SliceExpr cols, DType compute) {
    const auto& f = reg_.format(l.format);
    const int64_t r = rows.length < 0 ? l.out_features : rows.length, c = cols.length < 0 ? l.in_features : cols.length;
    const std::string label =
        "weight " + l.weight + range_text(rows) + (cols.length >= 0 ? " cols" + range_text(cols) : "");
    // Where the format runs its own GEMM on this device (not for the fp32 projections): the
    // stored slice, handed to it.
    if (!f.dense && f.native_gemm && compute == dt_ && f.native_gemm(dev_)) {
      const std::string native_label = label + " (native " + l.format + ")";
      const int w = buffer(BufRole::Weight, native_label, {r, c}, f.storage, true);
      emit(AcquireStep{&l, {}, rows, cols, compute, w, true}, "acquire " + native_label, {});
      return w;
    }
    const int64_t bytes = f.acquire_bytes(r, c, l.stored.value_or(dt_), compute);
    const int w = buffer(BufRole::Weight, label, {r, c}, compute, bytes == 0);
    Terms t;
    if (bytes > 0) {  // convert (read stored, write compute), then scale
      const double n = double(r) * double(c);
      t.bytes = n * (double(ir::dtype_size(f.stored(dt_))) + double(ir::dtype_size(compute))) +
                2 * n * double(ir::dtype_size(compute));
      t.launches = 2;
    }
    // Outside the arena while the acquire runs: a host hook's whole copies, a conversion's temporaries.
    int64_t transient = int64_t(f.whole_copies) * l.out_features * l.in_features * int64_t(ir::dtype_size(compute));
    if (bytes > 0 && f.acquire_scratch) transient += f.acquire_scratch(r, c, compute, dev_);
    emit(AcquireStep{&l, {}, rows, cols, compute, w}, "acquire " + label, t, transient);
    return w;
  }
  // A raw tensor (a bias) in `compute`: a view when it is stored so, else converted.
  int acquire_tensor(const std::string& name, int64_t length, DType compute) {
    const int w = buffer(BufRole::Weight, "tensor " + name, {length}, compute, compute == dt_);
    Terms t;
    if (compute != dt_) t = {0, double(length) * (esz_ + double(ir::dtype_size(compute))), 1};
    emit(AcquireStep{nullptr, name, {0, 0, length, 1}, {}, compute, w}, "acquire tensor " + name, t);
    return w;
  }
  void release(int w) { emit(ReleaseStep{w}, "release " + p_.buffers[size_t(w)].label, {}); }

  // out := modulate(norm(residual rows)); H in the activation dtype, or the fp32 rows the
  // final layer projects.
  void norm(const ir::Norm& nm, const ir::Modulation& mod, const ir::ModRef& ref, const Operand& out, int64_t n,
            int64_t pieces) {
    const double nd = double(n) * double(m_.dim);
    const int64_t mod_pieces = mod.scope == ir::ModScope::PerSegment ? pieces : 1;
    if (fused_) {  // one kernel per modulation piece: rows in, out written once
      emit(NormStep{&nm, &mod, ref, true, out, {}}, "norm + modulation (fused)",
           {.bytes = nd * (esz_ + elem_size(out)), .launches = mod_pieces, .mover = Mover::NormKernel});
      return;
    }
    const Operand stats = whole(buffer(BufRole::RowStats, "Stats", {n, 1}, acc_));
    // copy in, vector norm, 1/rms, scale; LayerNorm: mean and subtract; affine; modulation.
    double bytes = nd * (esz_ + asz_) + nd * asz_ + 2 * nd * asz_;
    int64_t ops = 7;
    if (nm.kind == ir::NormKind::LayerNorm) bytes += 3 * nd * asz_, ops += 2;
    if (nm.affine) bytes += 2 * nd * asz_, ops += 1;
    if (nm.affine && !nm.bias.empty()) bytes += 2 * nd * asz_, ops += 1;
    if (mod.scope != ir::ModScope::None) {
      if (ref.scale >= 0) bytes += 3 * nd * asz_, ops += mod_pieces;
      if (ref.shift >= 0) bytes += 2 * nd * asz_, ops += mod_pieces;
    }
    // CPU temporaries: number operands, and 16-bit operands (norm weights, modulation rows)
    // converted to the accumulation dtype, one at a time.
    int64_t tmp = scalar(acc_);
    if (dt_ != acc_) {
      const int64_t rows = mod.scope == ir::ModScope::PerToken ? n : 1;
      if (nm.affine) tmp = std::max<int64_t>(tmp, m_.dim * int64_t(asz_));
      if (mod.scope != ir::ModScope::None && (ref.scale >= 0 || ref.shift >= 0))
        tmp = std::max<int64_t>(tmp, rows * m_.dim * int64_t(asz_));
    }
    emit(NormStep{&nm, &mod, ref, false, out, stats}, "norm + modulation (staged)", {0, bytes, ops}, cpu(tmp));
  }
  // H [n, dim] of the residual rows: fused straight into H, or staged through N32.
  Operand normed(const ir::Norm& nm, const ir::Modulation& mod, const ir::ModRef& ref, int64_t n, int64_t pieces) {
    const Operand h = whole(buffer(BufRole::Normed, "H", {n, m_.dim}, dt_));
    if (fused_) {
      norm(nm, mod, ref, h, n, pieces);
      return h;
    }
    const Operand n32 = whole(buffer(BufRole::Normed32, "N32", {n, m_.dim}, acc_));
    norm(nm, mod, ref, n32, n, pieces);
    copy(n32, h);
    return h;
  }
  void copy(const Operand& src, const Operand& dst, Layout layout = Layout::Same, int64_t heads = 0, int64_t rep = 1,
            int64_t hd = 0) {
    emit(CopyStep{src, dst, layout, heads, rep, hd}, "copy", {0, elems(src) * (elem_size(src) + elem_size(dst)), 1});
  }
  // out (+)= in[:, cols] @ W^T (+ bias), one GEMM per segment piece where weights differ by segment.
  void project(const Operand& in, const Operand& out, std::vector<SegWeight> ws, int64_t in_features,
               int64_t out_features, int64_t n, int64_t pieces, int64_t col_begin = 0, int64_t col_len = -1,
               bool accumulate = false) {
    const int64_t launches = ws.size() > 1 ? pieces : 1;
    const DType cd = p_.buffers[size_t(out.buf >= 0 ? out.buf : ws.front().weight)].dtype;
    const double e = double(ir::dtype_size(cd));
    Terms t{.flops = 2.0 * double(n) * double(in_features) * double(out_features),
            .bytes = (double(n) * in_features + double(in_features) * out_features + double(n) * out_features) * e,
            .launches = launches, .gemm_rows = n, .dtype = cd, .gemm_cols = out_features};
    const AcquireStep* acq = acquire_of(ws.front().weight);
    const bool nat = acq && acq->native;
    // Where the device's GEMMs in this dtype pack their operands (DeviceCaps::gemm_scratch: CPUs
    // with AMX / AVX512-BF16), that packing.
    int64_t workspace = dev_.held(dev_.gemm_packing(cd, n * in_features + in_features * out_features));
    if (nat) {  // 8-bit weights read, the activations quantized in one more pass per piece
      const auto& f = reg_.format(acq->linear->format);
      t.dtype = p_.buffers[size_t(ws.front().weight)].dtype;
      t.bytes = (2.0 * double(n) * in_features + double(in_features) * out_features + double(n) * out_features) * e;
      t.launches = 2 * launches;
      if (f.gemm_workspace)
        workspace = dev_.held(f.gemm_workspace({n, in_features, out_features, cd, accumulate}, dev_), 2);
    }
    emit(ProjectStep{in, out, ws, col_begin, col_len, accumulate, nat},
         std::string(accumulate ? "project (accumulate) " : "project ") + std::to_string(in_features) + " -> " +
             std::to_string(out_features) + (nat ? " (native)" : ""),
         t, workspace);
    lora(in, out, ws, in_features, n, col_begin, col_len, cd);
  }
  // The LoRA step after a projection in `cd` whose weights carry adapters (compile_lora.cpp).
  void lora(const Operand& in, const Operand& out, const std::vector<SegWeight>& ws, int64_t in_features, int64_t n,
            int64_t col_begin, int64_t col_len, DType cd);
  void qk_norm(const Operand& t, const ir::QkNorm& qk, std::vector<SegWeight> ws, int64_t heads, int64_t hd,
               int64_t n, int64_t pieces) {
    if (qk.kind == ir::QkNormKind::None) return;
    const Operand stats =
        whole(buffer(BufRole::RowStats, "Stats", {n, qk.kind == ir::QkNormKind::PerHead ? heads : int64_t{1}}, acc_));
    const int64_t launches = 4 + 3 * (ws.size() > 1 ? pieces : 1);
    const int64_t width = qk.kind == ir::QkNormKind::PerHead ? hd : heads * hd;
    const int64_t tmp = std::max(scalar(acc_), dt_ != acc_ ? width * int64_t(asz_) : int64_t{0});
    emit(QkNormStep{t, qk, std::move(ws), heads, hd, stats}, "Q/K norm",
         {0, 5 * double(n) * double(heads * hd) * asz_, launches}, cpu(tmp));
  }
  void rope(const Operand& t, const ir::Rope& r, int64_t heads, int64_t hd, int64_t n) {
    if (r.style == ir::RopeStyle::None) return;
    const Operand tmp = whole(buffer(BufRole::RopeTmp, "RopeTmp", {n, heads, r.rotary_dim / 2}, acc_));
    emit(RopeStep{t, &r, heads, hd, tmp}, "RoPE", {0, 12 * double(n) * double(heads) * double(r.rotary_dim / 2) * asz_, 5});
  }
  void qk_fused(const Operand& in, const Operand& dst, Layout layout, const ir::Attention& a,
                std::vector<SegWeight> ws, int64_t heads, int64_t rep, int64_t n, int64_t pieces) {
    Terms t{0, 2 * double(n) * double(heads * a.head_dim) * esz_, ws.size() > 1 ? pieces : 1};
    t.mover = Mover::QkKernel;
    emit(QkNormRopeStep{in, dst, layout, a.qk_norm, &a.rope, std::move(ws), heads, rep, a.head_dim},
         "Q/K norm + RoPE (fused)", t);
  }
  void patches(const std::vector<std::string>& names, TensorRole role, const Operand& t) {
    const double n = elems(t);
    const DType dt = dtype_of(t);
    const int64_t rows = t.shape.empty() ? 0 : t.shape.front();
    for (const auto& name : names) {
      const auto& patch = reg_.patch(name);
      if (!patch.modifies.count(role)) continue;
      const int64_t scratch = patch.scratch_bytes ? patch.scratch_bytes(rows, int64_t(n) / std::max<int64_t>(rows, 1), dt, dev_.kind) : 0;
      emit(PatchStep{name, role, t}, "patch " + name + " on " + contracts::to_string(role),
           {0, 2 * n * elem_size(t), 2}, dev_.held(scratch));
    }
  }
  void attend(const ir::Attention& a, const Operand& qf, int k, int v, const Operand& out, int64_t n, int64_t L,
              Layout q_layout, Layout kv_layout, const contracts::AttnCall& call) {
    Attend at = attend_step(a, qf, k, v, out, n, L, q_layout, kv_layout, call, a.kv_heads, {});
    emit(std::move(at.step), at.what, at.terms, at.transient);
  }
  // A ulysses Q slab's attention with its exchanges (ExchangeStep Ulysses): this rank's Q rows
  // `q_rows` [each, H*hd] out to the ranks holding their heads, piece by piece, and the output
  // rows back into `o_rows`; `q_heads`, `qf` and `oh` as for attend() over P*each rows (`o_rows`
  // may be `q_rows`, `oh` `q_heads`: the executor copies each piece out before its place is
  // written). The Q pieces on their way out are packed rank by rank in a buffer of the step's,
  // each piece's output coming back in its place (after the piece has gone). The link time runs
  // beside the attention but for the last piece's way back. `groups` per rank.
  void ulysses_attend(const ir::Attention& a, const Operand& q_rows, const Operand& q_heads, const Operand& qf,
                      const Operand& oh, const Operand& o_rows, int k, int v, int64_t each, int64_t L,
                      Layout q_layout, Layout kv_layout, const contracts::AttnCall& call,
                      const std::vector<int64_t>& groups, AttendStep::Pieces pieces) {
    const size_t me = size_t(seq_.rank);
    const int64_t P = seq_.ranks, rep = a.heads / a.kv_heads, hd = a.head_dim, unit = rep * hd;
    // Every rank's pieces: this rank's rows of each other rank's heads out, and theirs of its own in.
    const int64_t all = std::accumulate(groups.begin(), groups.end(), int64_t{0});
    const double out_elems = double(each * (all - groups[me]) * unit), in_elems = double((P - 1) * each * groups[me] * unit);
    Attend at;
    if (groups[me] > 0)
      at = attend_step(a, qf, k, v, oh, P * each, L, q_layout, kv_layout, call, groups[me], std::move(pieces), P);
    Terms t = at.terms;
    t.bytes += 2 * (out_elems + in_elems) * esz_;  // the pieces packed and placed, both ways
    t.launches += 4 * (P - 1);
    t.link_bytes = 2 * (out_elems + in_elems) * esz_;
    // Q pieces travel while the first are attended; the last piece's output goes back after it.
    t.link_beside = P > 1 ? 1.0 - 1.0 / double(2 * (P - 1)) : 0.0;
    std::vector<int64_t> heads;  // query heads per rank, of hd features each
    for (int64_t g : groups) heads.push_back(g * rep);
    const Operand packed =
        whole(buffer(BufRole::SeqRows, "Q pieces out, then O pieces back", {each, (all - groups[me]) * unit}, dt_));
    ExchangeStep x{.kind = Exchange::Ulysses, .in = q_rows, .out = o_rows,
                   .rows = std::vector<int64_t>(size_t(P), each), .heads = std::move(heads), .unit = hd,
                   .sent = packed, .q_heads = q_heads};
    if (groups[me] > 0) x.attend = std::move(at.step);
    emit(std::move(x),
         "exchange rows for heads, " + (groups[me] > 0 ? at.what : std::string("no heads here")) +
             ", heads back for rows, piece by piece (all-to-all, " + std::to_string(P) + " ranks)",
         t, at.transient);
  }
  // An attend step, its summary, its terms and its bytes outside the arena.
  struct Attend {
    AttendStep step;
    std::string what;
    Terms terms;
    int64_t transient = 0;
  };
  // `groups`: the K/V heads attended (a.kv_heads unless a rank attends its share of them).
  // `pieces`: the ranks' rows of a ulysses Q slab, each attended in a call of its own (a folded
  // Q piece gathered first). `calls` > 0: the n rows attended in that many calls of n / calls
  // rows (where no pieces say).
  Attend attend_step(const ir::Attention& a, const Operand& qf, int k, int v, const Operand& out, int64_t n, int64_t L,
                     Layout q_layout, Layout kv_layout, const contracts::AttnCall& call, int64_t groups,
                     AttendStep::Pieces pieces, int64_t calls = 0) {
    const int64_t G = groups, rep = a.heads / a.kv_heads, hd = a.head_dim;
    const auto& consumer = reg_.consumer(a.consumer);
    const bool carried = bool(consumer.k_carrier_bytes);  // k is the carrier k_carrier() made
    if (!pieces.ranks.empty()) calls = int64_t(pieces.ranks.size());
    calls = std::max<int64_t>(calls, 1);
    const int64_t rows = !pieces.ranks.empty() ? pieces.rows : n / calls;
    const contracts::AttnShape sh{rep * rows, L, G, G, hd, dt_, dev_.kind, dev_.threads, dev_.gemm_scratch(dt_),
                                  carried};
    const int64_t gathered = calls > 1 && q_layout == Layout::Folded ? G * rep * rows * hd * int64_t(esz_) : 0;
    const int64_t scratch = consumer.call_bytes(sh) + gathered;
    const double work = consumer.work_fraction ? std::clamp(consumer.work_fraction(sh, call), 0.0, 1.0) : 1.0;
    const double q_rows = double(rep * n);
    // The consumer reads Q, K (or its carrier), V and writes its output (and scratch); its
    // output is then copied token-major into `out`. Each call's rows fill the device's waves on
    // their own (gemm_rows: one call's).
    const double k_bytes = carried ? double(p_.buffers[size_t(k)].bytes()) : double(L) * double(G * hd) * esz_;
    Terms t{4.0 * q_rows * double(L) * double(G) * double(hd) * work,
            (2.0 * q_rows + double(L)) * double(G * hd) * esz_ + k_bytes + 2.0 * double(scratch) +
                2.0 * double(n) * double(G * rep * hd) * esz_,
            2 * calls, rep * rows, dt_, true, G, L};
    std::ostringstream what;
    what << "attend (consumer '" << a.consumer << "'" << (carried ? ", K carrier" : "");
    if (call.routed(L)) what << ", kv budget " << call.kv_budget;
    if (calls > 1) what << ", one call per rank's rows";
    return {AttendStep{a.consumer, qf, whole(k), whole(v), out, q_layout, kv_layout, G, rep, hd,
                       1.0 / std::sqrt(double(hd)), carried, L, call, std::move(pieces)},
            what.str() + ")", t, dev_.held(scratch, consumer.call_allocations + (gathered > 0 ? 1 : 0))};
  }
  // The K carrier of `consumer` for L rows, or -1 where the consumer takes K as it is.
  int k_carrier(const std::string& consumer, int64_t G, int64_t L, int64_t hd) {
    const auto& c = reg_.consumer(consumer);
    if (!c.k_carrier_bytes) return -1;
    const int64_t bytes = c.k_carrier_bytes(G, L, hd);
    return buffer(BufRole::GlobalK, "K carrier ('" + consumer + "')", {G, bytes / G}, DType::I8);
  }
  // One K slab [G, n, hd] into the carrier: read once (twice for the first slab, whose
  // statistics the carrier keeps), written at one byte per element.
  void carry_k(const std::string& consumer, const Operand& k, int carrier, int64_t L) {
    const double e = elems(k);
    emit(CarryKStep{consumer, k, whole(carrier), L}, "K slab into the carrier of '" + consumer + "'",
         {0, e * (2 * esz_ + 1), 3});
  }
  // A sequence-parallel exchange of rows for heads (ExchangeStep RowsToHeads): `chunk` rows of
  // each rank, `heads` per rank of `unit` features each. Its link bytes are what this rank sends
  // and receives. The chunk is the slab of each rank's `held` rows that the current token slab
  // is, its rows placed in `out` at theirs. `sent` and `received`: program buffers through which
  // it is left in flight, its link time beside the steps that follow; complete() ends it.
  // `arrival` (ExchangeStep::arrival): the rows land in `out` as they come, `received` is `out`.
  void exchange(const Operand& in, const Operand& out, std::vector<int64_t> heads, int64_t unit, Layout out_layout,
                std::vector<int64_t> held, int64_t chunk, const Operand& sent, const Operand& received,
                bool arrival = false) {
    const size_t me = size_t(seq_.rank);
    std::vector<int64_t> rows(size_t(seq_.ranks), chunk);
    auto sum = [](const std::vector<int64_t>& v) { return double(std::accumulate(v.begin(), v.end(), int64_t{0})); };
    // Heads of `unit` features this rank gives and gets; of them its own stay.
    const double given = double(rows[me]) * sum(heads), got = sum(rows) * double(heads[me]);
    // packed, then (unless they arrive in place) placed
    Terms t{0, 2 * (elems(in) + (arrival ? 0.0 : got * double(unit))) * esz_, arrival ? 1 : 2};
    t.link_bytes = (given + got - 2 * double(rows[me]) * double(heads[me])) * double(unit) * esz_;
    // The rows are packed into `sent` and received into `received`, then placed as views.
    t.overlapped = true;
    emit(ExchangeStep{.kind = Exchange::RowsToHeads, .in = in, .out = out, .rows = std::move(rows),
                      .heads = std::move(heads), .unit = unit, .out_layout = out_layout, .sent = sent,
                      .received = received, .held = std::move(held), .chunk = chunk, .arrival = arrival},
         "exchange rows for heads (all-to-all, " + std::to_string(seq_.ranks) + " ranks" +
             (arrival ? ", in place in the order they arrive)" : ")"),
         t);
  }
  // Waits for the exchange in flight through `received` and places its rows in `out`.
  void complete(const Operand& received, const Operand& out) {
    emit(ExchangeStep{.kind = Exchange::Complete, .in = received, .out = out, .received = received},
         "exchange complete (rows for heads in flight)", {});
  }
  // Ring attention (ExchangeStep Ring) of this rank's q rows over every rank's K/V rows, each
  // K/V block attended by `consumer` (one that returns the log-sum-exp).
  void ring(const std::string& consumer, const Operand& q, const Operand& k, const Operand& v, const Operand& out,
            std::vector<int64_t> rows, int64_t heads, int64_t groups, int64_t hd, int64_t q_chunk) {
    const size_t me = size_t(seq_.rank);
    const double L = double(std::accumulate(rows.begin(), rows.end(), int64_t{0})), n = double(rows[me]);
    const int64_t most = *std::max_element(rows.begin(), rows.end()), rep = heads / groups;
    q_chunk = std::clamp<int64_t>(q_chunk, 1, std::max<int64_t>(rows[me], 1));
    const contracts::AttnShape sh{rep * q_chunk, most, groups, groups, hd, dt_, dev_.kind, dev_.threads,
                                  dev_.gemm_scratch(dt_)};
    const auto& caps = reg_.consumer(consumer);
    const int64_t scratch = caps.call_bytes(sh), slabs = (std::max<int64_t>(rows[me], 1) + q_chunk - 1) / q_chunk;
    Terms t{4.0 * n * L * double(heads) * double(hd),
            (2 * n * double(heads) + 2 * L * double(groups)) * double(hd) * esz_ + 2 * n * double(heads * hd) * asz_ +
                2.0 * double(scratch) * double(slabs),
            int64_t(6 * seq_.ranks * slabs), rep * q_chunk, dt_, true, groups, most};
    t.link_bytes = 2.0 * 2.0 * (L - n) * double(groups * hd) * esz_;
    // The running output and log-sum-exp; the held K/V block and, while it is attended, the
    // incoming one and a Q slab's temporaries (its folded copy, the consumer's call, the output
    // unfolded and in fp32, four row statistics), or at the end the output in the model's dtype.
    const int64_t f = int64_t(ir::dtype_size(acc_)), e = int64_t(esz_), rows_me = rows[me];
    const int64_t block = dev_.held(2 * most * groups * hd * e);
    const int64_t slab = 2 * dev_.held(q_chunk * heads * hd * e) + dev_.held(q_chunk * heads * hd * f) +
                         dev_.held(scratch, caps.call_allocations) + 4 * dev_.held(q_chunk * heads * f);
    const int64_t transient = dev_.held(rows_me * heads * hd * f) + dev_.held(rows_me * heads * f) + block +
                              std::max(block + slab, dev_.held(rows_me * heads * hd * e));
    ExchangeStep x{Exchange::Ring, q, out, std::move(rows), {}, hd, Layout::Same, k, v, rep, q_chunk,
                   1.0 / std::sqrt(double(hd)), consumer};
    emit(std::move(x), "ring attention (K/V blocks around " + std::to_string(seq_.ranks) + " ranks, consumer '" +
                           consumer + "')",
         t, transient);
  }
  void activate(const Operand& t, ir::ActKind act) {
    emit(ActivateStep{t, act}, std::string("activation ") + ir::to_string(act), {0, 2 * elems(t) * esz_, 1});
  }
  void mul(const Operand& dst, const Operand& src) { emit(MulStep{dst, src}, "gate * up", {0, 3 * elems(dst) * esz_, 1}); }
  // Zeroes rows [from, end) of t.
  void zero(const Operand& t, int64_t from = 0) {
    const double rows = t.shape.empty() ? 1 : double(t.shape.front());
    const double bytes = elems(t) * elem_size(t) * (rows > 0 ? (rows - double(from)) / rows : 0);
    emit(ZeroStep{t, from}, from > 0 ? "zero rows " + std::to_string(from) + " on" : std::string("zero"), {0, bytes, 1});
  }
  // dst += src; on the CPU a 16-bit src is cast to dst's dtype through a temporary (ATen's CPU
  // kernels cast a mixed-dtype operand so; CUDA kernels cast in registers).
  void add(const Operand& dst, const Operand& src) {
    const double wider = std::max(elem_size(dst), elem_size(src));
    emit(AddStep{dst, src}, "accumulate", {0, elems(dst) * (2 * elem_size(dst) + elem_size(src)), 1},
         elem_size(dst) == elem_size(src) ? 0 : cpu(int64_t(elems(src)) * int64_t(wider)));
  }
  void add_bias(const Operand& t, const std::string& bias) {
    const int64_t width = t.shape.back();
    emit(AddBiasStep{t, bias}, "add bias " + bias, {0, 2 * elems(t) * elem_size(t), 1},
         elem_size(t) != esz_ ? cpu(width * int64_t(elem_size(t))) : 0);
  }
  void residual_add(const Operand& y, const ir::Modulation& mod, const ir::ModRef& ref, int64_t n, int64_t pieces) {
    const int64_t launches = (ref.gate >= 0 && mod.scope == ir::ModScope::PerSegment) ? pieces : 1;
    const bool gated = ref.gate >= 0 && mod.scope != ir::ModScope::None;
    // A CPU kernel adding a wider y into the residual computes in y's dtype: the residual
    // rows and the result are converted through temporaries (and a gate row beside them).
    int64_t tmp = 0;
    if (elem_size(y) != esz_) {
      tmp = 2 * n * m_.dim * int64_t(elem_size(y));
      if (gated) tmp += (mod.scope == ir::ModScope::PerToken ? n : 1) * m_.dim * int64_t(elem_size(y));
    }
    // Reads the residual rows and y, writes the rows (a fused kernel: in one pass, at the
    // copy bandwidth like the ATen operation).
    const Terms t{0, double(n) * double(m_.dim) * (2 * esz_ + elem_size(y)), launches};
    emit(ResidualAddStep{y, &mod, ref, fused_}, std::string(gated ? "gated residual add" : "residual add") +
         (fused_ ? " (fused)" : ""), t, cpu(tmp));
  }

  Program take() { return std::move(p_); }

 private:
  template <typename F>
  void loop(Axis axis, int64_t base, int64_t begin, int64_t rows, int64_t count, F&& body) {
    const int at = int(p_.steps.size());
    emit(LoopStep{axis, base, begin, rows, count, -1},
         std::string(axis == Axis::Tokens ? "token" : "feature") + " slabs: " + std::to_string(count) + " x " +
             std::to_string(rows) + " from " + std::to_string(begin),
         {});
    ++depth_;
    body();
    --depth_;
    std::get<LoopStep>(p_.steps[size_t(at)].body).end = int(p_.steps.size());
    emit(EndLoopStep{at}, "end", {});
  }
  DType dtype_of(const Operand& o) const { return o.src == Src::Buffer ? p_.buffers[size_t(o.buf)].dtype : dt_; }
  double elem_size(const Operand& o) const { return double(ir::dtype_size(dtype_of(o))); }
  static double elems(const Operand& o) {
    double e = 1;
    for (int64_t d : o.shape) e *= double(d);
    return e;
  }
  // Bytes that only CPU kernels allocate (see add, scalar_operand_bytes).
  int64_t cpu(int64_t bytes) const { return dev_.kind == contracts::DeviceKind::CPU ? bytes : 0; }
  int64_t scalar(DType op) const { return contracts::scalar_operand_bytes(op, dev_.kind); }
  // Reads and writes of a step, from its operands.
  void collect(Step& s) {
    auto push = [](std::vector<int>& to, const Operand& o) {
      if (o.src == Src::Buffer && o.buf >= 0) to.push_back(o.buf);
    };
    auto r = [&](const Operand& o) { push(s.reads, o); };
    auto w = [&](const Operand& o) { push(s.writes, o); };
    auto ws = [&](const std::vector<SegWeight>& v) {
      for (const auto& x : v) {
        if (x.weight >= 0) s.reads.push_back(x.weight);
        if (x.bias_buf >= 0) s.reads.push_back(x.bias_buf);
      }
    };
    std::visit(
        [&](const auto& b) {
          using T = std::decay_t<decltype(b)>;
          if constexpr (std::is_same_v<T, AcquireStep>) s.writes.push_back(b.out);
          else if constexpr (std::is_same_v<T, ReleaseStep>) s.reads.push_back(b.weight);
          else if constexpr (std::is_same_v<T, ZeroStep>) w(b.t);
          else if constexpr (std::is_same_v<T, NormStep>) w(b.out), w(b.stats);
          else if constexpr (std::is_same_v<T, CopyStep>) r(b.src), w(b.dst);
          else if constexpr (std::is_same_v<T, ProjectStep>) {
            r(b.in), w(b.out), ws(b.weights);
            if (b.accumulate) r(b.out);
          } else if constexpr (std::is_same_v<T, QkNormStep>) r(b.t), w(b.t), w(b.stats);
          else if constexpr (std::is_same_v<T, RopeStep>) r(b.t), w(b.t), w(b.tmp);
          else if constexpr (std::is_same_v<T, QkNormRopeStep>) r(b.in), w(b.dst);
          else if constexpr (std::is_same_v<T, PatchStep>) r(b.t), w(b.t);
          else if constexpr (std::is_same_v<T, AttendStep>) r(b.q), r(b.k), r(b.v), w(b.out);
          else if constexpr (std::is_same_v<T, ActivateStep>) r(b.t), w(b.t);
          else if constexpr (std::is_same_v<T, MulStep>) r(b.src), r(b.dst), w(b.dst);
          else if constexpr (std::is_same_v<T, AddStep>) r(b.src), r(b.dst), w(b.dst);
          else if constexpr (std::is_same_v<T, AddBiasStep>) r(b.t), w(b.t);
          else if constexpr (std::is_same_v<T, ResidualAddStep>) r(b.y);
          else if constexpr (std::is_same_v<T, CarryKStep>) r(b.k), w(b.carrier);
          else if constexpr (std::is_same_v<T, LoraStep>) r(b.in), r(b.out), w(b.out), w(b.ax);
          else if constexpr (std::is_same_v<T, ExchangeStep>) {
            r(b.in), r(b.k), r(b.v), w(b.out), w(b.sent), w(b.received), w(b.q_heads);
            if (b.attend) w(b.attend->q), r(b.attend->k), r(b.attend->v), w(b.attend->out);
          }
        },
        s.body);
  }

  // The step that acquired weight buffer `w`; null where none did.
  const AcquireStep* acquire_of(int w) const {
    for (auto it = p_.steps.rbegin(); it != p_.steps.rend(); ++it)
      if (const auto* a = std::get_if<AcquireStep>(&it->body); a && a->out == w) return a;
    return nullptr;
  }

  const ir::Model& m_;
  const contracts::Registry& reg_;
  const contracts::DeviceCaps& dev_;
  Sequence seq_;
  ir::RowRange own_;
  DType dt_, acc_;
  double esz_, asz_;
  bool fused_;
  int depth_ = 0;
  Program p_;
};

}  // namespace sp::plan::detail
