// Quantized weights: loading them from a checkpoint as stored, the precision policy, and the
// per-linear report of formats.
//
// Design note. Recognition (recognize/quant.hpp) says which stored weights are quantized;
// load_quantized keeps them so (joined parts of different per-tensor scales get one scale per
// output row) and notes each format, with why, on the weight source: apply_precision carries the
// notes into the IR (ir::Linear::format) and format_lines reports them.
//
// Example:
//     auto w = sp::models::load_canonical(file, rec, at::kBFloat16, at::kCUDA, reg);
//     sp::models::FamilyRun fr = sp::models::prepare_loaded(rec.config, *w, reg, raw, ir::DType::BF16, "sdpa");
//     sp::models::apply_precision(fr.model, *w, sp::models::Precision::Preserve, dev);
//     for (const auto& l : sp::models::format_lines(fr.model, *w, reg, dev)) std::cout << l.weight << " " << l.format << "\n";
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "exec/formats/weights.hpp"
#include "models/families.hpp"
#include "recognize/recognize.hpp"

namespace sp::models {

// Loads canonical `canonical` in its stored quantized form if its parts are quantized
// (returns false otherwise). Throws naming the tensors when parts mix formats.
bool load_quantized(const io::SafetensorsFile& f, const recognize::Recognized& r, const std::string& canonical,
                    const recognize::Source& src, const at::Device& device, exec::TensorWeights& w);

// models::prepare for weights that may hold quantized linears the prologue computes itself
// (ComfyUI's files quantize the blocks' modulation linears too): it reads those dequantized (to
// weight_dtype of the model dtype); the ones that no linear of the returned model names are
// noted on `w` as dequantized at load (format_lines lists them).
FamilyRun prepare_loaded(const recognize::FamilyConfig& c, exec::TensorWeights& w, const contracts::Registry& reg,
                         const TensorMap& raw, ir::DType dtype, const std::string& consumer);

enum class Precision { Preserve, Fp8, Int8 };
Precision parse_precision(const std::string& s);  // "preserve" | "fp8" | "int8"
const char* to_string(Precision p);
// The format a precision stores the blocks' linears in: "" (preserve), "fp8-e4m3", "int8".
const char* precision_format(Precision p);
// std::invalid_argument naming the device where it cannot run `p` (fp8 needs CUDA sm_89+).
void check_precision_device(Precision p, const contracts::DeviceCaps& dev);

// Sets each linear's format: quantized weights as noted at load; with Fp8/Int8 the blocks'
// dense 16-bit linears are converted (in `w`) to fp8-e4m3 / int8. Fp8 needs fp8 tensor cores
// (CUDA sm_89+): elsewhere std::invalid_argument naming the device.
void apply_precision(ir::Model& m, exec::TensorWeights& w, Precision p, const contracts::DeviceCaps& dev);
// The formats noted on `w` onto the IR, and every dense 16/32-bit block linear stored in
// `target` (a registered format; empty: none), noted with `why`.
void convert_block_linears(ir::Model& m, exec::TensorWeights& w, const std::string& target, const std::string& why);

struct FormatLine {
  std::string weight, format, why;
  std::string gemm;      // how its projections run on the device (16-bit activations)
  bool outside = false;  // a stored quantized weight no planned linear names (prepare_loaded)
  std::string stored;    // outside: the format it is stored in
};
// Every linear of the model: its format, why (for dense ones under `p`: why it was not
// converted), and the GEMM its format runs on `dev` (the format's own kernel where
// FormatCaps::native_gemm holds there; else the dequantized slice in an ordinary matmul);
// then every quantized weight of `w` that no linear names (outside = true).
std::vector<FormatLine> format_lines(const ir::Model& m, const exec::TensorWeights& w, const contracts::Registry& reg,
                                     const contracts::DeviceCaps& dev, Precision p = Precision::Preserve);
// "3 linears outside the planned formats dequantized at load (stored fp8-e4m3, e.g. ...)\n", or "".
std::string outside_summary(const std::vector<FormatLine>& lines);
// "weight formats (per linear):" and one line per linear with its format, why and GEMM.
std::string formats_text(const std::vector<FormatLine>& lines);
// [{"weight", "format", "why", "gemm"}, ...]
nlohmann::json formats_json(const std::vector<FormatLine>& lines);

}  // namespace sp::models
