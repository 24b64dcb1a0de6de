// The files the commands write: their paths checked before any work, their input kept from
// being overwritten, and their temp files removed when a command is interrupted.
//
// Design note. Every option naming an output file takes output_file() as its CLI11 check, so
// a bad path fails while the command line is parsed: the path is not a directory, its
// directory exists, and a file can be created there (tried, with the temp file name the
// writers use, so read-only filesystems and permissions are caught as the write would meet
// them, also for root). Commands whose output size is known before the work (make-checkpoint,
// convert) call check_free_space with it: the filesystem must have the size plus a margin
// free (STREAMPLAN_FREE_BYTES_FOR_TESTS replaces the measured free space, as for the
// safetensors writers). The safetensors writers write "<path>.tmp" and rename it onto the
// path; while a TempFileGuard lives, SIGINT and SIGTERM remove that temp file and then end
// the process by the signal's default action (a shell sees status 128 + signal). A signal
// the process inherited as ignored (a background job without job control) stays ignored.
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

// "" when a file can be written at `path`, else why not (without the option's name).
std::string output_path_problem(const std::string& path);
// A CLI11 check running output_path_problem ("--out: directory '/x' does not exist").
CLI::Validator output_file();

// Throws std::invalid_argument naming `option`, the path and the byte counts when the
// filesystem of `path` has less than `bytes` plus a margin (1 MiB or 1 %, the larger) free.
// A stale "<path>.tmp" counts as free (the write replaces it).
void check_free_space(const std::string& option, const std::string& path, uint64_t bytes);

// Throws std::invalid_argument when `out` names the file `in` names (the same path, or another
// path, a symbolic or a hard link to it).
void check_not_input(const std::string& out_option, const std::string& out, const std::string& in_option,
                     const std::string& in);

// While alive, SIGINT and SIGTERM remove `tmp` and end the process by the signal. One at a time.
class TempFileGuard {
 public:
  explicit TempFileGuard(const std::string& tmp);
  ~TempFileGuard();
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;
};

}  // namespace sp::cli
