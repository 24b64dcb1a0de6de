#include "plan/units.hpp"

#include <cmath>
#include <cstdio>

namespace sp::plan {

namespace {

struct Unit {
  const char* name;
  double scale;
};

constexpr Unit kBytes[] = {{"B", 1.0},
                           {"KiB", 1024.0},
                           {"MiB", 1024.0 * 1024},
                           {"GiB", 1024.0 * 1024 * 1024},
                           {"TiB", 1024.0 * 1024 * 1024 * 1024}};
constexpr int kByteUnits = sizeof kBytes / sizeof kBytes[0];

std::string fixed(double v, int decimals, const char* unit) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f %s", decimals, v, unit);
  return buf;
}

// Two decimals below 10 of a unit, one above: about three significant digits.
int usual_decimals(double v) { return std::fabs(v) >= 10 ? 1 : 2; }

// The largest unit that `bytes` fills at least once, moving up where the figure would round
// to 1024 of its unit ("1.00 MiB", not "1024.0 KiB").
int byte_unit(double bytes) {
  const double a = std::fabs(bytes);
  int u = 0;
  while (u + 1 < kByteUnits && a >= kBytes[u + 1].scale) ++u;
  if (u > 0 && u + 1 < kByteUnits && a / kBytes[u].scale >= 1023.95) ++u;
  return u;
}

std::string bytes_in(int64_t bytes, int u, int decimals) {
  if (u == 0) return std::to_string(bytes) + " B";
  return fixed(double(bytes) / kBytes[u].scale, decimals, kBytes[u].name);
}

// Times below a second in ms, below a minute in s, each with decimals by magnitude.
std::string ms_or_s(double ms, int extra) {
  if (std::fabs(ms) < 999.95) {
    const double a = std::fabs(ms);
    return fixed(ms, (a >= 10 ? 1 : (a >= 0.1 ? 2 : 3)) + extra, "ms");
  }
  return fixed(ms / 1e3, usual_decimals(ms / 1e3) + extra, "s");
}

}  // namespace

std::string human_bytes(int64_t bytes) {
  const int u = byte_unit(double(bytes));
  return bytes_in(bytes, u, u == 0 ? 0 : usual_decimals(double(bytes) / kBytes[u].scale));
}

std::string human_ms(double ms) {
  if (!std::isfinite(ms)) return std::to_string(ms) + " ms";
  const double s = ms / 1e3;
  if (std::fabs(s) < 59.95) return ms_or_s(ms, 0);
  char buf[64];
  const long long secs = std::llround(s);
  if (std::llabs(secs) < 3600) {
    std::snprintf(buf, sizeof buf, "%lld min %lld s", secs / 60, std::llabs(secs % 60));
    return buf;
  }
  const long long mins = std::llround(s / 60);
  std::snprintf(buf, sizeof buf, "%lld h %lld min", mins / 60, std::llabs(mins % 60));
  return buf;
}

std::pair<std::string, std::string> distinct_bytes(int64_t a, int64_t b) {
  std::pair<std::string, std::string> p{human_bytes(a), human_bytes(b)};
  if (p.first != p.second || a == b) return p;
  const double larger = std::fmax(std::fabs(double(a)), std::fabs(double(b)));
  const int u = byte_unit(larger);
  // One byte is 10^-13 of a TiB: the figures differ by then at the latest.
  for (int d = usual_decimals(larger / kBytes[u].scale); d <= 13 && p.first == p.second; ++d)
    p = {bytes_in(a, u, d), bytes_in(b, u, d)};
  return p;
}

std::pair<std::string, std::string> distinct_ms(double a, double b) {
  std::pair<std::string, std::string> p{human_ms(a), human_ms(b)};
  if (p.first != p.second || a == b) return p;
  // Both in the unit of the larger (ms below a second, else s).
  const double larger = std::fmax(std::fabs(a), std::fabs(b));
  auto in_unit = [&](double v, int extra) {
    if (larger < 999.95) return ms_or_s(v, extra);
    return fixed(v / 1e3, usual_decimals(larger / 1e3) + extra, "s");
  };
  for (int extra = 1; extra <= 12 && p.first == p.second; ++extra) p = {in_unit(a, extra), in_unit(b, extra)};
  return p;
}

}  // namespace sp::plan
