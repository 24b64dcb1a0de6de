// In-place row operations of the planned schedule. Each works on a slab of rows
// [row0, row0 + n) and allocates nothing: per-row statistics go to the buffer the
// program placed for them.
//
// Example:
//     sp::exec::Ops ops(model, weights, inputs);
//     ops.norm_modulate(x.narrow(0, r0, n), sub.norm, block.modulation, sub.mod, r0, n32, stats);
//     ops.norm_modulate_fused(x.narrow(0, r0, n), sub.norm, block.modulation, sub.mod, r0, h);  // CUDA
#pragma once

#include <ATen/ATen.h>

#include "exec/run/executor.hpp"

namespace sp::exec {

class Ops {
 public:
  Ops(const ir::Model& m, const WeightSource& w, const Inputs& in) : m_(m), w_(w), in_(in) {}

  // n32 := modulate(norm(x_rows)) in the accumulation dtype; stats [n, 1] scratch.
  void norm_modulate(const at::Tensor& x_rows, const ir::Norm& n, const ir::Modulation& mod, const ir::ModRef& r,
                     int64_t row0, const at::Tensor& n32, const at::Tensor& stats) const;
  // out := modulate(norm(x_rows)) in one kernel (exec/kernels/fused.hpp), in out's dtype.
  void norm_modulate_fused(const at::Tensor& x_rows, const ir::Norm& n, const ir::Modulation& mod,
                           const ir::ModRef& r, int64_t row0, const at::Tensor& out) const;
  // out3 [n, heads, head_dim] (any layout) := rope(qk_norm(t)) in one kernel, t [n, heads*head_dim];
  // cos / sin: the slab's rows of the RoPE tables (undefined without RoPE).
  void qk_norm_rope_fused(const at::Tensor& t, const ir::QkNorm& qn, const std::string& weight, const ir::Rope& rope,
                          const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& out3) const;
  // t32 [n, heads*head_dim] normalized per head or across heads, times the named weight;
  // stats [n, heads] (per head) or [n, 1] scratch.
  void qk_norm_(const at::Tensor& t32, const ir::QkNorm& qn, const std::string& weight, int64_t heads,
                int64_t head_dim, const at::Tensor& stats) const;
  // t3 [n, heads, head_dim]: rotates the leading rotary_dim dims; tmp [n, heads, rotary_dim/2].
  void rope_(const at::Tensor& t3, const ir::Rope& r, const at::Tensor& cos, const at::Tensor& sin,
             const at::Tensor& tmp) const;
  void activate_(const at::Tensor& t, ir::ActKind a) const;
  // x_rows += gate * y (gate from the modulation table, or 1); fused: one row kernel per piece.
  void gated_add(const at::Tensor& x_rows, const at::Tensor& y, const ir::Modulation& mod, const ir::ModRef& r,
                 int64_t row0, bool fused) const;

 private:
  // Calls f(local_begin, length, segment) for each piece of the slab that uses one row of a
  // per-segment table (segment -1: one piece, for shared and per-token tables).
  template <typename F>
  void pieces(const ir::Modulation& mod, int64_t row0, int64_t n, F&& f) const;
  // Entry idx of the modulation for the piece's rows: [len, dim] per token, else [dim].
  at::Tensor mod_rows(const ir::Modulation& mod, int idx, int64_t row0, int64_t len, int64_t segment) const;
  // Calls f(local_begin, length, modulation_row_view) for each segment piece of the slab.
  template <typename F>
  void mod_pieces(const ir::Modulation& mod, int idx, int64_t row0, int64_t n, F&& f) const;
  const ir::Model& m_;
  const WeightSource& w_;
  const Inputs& in_;
};

}  // namespace sp::exec
