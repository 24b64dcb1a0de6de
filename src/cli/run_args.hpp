// The arguments of `streamplan run` (cli/run_cmd.cpp), which its sequence-parallel ranks
// (cli/ranks.hpp) run with as well.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "cli/kv_options.hpp"
#include "models/families.hpp"

namespace sp::cli {

struct RunArgs {
  std::string checkpoint, sidecar, inputs, output, dtype = "auto", device = "auto", consumer = "sdpa", budget;
  std::string device_memory, resident_blocks;
  std::vector<std::string> loras;
  std::string precision = "preserve";
  models::Geometry geom;
  int64_t chunk = 0, feature_slice = 0;
  uint64_t seed = 0;
  bool planned_only = false, json = false, quiet = false;
  std::string explain;  // "", "grouped" or "full"
  KvArgs kv;
  // Sequence parallel over ranks (cli/ranks.hpp).
  int nproc = 0;
  std::string sequence = "ulysses", weights = "auto";
  double link_rate = 0;  // GB/s; 0: measured over the ranks
  bool check = false;
  const CLI::App* cmd = nullptr;
  bool given(const char* option) const { return cmd->count(option) > 0; }
};

}  // namespace sp::cli
