// Prints what read_safetensors_header makes of a file, for test_safetensors.py: one JSON
// object, {"data_start", "tensors": [{"name", "dtype", "shape", "offset", "bytes"}],
// "metadata"}, exit 0; or {"error": what, "kind": "corruption" | "config" | "io"}, exit 1.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "strata/core/error.hpp"
#include "strata/runtime/formats/safetensors.hpp"

int main(int argc, char** argv) {
  using nlohmann::json;
  if (argc != 2) {
    std::fprintf(stderr, "usage: safetensors_dump FILE\n");
    return 2;
  }
  try {
    const strata::SafetensorsHeader h = strata::read_safetensors_header(argv[1]);
    json tensors = json::array();
    for (const auto& t : h.tensors)
      tensors.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"offset", t.offset}, {"bytes", t.bytes}});
    std::cout << json{{"data_start", h.data_start}, {"tensors", tensors}, {"metadata", h.metadata}}.dump() << "\n";
    return 0;
  } catch (const strata::CorruptionError& e) {
    std::cout << json{{"error", e.what()}, {"kind", "corruption"}}.dump() << "\n";
  } catch (const strata::ConfigError& e) {
    std::cout << json{{"error", e.what()}, {"kind", "config"}}.dump() << "\n";
  } catch (const strata::IoError& e) {
    std::cout << json{{"error", e.what()}, {"kind", "io"}}.dump() << "\n";
  }
  return 1;
}
