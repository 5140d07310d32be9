// Nameless swap files and the reclaiming of named ones left behind (swap_lifetime.hpp).
#include "swap_lifetime.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string_view>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/log.hpp"

namespace strata::detail {

namespace {

std::atomic<uint64_t> g_swap_serial{0};  // <n> in strata-swap-<pid>-<n>.bin, unique per process

std::string join(const std::string& dir, std::string_view name) {
  return dir + (dir.ends_with('/') ? "" : "/") + std::string(name);
}

[[noreturn]] void throw_create_failed(const std::string& dir, int e) {
  if (e == EINVAL)
    throw ConfigError("nvme path '" + dir + "' does not support O_DIRECT (tmpfs or a network file system?); "
                      "point nvme_path at a local disk");
  throw ConfigError("nvme store: cannot create a swap file in '" + dir + "': " + std::strerror(e));
}

// The pid in "strata-swap-<pid>-<n>.bin", or 0 when `name` is not of that form.
pid_t swap_file_pid(std::string_view name) {
  constexpr std::string_view prefix = "strata-swap-", suffix = ".bin";
  if (!name.starts_with(prefix) || !name.ends_with(suffix)) return 0;
  name.remove_prefix(prefix.size());
  name.remove_suffix(suffix.size());
  const size_t dash = name.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash + 1 == name.size()) return 0;
  long pid = 0;
  auto [p, ec] = std::from_chars(name.data(), name.data() + dash, pid);
  if (ec != std::errc() || p != name.data() + dash || pid <= 0 || pid != static_cast<pid_t>(pid)) return 0;
  for (char c : name.substr(dash + 1))
    if (c < '0' || c > '9') return 0;
  return static_cast<pid_t>(pid);
}

// EPERM means the process exists under another user: alive.
bool process_is_gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

}  // namespace

int open_unnamed_swap_file(const std::string& dir) {
  int fd = open(dir.c_str(), O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  int e = errno;
  // EOPNOTSUPP: this file system has no O_TMPFILE; EISDIR: the kernel predates it;
  // EINVAL: O_TMPFILE or O_DIRECT refused (the named open below tells which).
  if (e != EOPNOTSUPP && e != EISDIR && e != EINVAL) throw_create_failed(dir, e);
  return open_named_swap_file(dir);
}

int open_named_swap_file(const std::string& dir) {
  int fd = -1, e = 0;
  const std::string pid = std::to_string(getpid());
  for (;;) {
    const std::string path = join(dir, "strata-swap-" + pid + "-" + std::to_string(g_swap_serial.fetch_add(1)) + ".bin");
    fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0) {
      e = errno;
      if (e == EEXIST) continue;  // left by an earlier process that had this pid
      throw_create_failed(dir, e);
    }
    // Locked for the moment it has a name: a run starting now in another pid namespace,
    // to which this pid looks dead, leaves a locked file alone.
    flock(fd, LOCK_EX | LOCK_NB);
    if (unlink(path.c_str()) != 0) {
      e = errno;
      close(fd);
      throw ConfigError("nvme store: cannot unlink the new swap file '" + path + "': " + std::strerror(e) +
                        "; the process needs write permission on '" + dir + "'");
    }
    return fd;
  }
}

StaleSwapFiles reclaim_stale_swap_files(const std::string& dir) {
  StaleSwapFiles out;
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return out;  // the caller has checked the path and reports its own errors
  DIR* d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return out;
  }
  std::vector<std::string> names;
  while (dirent* ent = readdir(d))
    if (swap_file_pid(ent->d_name) != 0) names.emplace_back(ent->d_name);

  std::string pids;
  for (const auto& name : names) {
    const pid_t pid = swap_file_pid(name);
    struct stat st {};
    if (fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    const uint64_t held = static_cast<uint64_t>(st.st_blocks) * 512;
    if (pid == getpid() || !process_is_gone(pid)) {
      ++out.live_files;
      out.live_bytes += held;
      continue;
    }
    const int fd = openat(dfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;  // gone already (another run reclaimed it) or unreadable: not ours to judge
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {  // held by a process this host's pids do not show
      close(fd);
      ++out.live_files;
      out.live_bytes += held;
      continue;
    }
    if (unlinkat(dfd, name.c_str(), 0) == 0) {
      ++out.reclaimed_files;
      out.reclaimed_bytes += held;
      pids += (pids.empty() ? "" : ", ") + std::to_string(pid);
    } else if (errno != ENOENT) {
      log::warn("nvme store: cannot remove the stale swap file '" + join(dir, name) + "' of process " +
                std::to_string(pid) + ", which is gone: " + std::strerror(errno) + "; remove it by hand");
    }
    close(fd);
  }
  closedir(d);  // closes dfd
  if (out.reclaimed_files > 0)
    log::info("nvme store: reclaimed " + std::to_string(out.reclaimed_files) + " stale swap file" +
              (out.reclaimed_files > 1 ? "s" : "") + " (" + format_bytes(out.reclaimed_bytes) + ") in '" + dir +
              "' left by processes that are gone (pid " + pids + ")");
  return out;
}

}  // namespace strata::detail
