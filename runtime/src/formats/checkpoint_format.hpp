// The on-disk format of a checkpoint, shared by checkpoint.cpp (saving), checkpoint_load.cpp
// (loading, reading shards), checkpoint_dirs.cpp (finding checkpoints) and
// checkpoint_manifest.cpp (the manifest's text, which the fuzz target
// tests/fuzz/fuzz_manifest.cpp also builds alone). Private to runtime/.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "strata/runtime/formats/checkpoint.hpp"

namespace strata::checkpoint_format {

inline constexpr const char* kFormat = "strata-checkpoint";
inline constexpr int kVersion = 1;
inline constexpr int kStates = 3;  // master, exp_avg, exp_avg_sq
inline constexpr const char* kStateNames[kStates] = {"master", "exp_avg", "exp_avg_sq"};

inline std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}
inline std::string rank_file(int r) { return "rank-" + std::to_string(r) + ".bin"; }

inline std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The manifest's body (without its checksum), and the checksum of a body.
nlohmann::json info_to_json(const CheckpointInfo& info);
uint64_t manifest_hash(const nlohmann::json& body);
// Bytes of one group's three segments in every rank file, and where group g begins.
uint64_t group_offset(const CheckpointInfo& info, size_t g);
// The manifest `text` at mpath of checkpoint dir, checked (parse_checkpoint_manifest).
CheckpointInfo parse_manifest(const std::filesystem::path& dir, const std::filesystem::path& mpath,
                              const std::string& text);

}  // namespace strata::checkpoint_format
