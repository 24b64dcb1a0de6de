// Quantities as people read them: every human-readable line of the project formats bytes and
// times here; JSON keeps the raw numbers. The unit follows the magnitude, with two decimals below
// 10 of it and one above (three significant digits). Pairs being compared print both in the unit
// of the larger, with digits added until they differ ("0.45 MiB is below 0.45 MiB" never reads).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace sp::plan {

// "512 B", "14.1 KiB", "4.69 MiB", "8.38 TiB".
std::string human_bytes(int64_t bytes);
// "0.123 ms", "12.3 ms", "4.20 s", "3 min 20 s", "22 h 1 min".
std::string human_ms(double ms);

// a and b in the unit of the larger, with the fewest decimals (at least human_bytes') at
// which they read differently; equal numbers read the same.
std::pair<std::string, std::string> distinct_bytes(int64_t a, int64_t b);
// The same for times: human_ms where those differ, else both in ms or s with more decimals.
std::pair<std::string, std::string> distinct_ms(double a, double b);

}  // namespace sp::plan
