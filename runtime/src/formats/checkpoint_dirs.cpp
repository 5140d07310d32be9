// Checkpoint directories (checkpoint.hpp): the directory lock, flock(2) on
// <root>/.strata-lock; finding the step-<N> checkpoints in a directory, and choosing the
// one a run starts from.
#include "checkpoint_dirs.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <span>

#include "checkpoint_format.hpp"
#include "checkpoint_io.hpp"
#include "strata/core/error.hpp"
#include "strata/core/log.hpp"

namespace strata {

namespace fs = std::filesystem;

using namespace checkpoint_format;  // NOLINT: the format's names, used throughout
using namespace checkpoint_detail;  // NOLINT: checkpoint_io.hpp's file I/O and agreement

namespace {

constexpr const char* kLockName = ".strata-lock";

// The directories whose lock this process holds, by (st_dev, st_ino), with a count: a
// save in a process that holds its directory's lock (train) needs no second one.
std::mutex g_held_mutex;
std::map<std::pair<uint64_t, uint64_t>, int> g_held;

// "pid N on host H", as the holder recorded it in the lock file.
std::string holder_of(int fd) {
  char buf[512] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string text = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  long long pid = 0;
  char host[256] = {};
  if (std::sscanf(text.c_str(), "pid %lld host %255s", &pid, host) == 2)
    return "pid " + std::to_string(pid) + " on host " + host;
  return "its pid is not recorded yet: it is starting";
}

std::string this_host() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "unknown";
  return host;
}

[[noreturn]] void not_writable(const fs::path& root, const std::string& what, int err) {
  throw ConfigError("strata.checkpoint_dir '" + root.string() + "' is not writable: " + what + " failed (" +
                    std::strerror(err) + "); fix its permissions or choose another checkpoint_dir");
}

// Rank 0 sends `text` to every rank.
void broadcast_text(coll::Communicator& host, std::string& text) {
  if (host.size() == 1) return;
  int64_t len = static_cast<int64_t>(text.size());
  host.broadcast(std::span<int64_t>(&len, 1), 0).wait();
  std::vector<uint8_t> buf(static_cast<size_t>(len));
  if (host.rank() == 0 && len > 0) std::memcpy(buf.data(), text.data(), buf.size());  // empty: data() may be null
  if (len > 0) host.broadcast(std::span<uint8_t>(buf), 0).wait();
  text.assign(buf.begin(), buf.end());
}

}  // namespace

namespace checkpoint_detail {

bool held_here(const fs::path& root) {
  struct stat st {};
  if (::stat(root.c_str(), &st) != 0) return false;
  std::lock_guard<std::mutex> g(g_held_mutex);
  return g_held.count({st.st_dev, st.st_ino}) > 0;
}

bool is_checkpoint_dir(const fs::path& p) {
  std::error_code ec;
  const std::string name = p.filename().string();
  if (name.starts_with(".step-") && name.ends_with(".tmp")) return true;
  if (name.starts_with("step-") && name.size() >= 13 &&
      std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
      fs::exists(p / rank_file(0), ec))
    return true;
  return fs::exists(p / "manifest.json", ec);
}

std::vector<std::pair<int64_t, fs::path>> step_dirs(const std::string& root, std::vector<fs::path>* leftovers) {
  std::error_code ec;
  std::vector<std::pair<int64_t, fs::path>> found;
  if (!fs::exists(root, ec)) return found;
  if (!fs::is_directory(root, ec))
    throw ConfigError("checkpoint directory '" + root + "' is not a directory: point strata.checkpoint_dir at a directory");
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(".step-") && name.ends_with(".tmp")) {
      if (leftovers) leftovers->push_back(e.path());
      continue;
    }
    if (!name.starts_with("step-") || name.size() < 13 || !e.is_directory(ec)) continue;
    const std::string digits = name.substr(5);
    int64_t step = 0;
    const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
    if (err != std::errc() || end != digits.data() + digits.size() || step < 0) continue;  // not ours
    found.emplace_back(step, e.path());
  }
  if (ec) throw IoError("listing checkpoint directory", root, 0, 0, ec.value(), kCheckpointDiskFull);
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return found;
}

}  // namespace checkpoint_detail

