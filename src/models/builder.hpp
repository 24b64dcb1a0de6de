// Model builder: an IR plus deterministic random weights and inputs from a small config.
//
// Design note. The embedded default model (`streamplan demo`, demo_config) is one
// configuration of this builder; tests use it with awkward configurations (odd lengths, GQA,
// partial RoPE, every layout).
// All random values are drawn in fp32 on the CPU from one seeded generator, in a fixed
// order, then rounded to the model dtype (and quantized for int8 formats) — so two
// instances with the same config hold the same weights whatever the dtype or device.
//
// Example:
//     sp::models::ModelConfig cfg = sp::models::demo_config();
//     cfg.layers = 4;
//     auto inst = sp::models::instantiate(cfg, reg, at::kCPU);
//     at::Tensor out = sp::exec::run_naive(inst.model, *inst.weights, inst.inputs, reg);
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "exec/run/executor.hpp"
#include "exec/formats/weights.hpp"
#include "ir/model.hpp"

namespace sp::models {

struct ModelConfig {
  std::string name = "avdit-demo";
  int64_t dim = 384, heads = 6, kv_heads = 6, head_dim = 64, hidden = 1024;
  int64_t in_features = 64, out_features = 64;
  int layers = 2;
  // Token segments in order; the segment named "video" may carry a (t, h, w) grid for RoPE.
  std::vector<ir::Segment> segments = {{"text", 128}, {"video", 3072}};
  int64_t video_t = 0, video_h = 0, video_w = 0;  // 0: positions along one axis
  ir::DType dtype = ir::DType::F32;
  bool fused_qkv = true, qkv_bias = false, out_bias = false, mlp_bias = false;
  ir::QkNormKind qk_norm = ir::QkNormKind::PerHead;
  ir::RopeStyle rope = ir::RopeStyle::SplitHalf;
  int64_t rotary_dim = 48;
  ir::GateUpLayout layout = ir::GateUpLayout::FusedHalves;
  ir::ActKind act = ir::ActKind::Silu;
  ir::NormKind norm = ir::NormKind::RMSNorm;
  bool norm_affine = false;
  double eps = 1e-5;
  ir::ModScope mod_scope = ir::ModScope::PerSegment;
  std::string consumer = "sdpa", format = "dense";
  std::vector<std::string> attn_patches, mlp_patches;
  bool embed = true, final_layer = true;
  // Structure knobs beyond the single-stream DiT:
  int64_t context_tokens = 0, context_dim = 0;  // > 0: a cross-attention sublayer on a context
  bool joint = false;                           // the first segment gets its own attention projections
  int64_t parallel_hidden = 0;                  // > 0: parallel MLP in the attention, no MLP sublayer
  bool per_segment_mlp = false;                 // one MLP sublayer (own weights) per segment
  std::vector<std::string> final_segments;      // rows of the output; empty: all
  uint64_t seed = 0;
  int64_t tokens() const;
};

// The embedded default: avdit layout (fused QKV, per-head Q/K RMSNorm, split-half RoPE
// over 3/4 of the head dim on a (t, h, w) grid, SwiGLU as [gate | up] halves, per-segment
// AdaLN over text and video, fp32 final projection), reduced to run in seconds on 2 cores.
ModelConfig demo_config();
// Sets the video segment to `tokens - text` rows (grid: as many full h x w frames as fit,
// positions along one axis for any remainder). Throws when tokens <= text tokens.
void set_total_tokens(ModelConfig& c, int64_t tokens);

ir::Model build_ir(const ModelConfig& c);

struct Instance {
  ir::Model model;
  std::shared_ptr<exec::TensorWeights> weights;
  exec::Inputs inputs;
};

Instance instantiate(const ModelConfig& c, const contracts::Registry& reg, const at::Device& device);
// The same weights and inputs in fp64, every format dequantized to dense: the reference.
Instance upcast_f64(const Instance& in, const contracts::Registry& reg);

}  // namespace sp::models
