// For test_lr_schedule.py: reads a JSON list of cases from stdin, each
// {"config": <a whole run config>, "steps": N}, parses each config with parse_config (the
// path a config file takes) and writes, as one JSON list, the learning rates
// LrSchedule::lr_at(0 .. N-1) of each case: the lr of optimizer steps 1 .. N. A config
// that fails to parse gives {"error": "<message>"} in its place.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "strata/core/error.hpp"
#include "strata/runtime/config/config.hpp"
#include "strata/runtime/config/lr_schedule.hpp"

using namespace strata;
using nlohmann::json;

int main() {
  json cases;
  try {
    cases = json::parse(std::cin);
  } catch (const json::parse_error& e) {
    std::fprintf(stderr, "lr_schedule_dump: stdin is not JSON: %s\n", e.what());
    return 2;
  }
  if (!cases.is_array()) {
    std::fprintf(stderr, "lr_schedule_dump: expected a JSON list of {\"config\": ..., \"steps\": N}\n");
    return 2;
  }
  json out = json::array();
  for (const json& c : cases) {
    try {
      const LrSchedule schedule{parse_config(c.at("config")).scheduler};
      json lrs = json::array();
      const int64_t steps = c.at("steps").get<int64_t>();
      for (int64_t s = 0; s < steps; ++s) lrs.push_back(schedule.lr_at(s));
      out.push_back(lrs);
    } catch (const ConfigError& e) {
      out.push_back({{"error", e.what()}});
    }
  }
  // nlohmann writes doubles with the digits that read back to the same double.
  std::cout << out.dump() << "\n";
  return 0;
}