CheckpointDirLock CheckpointDirLockAccess::take(const fs::path& root) {
  const fs::path lp = root / kLockName;
  Fd f(::open(lp.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (f.fd < 0) {
    const int err = errno;
    if (err == EACCES || err == EPERM || err == EROFS) not_writable(root, "creating its lock file " + lp.string(), err);
    throw IoError("opening the checkpoint directory's lock file", lp.string(), 0, 0, err, kCheckpointDiskFull);
  }
  while (::flock(f.fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EWOULDBLOCK)
      throw ConfigError("checkpoint_dir " + root.string() + " is in use by another strata train (" + holder_of(f.fd) +
                        "); wait for it or choose another checkpoint_dir");
    throw ConfigError("cannot lock checkpoint_dir " + root.string() + ": flock(2) on " + lp.string() + " failed (" +
                      std::strerror(err) + "); its filesystem does not support flock: mount it with flock support "
                      "(Lustre: -o flock) or choose a checkpoint_dir on another filesystem");
  }
  const std::string me = "pid " + std::to_string(::getpid()) + " host " + this_host() + "\n";
  if (::ftruncate(f.fd, 0) != 0) not_writable(root, "writing its lock file " + lp.string(), errno);
  write_all(f.fd, me.data(), me.size(), 0, lp.string());
  struct stat st {};
  if (::stat(root.c_str(), &st) != 0)
    throw IoError("stat of checkpoint directory", root.string(), 0, 0, errno, kCheckpointDiskFull);
  CheckpointDirLock lock;
  lock.fd_ = f.fd;
  f.fd = -1;
  lock.dev_ = st.st_dev;
  lock.ino_ = st.st_ino;
  std::lock_guard<std::mutex> g(g_held_mutex);
  ++g_held[{lock.dev_, lock.ino_}];
  return lock;
}

void CheckpointDirLockAccess::release_and_remove(CheckpointDirLock& lock, const fs::path& root) {
  if (lock.held()) ::unlink((root / kLockName).c_str());
  lock.release();
}

bool CheckpointDirLockAccess::has_lock_file(const fs::path& root) {
  std::error_code ec;
  return fs::exists(root / kLockName, ec);
}

CheckpointDirLock::CheckpointDirLock(CheckpointDirLock&& o) noexcept : fd_(o.fd_), dev_(o.dev_), ino_(o.ino_) {
  o.fd_ = -1;
}

CheckpointDirLock& CheckpointDirLock::operator=(CheckpointDirLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = o.fd_;
    dev_ = o.dev_;
    ino_ = o.ino_;
    o.fd_ = -1;
  }
  return *this;
}

CheckpointDirLock::~CheckpointDirLock() { release(); }

void CheckpointDirLock::release() {
  if (fd_ < 0) return;
  {
    std::lock_guard<std::mutex> g(g_held_mutex);
    auto it = g_held.find({dev_, ino_});
    if (it != g_held.end() && --it->second == 0) g_held.erase(it);
  }
  ::close(fd_);  // releases the flock (the file stays: removing it would race a waiting run)
  fd_ = -1;
}

CheckpointDirLock lock_checkpoint_dir(coll::Communicator& host, const std::string& root) {
  CheckpointDirLock lock;
  std::exception_ptr ep;
  if (host.rank() == 0) {
    try {
      if (root.empty()) throw ConfigError("no checkpoint directory given: set strata.checkpoint_dir");
      fs::path p = fs::absolute(fs::path(root)).lexically_normal();
      if (p.filename().empty() && p != p.root_path()) p = p.parent_path();  // a trailing '/'
      // A checkpoint is not a directory of checkpoints: new ones would nest inside it, and
      // --resume would not find it.
      for (fs::path q = p; q != q.root_path(); q = q.parent_path())
        if (is_checkpoint_dir(q))
          throw ConfigError("strata.checkpoint_dir '" + root + "' is " +
                            (q == p ? std::string("a checkpoint") : "inside the checkpoint '" + q.string() + "'") +
                            " (a step-<N> directory, or one holding a manifest.json), not a directory of checkpoints: "
                            "set it to the directory that holds the step-<N> directories ('" +
                            q.parent_path().string() + "'); to resume from this checkpoint, add --resume-from " +
                            q.string());
      std::error_code ec;
      fs::create_directories(p, ec);
      if (ec)
        throw ConfigError("cannot create strata.checkpoint_dir '" + root + "': " + ec.message() +
                          "; choose a directory whose parent is a writable directory");
      if (!fs::is_directory(p, ec))
        throw ConfigError("strata.checkpoint_dir '" + root + "' is not a directory: point it at a directory");
      lock = CheckpointDirLockAccess::take(p);
      // Writable for checkpoints: a new file, not only the lock file an earlier run left.
      // One name for every run: the lock is held, so a probe found here is the leftover of
      // a holder killed between creating and removing it, and this one replaces it.
      const fs::path probe = p / ".strata-probe";
      Fd f(::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      if (f.fd < 0) not_writable(p, "creating a file in it (" + probe.string() + ")", errno);
      f.close_checked(probe.string());
      if (::unlink(probe.c_str()) != 0) not_writable(p, "removing a file from it (" + probe.string() + ")", errno);
    } catch (...) {
      ep = std::current_exception();
      lock = CheckpointDirLock();
    }
  }
  if (auto f = agree(host, ep)) f->raise(host.rank());
  return lock;
}

std::optional<std::string> latest_checkpoint(const std::string& root) {
  std::vector<fs::path> leftovers;
  const auto found = step_dirs(root, &leftovers);
  for (const auto& t : leftovers) log::warn("ignoring '" + t.string() + "': a checkpoint save that did not finish");
  for (const auto& [step, dir] : found) {
    try {
      read_checkpoint_info(dir.string());
      return dir.string();
    } catch (const Error& e) {
      log::warn("skipping checkpoint '" + dir.string() + "': " + e.what());
    }
  }
  return std::nullopt;
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& root) {
  std::vector<CheckpointEntry> out;
  for (const auto& [step, dir] : step_dirs(root, nullptr)) {
    CheckpointEntry e{step, dir.string(), ""};
    try {
      read_checkpoint_info(e.dir);
    } catch (const Error& err) {
      e.problem = err.what();
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::string other_checkpoints_hint(const std::string& failed) {
  fs::path f = fs::path(failed).lexically_normal();
  if (f.filename().empty()) f = f.parent_path();
  const fs::path parent = f.has_parent_path() ? f.parent_path() : fs::path(".");
  std::vector<std::string> names;
  std::string newest;
  try {
    for (const auto& e : list_checkpoints(parent.string())) {
      if (!e.problem.empty() || fs::path(e.dir).filename() == f.filename()) continue;
      names.push_back(fs::path(e.dir).filename().string());
      if (newest.empty()) newest = e.dir;
    }
  } catch (const Error&) {
    return "";
  }
  if (names.empty()) return "; '" + parent.string() + "' holds no other complete checkpoint";
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  return "; the complete checkpoints in '" + parent.string() + "': " + list +
         "; resume from one with strata train --resume-from " + newest;
}

std::string choose_start_checkpoint(coll::Communicator& host, const std::string& root, bool resume,
                                    const std::string& from) {
  std::string start;
  std::exception_ptr ep;
  if (host.rank() == 0) {
    try {
      int64_t k = 0;
      std::error_code ec;
      if (!from.empty()) {
        if (fs::is_directory(from, ec) && !fs::exists(fs::path(from) / "manifest.json", ec)) {
          const auto inside = step_dirs(from, nullptr);
          if (!inside.empty())
            throw ConfigError("--resume-from '" + from + "' is a directory of checkpoints, not one: name one of its "
                              "step-<N> directories (the newest is " + inside.front().second.string() +
                              "), or resume from its latest with --resume and strata.checkpoint_dir=" + from);
        }
        try {
          k = read_checkpoint_info(from).step;
        } catch (const CorruptionError& e) {
          throw CorruptionError(e.what() + other_checkpoints_hint(from));
        }
        start = from;
      } else if (resume) {
        if (auto latest = latest_checkpoint(root)) {
          start = *latest;
          k = read_checkpoint_info(start).step;
        }
      }
      // Checkpoints beyond the start: a save would reach one and stop ("exists already").
      std::vector<CheckpointEntry> beyond;
      std::string latest_complete;
      int64_t latest_step = 0;
      if (!root.empty())
        for (auto& e : list_checkpoints(root)) {
          if (e.problem.empty() && latest_complete.empty()) latest_complete = e.dir, latest_step = e.step;
          if (e.step > k) beyond.push_back(std::move(e));
        }
      if (!beyond.empty()) {
        std::string names;
        for (const auto& e : beyond)
          names += (names.empty() ? "" : ", ") + fs::path(e.dir).filename().string() +
                   (e.problem.empty() ? "" : " (damaged: " + e.problem + ")");
        std::string msg = "strata.checkpoint_dir '" + root + "' holds " + names;
        msg += start.empty() ? ", and this run starts from step 0"
                             : ", beyond step " + std::to_string(k) + " where this run resumes (" + start + ")";
        msg += ": its saves would stop at the first of them they reach, since a checkpoint is never overwritten. "
               "Move " + std::string(beyond.size() == 1 ? "it" : "them") + " out of '" + root + "'";
        if (!latest_complete.empty() && latest_step > k)
          msg += ", or resume from the latest complete one with --resume (" + latest_complete + ")";
        msg += ", or choose another strata.checkpoint_dir";
        throw ConfigError(msg);
      }
      if (resume && start.empty())
        log::warn("--resume: no complete checkpoint in " + root + "; starting from step 0");
    } catch (...) {
      ep = std::current_exception();
    }
  }
  if (auto f = agree(host, ep)) f->raise(host.rank());
  broadcast_text(host, start);
  return start;
}

}  // namespace strata
