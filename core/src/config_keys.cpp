#include "strata/core/config_keys.hpp"

#include <algorithm>
#include <numeric>

#include "strata/core/error.hpp"

namespace strata {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  std::iota(prev.begin(), prev.end(), size_t{0});
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest_key(std::string_view key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    size_t d = edit_distance(key, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

void throw_unknown_key(std::string_view section, std::string_view key, const std::vector<std::string>& candidates) {
  std::string full = section.empty() ? std::string(key) : std::string(section) + "." + std::string(key);
  std::string msg = "unknown config key '" + full + "'";
  if (!candidates.empty()) {
    msg += ": did you mean '" + nearest_key(key, candidates) + "'? valid keys are";
    for (size_t i = 0; i < candidates.size(); ++i) msg += (i ? ", " : " ") + candidates[i];
  }
  throw ConfigError(msg);
}

}  // namespace strata
