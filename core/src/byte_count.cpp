#include "strata/core/byte_count.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "strata/core/error.hpp"

namespace strata {

namespace {

constexpr double kTwoTo64 = 18446744073709551616.0;

struct Unit {
  std::string_view name;  // lower case
  uint64_t scale;         // bytes
};
constexpr Unit kUnits[] = {
    {"", 1},           {"b", 1},
    {"kb", 1000},      {"mb", 1000'000},   {"gb", 1000'000'000},   {"tb", 1000'000'000'000},
    {"k", 1ull << 10}, {"m", 1ull << 20},  {"g", 1ull << 30},      {"t", 1ull << 40},
    {"ki", 1ull << 10}, {"mi", 1ull << 20}, {"gi", 1ull << 30},    {"ti", 1ull << 40},
    {"kib", 1ull << 10}, {"mib", 1ull << 20}, {"gib", 1ull << 30}, {"tib", 1ull << 40},
};

// The text in double quotes, with anything but printable ASCII as \xNN: the input may be
// any bytes (a flag, a JSON string), and the message must stay one readable line.
std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out + "\"";
}

[[noreturn]] void refuse(const std::string& shown, const std::string& problem) {
  throw ConfigError(shown + " " + problem + ": expected " + byte_count_forms());
}

}  // namespace

std::string byte_count_forms() {
  return std::string("a byte count: a whole number, or a number and a unit such as \"512MiB\", \"2GB\", \"5G\", "
                     "\"1.5GiB\" (") +
         kByteCountUnits + ")";
}

std::string byte_count_too_large_text() {
  return "is too large: a byte count is at most " + std::to_string(kMaxByteCount) + " (2^64 - 1 bytes, 16 EiB)";
}

uint64_t parse_byte_count(std::string_view text, const std::string& what) {
  const std::string shown = what + " = " + quoted(text);
  if (text.find_first_not_of(' ') == std::string_view::npos) refuse(shown, "is empty");
  if (text[0] == '-') refuse(shown, "is negative");
  size_t i = 0;
  auto digits = [&] {
    const size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i > start;
  };
  const bool whole = digits();
  bool frac = false, point = false, exponent = false, negative_exponent = false;
  if (i < text.size() && text[i] == '.') {
    point = true;
    ++i;
    frac = digits();
  }
  if (!whole && !frac) refuse(shown, "is not a byte count");
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    exponent = true;
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative_exponent = text[i++] == '-';
    if (!digits()) refuse(shown, "is not a byte count");
  }
  const std::string_view number = text.substr(0, i);
  while (i < text.size() && text[i] == ' ') ++i;
  const std::string_view written_unit = text.substr(i);
  std::string unit;
  for (; i < text.size(); ++i) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  const Unit* u = nullptr;
  for (const Unit& k : kUnits)
    if (unit == k.name) u = &k;
  if (!u) refuse(shown, "has an unknown unit " + quoted(written_unit));

  if (!point && !exponent) {
    // A whole number of units is exact, up to the last byte (a double would round
    // 2^64 - 1 up to 2^64).
    uint64_t n = 0, bytes = 0;
    const auto r = std::from_chars(number.data(), number.data() + number.size(), n);
    if (r.ec == std::errc::result_out_of_range || __builtin_mul_overflow(n, u->scale, &bytes))
      throw ConfigError(shown + " " + byte_count_too_large_text());
    return bytes;
  }
  double x = 0;
  const auto r = std::from_chars(number.data(), number.data() + number.size(), x);
  if (r.ec == std::errc::result_out_of_range) {
    // Past a double's range: "1e-400" is a fraction of a byte, "1e400" far too many.
    if (negative_exponent) return 0;
    throw ConfigError(shown + " " + byte_count_too_large_text());
  }
  const double bytes = std::round(x * static_cast<double>(u->scale));
  if (!(bytes < kTwoTo64)) throw ConfigError(shown + " " + byte_count_too_large_text());
  return static_cast<uint64_t>(bytes);
}

}  // namespace strata
