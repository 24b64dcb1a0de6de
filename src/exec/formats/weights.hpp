// Weight sources and weight formats: how the executor acquires the weights the IR names
// (exec/formats/README.md).
//
// Design note. A WeightSource hands out a weight whole or as a slice of rows (output
// features, optionally strided) and columns (input features), for compute in a dtype, through
// its format's FormatImpl. A converting format writes into the buffer the program placed for
// it (`out`) and keeps no copy beyond the program's release step.
//
// Example:
//     sp::exec::TensorWeights w(&reg);
//     w.store(lin, at::randn({64, 32}), at::kFloat);                  // in lin's format
//     at::Tensor rows = w.acquire(lin, {0, 16}, {}, at::kFloat);      // view of rows 0..15
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
  // The raw tensor (e.g. norm weights, biases, int8 storage). By value: a source may make it
  // on request (a host's weight hook), and then it lives as long as the caller holds it.
  virtual at::Tensor tensor(const std::string& name) const = 0;
  virtual bool contains(const std::string& name) const = 0;
  // rows/cols of a Linear's weight for compute in `dtype`: a view where the format hands
  // out views, else converted into `out` (a placed buffer of that shape) and returned;
  // without `out` a converting format allocates (the naive reference).
  virtual at::Tensor acquire(const ir::Linear& l, Slice rows, Slice cols, at::ScalarType dtype,
                             const at::Tensor& out = {}) const = 0;
  // Called by both executors before and after each block's work: a source that streams
  // weights from host memory loads and releases them here (exec/residency). Nothing by default.
  virtual void begin_block(size_t /*block*/) const {}
  virtual void end_block(size_t /*block*/) const {}
  // x·Wᵀ (+ bias) of weight `name` for a linear outside the program (a model's prologue), in
  // x's dtype, as the format's own GEMM computes it where the source holds the weight quantized
  // and x's device runs that format natively (what the host computes); undefined elsewhere:
  // the caller computes it from tensor(). None by default.
  virtual at::Tensor native_linear(const std::string& /*name*/, const at::Tensor& /*x*/,
                                   const at::Tensor& /*bias*/) const {
    return {};
  }
};

// A source's tensors, and the slices acquired from it, each read onto one device.
class OnDevice : public WeightSource {
 public:
  OnDevice(const WeightSource& w, const at::Device& d) : w_(w), d_(d) {}
  at::Tensor tensor(const std::string& name) const override { return w_.tensor(name).to(d_); }
  bool contains(const std::string& name) const override { return w_.contains(name); }
  at::Tensor acquire(const ir::Linear& l, Slice rows, Slice cols, at::ScalarType dtype,
                     const at::Tensor& out = {}) const override {
    return w_.acquire(l, rows, cols, dtype, out).to(d_);
  }

 private:
  const WeightSource& w_;
  at::Device d_;
};

class TensorWeights;

// How one weight format stores and converts its weights.
struct FormatImpl : contracts::Impl {
  // Stores the float weight `w` [out, in] of `l` in this format (with any tensors beside it).
  virtual void store(TensorWeights& into, const ir::Linear& l, const at::Tensor& w, at::ScalarType model) const = 0;
  // rows x cols of the stored weight, in `dtype` (see WeightSource::acquire).
  virtual at::Tensor acquire(const WeightSource& src, const ir::Linear& l, Slice rows, Slice cols,
                             at::ScalarType dtype, const at::Tensor& out) const = 0;
  // The tensors stored beside l's weight (scales): they travel with it when weights move.
  virtual std::vector<std::string> companions(const ir::Linear& /*l*/) const { return {}; }
  // Formats declaring FormatCaps::native_gemm: y (+)= x @ W[rows, cols]^T (+ bias), with
  // `stored` the stored slice (stored_slice) and the scales of that slice read from `src`.
  virtual void gemm(const WeightSource& src, const ir::Linear& l, Slice rows, Slice cols, const at::Tensor& stored,
                    const at::Tensor& x, const at::Tensor& y, const at::Tensor& bias, bool accumulate) const;
};

// Weights held as tensors by name, acquired through their formats' implementations.
class TensorWeights : public WeightSource {
 public:
  explicit TensorWeights(const contracts::Registry* reg) : reg_(reg) {}
  void add(const std::string& name, at::Tensor t) { t_[name] = std::move(t); }
  // `w` (float) stored in l's format under l.weight.
  void store(const ir::Linear& l, const at::Tensor& w, at::ScalarType model);
  at::Tensor tensor(const std::string& name) const override;
  bool contains(const std::string& name) const override { return t_.count(name) != 0; }
  at::Tensor acquire(const ir::Linear& l, Slice rows, Slice cols, at::ScalarType dtype,
                     const at::Tensor& out = {}) const override;
  int64_t total_bytes() const;
  const std::map<std::string, at::Tensor>& all() const { return t_; }
  // Removes the tensor `name` and returns it (undefined where absent).
  at::Tensor take(const std::string& name);
  // Weights held in a non-dense format (a quantized checkpoint, or a conversion at load), by
  // weight name: the format and why (models/quant_load.hpp applies them to the IR).
  struct FormatNote {
    std::string format, why;
  };
  void note_format(const std::string& weight, FormatNote n) { notes_[weight] = std::move(n); }
  const std::map<std::string, FormatNote>& format_notes() const { return notes_; }

 private:
  const contracts::Registry* reg_;
  std::map<std::string, at::Tensor> t_;
  std::map<std::string, FormatNote> notes_;
};

at::ScalarType to_aten(ir::DType d);
inline std::string shape_text(const at::Tensor& t) { return ir::shape_text(t.sizes().vec()); }
at::Tensor slice(const at::Tensor& t, int64_t dim, Slice s);
// The stored weight of `l`, checked against the IR's shape, sliced.
at::Tensor stored_slice(const WeightSource& src, const ir::Linear& l, Slice rows, Slice cols);

// What computes a linear of format `f` on `dev`: the format's own GEMM (its kernel named), the
// dequantized slice then a matmul, or a matmul of the stored weight (dense formats).
std::string gemm_provider(const contracts::FormatCaps& f, const contracts::DeviceCaps& dev);
// x·Wᵀ (+ bias) of the whole weight `l` through its format's GEMM where x's device runs the
// format natively, with l's tensors read from `src` (copied to x's device where held
// elsewhere); undefined where the device does not run it.
at::Tensor native_linear(const contracts::Registry& reg, const WeightSource& src, const ir::Linear& l,
                         const at::Tensor& x, const at::Tensor& bias);
// A stored slice in `dtype`: copied into `out` (the placed buffer) and returned, or, without
// one, a new tensor (the naive reference). For formats whose acquire converts.
at::Tensor converted(const at::Tensor& stored, at::ScalarType dtype, const at::Tensor& out);

}  // namespace sp::exec
