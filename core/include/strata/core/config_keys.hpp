// Helpers for validating configuration keys: unknown keys are an error that names the
// key and the nearest valid one (DESIGN.md, Configuration).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace strata {

// Edit distance between two keys.
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate nearest `key`, or "" when the list is empty.
std::string nearest_key(std::string_view key, const std::vector<std::string>& candidates);

// Throws ConfigError: "unknown key '<section>.<key>': did you mean '<nearest>'? valid keys: ..."
[[noreturn]] void throw_unknown_key(std::string_view section, std::string_view key,
                                    const std::vector<std::string>& candidates);

}  // namespace strata
