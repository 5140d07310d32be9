// The messages of errors, for tests of bad input: of parsing a configuration, or of any
// call expected to throw E.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "strata/core/error.hpp"
#include "strata/runtime/config/config.hpp"

namespace strata::test {

// The ConfigError message for j, or "" when it parses.
inline std::string error_of(const nlohmann::json& j) {
  try {
    parse_config(j);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// The message of the E that f() throws; "wrong exception type: ..." for another
// exception, "no exception" when it returns.
template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no exception";
}

}  // namespace strata::test
