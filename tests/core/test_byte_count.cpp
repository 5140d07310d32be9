// Byte counts (core/byte_count.hpp): one parser behind every key and flag that takes a
// size, so a form the help names works everywhere (issue #37: `export --shard-size 5G`
// was refused while 5GB worked), and a count past the limit says it is too large and
// gives the limit (`device_budget "1e30B"` was called invalid syntax).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/core/byte_count.hpp"
#include "strata/core/config_keys.hpp"
#include "strata/core/error.hpp"

using namespace strata;
using nlohmann::json;

namespace {

// The message of a ConfigError from f, or "" when it returned.
template <class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

constexpr uint64_t KiB = 1ull << 10, MiB = 1ull << 20, GiB = 1ull << 30, TiB = 1ull << 40;

}  // namespace

TEST(ByteCount, EveryUnitTheHelpNamesWorksInKeysAndFlagsAlike) {
  struct Case {
    const char* text;
    uint64_t bytes;
  };
  const std::vector<Case> cases = {
      {"0", 0},
      {"4096", 4096},
      {"100B", 100},
      {"100 b", 100},
      // Single letters and their i / iB forms: powers of 1024.
      {"5G", 5 * GiB},
      {"5g", 5 * GiB},
      {"5Gi", 5 * GiB},
      {"5GiB", 5 * GiB},
      {"5gib", 5 * GiB},
      {"64K", 64 * KiB},
      {"64 KiB", 64 * KiB},
      {"3M", 3 * MiB},
      {"3MiB", 3 * MiB},
      {"2T", 2 * TiB},
      {"2TiB", 2 * TiB},
      {"1.5G", 3 * GiB / 2},
      // With B: powers of 1000.
      {"5GB", 5'000'000'000},
      {"5gb", 5'000'000'000},
      {"64KB", 64'000},
      {"3MB", 3'000'000},
      {"2TB", 2'000'000'000'000},
      {".5KB", 500},
      // Exponents, and the exact last byte.
      {"1e9", 1'000'000'000},
      {"1e3K", 1000 * KiB},
      {"18446744073709551615", kMaxByteCount},
      {"16777215TiB", 16777215 * TiB},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(parse_bytes(json(c.text), "strata.device_budget"), c.bytes) << c.text;
    EXPECT_EQ(parse_byte_count(c.text, "--shard-size"), c.bytes) << c.text;
  }
}

TEST(ByteCount, PastTheLimitItSaysTooLargeAndGivesTheLimit) {
  const std::string limit = "is too large: a byte count is at most 18446744073709551615";
  for (const char* text : {"1e30B", "1e30", "18446744073709551616", "99999999999999999999999K", "16777216TiB",
                           "17179869184G", "20000000TB", "1e400", "1.9e10GB"}) {
    const std::string key = refusal([&] { parse_bytes(json(text), "strata.device_budget"); });
    EXPECT_NE(key.find("strata.device_budget = \"" + std::string(text) + "\" " + limit), std::string::npos) << key;
    const std::string flag = refusal([&] { parse_byte_count(text, "--shard-size"); });
    EXPECT_NE(flag.find("--shard-size = \"" + std::string(text) + "\" " + limit), std::string::npos) << flag;
  }
  // JSON numbers: a config file's 1e30 arrives as a double.
  for (double x : {1e30, 18446744073709551616.0, 1e300}) {
    const std::string m = refusal([&] { parse_bytes(json(x), "strata.pinned_budget"); });
    EXPECT_NE(m.find("strata.pinned_budget = " + json(x).dump() + " " + limit), std::string::npos) << m;
  }
}

TEST(ByteCount, OtherMistakesNameTheProblemAndTheForms) {
  struct Case {
    std::string text, problem;
  };
  const std::vector<Case> cases = {
      {"", "is empty"},
      {"  ", "is empty"},
      {"-1G", "is negative"},
      {"G", "is not a byte count"},
      {"+5G", "is not a byte count"},
      {"1e", "is not a byte count"},
      {"12XB", "has an unknown unit \"XB\""},
      {"1.5.2GB", "has an unknown unit \".2GB\""},
      {"5 G B", "has an unknown unit \"G B\""},
      {"5PB", "has an unknown unit \"PB\""},
      {std::string("5\xff", 2), "has an unknown unit \"\\xff\""},
      {std::string("5G\0B", 4), "has an unknown unit \"G\\x00B\""},
  };
  for (const Case& c : cases) {
    const std::string m = refusal([&] { parse_byte_count(c.text, "--sizes"); });
    EXPECT_NE(m.find(c.problem), std::string::npos) << m;
    EXPECT_EQ(m.rfind("--sizes = \"", 0), 0u) << m;
    EXPECT_NE(m.find("K, M, G, T, KiB, MiB, GiB, TiB in powers of 1024"), std::string::npos) << m;
    EXPECT_NE(m.find("KB, MB, GB, TB in powers of 1000"), std::string::npos) << m;
  }
  // A key's non-string, non-number value names the forms too.
  EXPECT_NE(refusal([] { parse_bytes(json(true), "strata.nvme_budget"); }).find("\"512MiB\""), std::string::npos);
  EXPECT_NE(refusal([] { parse_bytes(json(1.5), "strata.nvme_budget"); }).find("strata.nvme_budget = 1.5 is invalid"),
            std::string::npos);
}
