// Checks of numeric command-line values whose refusals say what is accepted. CLI11's
// PositiveNumber and NonNegativeNumber print "Value 0 not in range 0.000000 to 1797...
// (309 digits)" and let NaN through; these say "--steps: got 0; give a whole number of at
// least 1" and refuse NaN and infinity. Shared by the CLI (cli/) and the benchmarks'
// subcommands (bench/), which are the two users of CLI11.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

namespace strata::cli_checks {

// A whole number of at least `lo`. Text that is not a whole number is left to CLI11's
// conversion into the option's type, which names it.
inline CLI::Validator at_least(long long lo) {
  const std::string want = lo == 0 ? "a whole number of at least 0" : "a whole number of at least " + std::to_string(lo);
  return CLI::Validator(
      [lo, want](std::string& s) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        if (end == s.c_str() || *end != '\0' || errno == ERANGE) return "";
        return v < lo ? "got " + s + "; give " + want : "";
      },
      "INT>=" + std::to_string(lo));
}

// A finite number of at least 0 (NaN and infinity refused).
inline CLI::Validator finite_non_negative() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (end == s.c_str() || *end != '\0') return "got '" + s + "'; give a number of at least 0";
        return std::isfinite(v) && v >= 0 ? "" : "got " + s + "; give a finite number of at least 0";
      },
      "NUMBER>=0");
}

}  // namespace strata::cli_checks
