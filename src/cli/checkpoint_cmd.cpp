// streamplan make-checkpoint: random-weight checkpoints of a family preset in any layout.
#include <iostream>

#include "cli/commands.hpp"
#include "models/checkpoint.hpp"

namespace sp::cli {

namespace {

struct Args {
  std::string family, layout = "original", out, dtype;
  int layers = -1;
  bool tiny = false;
  uint64_t seed = 0;
};

}  // namespace

Runner add_make_checkpoint(CLI::App& app) {
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("make-checkpoint", "write a random-weight checkpoint of a model family");
  cmd->add_option("--family", args->family, "wan2.1-1.3b, wan2.1-14b, flux1-dev, flux1-schnell or h3")
      ->required()
      ->check(CLI::IsMember({"wan2.1-1.3b", "wan2.1-14b", "flux1-dev", "flux1-schnell", "h3"}));
  cmd->add_option("--layers", args->layers, "blocks (Flux: double blocks; single = 2x); default: the model's")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--layout", args->layout, "original or diffusers")->check(CLI::IsMember({"original", "diffusers"}));
  cmd->add_flag("--tiny", args->tiny, "small widths, same structure (tests)");
  cmd->add_option("--dtype", args->dtype, "stored dtype (default: bf16, fp32 with --tiny)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cmd->add_option("--seed", args->seed, "random seed");
  cmd->add_option("--out", args->out, "output .safetensors file")->required();
  return [cmd, args]() {
    if (!cmd->parsed()) return -1;
    const auto cfg = recognize::preset(args->family, args->layers, args->tiny);
    const std::string d = args->dtype.empty() ? (args->tiny ? "fp32" : "bf16") : args->dtype;
    const at::ScalarType dt = d == "fp32" ? at::kFloat : d == "fp16" ? at::kHalf : at::kBFloat16;
    models::write_random_checkpoint(cfg, args->layout, args->out, args->seed, dt);
    std::cout << "wrote " << args->out << ": " << cfg.variant << " (" << args->layout << " layout, " << d << ")\n";
    return 0;
  };
}

}  // namespace sp::cli
