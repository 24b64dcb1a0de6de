// streamplan make-checkpoint: random-weight checkpoints of a family preset in any layout.
#include <chrono>
#include <iostream>
#include <optional>

#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "cli/output_check.hpp"
#include "exec/formats/weights.hpp"
#include "models/checkpoint.hpp"
#include "models/tensor_io.hpp"
#include "report/report.hpp"

namespace sp::cli {

namespace {

struct Args {
  std::string family, layout = "original", out, dtype;
  int layers = -1;
  bool tiny = false;
  // MiniMax H3 variants (0 / false / 1: the preset's plain form).
  int64_t curve_rows = 0, curve_basis = 0, head_bank = 1;
  bool gate_compress = false;
  bool quiet = false;
  uint64_t seed = 0;
};

std::string gib(uint64_t bytes) { return report::printf_text("%.1f GiB", double(bytes) / double(uint64_t{1} << 30)); }

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

// Applies the MiniMax H3 variant options to its preset; the result no longer matches the
// preset's structure, so it is named "custom" (as recognition names it).
void apply_variant(const Args& a, recognize::FamilyConfig& cfg) {
  if (a.curve_rows <= 0 && !a.gate_compress && a.head_bank == 1) return;
  if (cfg.family != "minimax-h3")
    throw std::invalid_argument("--curve-rows, --curve-basis, --gate-compress and --head-bank apply to --family "
                                "minimax-h3 only, got --family " + a.family);
  if (a.curve_rows > 0) {
    cfg.time_table_rows = a.curve_rows;
    cfg.time_dim = a.curve_basis;
    cfg.freq_dim = 0;  // no sinusoid in the curve form
  }
  cfg.gate_compress = a.gate_compress;
  cfg.head_bank = a.head_bank;
  cfg.variant = "custom";
}

// The size of the file write_random_checkpoint writes (its header follows from the names,
// shapes, dtype and the sidecar metadata); nullopt when the header is beyond what a file can
// hold (the write then says so).
std::optional<uint64_t> file_bytes(const recognize::FamilyConfig& cfg, const std::string& layout, at::ScalarType dt) {
  io::SafetensorsStreamWriter w;
  w.set_metadata(models::kSidecarKey, recognize::to_json(recognize::sidecar_for(cfg)));
  w.set_metadata("streamplan.variant", cfg.variant);
  try {
    for (const auto& s : recognize::checkpoint_tensors(cfg, layout)) w.declare(s.name, models::to_io(dt, s.name), s.shape);
  } catch (const io::SafetensorsError&) {
    return std::nullopt;
  }
  return w.file_bytes();
}

}  // namespace

Runner add_make_checkpoint(CLI::App& app) {
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("make-checkpoint", "write a random-weight checkpoint of a model family");
  cmd->add_option("--family", args->family, "wan2.1-1.3b, wan2.1-14b, flux1-dev, flux1-schnell, avdit or minimax-h3")
      ->required()
      ->check(CLI::IsMember({"wan2.1-1.3b", "wan2.1-14b", "flux1-dev", "flux1-schnell", "avdit", "minimax-h3"}));
  cmd->add_option("--layers", args->layers, "blocks (Flux: double blocks; single = 2x); default: the model's")
      ->check(cli::at_least(1));
  cmd->add_option("--layout", args->layout, "original or diffusers")->check(CLI::IsMember({"original", "diffusers"}))->capture_default_str();
  cmd->add_flag("--tiny", args->tiny,
                "small widths, same structure (tests, tours; at tiny widths the default plan can peak above naive: "
                "the planner is for real widths)");
  auto* rows = cmd->add_option("--curve-rows", args->curve_rows, "minimax-h3: curve form, adaln_t_table rows G (>= 2)")
                   ->check(cli::at_least(2));
  auto* basis = cmd->add_option("--curve-basis", args->curve_basis, "minimax-h3: curve form, adaln_t_table columns K")
                    ->check(cli::at_least(1));
  rows->needs(basis);
  basis->needs(rows);
  cmd->add_flag("--gate-compress", args->gate_compress, "minimax-h3: blocks carry attn.to_gate_compress.weight");
  cmd->add_option("--head-bank", args->head_bank, "minimax-h3: PDD head bank of n output heads")->check(cli::at_least(1));
  cmd->add_option("--dtype", args->dtype, "stored dtype (default: bf16, fp32 with --tiny)")
      ->check(CLI::IsMember(ir::activation_dtype_names()));
  cmd->add_option("--seed", args->seed, "random seed");
  cmd->add_option("--out", args->out, "output .safetensors file")->required()->check(output_file());
  cmd->add_flag("--quiet", args->quiet, "no progress lines on stderr for long writes");
  return [cmd, args]() {
    if (!cmd->parsed()) return -1;
    auto cfg = recognize::preset(args->family, args->layers, args->tiny);
    apply_variant(*args, cfg);
    const std::string d = args->dtype.empty() ? (args->tiny ? "fp32" : "bf16") : args->dtype;
    const at::ScalarType dt = exec::to_aten(ir::parse_dtype(d, "--dtype"));
    if (const auto bytes = file_bytes(cfg, args->layout, dt)) check_free_space("--out", args->out, *bytes);
    std::function<void(const models::WriteProgress&)> progress;
    if (!args->quiet) progress = Progress();
    {
      TempFileGuard guard(args->out + ".tmp");
      models::write_random_checkpoint(cfg, args->layout, args->out, args->seed, dt, progress);
    }
    std::cout << "wrote " << args->out << ": " << cfg.variant << " (" << args->layout << " layout, " << d << ")\n";
    return 0;
  };
}

}  // namespace sp::cli
