// Structure recognition of transformer checkpoints: tensor names + shapes (+ an optional
// sidecar) -> model family, layout, dimensions, and where every canonical tensor comes from.
//
// Usage:
//   sp::recognize::Recognized r = sp::recognize::recognize(sp::io::SafetensorsFile::open("wan.safetensors"));
//   r.config.variant;  // "wan2.1-1.3b"     r.layout;  // "original" or "diffusers"
//   r.tensors.at("blocks.0.self_attn.q.weight");  // Source{Copy, {"blocks.0.attn1.to_q.weight"}} for diffusers
//   auto cfg = sp::recognize::preset("flux1-dev", /*layers=*/2, /*tiny=*/true);
//   for (const auto& t : sp::recognize::checkpoint_tensors(cfg, "diffusers")) { ... }  // make-checkpoint
//
// Canonical names are the original layout of each family (Wan repo, BFL Flux, the MiniMax H3
// release, avdit as defined in docs/checkpoints.md). Recognition rules are data
// (tables_*.cpp); see README.md.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/safetensors.hpp"
#include "recognize/quant.hpp"
#include "recognize/sidecar.hpp"

namespace sp::recognize {

class RecognizeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// How one canonical tensor is assembled from checkpoint tensors.
struct Source {
  enum class Op {
    Copy,         // tensors[0] as is
    Concat0,      // tensors concatenated along dim 0, in order
    SwapHalves0,  // tensors[0] with its two halves along dim 0 exchanged
  };
  Op op = Op::Copy;
  std::vector<std::string> tensors;  // names as stored in the checkpoint (prefix included)
  bool operator==(const Source&) const = default;
};

// Everything the model builders need. Structural fields come from names and shapes;
// conventions (eps, rope, text_tokens, segments) from the sidecar, the matched preset, or
// the family defaults, in that order of precedence.
struct FamilyConfig {
  std::string family;   // "wan2.1" | "flux1" | "avdit" | "minimax-h3"
  std::string variant;  // "wan2.1-1.3b", "wan2.1-14b", "flux1-dev", "flux1-schnell", "avdit",
                        // "minimax-h3" (its plain form only), their "-tiny" forms
                        // ("wan2.1-tiny", ...), or "custom"
  int64_t dim = 0;
  int64_t heads = 0, head_dim = 0;  // attention width heads*head_dim (== dim except avdit, MiniMax H3)
  int64_t ffn = 0;                  // MLP hidden width (Flux: mlp_ratio * dim; SwiGLU: per half)
  int64_t layers = 0;               // Wan/avdit/MiniMax H3 blocks; Flux double-stream blocks
  int64_t single_layers = 0;        // Flux single-stream blocks
  int64_t in_channels = 0, out_channels = 0;  // per token: Wan latent channels (before the
                                              // patch), Flux packed channels, avdit patch features
  int64_t text_dim = 0;    // text encoder width (Wan/avdit text embed input, Flux context_in)
  int64_t freq_dim = 256;  // sinusoidal timestep embedding width
  int64_t vec_dim = 0;     // Flux pooled vector width
  int64_t audio_dim = 0;   // avdit audio embedding input width
  std::array<int64_t, 3> patch{1, 1, 1};  // Wan t,h,w patch (conv3d kernel); 1,1,1 otherwise
  bool guidance = false;                  // Flux dev: guidance embedding present
  bool qkv_bias = false;                  // Q/K/V projections carry biases (Wan, Flux)
  // MiniMax H3 ("minimax-h3"; in_channels = out_channels: video patch features, audio_dim:
  // audio row features, text_dim: text states, freq_dim: sinusoid width of the plain form).
  int64_t refiner_layers = 0;   // token-refiner blocks over the text
  int64_t time_dim = 0;         // adaln input width: the time embedding (plain) or the curve basis
  int64_t time_table_rows = 0;  // curve form: rows of adaln_t_table; 0: plain form (time_embedder)
  int64_t head_bank = 1;        // PDD head bank: heads per output projection (1: plain heads)
  bool gate_compress = false;   // blocks carry attn.to_gate_compress (unused by the dense forward)

  // Conventions.
  double eps = 1e-6;  // every norm of the family
  double rope_theta = 10000;
  std::vector<int64_t> rope_axes_dim;  // per axis (t, h, w), sums to rotary_dim
  int64_t rotary_dim = 0;              // leading head dims rotated (== head_dim for Wan/Flux)
  int64_t text_tokens = 0;             // default text length (Wan 512, Flux dev 512/schnell 256)
  double timestep_scale = 1;           // model embeds sinusoid(timestep_scale * t) (Flux 1000)
  std::vector<std::string> segments;   // avdit: token segment order of modulation rows

  bool operator==(const FamilyConfig&) const = default;
};

struct Recognized {
  FamilyConfig config;
  std::string layout;  // "original" | "diffusers"
  std::string prefix;  // stripped from every name ("" or e.g. "model.diffusion_model.")
  std::map<std::string, Source> tensors;  // canonical name -> source
  // Stored weights kept quantized, by stored name (recognize/quant.hpp); the side tensors
  // (comfy_quant, scales, the scaled_fp8 marker) are named there, not in `tensors`.
  std::map<std::string, QuantSpec> quant;
};

// Recognizes a checkpoint from its tensors' names and shapes. Throws RecognizeError naming the
// closest table's unexplained tensors; or the missing tensors, index gaps and shape mismatches
// of a table that explains them all; or what the sidecar contradicts (README.md, "Engine").
Recognized recognize(const std::vector<io::TensorInfo>& tensors,
                     const std::optional<Sidecar>& sidecar = {});
Recognized recognize(const io::SafetensorsFile& file, const std::optional<Sidecar>& sidecar = {});

// The families and layouts known to the recognizer.
std::vector<std::string> families();  // {"wan2.1", "flux1", "avdit", "minimax-h3"}
std::vector<std::string> layouts(const std::string& family);  // "original" first

// ---- make-checkpoint ----

struct TensorSpec {
  std::string name;  // name in the layout
  std::vector<int64_t> shape;
  std::string canonical;             // canonical (original-layout) tensor it belongs to
  Source::Op op = Source::Op::Copy;  // how it maps onto the canonical tensor
  int64_t row_offset = 0;            // Concat0: first canonical row (dim 0) this part holds
};

// Every tensor of `layout` for `config`, in a stable order (top-level tensors, then block by
// block). Throws RecognizeError for an unknown family or layout.
std::vector<TensorSpec> checkpoint_tensors(const FamilyConfig& config, const std::string& layout);

// A preset: "wan2.1-1.3b", "wan2.1-14b", "flux1-dev", "flux1-schnell", "avdit", "minimax-h3" (or a
// "-tiny" name, same as tiny=true). layers: -1 keeps the preset's count; otherwise Wan/avdit and
// MiniMax H3 DiT blocks (not its refiner blocks), Flux double blocks (single blocks = 2 * layers,
// the 19:38 ratio). tiny: small widths, same structure.
FamilyConfig preset(const std::string& variant, int layers = -1, bool tiny = false);
std::vector<std::string> preset_names();

// The sidecar recording everything of `config` that names and shapes cannot tell
// (family, head_dim, eps, rope, text_tokens, avdit segments).
Sidecar sidecar_for(const FamilyConfig& config);

}  // namespace sp::recognize
