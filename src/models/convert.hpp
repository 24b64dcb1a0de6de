// Writing a checkpoint's block linears in a quantized format, in ComfyUI's current convention.
//
// Design note. The file is written in the family's original layout (the canonical names:
// Wan repo, BFL Flux, ...), the one ComfyUI's loader detects, whatever layout it was read in:
// a diffusers checkpoint's split projections are joined (to_q|to_k|to_v -> qkv) and swapped
// halves put back before quantization. Names keep the prefix "model.diffusion_model." (which
// ComfyUI strips) and lose any other. Each converted linear "<layer>.weight" is written as the
// format stores it (float8_e4m3fn, or int8 of the ConvRot-rotated weight) with
// "<layer>.weight_scale" (fp32: [] for fp8, [out, 1] per row for int8) and
// "<layer>.comfy_quant" (uint8 bytes of the JSON recognize::comfy_quant_json gives) beside it
// -- what ComfyUI's mixed-precision Linear reads (comfy/ops.py) and writes back when it saves
// the model. No "<layer>.input_scale" is written (no calibration): ComfyUI then quantizes fp8
// activations with scale 1 where it runs fp8 matmuls. The quantization is the format's own
// store function, so a converted file loads back to exactly the weights that --precision
// would have made. Converted are 2-D ".weight" tensors of blocks (a name with a block index)
// in a 16/32-bit float dtype; for convrot-int8 only those whose input width is a multiple of
// 256. Everything else, and the metadata (sidecar), is copied as is.
//
// Example:
//     auto r = sp::models::convert_checkpoint("wan.safetensors", "wan_fp8.safetensors", "fp8-e4m3", reg);
//     std::cout << r.converted << " linears converted\n";
#pragma once

#include <string>
#include <vector>

#include "contracts/contracts.hpp"

namespace sp::models {

struct ConvertReport {
  std::string layout;                         // the layout read ("original" or "diffusers")
  std::vector<std::string> converted, kept;  // weight names as written
};

// `format`: "fp8-e4m3" | "int8" | "convrot-int8". Throws for a checkpoint that is already
// quantized or an unknown format.
ConvertReport convert_checkpoint(const std::string& in, const std::string& out, const std::string& format,
                                 const contracts::Registry& reg);

}  // namespace sp::models
