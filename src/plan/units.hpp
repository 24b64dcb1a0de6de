// Quantities as people read them: every human-readable line of the project (explain, tables,
// errors, progress) formats bytes and times here; JSON keeps the raw numbers.
//
// Design note. The unit follows the magnitude: bytes in B, KiB, MiB, GiB or TiB (powers of
// 1024), times in ms, s, "min s" or "h min". A figure keeps two decimals below 10 of its
// unit and one above, so that it reads as three significant digits. Where two quantities are
// compared ("budget X is below the smallest achievable peak Y", "slower: X vs Y"), the pair
// forms print both in the unit of the larger and add digits until they differ, so that a
// comparison never reads "0.45 MiB is below 0.45 MiB".
//
// Example:
//     sp::plan::human_bytes(9216);                 // "9.00 KiB"
//     sp::plan::human_ms(1320600.9);               // "22 min 1 s"
//     auto [b, s] = sp::plan::distinct_bytes(471903, 471904);  // "460.843 KiB", "460.844 KiB"
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
