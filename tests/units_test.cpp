// The one formatter of human-readable quantities (plan/units.hpp): units by magnitude, and
// pairs that never read alike when they differ.
#include <gtest/gtest.h>

#include "plan/units.hpp"

namespace pl = sp::plan;

TEST(Units, BytesTakeTheUnitOfTheirMagnitude) {
  EXPECT_EQ(pl::human_bytes(0), "0 B");
  EXPECT_EQ(pl::human_bytes(512), "512 B");
  EXPECT_EQ(pl::human_bytes(1023), "1023 B");
  EXPECT_EQ(pl::human_bytes(1024), "1.00 KiB");
  EXPECT_EQ(pl::human_bytes(9216), "9.00 KiB");
  EXPECT_EQ(pl::human_bytes(14438), "14.1 KiB");
  EXPECT_EQ(pl::human_bytes(471904), "460.8 KiB");
  EXPECT_EQ(pl::human_bytes(int64_t(4.69 * 1048576)), "4.69 MiB");
  EXPECT_EQ(pl::human_bytes(int64_t(142.3 * 1048576)), "142.3 MiB");
  EXPECT_EQ(pl::human_bytes(int64_t(8789065.0 * 1048576)), "8.38 TiB");
  EXPECT_EQ(pl::human_bytes(int64_t(2.5 * 1073741824)), "2.50 GiB");
  // A figure that would round to 1024 of its unit is shown in the next one.
  EXPECT_EQ(pl::human_bytes(1048575), "1.00 MiB");
  EXPECT_EQ(pl::human_bytes(-2048), "-2.00 KiB");
}

TEST(Units, TimesTakeTheUnitOfTheirMagnitude) {
  EXPECT_EQ(pl::human_ms(0.0123), "0.012 ms");
  EXPECT_EQ(pl::human_ms(0.5), "0.50 ms");
  EXPECT_EQ(pl::human_ms(12.34), "12.3 ms");
  EXPECT_EQ(pl::human_ms(803.3), "803.3 ms");
  EXPECT_EQ(pl::human_ms(999.99), "1.00 s");
  EXPECT_EQ(pl::human_ms(4200), "4.20 s");
  EXPECT_EQ(pl::human_ms(15784.7), "15.8 s");
  EXPECT_EQ(pl::human_ms(59990), "1 min 0 s");
  EXPECT_EQ(pl::human_ms(200000), "3 min 20 s");
  EXPECT_EQ(pl::human_ms(1320600.9), "22 min 1 s");
  EXPECT_EQ(pl::human_ms(3599600), "1 h 0 min");
  EXPECT_EQ(pl::human_ms(7.5 * 3600e3), "7 h 30 min");
  EXPECT_EQ(pl::human_ms(50 * 3600e3), "50 h 0 min");
}

TEST(Units, PairsAddDigitsUntilTheyDiffer) {
  // Different at the usual precision: the usual renderings, each in its own unit.
  EXPECT_EQ(pl::distinct_bytes(1000, 2 << 20), std::make_pair(std::string("1000 B"), std::string("2.00 MiB")));
  // The same at the usual precision: one unit, more decimals.
  EXPECT_EQ(pl::distinct_bytes(471903, 471904), std::make_pair(std::string("460.843 KiB"), std::string("460.844 KiB")));
  const auto [a, b] = pl::distinct_bytes(int64_t(0.45 * 1048576), int64_t(0.45 * 1048576) + 1);
  EXPECT_NE(a, b);
  // One byte apart at a TiB still reads differently.
  const int64_t tib = int64_t{1} << 40;
  const auto [c, d] = pl::distinct_bytes(tib, tib + 1);
  EXPECT_NE(c, d) << c;
  // Equal numbers read the same, with the usual digits.
  EXPECT_EQ(pl::distinct_bytes(4096, 4096), std::make_pair(std::string("4.00 KiB"), std::string("4.00 KiB")));

  EXPECT_EQ(pl::distinct_ms(12.3, 10.1), std::make_pair(std::string("12.3 ms"), std::string("10.1 ms")));
  EXPECT_EQ(pl::distinct_ms(100.01, 100.04), std::make_pair(std::string("100.01 ms"), std::string("100.04 ms")));
  EXPECT_EQ(pl::distinct_ms(4201, 4204), std::make_pair(std::string("4.201 s"), std::string("4.204 s")));
  const auto [e, f] = pl::distinct_ms(100.015855, 100.0158551);
  EXPECT_NE(e, f);
  EXPECT_EQ(pl::distinct_ms(5, 5).first, "5.00 ms");
}
