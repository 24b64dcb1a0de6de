// streamplan convert: a checkpoint's block linears quantized, in a weight layout ComfyUI loads.
#include <iostream>

#include "cli/commands.hpp"
#include "cli/output_check.hpp"
#include "exec/registry.hpp"
#include "models/convert.hpp"
#include "models/lora_file.hpp"

namespace sp::cli {

namespace {

struct Args {
  std::string to, layout = "comfy_quant", in, out;
  bool input_scale = false;
};

int convert(const Args& a) {
  check_not_input("OUT", a.out, "IN", a.in);
  const auto reg = exec::builtin_registry();
  models::ConvertOptions o{a.to == "fp8" ? "fp8-e4m3" : a.to, a.layout, a.input_scale};
  const models::Conversion c = models::with_lora_hint(a.in, [&] { return models::Conversion(a.in, o, reg); });
  const models::ConvertReport& r = c.report();
  check_free_space("OUT", a.out, r.file_bytes);
  {
    TempFileGuard guard(a.out + ".tmp");
    c.write(a.out);
  }
  std::cout << a.out << ": " << r.converted.size() << " linears in " << o.format << " (" << o.layout << "), "
            << r.kept.size() << " other 2-D tensors kept as stored; original layout"
            << (r.layout == "original" ? "" : " (read " + r.layout + ")") << "\n";
  for (const auto& g : r.kept_groups)
    std::cout << "  " << g.names.size() << " kept: " << g.reason << " (e.g. " << g.names.front() << ")\n";
  return 0;
}

}  // namespace

Runner add_convert(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "convert",
      "write a checkpoint with its block linears quantized, in the original layout and a weight layout ComfyUI loads. "
      "The blocks' modulation linears are quantized too, as in ComfyUI's own fp8 files; run dequantizes the linears "
      "the model computes outside its planned formats at load");
  cmd->add_option("--to", a->to,
                  "format: fp8 (float8_e4m3fn), fp8-e5m2 (float8_e5m2; --layout plain), int8 (int8_tensorwise, "
                  "per-row scales) or convrot-int8 (int8_tensorwise with ConvRot rotation; only linears whose "
                  "in_features are a multiple of 256)")
      ->required()
      ->check(CLI::IsMember({"fp8", "fp8-e5m2", "int8", "convrot-int8"}));
  cmd->add_option("--layout", a->layout,
                  "comfy_quant (weight_scale and comfy_quant tensors per layer), scaled_fp8 (--to fp8: scale_weight "
                  "per layer and the scaled_fp8 marker) or plain (--to fp8/fp8-e5m2: bare float8 weights, no scales)")
      ->check(CLI::IsMember({"comfy_quant", "scaled_fp8", "plain"}))
      ->capture_default_str();
  cmd->add_flag("--input-scale", a->input_scale, "--layout scaled_fp8: also write scale_input (1.0) per layer");
  cmd->add_option("IN", a->in, "input safetensors checkpoint (16/32-bit)")->required()->check(CLI::ExistingFile);
  cmd->add_option("OUT", a->out, "output safetensors file (not IN)")->required()->check(output_file());
  return [cmd, a]() { return cmd->parsed() ? convert(*a) : -1; };
}

}  // namespace sp::cli
