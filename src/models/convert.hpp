// Writing a checkpoint's block linears in a quantized format, in one of the weight layouts
// ComfyUI loads (docs/checkpoints.md, "convert"; the layouts: docs/cli.md).
//
// Design note. The file is written in the family's original layout, converting the blocks' 2-D
// 16/32-bit ".weight" tensors (modulation linears included, as ComfyUI's own files store them)
// and copying everything else. comfy_quant stores each weight as the format's own store function
// makes it, so a converted file loads back to exactly the weights --precision would have made.
// The output's tensors and size follow from the input's header alone (Conversion); the file is
// then streamed, one canonical tensor at a time, into "<out>.tmp" and renamed onto `out`.
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

  io::SafetensorsFile file_;
  recognize::Recognized rec_;
  ConvertOptions options_;
  const contracts::Registry* reg_;
  std::string json_;      // comfy_quant bytes
  std::string marker_;    // scaled_fp8 marker name; empty for other layouts
  std::vector<Item> items_;
  ConvertReport report_;
};

}  // namespace sp::models
