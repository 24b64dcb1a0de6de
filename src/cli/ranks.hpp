// `streamplan run --nproc N`: one forward of a checkpoint split over N ranks of one host
// (sequence parallel, docs/sequence_parallel.md), each rank a process of this command on a
// torch.distributed process group: gloo on the CPU, NCCL on CUDA (one GPU per rank).
//
// Design note. The command either starts the ranks itself (--nproc without torchrun's
// environment: it runs itself N times with that environment and waits for them) or is one of
// them (RANK and WORLD_SIZE set, by itself or by torchrun). Each rank attaches the planner to the
// checkpoint's tensors as a host does (host/attached.hpp) with the group, so that the CLI and the
// Python package run one sequence-parallel path; rank 0 prints and writes what every rank agrees
// on, with each rank's time and peak.
//
// Example:
//     streamplan run --checkpoint wan.safetensors --frames 5 --height 64 --width 64 --nproc 2 --check
#pragma once

#include <optional>
#include <string>

#include "cli/run_args.hpp"

namespace sp::cli {

// This process's rank from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT); none where RANK is unset. Throws std::invalid_argument naming a variable that
// is malformed or missing beside RANK.
struct RankEnv {
  int rank = 0, size = 1, local_rank = 0;
  std::string addr = "127.0.0.1";
  int port = 0;
};
std::optional<RankEnv> rank_env();

// Runs this command's own arguments `nproc` times as the ranks of one host and waits for them:
// 0 when every rank succeeded, else the exit status of the first that failed (the others are
// stopped).
int spawn_ranks(int nproc);

// Where spawn_ranks' ranks read the checkpoint from instead of --checkpoint, when set: the
// copy --precision fp8|int8 converted once for them.
inline constexpr const char* kRanksCheckpointEnv = "STREAMPLAN_RANKS_CHECKPOINT";

// One rank's run: the checkpoint's forward over the group of `env`.
int run_rank(const RunArgs& a, const RankEnv& env);

}  // namespace sp::cli
