// streamplan convert: a checkpoint's block linears quantized, in ComfyUI's convention.
#include <iostream>

#include "cli/commands.hpp"
#include "exec/registry.hpp"
#include "models/convert.hpp"

namespace sp::cli {

namespace {

struct Args {
  std::string to, in, out;
};

int convert(const Args& a) {
  const auto reg = exec::builtin_registry();
  const std::string format = a.to == "fp8" ? "fp8-e4m3" : a.to;
  const auto r = models::convert_checkpoint(a.in, a.out, format, reg);
  std::cout << a.out << ": " << r.converted.size() << " linears in " << format << ", " << r.kept.size()
            << " other 2-D tensors kept as stored; original layout"
            << (r.layout == "original" ? "" : " (read " + r.layout + ")") << "\n";
  return 0;
}

}  // namespace

Runner add_convert(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("convert", "write a checkpoint with its block linears quantized, in the original layout ComfyUI loads (comfy_quant)");
  cmd->add_option("--to", a->to, "format: fp8 (float8_e4m3fn), int8 (int8_tensorwise, per-row scales) or "
                                  "convrot-int8 (int8_tensorwise with ConvRot rotation, groups of 256)")
      ->required()
      ->check(CLI::IsMember({"fp8", "int8", "convrot-int8"}));
  cmd->add_option("IN", a->in, "input safetensors checkpoint")->required()->check(CLI::ExistingFile);
  cmd->add_option("OUT", a->out, "output safetensors file")->required();
  return [cmd, a]() { return cmd->parsed() ? convert(*a) : -1; };
}

}  // namespace sp::cli
