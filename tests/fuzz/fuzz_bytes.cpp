// Byte counts (core/byte_count.hpp), as a flag's text and as a config key's JSON string,
// which must agree. Beyond the common contract: a count that parses reads back the same
// with a "B" after it and, with no unit, a "K" multiplies it by 1024 exactly or is too
// large, so the units cannot drift apart.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "fuzz_common.hpp"
#include "strata/core/byte_count.hpp"
#include "strata/core/config_keys.hpp"

namespace {

std::optional<uint64_t> parsed(const std::string& text) {
  try {
    return strata::parse_byte_count(text, "--fuzz");
  } catch (const strata::ConfigError&) {
    return std::nullopt;
  }
}

void require(bool ok, const char* what, const std::string& text) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_bytes: %s for \"%s\"\n", what, text.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(strata::fuzz::bytes(data, size));
  strata::fuzz::only_strata_errors("fuzz_bytes", [&] {
    const std::optional<uint64_t> n = parsed(text);
    // The key's reading of a JSON string is the flag's.
    std::optional<uint64_t> key;
    try {
      key = strata::parse_bytes(nlohmann::json(text), "strata.device_budget");
    } catch (const strata::ConfigError&) {
    }
    require(n == key, "a flag and a key read the same text differently", text);
    if (!n) return;
    const bool unitless = text.find_first_not_of("0123456789.eE+-") == std::string::npos;
    if (!unitless) return;
    require(parsed(text + "B") == n, "\"B\" changed the count", text);
    const std::optional<uint64_t> k = parsed(text + "K");
    if (k && text.find_first_of(".eE") == std::string::npos)
      require(*k == *n * 1024 && *k / 1024 == *n, "\"K\" is not 1024 bytes", text);
  });
  return 0;
}
