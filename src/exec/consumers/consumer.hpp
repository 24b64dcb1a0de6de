// Attention consumers: implementations registered together with their capabilities.
//
// Design note. A consumer computes softmax(q k^T * scale) v for q [1, G, rows, head_dim]
// against k, v [1, G, kv_rows, head_dim] (grouped-query heads folded into rows) into a new
// tensor in q's dtype, allocating exactly the call_bytes its capabilities declare
// (exec/consumers/README.md).
//
// Example:
//     const auto& attend = sp::exec::impl_of<sp::exec::ConsumerImpl>(reg.consumer("sdpa"));
//     at::Tensor o = attend.attend(q, k, v, 1.0 / std::sqrt(128.0));
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "contracts/contracts.hpp"

namespace sp::exec {

struct ConsumerImpl : contracts::Impl {
  virtual at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) const = 0;
  // Why the consumer cannot run on `device` in `dtype` (its kernels' requirements and their
  // self-test on that device), or "" where it can. Checked before a run, so that a choice it
  // cannot honour is refused (or, for a host's automatic choice, passed over) with the reason.
  virtual std::string unusable(const at::Device& /*device*/, at::ScalarType /*dtype*/) const { return {}; }
  // The same for one call of a planned (or naive) run with its arguments: the Q slab's first
  // row, the block, the sublayer's query rows, the KV budget and the video rows (the attend
  // step's). The executors call this; consumers whose result depends on them override it.
  virtual at::Tensor attend_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                 const contracts::AttnCall& /*call*/) const {
    return attend(q, k, v, scale);
  }
  // Consumers that declare ConsumerCaps::lse: the output in q's dtype and the log-sum-exp of
  // each row's scaled scores [1, G, rows] in fp32 (fp64 for fp64 inputs), for outputs over parts of K/V to merge.
  virtual std::pair<at::Tensor, at::Tensor> attend_lse(const at::Tensor& /*q*/, const at::Tensor& /*k*/,
                                                       const at::Tensor& /*v*/, double /*scale*/) const {
    throw contracts::ContractError("this consumer returns no log-sum-exp");
  }
  // Consumers that declare a K carrier (ConsumerCaps::k_carrier_bytes): the K slab
  // [1, G, n, head_dim] of rows [row0, row0 + n) of kv_rows into `carrier` (the declared bytes,
  // int8), and attention against the filled carrier.
  virtual void carry_k(const at::Tensor& /*k*/, const at::Tensor& /*carrier*/, int64_t /*row0*/,
                       int64_t /*kv_rows*/) const {
    throw contracts::ContractError("this consumer declares no K carrier");
  }
  virtual at::Tensor attend_carried(const at::Tensor& /*q*/, const at::Tensor& /*carrier*/, const at::Tensor& /*v*/,
                                    double /*scale*/, const contracts::AttnCall& /*call*/, int64_t /*kv_rows*/) const {
    throw contracts::ContractError("this consumer declares no K carrier");
  }
};

// softmax(q k^T * scale) v with explicit scores in fp32 (or fp64), and the rows' log-sum-exp:
// the math consumer's attend_lse.
std::pair<at::Tensor, at::Tensor> math_attention_lse(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     double scale);

// rel L2 of `got` against `want`, in fp32: the consumers' self-tests.
double self_test_rel_l2(const at::Tensor& got, const at::Tensor& want);

// The `sdpa` consumer's attention, and which kernel it runs on `device` in `dtype` and why
// (on CUDA measured at the first use there: cuDNN's or ATen's own choice).
at::Tensor sdpa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale);
std::string sdpa_kernel(const at::Device& device, at::ScalarType dtype, int64_t head_dim);

// The implementation registered with `caps`, as interface T; throws naming the component
// when none (or one of another kind) was registered.
template <typename T, typename Caps>
const T& impl_of(const Caps& caps) {
  const T* impl = dynamic_cast<const T*>(caps.impl.get());
  if (!impl) throw contracts::ContractError("'" + caps.name + "' has capabilities but no implementation registered");
  return *impl;
}

}  // namespace sp::exec
