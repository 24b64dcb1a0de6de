// LoRA: a low-rank update of a projection's weight, applied lazily per slab.
//
// Design note. The planned schedule never forms W + scale * B A: the program's LoRA step
// (plan/compile_lora.cpp) adds scale * (A x) B^T into each projection's rows, whatever the base
// weight's format; the naive reference merges the adapters into its full weight. Both are this
// implementation, so the equivalence tests compare schedules, not two LoRA codes. A and B are
// read by the adapter's names, in the model's dtype (patches/README.md).
//
// Example:
//     const auto& lora = sp::exec::impl_of<sp::exec::LoraImpl>(reg.patch("lora"));
//     lora.apply(weights, adapter, rows, cols, x, y, ax);   // y[:, rows] += s * (x A^T) B^T
//     at::Tensor w = lora.merged(weights, linear, base);    // base + every adapter (reference)
#pragma once

#include <ATen/ATen.h>

#include "contracts/contracts.hpp"
#include "exec/formats/weights.hpp"

namespace sp::exec {

struct LoraImpl : contracts::Impl {
  // out[:, j] += a.scale * (x @ A[:, cols]^T) @ B[r_j]^T for each projected output row
  // r_j = rows.begin + j * rows.step inside the adapter's rows; x holds input columns `cols`
  // of the weight. `ax` is a placed buffer of at least x.size(0) * a.rank elements.
  void apply(const WeightSource& w, const ir::LoraAdapter& a, Slice rows, Slice cols, const at::Tensor& x,
             const at::Tensor& out, const at::Tensor& ax) const;
  // The full weight `base` [out, in] of `l` with every adapter of `l` added (a new tensor).
  at::Tensor merged(const WeightSource& w, const ir::Linear& l, const at::Tensor& base) const;
};

// A weight source that also serves the LoRA tensors (by the adapters' names) over `base`,
// which keeps serving everything else, the Linears' weights included.
class LoraWeights : public WeightSource {
 public:
  LoraWeights(const WeightSource& base, const std::map<std::string, at::Tensor>& lora) : base_(base), lora_(lora) {}
  at::Tensor tensor(const std::string& name) const override {
    auto it = lora_.find(name);
    return it != lora_.end() ? it->second : base_.tensor(name);
  }
  bool contains(const std::string& name) const override { return lora_.count(name) || base_.contains(name); }
  at::Tensor acquire(const ir::Linear& l, Slice rows, Slice cols, at::ScalarType dtype,
                     const at::Tensor& out = {}) const override {
    return base_.acquire(l, rows, cols, dtype, out);
  }

 private:
  const WeightSource& base_;
  const std::map<std::string, at::Tensor>& lora_;
};

}  // namespace sp::exec
