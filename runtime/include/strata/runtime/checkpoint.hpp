// Sharded checkpoints of a ZeroEngine (DESIGN.md, "How we know it works": faults).
//
// Layout of one checkpoint, <root>/step-<N>/ (N zero-padded to 8 digits):
//   rank-<r>.bin    this rank's optimizer shards (master, exp_avg, exp_avg_sq) of every
//                   group, wherever they live (device, pinned or NVMe), in group order
//   manifest.json   written last, by rank 0, after every rank's file is complete and
//                   fsync'd: format version, step, world size, the groups (name, numel,
//                   padded numel), per-rank file size and xxh3 checksum, the run's config
//                   and the caller's `extra` (data position, RNG state, ...)
// Every rank writes into <root>/.step-<N>.tmp/; once rank 0 has the manifest written it
// renames the directory to step-<N> (one rename(2) of a directory: atomic), so a crash at
// any point leaves either no step-<N> or a complete one. Existing checkpoints are never
// opened for writing; a failed save removes only its own .tmp directory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "strata/runtime/zero_engine.hpp"

namespace strata {

struct CheckpointInfo {
  std::string dir;          // <root>/step-<N>
  int64_t step = 0;         // optimizer steps taken when it was saved
  int world_size = 0;       // ranks that wrote it
  nlohmann::json config;    // the configuration of the run that saved it
  nlohmann::json extra;     // what the caller stored (data position, RNG state, ...)
};

// Collective: every rank of engine.comm() calls it with the same arguments. Returns the
// new checkpoint's directory. Throws IoError (full disk, ...) with nothing existing
// touched.
std::string save_checkpoint(ZeroEngine& engine, const std::string& root, const nlohmann::json& config,
                            const nlohmann::json& extra);

// The complete checkpoint with the highest step under root (directories without a
// valid manifest are ignored, with a warning); nullopt when there is none.
std::optional<std::string> latest_checkpoint(const std::string& root);

// Reads and checks a checkpoint's manifest only (no shard data). Throws
// CorruptionError (missing/garbled manifest, missing rank file, wrong size) or
// ConfigError naming the problem.
CheckpointInfo read_checkpoint_info(const std::string& dir);

// Collective: loads optimizer shards (and so the working parameters) into the engine.
// The engine's groups must match the checkpoint's (names and numels; otherwise a
// ConfigError naming the first difference, e.g. "checkpoint is of another model
// shape"). A checkpoint written by a different world size is re-sharded: each rank
// reads its own slice from the writers' files. Checksums are verified; a mismatch is a
// CorruptionError naming the file.
CheckpointInfo load_checkpoint(ZeroEngine& engine, const std::string& dir);

// Reads the full fp32 master weights of group g (unpadded, group_numel elements) from a
// checkpoint's files, without an engine (export, sample).
std::vector<float> read_checkpoint_group(const CheckpointInfo& info, int g);

}  // namespace strata
