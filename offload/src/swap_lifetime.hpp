// Private to offload: how a swap file is made so that it cannot outlive its process, and
// how the named swap files that older runs left behind are reclaimed.
//
// A swap file holds the whole NVMe budget of its path. A file with a name stays on disk
// after SIGKILL, SIGBUS, a segfault or an mpirun abort, and the next run finds the disk
// full. So a swap file never has a name while it holds data: it is made with O_TMPFILE
// (ext4, xfs, btrfs, tmpfs), or, where the file system refuses that, created under a name
// and unlinked at once, before it is preallocated. Either way the kernel returns the
// space when the last descriptor closes, however the process ends.
//
// Named files `strata-swap-<pid>-<n>.bin` remain from Strata before this, and from a
// process killed between create and unlink in the fallback. At start each path is
// scanned for them and those of dead processes are removed.
#pragma once

#include <cstdint>
#include <string>

namespace strata::detail {

// Opens a new, empty, nameless swap file in `dir` for O_DIRECT reads and writes.
// Throws ConfigError naming the directory when the file system refuses O_DIRECT or the
// file cannot be made.
int open_unnamed_swap_file(const std::string& dir);
// Its fallback where O_TMPFILE is refused: strata-swap-<pid>-<n>.bin created with
// O_EXCL (a name an earlier process with this pid left is skipped), flocked, and unlinked
// before it is returned.
int open_named_swap_file(const std::string& dir);

struct StaleSwapFiles {
  uint64_t reclaimed_files = 0;
  uint64_t reclaimed_bytes = 0;  // bytes of disk the removed files held
  uint64_t live_files = 0;       // named swap files of processes still running (left alone)
  uint64_t live_bytes = 0;
};

// Removes `dir`'s files named strata-swap-<pid>-<n>.bin whose process is gone from this
// host (kill(pid, 0) fails with ESRCH) and that no one holds a flock on. Files of live
// processes, this one included, are never touched; nor are symlinks, non-regular files
// or other names. Logs one info line when it removed anything, one warning per file it
// could not remove. Never throws.
StaleSwapFiles reclaim_stale_swap_files(const std::string& dir);

}  // namespace strata::detail
