// The JSON config with command-line overrides, as `strata train -c FILE --set ...` reads
// it. Input: the file's text, then optionally a NUL byte and up to 8 NUL-separated
// `--set` assignments. Each goes through parse_config_text, apply_override, parse_config
// and validate_for_world (worlds 1, 2 and 6), as load_config and the CLI do.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "strata/runtime/config/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in = strata::fuzz::bytes(data, size);
  const size_t nul = in.find('\0');
  const std::string text(in.substr(0, nul));
  std::vector<std::string> sets;
  for (size_t at = nul; at != std::string_view::npos && sets.size() < 8;) {
    const size_t next = in.find('\0', at + 1);
    sets.emplace_back(in.substr(at + 1, next == std::string_view::npos ? std::string_view::npos : next - at - 1));
    at = next;
  }
  strata::fuzz::only_strata_errors("fuzz_config", [&] {
    nlohmann::json j = strata::parse_config_text(text, "fuzz.json");
    for (const auto& s : sets) strata::apply_override(j, s);
    const strata::Config c = strata::parse_config(j);
    for (int world : {1, 2, 6}) strata::fuzz::only_strata_errors("fuzz_config", [&] { strata::validate_for_world(c, world); });
  });
  return 0;
}
