#include <gtest/gtest.h>

#include "strata/core/config_keys.hpp"
#include "strata/core/error.hpp"

using namespace strata;

TEST(ConfigKeys, NearestKey) {
  std::vector<std::string> keys{"block_size", "queue_depth", "intra_op_parallelism"};
  EXPECT_EQ(nearest_key("queue_dept", keys), "queue_depth");
  EXPECT_EQ(nearest_key("blocksize", keys), "block_size");
  EXPECT_EQ(edit_distance("abc", "abc"), 0u);
  EXPECT_EQ(edit_distance("abc", "abd"), 1u);
}

TEST(ConfigKeys, UnknownKeyMessageNamesKeyAndFix) {
  try {
    throw_unknown_key("aio", "queue_dept", {"block_size", "queue_depth"});
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("aio.queue_dept"), std::string::npos) << m;
    EXPECT_NE(m.find("did you mean 'queue_depth'"), std::string::npos) << m;
  }
}

// ---- the table machinery, on a small table of its own -----------------------------------

namespace {

enum class Colour { Red = 3, Blue = 7 };

struct Target {
  uint64_t count = 5;
  unsigned small = 1;
  float rate = 0.5f;
  std::string name;
  Colour colour = Colour::Red;
  std::vector<std::string> dirs;
};

const ConfigSection kInner = {
    .path = "outer.inner",
    .keys = {{.name = "small", .type = KeyType::Whole, .min = 1, .max = 8, .power_of_two = true,
              .help = "A power of two.", .field = STRATA_CONFIG_FIELD(Target, small)}},
    .inline_in_parent = true,
};

const ConfigSection kOuter = {
    .path = "outer",
    .keys = {
        {.name = "count", .type = KeyType::Whole, .min = 1, .help = "A count.",
         .field = STRATA_CONFIG_FIELD(Target, count)},
        {.name = "rate", .type = KeyType::Float, .lo = 0, .hi = 1, .hi_open = true, .help = "A rate.",
         .field = STRATA_CONFIG_FIELD(Target, rate)},
        {.name = "name", .type = KeyType::Text, .help = "A name.", .field = STRATA_CONFIG_FIELD(Target, name)},
        {.name = "colour", .type = KeyType::Text, .choices = {{"red", int(Colour::Red)}, {"blue", int(Colour::Blue)}},
         .ignore_case = true, .help = "A colour.", .field = STRATA_CONFIG_FIELD(Target, colour)},
        {.name = "dirs", .type = KeyType::Paths, .nullable = true, .help = "Directories.",
         .field = STRATA_CONFIG_FIELD(Target, dirs)},
        {.name = "knob", .type = KeyType::Boolean, .help = "Elsewhere's knob.", .use = KeyUse::NoEffect,
         .why = "nothing here turns"},
        {.name = "always", .type = KeyType::Boolean, .help = "On.", .use = KeyUse::Fixed, .only = true,
         .why = "it is always on"},
        {.name = "later", .type = KeyType::Boolean, .help = "Not yet.", .use = KeyUse::Refused, .only = false,
         .why = "it comes later"},
        {.name = "inner", .type = KeyType::Section, .section = &kInner},
    },
};

struct Parsed {
  Target t;
  std::vector<std::string> warnings;
};
Parsed parse(const char* text) {
  Parsed p;
  parse_section(kOuter, nlohmann::json::parse(text), &p.t, p.warnings);
  return p;
}
std::string error_of(const char* text) {
  try {
    parse(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << "missing \"" << (part) << "\" in: " << (msg)

}  // namespace

TEST(ConfigTable, ValuesReachTheirFieldsAndAbsentKeysKeepTheDefaults) {
  Parsed p = parse(R"({"count": 5e7, "rate": 0.25, "name": "x", "colour": "BLUE", "dirs": ["/a", "/b"],
                       "inner": {"small": 4.0}})");
  EXPECT_EQ(p.t.count, 50'000'000u);  // float notation is a whole number when it has no fraction
  EXPECT_EQ(p.t.rate, 0.25f);
  EXPECT_EQ(p.t.name, "x");
  EXPECT_EQ(p.t.colour, Colour::Blue);
  EXPECT_EQ(p.t.dirs, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_EQ(p.t.small, 4u);
  EXPECT_TRUE(p.warnings.empty());
  Parsed d = parse(R"({"dirs": null})");
  EXPECT_EQ(d.t.count, 5u);
  EXPECT_EQ(d.t.colour, Colour::Red);
  EXPECT_TRUE(d.t.dirs.empty());
}

TEST(ConfigTable, BadValuesNameTheKeyTheValueAndWhatIsAccepted) {
  EXPECT_HAS(error_of(R"({"count": 2.5})"), "outer.count = 2.5 is invalid: expected a whole number >= 1");
  EXPECT_HAS(error_of(R"({"count": "8"})"), "outer.count = \"8\"");
  EXPECT_HAS(error_of(R"({"count": "auto"})"), "HuggingFace");
  EXPECT_HAS(error_of(R"({"inner": {"small": 3}})"), "outer.inner.small = 3 is invalid: expected a power of two from 1 to 8");
  EXPECT_HAS(error_of(R"({"inner": {"small": 16}})"), "outer.inner.small = 16");
  EXPECT_HAS(error_of(R"({"rate": 1})"), "outer.rate = 1 is invalid: expected a number in [0, 1)");
  // Checked as the float it is stored in: 0.99999999 would become 1.
  EXPECT_HAS(error_of(R"({"rate": 0.99999999})"), "outer.rate = 0.99999999");
  EXPECT_HAS(error_of(R"({"colour": "green"})"), "outer.colour = \"green\" is invalid: expected \"red\" or \"blue\"");
  EXPECT_HAS(error_of(R"({"colour": 1})"), "outer.colour = 1 is invalid: expected a string");
  EXPECT_HAS(error_of(R"({"dirs": ["/a", "/a"]})"), "outer.dirs lists '/a' twice");
  EXPECT_HAS(error_of(R"({"dirs": []})"), "non-empty list of directory paths, or null");
  EXPECT_HAS(error_of(R"({"inner": 3})"), "outer.inner = 3 is invalid: expected a JSON object");
  EXPECT_HAS(error_of(R"({"cuont": 1})"), "unknown config key 'outer.cuont': did you mean 'count'?");
}

TEST(ConfigTable, KeysWithoutEffectWarnOnceAndRefusedOnesSayNotYet) {
  Parsed p = parse(R"({"knob": false, "always": true, "later": false})");
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_EQ(p.warnings[0], "outer.knob has no effect: nothing here turns");
  p = parse(R"({"always": false})");
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_EQ(p.warnings[0], "outer.always = false has no effect: it is always on");
  EXPECT_EQ(error_of(R"({"later": true})"),
            "outer.later = true is not supported yet: it comes later: set outer.later to false or remove it");
  EXPECT_HAS(error_of(R"({"knob": 1})"), "outer.knob = 1 is invalid: expected true or false");
}

TEST(ConfigTable, ListingsShowRangesDefaultsAndWhy) {
  Target defaults;
  const std::string text = keys_text(kOuter, &defaults);
  EXPECT_HAS(text, "outer.count: a whole number >= 1; default 5\n    A count.\n");
  EXPECT_HAS(text, "outer.colour: \"red\" or \"blue\"; default \"red\"\n");
  EXPECT_HAS(text, "outer.dirs: a directory path or a non-empty list of directory paths, or null; default unset\n");
  EXPECT_HAS(text, "outer.knob: true or false; default —\n    Elsewhere's knob. No effect, with a warning: nothing here turns.\n");
  EXPECT_HAS(text, "outer.inner.small: a power of two from 1 to 8; default 1\n");
  const std::string md = keys_markdown(kOuter, &defaults, "outer");
  EXPECT_HAS(md, "| `rate` | a number in [0, 1) | `0.5` | A rate. |\n");
  EXPECT_HAS(md, "| `inner.small` | a power of two from 1 to 8 | `1` | A power of two. |\n");  // inline
  EXPECT_HAS(md, "`true` is refused, not supported yet: it comes later.");
  EXPECT_EQ(markdown_sections(kOuter), std::vector<std::string>{"outer"});
}

TEST(ConfigTable, NumbersAreWrittenShortest) {
  EXPECT_EQ(config_number_text(1e-8), "1e-8");
  EXPECT_EQ(config_number_text(static_cast<double>(0.9f)), "0.9");
  EXPECT_EQ(config_number_text(0.001), "0.001");
  EXPECT_EQ(config_number_text(3e20), "3e20");
  EXPECT_EQ(config_number_text(1), "1");
}
