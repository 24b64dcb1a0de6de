// Subcommands of the streamplan command line; each adds itself to the app and returns a
// runner called when it was parsed.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace sp::cli {

using Runner = std::function<int()>;

Runner add_run(CLI::App& app);
Runner add_make_checkpoint(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_convert(CLI::App& app);
Runner add_bench_attention(CLI::App& app);
Runner add_probe(CLI::App& app);

}  // namespace sp::cli
