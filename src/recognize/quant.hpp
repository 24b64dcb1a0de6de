// Quantized checkpoints as ComfyUI stores them: which stored weights are quantized, in which
// format, and which tensors hold their scales.
//
// Design note. Two conventions exist: "<layer>.comfy_quant" (uint8 bytes of a JSON object whose
// "format" names the scheme, with "<layer>.weight_scale" and optionally "<layer>.input_scale"),
// and the older "scaled_fp8" marker with per-layer "scale_weight" / "scale_input". A float8
// weight with neither is a plain cast (scale 1: fp8-e4m3-cast, fp8-e5m2), computed as its users
// compute, never with quantized activations. scan_quant takes the side tensors out of what
// structure recognition sees; a scheme the project does not run (nvfp4, mxfp8, another ConvRot
// group, ...) is a RecognizeError naming the tensor and the scheme, never a silent cast.
//
// Example:
//     auto file = sp::io::SafetensorsFile::open("wan_fp8.safetensors");
//     sp::recognize::Recognized r = sp::recognize::recognize(file);   // calls scan_quant
//     const sp::recognize::QuantSpec& q = r.quant.at("model.diffusion_model.blocks.0.ffn.0.weight");
//     q.format;        // "fp8-e4m3"
//     q.weight_scale;  // "model.diffusion_model.blocks.0.ffn.0.weight_scale"
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.hpp"

namespace sp::recognize {

struct QuantSpec {
  std::string format;        // project format: "fp8-e4m3" | "fp8-e4m3-cast" | "fp8-e5m2" | "int8" | "convrot-int8"
  std::string origin;        // how the checkpoint said so, e.g. "comfy_quant int8_tensorwise (convrot 256)"
  std::string weight_scale;  // stored tensor name; empty: scale 1
  std::string input_scale;   // stored tensor name; empty: none
};

struct QuantScan {
  std::vector<io::TensorInfo> structural;   // what structure recognition sees
  std::map<std::string, QuantSpec> weights;  // stored weight name -> its quantization
};

// `json_of(name)` returns the bytes of a comfy_quant tensor.
QuantScan scan_quant(const std::vector<io::TensorInfo>& tensors,
                     const std::function<std::string(const std::string&)>& json_of);
QuantScan scan_quant(const io::SafetensorsFile& file);

// The comfy_quant JSON ComfyUI reads for a project format (convert writes it).
std::string comfy_quant_json(const std::string& format);

}  // namespace sp::recognize
