#include "exec/consumers.hpp"

#include <map>
#include <mutex>
#include <stdexcept>

namespace sp::exec {

namespace {

at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, scale);
}

// Reference: explicit scores, an in-place softmax in fp32 (or fp64), then P V.
at::Tensor math(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  at::Tensor s = at::matmul(q, k.transpose(-2, -1));
  at::Tensor p = (s.scalar_type() == at::kFloat || s.scalar_type() == at::kDouble) ? s : s.to(at::kFloat);
  p.mul_(scale);
  p.sub_(std::get<0>(p.max(-1, true)));
  p.exp_();
  p.div_(p.sum(-1, true));
  return at::matmul(p.scalar_type() == q.scalar_type() ? p : p.to(q.scalar_type()), v);
}

struct Table {
  std::mutex mu;
  std::map<std::string, AttentionFn> fns = {{"sdpa", sdpa}, {"math", math}, {"whole", sdpa}};
};
Table& table() {
  static Table t;
  return t;
}

}  // namespace

void register_consumer_impl(const std::string& name, AttentionFn fn) {
  std::lock_guard<std::mutex> l(table().mu);
  table().fns[name] = std::move(fn);
}

const AttentionFn& consumer_impl(const std::string& name) {
  std::lock_guard<std::mutex> l(table().mu);
  auto it = table().fns.find(name);
  if (it != table().fns.end()) return it->second;
  std::string known;
  for (const auto& [k, v] : table().fns) known += (known.empty() ? "" : ", ") + k;
  throw std::invalid_argument("no implementation registered for attention consumer '" + name + "' (known: " + known +
                              ")");
}

}  // namespace sp::exec
