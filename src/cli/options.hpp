// Checks of numeric options whose messages a user can act on: CLI11 reports them as
// "--tokens: must be >= 1, got 0", where its PositiveNumber and Range validators print the
// limits as doubles ("Value 0 not in range 0.000000 to 1797…").
//
// Example:
//     cmd->add_option("--tokens", tokens, "total tokens")->check(sp::cli::at_least(1));
//     cmd->add_option("--reps", reps, "repetitions")->check(sp::cli::between(1, 100));
#pragma once

#include <CLI/CLI.hpp>

#include <sstream>
#include <string>

namespace sp::cli {

namespace detail {

inline std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// Accepts numbers for which in_limits holds; `limits` completes "must be ...".
template <class InLimits>
CLI::Validator numeric_check(std::string limits, InLimits in_limits) {
  return CLI::Validator(
      [limits, in_limits](std::string& in) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(in, v)) return "must be a number " + limits + ", got '" + in + "'";
        if (!in_limits(v)) return "must be " + limits + ", got " + in;
        return {};
      },
      "");
}

}  // namespace detail

inline CLI::Validator at_least(double lo) {
  return detail::numeric_check(">= " + detail::number_text(lo), [lo](double v) { return v >= lo; });
}

inline CLI::Validator between(double lo, double hi) {
  return detail::numeric_check("between " + detail::number_text(lo) + " and " + detail::number_text(hi),
                               [lo, hi](double v) { return v >= lo && v <= hi; });
}

inline CLI::Validator above(double lo) {
  return detail::numeric_check("> " + detail::number_text(lo), [lo](double v) { return v > lo && v < 1e300; });
}

// --link-rate GB/s (plan --ranks, run --nproc): the rate the plans price the exchanges at;
// `with` names the option it goes with, `otherwise` the rate used without it.
inline CLI::Option* add_link_rate_option(CLI::App* cmd, double& gb_per_s, const std::string& with,
                                         const std::string& otherwise) {
  return cmd
      ->add_option("--link-rate", gb_per_s,
                   with + ": GB/s each rank sends and receives in an all-to-all, which the plans price the exchanges "
                          "at (default: " + otherwise + ")")
      ->check(above(0));
}

// --feature-slice: a slice width >= 1, or -1 for no feature slicing; omitted, the planner
// chooses. 0 is an error rather than a second way of saying "automatic".
inline CLI::Validator feature_slice_check() {
  return detail::numeric_check(">= 1, or -1 for no slicing (omit it for automatic)",
                               [](double v) { return v >= 1 || v == -1; });
}

// --explain (grouped: linears and blocks that read alike on one line) or --explain=full
// (every line). Leaves `mode` empty when not given.
inline CLI::Option* add_explain_option(CLI::App* cmd, std::string& mode, const std::string& what) {
  return cmd->add_flag("--explain{grouped}", mode, what + "; --explain=full lists every block and linear on its own line")
      ->check(CLI::IsMember({"grouped", "full"}));
}

// "" or "auto": 0 (the planner chooses); else a positive count.
inline int parse_resident_blocks(const std::string& s) {
  if (s.empty() || s == "auto") return 0;
  int n = 0;
  if (!CLI::detail::lexical_cast(s, n) || n < 1)
    throw std::invalid_argument("--resident-blocks: expected a positive number or auto, got '" + s + "'");
  return n;
}

}  // namespace sp::cli
