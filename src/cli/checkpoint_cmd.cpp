// streamplan make-checkpoint: random-weight checkpoints of a family preset in any layout.
#include <chrono>
#include <cstdio>
#include <iostream>

#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "exec/formats/weights.hpp"
#include "models/checkpoint.hpp"

namespace sp::cli {

namespace {

struct Args {
  std::string family, layout = "original", out, dtype;
  int layers = -1;
  bool tiny = false;
  bool quiet = false;
  uint64_t seed = 0;
};

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / double(uint64_t{1} << 30));
  return buf;
}

// Reports on stderr every 2 s once a write has run that long, so short writes stay silent
// and long ones show they are alive and how far along they are.
class Progress {
 public:
  void operator()(const models::WriteProgress& p) {
    const auto now = Clock::now();
    const bool last = p.tensors == p.total_tensors;
    if (now < next_ && !(last && shown_)) return;
    next_ = now + std::chrono::seconds(2);
    shown_ = true;
    std::cerr << "[make-checkpoint] " << p.tensors << "/" << p.total_tensors << " tensors, " << gib(p.bytes)
              << " of " << gib(p.total_bytes) << "\n";
  }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point next_ = Clock::now() + std::chrono::seconds(2);
  bool shown_ = false;
};

}  // namespace

Runner add_make_checkpoint(CLI::App& app) {
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("make-checkpoint", "write a random-weight checkpoint of a model family");
  cmd->add_option("--family", args->family, "wan2.1-1.3b, wan2.1-14b, flux1-dev, flux1-schnell or h3")
      ->required()
      ->check(CLI::IsMember({"wan2.1-1.3b", "wan2.1-14b", "flux1-dev", "flux1-schnell", "h3"}));
  cmd->add_option("--layers", args->layers, "blocks (Flux: double blocks; single = 2x); default: the model's")
      ->check(cli::at_least(1));
  cmd->add_option("--layout", args->layout, "original or diffusers")->check(CLI::IsMember({"original", "diffusers"}))->capture_default_str();
  cmd->add_flag("--tiny", args->tiny, "small widths, same structure (tests)");
  cmd->add_option("--dtype", args->dtype, "stored dtype (default: bf16, fp32 with --tiny)")
      ->check(CLI::IsMember(ir::activation_dtype_names()));
  cmd->add_option("--seed", args->seed, "random seed");
  cmd->add_option("--out", args->out, "output .safetensors file")->required();
  cmd->add_flag("--quiet", args->quiet, "no progress lines on stderr for long writes");
  return [cmd, args]() {
    if (!cmd->parsed()) return -1;
    const auto cfg = recognize::preset(args->family, args->layers, args->tiny);
    const std::string d = args->dtype.empty() ? (args->tiny ? "fp32" : "bf16") : args->dtype;
    const at::ScalarType dt = exec::to_aten(ir::parse_dtype(d, "--dtype"));
    std::function<void(const models::WriteProgress&)> progress;
    if (!args->quiet) progress = Progress();
    models::write_random_checkpoint(cfg, args->layout, args->out, args->seed, dt, progress);
    std::cout << "wrote " << args->out << ": " << cfg.variant << " (" << args->layout << " layout, " << d << ")\n";
    return 0;
  };
}

}  // namespace sp::cli
