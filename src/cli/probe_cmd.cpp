// streamplan probe: the device's rates the cost model uses (exec/device/probe.hpp), measured
// now and cached, shown from the cache (--show) or the cache cleared (--reset).
#include <iostream>

#include "cli/commands.hpp"
#include "exec/device/device.hpp"
#include "exec/device/probe.hpp"

namespace sp::cli {

namespace {

struct Args {
  std::string device = "auto";
  bool show = false, reset = false, json = false;
};

int run_probe(const Args& a) {
  const at::Device d = exec::pick_device(a.device);
  const auto caps = exec::describe_device(d);
  const std::string path = exec::probe_cache_path(caps);
  if (a.reset) {
    const bool removed = exec::forget_probe(caps);
    std::cout << (removed ? "removed " : "nothing cached at ") << (path.empty() ? "(no cache directory)" : path) << "\n";
    return 0;
  }
  const std::optional<exec::ProbeResult> r =
      a.show ? exec::cached_probe(caps) : exec::probe_device(d, caps, /*use_cache=*/false);
  if (!r) {  // --show with nothing cached
    std::cout << "no cached rates for " << exec::probe_key(caps) << " at "
              << (path.empty() ? "(no cache directory: set XDG_CACHE_HOME or HOME)" : path)
              << "; `streamplan probe` measures them\n";
    return 0;
  }
  if (a.json) std::cout << exec::probe_json(*r).dump(2) << "\n";
  else std::cout << exec::probe_text(*r);
  return 0;
}

}  // namespace

Runner add_probe(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("probe", "measure the device's rates that the planner's time estimates use and cache them; "
                                          "--show prints the cached ones, --reset clears them");
  cmd->add_option("--device", a->device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  auto* show = cmd->add_flag("--show", a->show, "print the cached rates without measuring");
  auto* reset = cmd->add_flag("--reset", a->reset, "remove the cached rates (the next run measures them again)");
  show->excludes(reset);
  cmd->add_flag("--json", a->json, "print the rates as JSON");
  return [cmd, a]() { return cmd->parsed() ? run_probe(*a) : -1; };
}

}  // namespace sp::cli
