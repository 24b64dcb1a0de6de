#include "exec/dist/exchange.hpp"

#include "exec/device/device.hpp"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <stdexcept>

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

// Rows-major q [n_q, H, D] as the fp32 heads-major [H, n_q, D] that attend_block takes, scaled.
at::Tensor scaled_heads(const at::Tensor& q, double scale) { return q.to(at::kFloat).permute({1, 0, 2}).mul(scale); }

// Attention of q [H, n_q, D] (fp32, scaled) against one K/V block [n, G, D]: the output
// [H, n_q, D] and the log-sum-exp of each row's scores [H, n_q], in fp32; `q_chunk` > 0: the
// scores of that many query rows at a time.
std::pair<at::Tensor, at::Tensor> attend_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               int64_t q_chunk = 0) {
  const int64_t rep = q.size(0) / k.size(1), n_q = q.size(1);
  auto heads = [&](const at::Tensor& t) { return t.to(at::kFloat).permute({1, 0, 2}).repeat_interleave(rep, 0); };
  const at::Tensor kh = heads(k).transpose(1, 2), vh = heads(v);
  if (q_chunk <= 0 || q_chunk >= n_q) {
    const at::Tensor s = at::bmm(q, kh);
    const at::Tensor lse = at::logsumexp(s, -1);
    return {at::bmm(at::exp(s - lse.unsqueeze(-1)), vh), lse};
  }
  at::Tensor out = at::empty({q.size(0), n_q, vh.size(2)}, q.options()), lse = at::empty({q.size(0), n_q}, q.options());
  for (int64_t i = 0; i < n_q; i += q_chunk) {
    const int64_t n = std::min(q_chunk, n_q - i);
    const at::Tensor s = at::bmm(q.narrow(1, i, n), kh);
    const at::Tensor l = at::logsumexp(s, -1);
    lse.narrow(1, i, n).copy_(l);
    out.narrow(1, i, n).copy_(at::bmm(at::exp(s - l.unsqueeze(-1)), vh));
  }
  return {out, lse};
}

}  // namespace

at::Tensor rows_to_heads(const Group& pg, const at::Tensor& x, const std::vector<int64_t>& rows,
                         const std::vector<int64_t>& heads) {
  const size_t me = check(*pg, x, rows, heads, "rows_to_heads");
  const int64_t d = x.size(2);
  if (x.size(0) != rows[me] || x.size(1) != sum(heads))
    throw std::invalid_argument(c10::str("rows_to_heads: rank ", me, " holds ", x.sizes(), ", expected [", rows[me],
                                         ", ", sum(heads), ", D]"));
  // To rank j: this rank's rows of j's heads; from rank i: i's rows of this rank's heads.
  std::vector<at::Tensor> parts;
  std::vector<int64_t> send, recv;
  for (size_t j = 0, h0 = 0; j < rows.size(); h0 += size_t(heads[j]), ++j) {
    parts.push_back(x.narrow(1, int64_t(h0), heads[j]).flatten());
    send.push_back(rows[me] * heads[j] * d);
    recv.push_back(rows[j] * heads[me] * d);
  }
  at::Tensor in = at::cat(parts), out = at::empty({sum(recv)}, x.options());
  pg->alltoall_base(out, in, recv, send)->wait();
  return out.view({sum(rows), heads[me], d});
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
  if (heads[size_t(me)] > 0)
    out = attend_block(scaled_heads(qh, scale), kh, vh).first.permute({1, 0, 2}).to(q.scalar_type());
  return heads_to_rows(pg, out.contiguous(), rows, heads);
}

at::Tensor ring_attention(const Group& pg, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::vector<int64_t>& rows, double scale, int64_t q_chunk) {
  const int p = pg->getSize(), me = pg->getRank();
  if (int(rows.size()) != p)
    throw std::invalid_argument(c10::str("ring_attention: ", rows.size(), " row counts for a process group of ", p,
                                         " ranks"));
  check_attention("ring_attention", me, q, k, v, rows[size_t(me)], /*same_rows=*/false);
  const at::Tensor qh = scaled_heads(q, scale);
  at::Tensor out, lse;
  at::Tensor held = at::stack({k, v}).contiguous();  // the block of rank (me - step)
  for (int step = 0; step < p; ++step) {
    const int origin = (me - step + p) % p, next = (origin - 1 + p) % p;
    std::vector<at::Tensor> incoming, outgoing{held};
    c10::intrusive_ptr<c10d::Work> sent, received;
    if (step + 1 < p) {  // the next block travels while this one is attended
      incoming.push_back(at::empty({2, rows[size_t(next)], k.size(1), k.size(2)}, k.options()));
      sent = pg->send(outgoing, (me + 1) % p, step);
      received = pg->recv(incoming, (me - 1 + p) % p, step);
    }
    if (rows[size_t(origin)] > 0) {
      auto [o, l] = attend_block(qh, held[0], held[1], q_chunk);
      if (!out.defined()) {
        out = o, lse = l;
      } else {  // merged by log-sum-exp
        const at::Tensor m = at::maximum(lse, l), a = at::exp(lse - m), b = at::exp(l - m);
        out = (out * a.unsqueeze(-1) + o * b.unsqueeze(-1)) / (a + b).unsqueeze(-1);
        lse = m + at::log(a + b);
      }
    }
    if (step + 1 < p) {
      sent->wait();
      received->wait();
      held = incoming.front();
    }
  }
  if (!out.defined()) throw std::invalid_argument("ring_attention: no rank holds a key row");
  return out.permute({1, 0, 2}).to(q.scalar_type());
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
