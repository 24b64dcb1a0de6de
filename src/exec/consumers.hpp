// Attention consumer implementations, registered by name beside their contracts.
//
// Design note. An implementation computes softmax(q k^T * scale) v for tensors shaped
// [1, G, rows, head_dim] (q) and [1, G, kv_rows, head_dim] (k, v) and returns a new
// [1, G, rows, head_dim] tensor in q's dtype; grouped-query heads arrive folded into
// rows, so implementations see G equal head groups. What an implementation allocates
// per call must match its contract's call_bytes (contracts/contracts.cpp).
//
// Example:
//     const auto& attend = sp::exec::consumer_impl("sdpa");
//     at::Tensor o = attend(q, k, v, 1.0 / std::sqrt(128.0));
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>

namespace sp::exec {

using AttentionFn = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             double scale)>;

void register_consumer_impl(const std::string& name, AttentionFn fn);
const AttentionFn& consumer_impl(const std::string& name);  // throws naming known implementations

}  // namespace sp::exec
