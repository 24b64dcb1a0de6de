// Sequence-parallel exchanges over a torch.distributed process group (c10d: NCCL on CUDA, gloo
// on the CPU). Ulysses attention splits the rows of a sequence across ranks; around attention
// one all-to-all trades a rank's rows of every head for every rank's rows of its own heads, and
// another trades them back. Row and head counts per rank may be uneven (split sizes), so any
// head count runs on any rank count. Ring attention keeps the heads and passes K/V around.
//
// Example (rank r of p, its rows of Q as [rows[r], H, D]):
//     const auto rows = sp::exec::dist::shares(total_rows, p), heads = sp::exec::dist::shares(H, p);
//     at::Tensor qh = sp::exec::dist::rows_to_heads(pg, q, rows, heads);   // [total_rows, heads[r], D]
//     at::Tensor back = sp::exec::dist::heads_to_rows(pg, qh, rows, heads); // == q
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <vector>

#include "exec/consumers/consumer.hpp"
#include "plan/program.hpp"

namespace sp::exec::dist {

using Group = c10::intrusive_ptr<c10d::ProcessGroup>;

using plan::shares;  // n items over p ranks: the first n % p ranks take one more

// x [rows[me], sum(heads), D] -> [sum(rows), heads[me], D]: every rank's rows of this rank's heads.
at::Tensor rows_to_heads(const Group& pg, const at::Tensor& x, const std::vector<int64_t>& rows,
                         const std::vector<int64_t>& heads);
// rows_to_heads begun: x packed into `send` (x.numel() elements, x's dtype), the all-to-all into
// `recv` ([sum(rows), heads[me], D] elements) in flight. Wait on the work before reading `recv`
// or writing `send` again (on CUDA the wait orders the current stream after it).
c10::intrusive_ptr<c10d::Work> start_rows_to_heads(const Group& pg, const at::Tensor& x, const std::vector<int64_t>& rows,
                                                   const std::vector<int64_t>& heads, const at::Tensor& send,
                                                   const at::Tensor& recv);
// One pair of one round of a collective exchange: every rank calls it together, each sending
// `send` to rank `to` and receiving `recv` (contiguous, its dtype) from rank `from` (an
// all-to-all whose other parts are empty). Wait on the work before reading `recv`.
c10::intrusive_ptr<c10d::Work> start_pair(const Group& pg, const at::Tensor& send, int64_t to, const at::Tensor& recv,
                                          int64_t from);
// The inverse: y [sum(rows), heads[me], D] -> [rows[me], sum(heads), D].
at::Tensor heads_to_rows(const Group& pg, const at::Tensor& y, const std::vector<int64_t>& rows,
                         const std::vector<int64_t>& heads);

// Ulysses attention: this rank's rows q [rows[me], H, D], k and v [rows[me], G, D] (H a multiple
// of G); the K/V groups are shared out over the ranks (shares(G, p)), each with its query heads,
// every rank attends its groups over all sum(rows) rows (explicit scores, fp32 softmax), and
// the outputs go back to their rows: [rows[me], H, D] in q's dtype.
at::Tensor ulysses_attention(const Group& pg, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::vector<int64_t>& rows, double scale);

// Ring attention: this rank's query rows q [n_q, H, D] against the keys and values of every
// rank, k and v [rows[me], G, D] here (H a multiple of G). The K/V blocks travel around the
// ring head-major (to rank me + 1, from me - 1; the next block in flight while this one is
// attended); `consumer`'s attend_lse (one that declares ConsumerCaps::lse; null: explicit scores
// in fp32) takes `q_chunk` query rows at a time (0: all) against each block, and the outputs
// merge by their log-sum-exp into a running one in fp32 (fp64 for fp64 inputs). Returns
// [n_q, H, D] in q's dtype: attention over all sum(rows) keys.
at::Tensor ring_attention(const Group& pg, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::vector<int64_t>& rows, double scale, int64_t q_chunk = 0,
                          const ConsumerImpl* consumer = nullptr);

// Every rank's rows of x [rows[me], ...], in rank order, on every rank: [sum(rows), ...].
at::Tensor gather_rows(const Group& pg, const at::Tensor& x, const std::vector<int64_t>& rows);

// Each value's smallest over the ranks of the group (an all-reduce on `device`); every rank calls
// it with as many values.
std::vector<int64_t> min_over_ranks(const Group& pg, const std::vector<int64_t>& values, const at::Device& device);

// Bytes one rank sends and receives per second in an all-to-all of about `bytes` per rank over
// the group, on `device` (the median of 3 after one warm-up; the slowest rank's, so that every
// rank plans with the same rate); every rank must call it.
double probe_link(const Group& pg, const at::Device& device, int64_t bytes = int64_t{16} << 20);

}  // namespace sp::exec::dist
