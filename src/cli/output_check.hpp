// The files the commands write: their paths checked before any work, their input kept from
// being overwritten, and their temp files removed when a command is interrupted.
//
// Design note. Every option naming an output file takes output_file() as its CLI11 check, so
// a bad path fails while the command line is parsed. The check creates the writers' temp file
// "<path>.tmp", so read-only filesystems and permissions are caught as the write would meet
// them, also for root. The writers rename that file onto the path (docs/checkpoints.md).
//
// Example:
//     cmd->add_option("--out", out, "output file")->check(sp::cli::output_file());
//     ...
//     sp::cli::check_free_space("--out", out, expected_bytes);  // std::invalid_argument if short
//     sp::cli::TempFileGuard guard(out + ".tmp");
//     write_the_file(out);
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace sp::cli {

// A CLI11 check that the path is no directory, that its directory exists and that a file can
// be created there ("--out: directory '/x' does not exist").
CLI::Validator output_file();

// Throws std::invalid_argument naming `option`, the path and the byte counts when the
// filesystem of `path` has less than `bytes` plus a margin (1 MiB or 1 %, the larger) free.
// A stale "<path>.tmp" counts as free (the write replaces it); STREAMPLAN_FREE_BYTES_FOR_TESTS
// replaces the measured free space.
void check_free_space(const std::string& option, const std::string& path, uint64_t bytes);

// Throws std::invalid_argument when `out` names the file `in` names (the same path, or another
// path, a symbolic or a hard link to it).
void check_not_input(const std::string& out_option, const std::string& out, const std::string& in_option,
                     const std::string& in);

// While alive, SIGINT and SIGTERM remove `tmp` and end the process by the signal's default
// action (a shell sees 128 + signal); one inherited as ignored stays ignored. One at a time.
class TempFileGuard {
 public:
  explicit TempFileGuard(const std::string& tmp);
  ~TempFileGuard();
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;
};

}  // namespace sp::cli
