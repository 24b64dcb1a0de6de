// Writing a checkpoint's block linears in a quantized format, in one of the weight layouts
// ComfyUI loads.
//
// Design note. The file is written in the family's original layout (the canonical names:
// Wan repo, BFL Flux, ...), the one ComfyUI's loader detects, whatever layout it was read in:
// a diffusers checkpoint's split projections are joined (to_q|to_k|to_v -> qkv) and swapped
// halves put back before quantization. Names keep the prefix "model.diffusion_model." (which
// ComfyUI strips) and lose any other. Converted are 2-D ".weight" tensors of blocks (a name
// with a block index) in a 16/32-bit float dtype -- the modulation linears of the blocks
// included, as ComfyUI's own quantized files store them (the run dequantizes those the model
// reads outside its planned formats at load: quant_load.hpp prepare_loaded); for
// convrot-int8 only those whose input width is a multiple of the format's input group (256).
// Everything else, and the metadata (sidecar), is copied as is. Three layouts:
//  - comfy_quant (ComfyUI's current convention): each converted "<layer>.weight" as the
//    format stores it (float8_e4m3fn, or int8 of the ConvRot-rotated weight) with
//    "<layer>.weight_scale" (fp32: [] for fp8, [out, 1] per row for int8) and
//    "<layer>.comfy_quant" (uint8 bytes of the JSON recognize::comfy_quant_json gives) beside
//    it -- what ComfyUI's mixed-precision Linear reads (comfy/ops.py) and writes back when it
//    saves the model. No "<layer>.input_scale" (no calibration): ComfyUI then quantizes fp8
//    activations with scale 1 where it runs fp8 matmuls. The quantization is the format's own
//    store function, so a converted file loads back to exactly the weights that --precision
//    would have made.
//  - scaled_fp8 (ComfyUI's older convention, fp8-e4m3 only): the same float8_e4m3fn weights
//    with a per-tensor fp32 "<layer>.scale_weight" ([]), the marker tensor "scaled_fp8"
//    (float8_e4m3fn, 0 elements, under the names' prefix: comfy/utils.py convert_old_quants)
//    and, with input_scale, "<layer>.scale_input" = 1 (fp32 []).
//  - plain (fp8-e4m3, fp8-e5m2): bare float8 weights without scales, the values clamped to
//    the type's finite range and cast, as "fp8 checkpoints" are commonly made.
// The output's tensors and size follow from the input's header alone (Conversion), so the
// size is known before any weight is read; the file is then streamed, one canonical tensor at
// a time (memory bounded by the largest one), into "<out>.tmp" and renamed onto `out`.
//
// Example:
//     sp::models::Conversion c("wan.safetensors", {.format = "fp8-e4m3", .layout = "scaled_fp8"}, reg);
//     std::cout << c.report().converted.size() << " linears, " << c.report().file_bytes << " bytes\n";
//     c.write("wan_fp8.safetensors");
#pragma once

#include <string>
#include <vector>

#include "contracts/contracts.hpp"
#include "io/safetensors.hpp"
#include "recognize/recognize.hpp"

namespace sp::models {

struct ConvertOptions {
  std::string format;                  // "fp8-e4m3" | "fp8-e5m2" | "int8" | "convrot-int8"
  std::string layout = "comfy_quant";  // "comfy_quant" | "scaled_fp8" | "plain"
  bool input_scale = false;            // scaled_fp8: "<layer>.scale_input" = 1 beside each weight
};

// The kept 2-D tensors that share a reason, e.g. "in_features 64 is not a multiple of 256, the
// input group of convrot-int8".
struct KeptGroup {
  std::string reason;
  std::vector<std::string> names;  // as written
};

struct ConvertReport {
  std::string layout;                        // the model layout read ("original" or "diffusers")
  std::vector<std::string> converted, kept;  // weight names as written; kept: the other 2-D tensors
  std::vector<KeptGroup> kept_groups;        // `kept` by reason, in the order first met
  uint64_t file_bytes = 0;                   // of the file write() makes
};

// A conversion planned from the input's header. The constructor throws std::invalid_argument
// for a combination of format and layout that does not exist (naming both), for a checkpoint
// that is already quantized, and when nothing would be converted (with every kept group's
// reason); recognize::RecognizeError for a file it cannot read as a model.
class Conversion {
 public:
  Conversion(const std::string& in, ConvertOptions options, const contracts::Registry& reg);
  const ConvertReport& report() const { return report_; }
  // Streams the file to `out` (atomically: "<out>.tmp", then a rename).
  void write(const std::string& out) const;

 private:
  struct Output {
    std::string name;
    io::DType dtype;
    std::vector<int64_t> shape;
  };
  struct Item {
    std::string canonical, name;  // name as written
    bool convert = false;
    std::vector<Output> outputs;  // the tensors written for it, in order
  };
  void declare(io::SafetensorsStreamWriter& w) const;

  std::string in_;
  io::SafetensorsFile file_;
  recognize::Recognized rec_;
  ConvertOptions options_;
  const contracts::Registry* reg_;
  std::string json_;      // comfy_quant bytes
  std::string marker_;    // scaled_fp8 marker name; empty for other layouts
  std::vector<Item> items_;
  ConvertReport report_;
};

// Conversion(in, {format}, reg) (comfy_quant), written to `out`.
ConvertReport convert_checkpoint(const std::string& in, const std::string& out, const std::string& format,
                                 const contracts::Registry& reg);

// The `--to` spelling of a format ("fp8" for "fp8-e4m3", else the format's name).
std::string to_option(const std::string& format);

}  // namespace sp::models
