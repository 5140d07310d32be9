// The ConfigError message of parsing a configuration, for tests of bad input.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "strata/core/error.hpp"
#include "strata/runtime/config.hpp"

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

}  // namespace strata::test
