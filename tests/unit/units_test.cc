// ParseSize and FormatBytes: the sizes operators type in config files and flags, and how the CLI and
// error messages print them back.
#include "common/units.h"

#include <cstdint>
#include <string>

#include <gtest/gtest.h>

namespace warmpool {
namespace {

uint64_t MustParse(const std::string& text) {
  Result<uint64_t> r = ParseSize(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().ToString();
  return r.ok() ? *r : ~uint64_t{0};
}

void ExpectInvalid(const std::string& text, const std::string& needle) {
  Result<uint64_t> r = ParseSize(text);
  ASSERT_FALSE(r.ok()) << "\"" << text << "\" parsed as " << (r.ok() ? *r : 0);
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << text;
  EXPECT_NE(r.status().message().find(needle), std::string::npos)
      << "message for \"" << text << "\": " << r.status().message();
}

TEST(ParseSizeTest, PlainByteCounts) {
  EXPECT_EQ(MustParse("0"), 0u);
  EXPECT_EQ(MustParse("1"), 1u);
  EXPECT_EQ(MustParse("1024"), 1024u);
  EXPECT_EQ(MustParse("1073741824"), 1073741824u);
  EXPECT_EQ(MustParse("17B"), 17u);
}

TEST(ParseSizeTest, BinaryUnits) {
  EXPECT_EQ(MustParse("64KiB"), 65536u);
  EXPECT_EQ(MustParse("512MiB"), 536870912u);
  EXPECT_EQ(MustParse("2GiB"), 2147483648u);
  EXPECT_EQ(MustParse("1.5GiB"), 1610612736u);
  EXPECT_EQ(MustParse("3TiB"), 3298534883328u);
  EXPECT_EQ(MustParse("4K"), 4096u);
  EXPECT_EQ(MustParse("4k"), 4096u);
  EXPECT_EQ(MustParse("8M"), 8388608u);
  EXPECT_EQ(MustParse("1G"), 1073741824u);
  EXPECT_EQ(MustParse("0.5KiB"), 512u);
}

TEST(ParseSizeTest, DecimalUnitsArePowersOfTen) {
  EXPECT_EQ(MustParse("100MB"), 100000000u);
  EXPECT_EQ(MustParse("1KB"), 1000u);
  EXPECT_EQ(MustParse("1kB"), 1000u);
  EXPECT_EQ(MustParse("2GB"), 2000000000u);
  EXPECT_EQ(MustParse("1.25TB"), 1250000000000u);
}

TEST(ParseSizeTest, SpaceBetweenNumberAndUnit) {
  EXPECT_EQ(MustParse("512 MiB"), 536870912u);
  EXPECT_EQ(MustParse("2 GB"), 2000000000u);
}

TEST(ParseSizeTest, EmptyAndNonNumericAreRefused) {
  ExpectInvalid("", "must start with a number");
  ExpectInvalid("abc", "must start with a number");
  ExpectInvalid("GiB", "must start with a number");
  ExpectInvalid("-1", "must start with a number");
  ExpectInvalid(" 1", "must start with a number");
}

TEST(ParseSizeTest, UnknownUnitsAreRefusedAndNamed) {
  ExpectInvalid("10XB", "unknown unit \"XB\"");
  ExpectInvalid("5 parsecs", "unknown unit \"parsecs\"");
  ExpectInvalid("1gib", "unknown unit \"gib\"");
  ExpectInvalid("1GiBs", "unknown unit \"GiBs\"");
  ExpectInvalid("1e3", "unknown unit \"e3\"");
  ExpectInvalid("2PiB", "unknown unit \"PiB\"");
  // The message lists what is accepted.
  ExpectInvalid("10XB", "use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB");
}

TEST(ParseSizeTest, MalformedNumbersAreRefused) {
  ExpectInvalid("1.2.3GiB", "size \"1.2.3GiB\"");
  ExpectInvalid(".", "size \".\"");
  ExpectInvalid("..5MiB", "size \"..5MiB\"");
}

TEST(ParseSizeTest, HugeValuesOverflowCleanly) {
  ExpectInvalid("99999999999999999999999", "too large");
  ExpectInvalid("20000000000000000000", "too large");
  ExpectInvalid("17000000TiB", "too large");
  ExpectInvalid("1" + std::string(400, '0'), "too large");  // strtod gives inf
}

TEST(ParseSizeTest, LargeValuesAboveInt64AreExact) {
  // Above INT64_MAX but representable: must not wrap through a signed conversion.
  EXPECT_EQ(MustParse("10000000000000000000"), 10000000000000000000u);
  EXPECT_EQ(MustParse("16000000TB"), 16000000000000000000u);
  EXPECT_EQ(MustParse("9500000000000000000"), 9500000000000000000u);
}

TEST(FormatBytesTest, BytesBelowOneKiB) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1), "1 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
}

TEST(FormatBytesTest, BinaryUnitsWithOneDecimal) {
  EXPECT_EQ(FormatBytes(1024), "1.0 KiB");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(512ull << 20), "512.0 MiB");
  EXPECT_EQ(FormatBytes(2ull << 30), "2.0 GiB");
  EXPECT_EQ(FormatBytes(1610612736ull), "1.5 GiB");
  EXPECT_EQ(FormatBytes(3ull << 40), "3.0 TiB");
  // TiB is the largest unit.
  EXPECT_EQ(FormatBytes(2048ull << 40), "2048.0 TiB");
}

TEST(FormatBytesTest, RoundTripsThroughParseSize) {
  for (uint64_t v : {1024ull, 65536ull, 536870912ull, 2147483648ull, 1610612736ull}) {
    std::string text = FormatBytes(v);
    std::string compact;
    for (char c : text) {
      if (c != ' ') compact += c;
    }
    EXPECT_EQ(MustParse(compact), v) << text;
  }
}

}  // namespace
}  // namespace warmpool

namespace warmpool {
namespace {

TEST(ParseDurationMs, UnitsAndForever) {
  EXPECT_EQ(*ParseDurationMs("250ms"), 250);
  EXPECT_EQ(*ParseDurationMs("30s"), 30000);
  EXPECT_EQ(*ParseDurationMs("90"), 90000);
  EXPECT_EQ(*ParseDurationMs("5m"), 300000);
  EXPECT_EQ(*ParseDurationMs("1.5h"), 5400000);
  EXPECT_EQ(*ParseDurationMs("0"), 0);
  EXPECT_EQ(*ParseDurationMs("-1"), -1);
}

TEST(ParseDurationMs, RejectsWhatIsNotADuration) {
  for (const char* bad : {"", "m", "5 minutes", "1.2.3s", "-5s", "5d", "abc"}) {
    auto r = ParseDurationMs(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace warmpool
