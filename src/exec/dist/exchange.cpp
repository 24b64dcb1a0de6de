#include "exec/dist/exchange.hpp"

#include "exec/device/device.hpp"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace sp::exec::dist {

namespace {

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

// The rank, checked against the split vectors and x's [.., .., D] shape.
size_t check(const c10d::ProcessGroup& pg, const at::Tensor& x, const std::vector<int64_t>& rows,
             const std::vector<int64_t>& heads, const char* what) {
  const int p = pg.getSize(), me = pg.getRank();
  if (int(rows.size()) != p || int(heads.size()) != p)
    throw std::invalid_argument(c10::str(what, ": ", rows.size(), " row and ", heads.size(),
                                         " head counts for a process group of ", p, " ranks"));
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i] < 0 || heads[i] < 0)
      throw std::invalid_argument(c10::str(what, ": negative count for rank ", i, " (rows ", rows[i], ", heads ",
                                           heads[i], ")"));
  if (x.dim() != 3) throw std::invalid_argument(c10::str(what, ": expects [rows, heads, head_dim], got ", x.sizes()));
  return size_t(me);
}

// q [n_q, H, D] against k and v [kv_rows, G, D] with H a multiple of G (and n_q == kv_rows where
// `same_rows`): an error naming the shapes otherwise.
void check_attention(const char* what, int me, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     int64_t kv_rows, bool same_rows) {
  if (q.dim() != 3 || k.dim() != 3 || !k.sizes().equals(v.sizes()) || k.size(0) != kv_rows ||
      (same_rows && q.size(0) != kv_rows) || q.size(2) != k.size(2) || k.size(1) < 1 || q.size(1) % k.size(1))
    throw std::invalid_argument(c10::str(what, ": rank ", me, " holds q ", q.sizes(), ", k ", k.sizes(), ", v ",
                                         v.sizes(), "; expected [", same_rows ? c10::str(kv_rows) : "n_q",
                                         ", H, D] and [", kv_rows, ", G, D] with H a multiple of G"));
}

// [n, G * rep, D] rows-major as [1, G, rep * n, D]: each K/V head's query heads folded into rows.
at::Tensor fold(const at::Tensor& x, int64_t groups) {
  const int64_t n = x.size(0), rep = x.size(1) / groups, d = x.size(2);
  return x.reshape({n, groups, rep, d}).permute({1, 2, 0, 3}).reshape({1, groups, rep * n, d});
}

// The inverse for an output [1, G, rep * n, D] -> [n, G * rep, D] or a log-sum-exp
// [1, G, rep * n] -> [n, G * rep].
at::Tensor unfold(const at::Tensor& x, int64_t n) {
  const int64_t g = x.size(1), rep = n ? x.size(2) / n : 1;
  if (x.dim() == 3) return x[0].reshape({g, rep, n}).permute({2, 0, 1}).reshape({n, g * rep});
  return x[0].reshape({g, rep, n, x.size(3)}).permute({2, 0, 1, 3}).reshape({n, g * rep, x.size(3)});
}

