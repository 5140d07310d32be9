// Checkpoint directories, as the code that saves checkpoints needs them: their lock and
// what is in them (checkpoint_dirs.cpp). Private to runtime/.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "strata/runtime/formats/checkpoint.hpp"

namespace strata {

struct CheckpointDirLockAccess {
  // Takes the lock of root (an existing directory) or throws a ConfigError naming the
  // holder. A lock file that cannot be created means root is not writable.
  static CheckpointDirLock take(const std::filesystem::path& root);
  // Removes root's lock file and releases the lock: for a writer that leaves root as it
  // found it (a failed import into a directory that had no lock file). The file is
  // unlinked while still locked: a run that looks for the lock after it makes a new one.
  static void release_and_remove(CheckpointDirLock& lock, const std::filesystem::path& root);
  // Whether root holds a lock file.
  static bool has_lock_file(const std::filesystem::path& root);
};

namespace checkpoint_detail {

// Whether this process holds root's lock (a save in train, which holds it, takes no other).
bool held_here(const std::filesystem::path& root);

// True for a directory Strata wrote as one checkpoint: one holding a manifest.json, a
// .step-<N>.tmp directory, or a step-<N> directory (N of 8 digits or more) holding a
// rank file (a damaged checkpoint; the name alone could be a user's "step-20240101").
bool is_checkpoint_dir(const std::filesystem::path& p);

// Every step-<N> directory under root (parsed name), and the leftover .tmp directories.
std::vector<std::pair<int64_t, std::filesystem::path>> step_dirs(const std::string& root,
                                                                 std::vector<std::filesystem::path>* leftovers);

}  // namespace checkpoint_detail

}  // namespace strata
