// Pieces shared by the family prologues (internal to src/models).
#pragma once

#include <ATen/ATen.h>

#include "exec/formats/weights.hpp"
#include "ir/model.hpp"
#include "models/tensor_io.hpp"
#include "recognize/recognize.hpp"

namespace sp::models::detail {

// [cos(t f) | sin(t f)], f_j = 10000^(-j/half), half = dim/2; t: [1] -> [dim] fp32.
at::Tensor sinusoid(const at::Tensor& t, int64_t dim);
// y = x W^T + b for canonical weight "<prefix>.weight" / ".bias".
at::Tensor affine(const exec::WeightSource& w, const std::string& prefix, const at::Tensor& x);
// RoPE tables "rope.cos"/"rope.sin" [T, sum(d)/2] fp32 into `tables`, for positions [T, axes]
// (float): per axis a of width d_a, pair j rotates by pos_a * theta^(-2j/d_a); columns axis by
// axis (angles in fp64).
void set_rope_tables(std::map<std::string, at::Tensor>& tables, const at::Tensor& pos,
                     const std::vector<int64_t>& axes_dim, double theta);
// Final layer: norm, shift/scale rows 0/1 of a 2-vector modulation table, fp32 projection.
ir::FinalLayer final_layer(std::vector<std::string> segments, ir::Norm norm, ir::ModScope scope,
                           const std::string& table, ir::Linear proj);
// Positions (f, h, w) of a row-major grid, [F*H*W, 3] float.
at::Tensor grid_positions(int64_t f, int64_t h, int64_t w, const at::Device& d);
const at::Tensor& need(const TensorMap& raw, const std::string& name, std::vector<int64_t> rank_dims);

// "blocks.<i>.", the prefix of block i's tensors.
inline std::string blk(int64_t i) { return "blocks." + std::to_string(i) + "."; }
ir::Linear linear(const std::string& name, int64_t in, int64_t out, bool bias, const std::string& format = "dense");
ir::Norm layer_norm(double eps);                 // no affine
ir::Norm rms_norm(double eps);                   // no affine

// Self-attention of an avdit or MiniMax H3 block under `prefix`: fused [q | k | v] projection
// `qkv` (no bias), per-head RMSNorm of Q and K (weights q_norm, k_norm), split-half RoPE over
// the leading rotary dims (tables "rope"), output projection `out`.
struct QkvNames {
  std::string qkv, q_norm, k_norm, out;
};
ir::Attention fused_qkv_attention(const std::string& prefix, const QkvNames& names, const recognize::FamilyConfig& c,
                                  const std::string& consumer);
// SwiGLU MLP whose `fc1` rows are [gate | up] (no biases).
ir::Mlp swiglu_halves(const std::string& fc1, const std::string& fc2, const recognize::FamilyConfig& c);

}  // namespace sp::models::detail