at::ScalarType accumulation(const at::Tensor& q) { return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// Explicit scores in fp32 (fp64 for fp64 inputs): the default of ring_attention and Ulysses'.
std::pair<at::Tensor, at::Tensor> exact(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  const at::ScalarType acc = accumulation(q);
  return math_attention_lse(q.to(acc), k.to(acc), v.to(acc), scale);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> start_rows_to_heads(const Group& pg, const at::Tensor& x, const std::vector<int64_t>& rows,
                                                   const std::vector<int64_t>& heads, const at::Tensor& send,
                                                   const at::Tensor& recv) {
  const size_t me = check(*pg, x, rows, heads, "rows_to_heads");
  const int64_t d = x.size(2);
  if (x.size(0) != rows[me] || x.size(1) != sum(heads))
    throw std::invalid_argument(c10::str("rows_to_heads: rank ", me, " holds ", x.sizes(), ", expected [", rows[me],
                                         ", ", sum(heads), ", D]"));
  // To rank j: this rank's rows of j's heads; from rank i: i's rows of this rank's heads.
  std::vector<int64_t> sent, got;
  for (size_t j = 0, h0 = 0, at_ = 0; j < rows.size(); h0 += size_t(heads[j]), at_ += size_t(sent.back()), ++j) {
    sent.push_back(rows[me] * heads[j] * d);
    got.push_back(rows[j] * heads[me] * d);
    send.narrow(0, int64_t(at_), sent.back()).view({rows[me], heads[j], d}).copy_(x.narrow(1, int64_t(h0), heads[j]));
  }
  at::Tensor in = send.narrow(0, 0, x.numel()), out = recv.narrow(0, 0, sum(got));
  return pg->alltoall_base(out, in, got, sent);
}

c10::intrusive_ptr<c10d::Work> start_pair(const Group& pg, const at::Tensor& send, int64_t to, const at::Tensor& recv,
                                          int64_t from) {
  const int64_t p = pg->getSize();
  if (to < 0 || to >= p || from < 0 || from >= p || !recv.is_contiguous() || send.scalar_type() != recv.scalar_type())
    throw std::invalid_argument(c10::str("start_pair: rank ", pg->getRank(), " of ", p, " sends ", send.sizes(), " ",
                                         send.scalar_type(), " to ", to, " and receives ", recv.sizes(), " ",
                                         recv.scalar_type(), " from ", from, " (contiguous, one dtype)"));
  std::vector<int64_t> sent(size_t(p), 0), got(size_t(p), 0);
  sent[size_t(to)] = send.numel();
  got[size_t(from)] = recv.numel();
  at::Tensor in = send.contiguous().view({-1}), out = recv.view({-1});
  return pg->alltoall_base(out, in, got, sent);
}

at::Tensor rows_to_heads(const Group& pg, const at::Tensor& x, const std::vector<int64_t>& rows,
                         const std::vector<int64_t>& heads) {
  const size_t me = size_t(pg->getRank());
  const int64_t total = sum(rows);
  at::Tensor send = at::empty({x.numel()}, x.options()),
             recv = at::empty({total * (me < heads.size() ? heads[me] : 0) * x.size(-1)}, x.options());
  start_rows_to_heads(pg, x, rows, heads, send, recv)->wait();
  return recv.view({total, heads[me], x.size(2)});
}

at::Tensor heads_to_rows(const Group& pg, const at::Tensor& y, const std::vector<int64_t>& rows,
                         const std::vector<int64_t>& heads) {
  const size_t me = check(*pg, y, rows, heads, "heads_to_rows");
  const int64_t d = y.size(2);
  if (y.size(0) != sum(rows) || y.size(1) != heads[me])
    throw std::invalid_argument(c10::str("heads_to_rows: rank ", me, " holds ", y.sizes(), ", expected [", sum(rows),
                                         ", ", heads[me], ", D]"));
  // To rank i: i's rows of this rank's heads (a contiguous range); from rank j: this rank's rows of j's heads.
  std::vector<int64_t> send, recv;
  for (size_t i = 0; i < rows.size(); ++i) {
    send.push_back(rows[i] * heads[me] * d);
    recv.push_back(rows[me] * heads[i] * d);
  }
  at::Tensor in = y.contiguous().flatten(), out = at::empty({sum(recv)}, y.options());
  pg->alltoall_base(out, in, recv, send)->wait();
  std::vector<at::Tensor> parts;
  for (size_t j = 0, at_ = 0; j < rows.size(); at_ += size_t(recv[j]), ++j)
    parts.push_back(out.narrow(0, int64_t(at_), recv[j]).view({rows[me], heads[j], d}));
  return at::cat(parts, 1);
}

at::Tensor ulysses_attention(const Group& pg, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::vector<int64_t>& rows, double scale) {
  const int p = pg->getSize(), me = pg->getRank();
  check_attention("ulysses_attention", me, q, k, v, k.size(0), /*same_rows=*/true);
  const int64_t rep = q.size(1) / k.size(1);
  const std::vector<int64_t> groups = shares(k.size(1), p);
  std::vector<int64_t> heads;
  for (int64_t g : groups) heads.push_back(g * rep);
  const at::Tensor qh = rows_to_heads(pg, q, rows, heads), kh = rows_to_heads(pg, k, rows, groups),
                   vh = rows_to_heads(pg, v, rows, groups);
  at::Tensor out = at::zeros_like(qh);
  if (heads[size_t(me)] > 0) {
    auto head_major = [](const at::Tensor& t) { return t.permute({1, 0, 2}).unsqueeze(0); };
    out = unfold(exact(fold(qh, groups[size_t(me)]), head_major(kh), head_major(vh), scale).first, qh.size(0))
              .to(q.scalar_type());
  }
  return heads_to_rows(pg, out.contiguous(), rows, heads);
}

at::Tensor ring_attention(const Group& pg, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::vector<int64_t>& rows, double scale, int64_t q_chunk,
                          const ConsumerImpl* consumer) {
  const int p = pg->getSize(), me = pg->getRank();
  if (int(rows.size()) != p)
    throw std::invalid_argument(c10::str("ring_attention: ", rows.size(), " row counts for a process group of ", p,
                                         " ranks"));
  check_attention("ring_attention", me, q, k, v, rows[size_t(me)], /*same_rows=*/false);
  if (sum(rows) == 0) throw std::invalid_argument("ring_attention: no rank holds a key row");
  const int64_t n_q = q.size(0), G = k.size(1), chunk = q_chunk > 0 ? q_chunk : std::max<int64_t>(n_q, 1);
  const at::ScalarType acc = accumulation(q);
  // The running output and log-sum-exp of every query row; the block of rank (me - step),
  // head-major as consumers take it.
  at::Tensor out = at::empty({n_q, q.size(1), q.size(2)}, q.options().dtype(acc)), lse = at::empty({n_q, q.size(1)}, out.options());
  at::Tensor held = at::stack({k, v}).permute({0, 2, 1, 3}).contiguous();
  bool started = false;
  for (int step = 0; step < p; ++step) {
    const int origin = (me - step + p) % p, next = (origin - 1 + p) % p;
    // The next block travels while this one is attended: sent and received in one exchange, as a
    // send and a receive between the same two ranks (two ranks) may not each wait on the other.
    at::Tensor incoming;
    c10::intrusive_ptr<c10d::Work> passed;
    if (step + 1 < p) {
      incoming = at::empty({2, G, rows[size_t(next)], k.size(2)}, k.options());
      passed = start_pair(pg, held, (me + 1) % p, incoming, (me - 1 + p) % p);
    }
    if (rows[size_t(origin)] > 0) {
      for (int64_t i = 0; i < n_q; i += chunk) {
        const int64_t n = std::min(chunk, n_q - i);
        const at::Tensor qs = fold(q.narrow(0, i, n), G), kb = held[0].unsqueeze(0), vb = held[1].unsqueeze(0);
        auto [o4, l4] = consumer ? consumer->attend_lse(qs, kb, vb, scale) : exact(qs, kb, vb, scale);
        const at::Tensor o = unfold(o4, n).to(acc), l = unfold(l4, n).to(acc);
        at::Tensor os = out.narrow(0, i, n), ls = lse.narrow(0, i, n);
        if (!started) {
          os.copy_(o);
          ls.copy_(l);
          continue;
        }
        // merged by log-sum-exp
        const at::Tensor m = at::maximum(ls, l), a = at::exp(ls - m), b = at::exp(l - m), w = a + b;
        os.mul_(a.unsqueeze(-1)).add_(o.mul_(b.unsqueeze(-1))).div_(w.unsqueeze(-1));
        ls.copy_(m.add_(w.log_()));
      }
      started = true;
    }
    if (step + 1 < p) {
      passed->wait();
      held = incoming;
    }
  }
  return out.to(q.scalar_type());
}

at::Tensor gather_rows(const Group& pg, const at::Tensor& x, const std::vector<int64_t>& rows) {
  const int p = pg->getSize(), me = pg->getRank();
  if (int(rows.size()) != p || x.dim() < 1 || x.size(0) != rows[size_t(me)])
    throw std::invalid_argument(c10::str("gather_rows: rank ", me, " holds ", x.sizes(), " of row counts ", rows,
                                         " for a process group of ", p, " ranks"));
  int64_t width = 1;  // from the shape: a rank may hold no rows
  for (int64_t i = 1; i < x.dim(); ++i) width *= x.size(i);
  std::vector<int64_t> send(size_t(p), x.numel()), recv;
  for (int64_t r : rows) recv.push_back(r * width);
  // This rank's rows to every rank (itself included); from each, its rows.
  at::Tensor in = x.contiguous().flatten().repeat({p});
  at::Tensor out = at::empty({sum(recv)}, x.options());
  pg->alltoall_base(out, in, recv, send)->wait();
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = sum(rows);
  return out.view(shape);
}

double probe_link(const Group& pg, const at::Device& device, int64_t bytes) {
  const int p = pg->getSize();
  const int64_t per = std::max<int64_t>(bytes / 4 / p, 1);
  at::Tensor in = at::ones({per * p}, at::TensorOptions().dtype(at::kFloat).device(device));
  at::Tensor out = at::empty_like(in);
  std::vector<int64_t> splits(size_t(p), per);
  std::vector<double> seconds;
  for (int i = 0; i < 4; ++i) {
    synchronize(device);
    const auto t0 = std::chrono::steady_clock::now();
    pg->alltoall_base(out, in, splits, splits)->wait();
    synchronize(device);
    if (i > 0) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const double rate = 2.0 * double(per) * 4.0 * double(p - 1) / std::max(seconds[1], 1e-9);
  return double(min_over_ranks(pg, {int64_t(rate)}, device).front());
}

std::vector<int64_t> min_over_ranks(const Group& pg, const std::vector<int64_t>& values, const at::Device& device) {
  if (values.empty()) return values;
  std::vector<at::Tensor> t{at::tensor(values, at::TensorOptions().dtype(at::kLong)).to(device)};
  pg->allreduce(t, c10d::AllreduceOptions{c10d::ReduceOp::MIN})->wait();
  const at::Tensor out = t.front().cpu();
  return {out.data_ptr<int64_t>(), out.data_ptr<int64_t>() + out.numel()};
}

}  // namespace sp::exec::dist
