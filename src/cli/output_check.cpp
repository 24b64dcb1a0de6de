#include "cli/output_check.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "io/safetensors.hpp"
#include "plan/budget.hpp"

namespace sp::cli {

namespace {

std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string quoted(const std::string& s) { return "'" + s + "'"; }

std::string bytes_text(uint64_t b) {
  return std::to_string(b) + " bytes (" + plan::human_bytes(static_cast<int64_t>(b)) + ")";
}

// The temp file of the one live TempFileGuard, for the signal handler (no allocation there).
char g_tmp[4096];
volatile std::sig_atomic_t g_armed = 0;
struct sigaction g_old_int {}, g_old_term {};
bool g_int_installed = false, g_term_installed = false;

extern "C" void remove_tmp_and_die(int sig) {
  if (g_armed) ::unlink(g_tmp);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);  // delivered with the default action once this handler returns
}

// Installs the handler for `sig` unless the process inherited it as ignored; true if installed.
bool install(int sig, struct sigaction& old) {
  struct sigaction sa {};
  sa.sa_handler = remove_tmp_and_die;
  sigemptyset(&sa.sa_mask);
  if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) return false;
  return ::sigaction(sig, &sa, nullptr) == 0;
}

// "" when a file can be written at `path`, else why not (without the option's name).
std::string output_path_problem(const std::string& path) {
  if (path.empty()) return "no file named";
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return quoted(path) + " is a directory; give a file path";
  const std::string dir = directory_of(path);
  if (::stat(dir.c_str(), &st) != 0)
    return "directory " + quoted(dir) + " of " + quoted(path) + (errno == ENOENT ? " does not exist" : ": " + std::string(std::strerror(errno)));
  if (!S_ISDIR(st.st_mode)) return quoted(dir) + " (in " + quoted(path) + ") is not a directory";
  // Create the writers' temp file and remove it again (unless it was there already).
  const std::string tmp = path + ".tmp";
  const bool existed = ::access(tmp.c_str(), F_OK) == 0;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot create a file in directory " + quoted(dir) + ": " + std::strerror(errno);
  ::close(fd);
  if (!existed) ::unlink(tmp.c_str());
  return {};
}

}  // namespace

CLI::Validator output_file() {
  return CLI::Validator([](std::string& in) { return output_path_problem(in); }, "FILE");
}

void check_free_space(const std::string& option, const std::string& path, uint64_t bytes) {
  const std::optional<uint64_t> avail = io::free_bytes_for(path);
  if (!avail)
    throw std::invalid_argument(option + " " + quoted(path) + ": cannot measure the free space of " +
                                quoted(directory_of(path)) + ": " + std::strerror(errno));
  const uint64_t margin = std::max<uint64_t>(uint64_t{1} << 20, bytes / 100);
  if (bytes + margin <= *avail) return;
  throw std::invalid_argument(option + " " + quoted(path) + ": the file needs " + bytes_text(bytes) +
                              " plus a margin of " + bytes_text(margin) + " but its filesystem has " +
                              bytes_text(*avail) + " free; nothing was written");
}

void check_not_input(const std::string& out_option, const std::string& out, const std::string& in_option,
                     const std::string& in) {
  struct stat a {}, b {};
  if (::stat(out.c_str(), &a) != 0 || ::stat(in.c_str(), &b) != 0) return;  // OUT does not exist yet
  if (a.st_dev == b.st_dev && a.st_ino == b.st_ino)
    throw std::invalid_argument(out_option + " " + quoted(out) + " is the input file " + in_option + " " +
                                quoted(in) + (out == in ? "" : " (the same file under another name)") +
                                "; writing it would replace the input: give another output path");
}

TempFileGuard::TempFileGuard(const std::string& tmp) {
  if (g_armed) throw std::logic_error("TempFileGuard: one is already active");
  if (tmp.size() >= sizeof g_tmp)
    throw std::invalid_argument("output path " + quoted(tmp) + " is longer than " + std::to_string(sizeof g_tmp - 1) +
                                " characters");
  std::memcpy(g_tmp, tmp.c_str(), tmp.size() + 1);
  g_armed = 1;
  g_int_installed = install(SIGINT, g_old_int);
  g_term_installed = install(SIGTERM, g_old_term);
}

TempFileGuard::~TempFileGuard() {
  if (g_int_installed) ::sigaction(SIGINT, &g_old_int, nullptr);
  if (g_term_installed) ::sigaction(SIGTERM, &g_old_term, nullptr);
  g_armed = 0;
}

}  // namespace sp::cli
