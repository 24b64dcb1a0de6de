// Weight sources: how the executor acquires the weights an IR Linear refers to.
//
// Design note. The IR names weights; a WeightSource supplies them on acquire, as the
// plan asks: whole or a slice of rows (output features, optionally strided for
// interleaved layouts) and columns (input features), in the compute dtype. Dense
// weights are handed out as views (no bytes allocated); other formats convert the
// requested slice only, allocating exactly plan::acquire_bytes() of it. Nothing keeps
// a converted copy beyond the acquiring scope.
//
// Example:
//     sp::exec::TensorWeights w;
//     w.add("fc1.weight", at::randn({64, 32}));
//     at::Tensor rows = w.acquire(lin, {0, 16}, {}, at::kFloat);   // view of rows 0..15
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>

#include "contracts/contracts.hpp"
#include "ir/model.hpp"

namespace sp::exec {

struct Slice {
  int64_t begin = 0;
  int64_t length = -1;  // -1: to the end
  int64_t step = 1;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The raw tensor (e.g. norm weights, biases, int8 storage).
  virtual const at::Tensor& tensor(const std::string& name) const = 0;
  virtual bool contains(const std::string& name) const = 0;
  // rows/cols of a Linear's weight, converted to `dtype` when its format is not dense.
  virtual at::Tensor acquire(const ir::Linear& l, Slice rows, Slice cols, at::ScalarType dtype) const = 0;
};

// Weights held as tensors by name. int8-rowwise weights keep their fp32 scales under
// "<name>.scale". A dense weight must already be in the activation dtype.
class TensorWeights : public WeightSource {
 public:
  explicit TensorWeights(const contracts::Registry* reg) : reg_(reg) {}
  void add(const std::string& name, at::Tensor t);
  const at::Tensor& tensor(const std::string& name) const override;
  bool contains(const std::string& name) const override { return t_.count(name) != 0; }
  at::Tensor acquire(const ir::Linear& l, Slice rows, Slice cols, at::ScalarType dtype) const override;
  int64_t total_bytes() const;
  const std::map<std::string, at::Tensor>& all() const { return t_; }

 private:
  const contracts::Registry* reg_;
  std::map<std::string, at::Tensor> t_;
};

at::ScalarType to_aten(ir::DType d);
at::Tensor slice(const at::Tensor& t, int64_t dim, Slice s);

}  // namespace sp::exec
