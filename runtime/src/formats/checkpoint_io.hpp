// What the parts of checkpointing share (checkpoint.cpp saves, checkpoint_load.cpp loads,
// checkpoint_dirs.cpp locks and chooses directories): file I/O whose every failure names
// the file, the offset and the length, and the ranks' agreement on a failure. Private to
// runtime/.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "strata/collectives/communicator.hpp"
#include "strata/core/error.hpp"

namespace strata::checkpoint_detail {

// What a full disk during a save asks for (IoError); the save's .tmp directory is removed.
inline constexpr const char* kCheckpointDiskFull =
    "free space on it or set strata.checkpoint_dir to a disk with room; the checkpoints saved before are intact";

// ---------------------------------------------------------------------------------------
// Plain file I/O; every failure names the file, the offset and the length.

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  // Close and report the error (a deferred write error may surface here).
  void close_checked(const std::string& path) {
    const int f = fd;
    fd = -1;
    if (::close(f) != 0) throw IoError("closing checkpoint file", path, 0, 0, errno, kCheckpointDiskFull);
  }
};

void write_all(int fd, const void* data, uint64_t n, uint64_t offset, const std::string& path);
void read_exact(int fd, void* data, uint64_t n, uint64_t offset, const std::string& path);
void fsync_fd(int fd, const std::string& path);
void fsync_dir(const std::filesystem::path& dir);

// ---------------------------------------------------------------------------------------
// Agreement: every rank learns whether any rank failed, and all throw the error of the
// lowest failing rank, so that no rank goes on into a collective the others left.

struct Failure {
  int origin = 0;           // rank that failed first (lowest)
  std::exception_ptr mine;  // set on the origin rank
  nlohmann::json desc;      // kind, what, and for I/O errors path/offset/length/errno

  [[noreturn]] void raise(int rank) const;  // throws the origin's error
};

std::optional<Failure> agree(coll::Communicator& host, const std::exception_ptr& ep);

}  // namespace strata::checkpoint_detail
