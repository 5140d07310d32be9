#include "strata/runtime/formats/checkpoint.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <span>

#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/core/log.hpp"
#include "strata/core/safe_io.hpp"
#include "checkpoint_format.hpp"
#include "strata/runtime/train/train.hpp"

namespace strata {

namespace fs = std::filesystem;
using nlohmann::json;

using namespace checkpoint_format;  // NOLINT: the format's names, used throughout

namespace {

// What a full disk during a save asks for (IoError); the save's .tmp directory is removed.
constexpr const char* kCheckpointDiskFull =
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

void write_all(int fd, const void* data, uint64_t n, uint64_t offset, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, std::min<uint64_t>(n, 1ull << 30), static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw IoError("writing checkpoint file", path, offset, n, errno, kCheckpointDiskFull);
    }
    if (w == 0) throw IoError("writing checkpoint file", path, offset, n, ENOSPC, kCheckpointDiskFull);
    p += w;
    offset += static_cast<uint64_t>(w);
    n -= static_cast<uint64_t>(w);
  }
}

void read_exact(int fd, void* data, uint64_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(data);
  const uint64_t want_end = offset + n;
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, std::min<uint64_t>(n, 1ull << 30), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw IoError("reading checkpoint file", path, offset, n, errno, kCheckpointDiskFull);
    }
    if (r == 0)
      throw CorruptionError("checkpoint file '" + path + "' ends at byte " + std::to_string(offset) +
                            ", expected at least " + std::to_string(want_end) +
                            " bytes: it is truncated; resume from another checkpoint");
    p += r;
    offset += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
}

void fsync_fd(int fd, const std::string& path) {
  if (::fsync(fd) != 0) throw IoError("fsync of checkpoint file", path, 0, 0, errno, kCheckpointDiskFull);
}

void fsync_dir(const fs::path& dir) {
  Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.fd < 0) throw IoError("opening directory for fsync", dir.string(), 0, 0, errno, kCheckpointDiskFull);
  if (::fsync(d.fd) != 0) throw IoError("fsync of directory", dir.string(), 0, 0, errno, kCheckpointDiskFull);
}

// A regular file only (a FIFO would block, /dev/zero never end), of bounded size.
std::string read_text(const fs::path& p) { return read_input_file(p, "checkpoint manifest", 256 << 20); }

// Test hook (checkpoint.hpp): die here, as a crash would, leaving what is on disk.
void maybe_kill(const char* point, int rank) {
  const char* v = std::getenv("STRATA_CHECKPOINT_KILL");
  if (rank == 0 && v != nullptr && std::strcmp(v, point) == 0) ::raise(SIGKILL);
}

// ---------------------------------------------------------------------------------------
// Agreement: every rank learns whether any rank failed, and all throw the error of the
// lowest failing rank, so that no rank goes on into a collective the others left.

struct Failure {
  int origin = 0;           // rank that failed first (lowest)
  std::exception_ptr mine;  // set on the origin rank
  json desc;                // kind, what, and for I/O errors path/offset/length/errno

  [[noreturn]] void raise(int rank) const {
    if (rank == origin && mine) std::rethrow_exception(mine);
    const std::string kind = desc.value("kind", "error");
    const std::string what = "on rank " + std::to_string(origin) + ": " + desc.value("what", "");
    if (kind == "io")
      throw IoError("checkpoint I/O failed on rank " + std::to_string(origin), desc.value("path", ""),
                    desc.value("offset", uint64_t{0}), desc.value("length", uint64_t{0}), desc.value("errno", 0), kCheckpointDiskFull);
    if (kind == "config") throw ConfigError(what);
    if (kind == "corruption") throw CorruptionError(what);
    throw Error(what);
  }
};

json describe(const std::exception_ptr& ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const IoError& e) {
    return {{"kind", "io"}, {"what", e.what()}, {"path", e.path()}, {"offset", e.offset()},
            {"length", e.length()}, {"errno", e.error_code()}};
  } catch (const ConfigError& e) {
    return {{"kind", "config"}, {"what", e.what()}};
  } catch (const CorruptionError& e) {
    return {{"kind", "corruption"}, {"what", e.what()}};
  } catch (const std::exception& e) {
    return {{"kind", "error"}, {"what", e.what()}};
  }
}

std::optional<Failure> agree(coll::Communicator& host, const std::exception_ptr& ep) {
  const int world = host.size(), rank = host.rank();
  int32_t flag = ep ? world - rank : 0;  // the maximum names the lowest failing rank
  host.all_reduce(std::span<int32_t>(&flag, 1), coll::ReduceOp::Max).wait();
  if (flag == 0) return std::nullopt;
  Failure f;
  f.origin = world - flag;
  std::string msg;
  if (rank == f.origin) {
    f.mine = ep;
    msg = describe(ep).dump();
  }
  int64_t len = static_cast<int64_t>(msg.size());
  host.broadcast(std::span<int64_t>(&len, 1), f.origin).wait();
  std::vector<uint8_t> buf(static_cast<size_t>(len));
  if (rank == f.origin) std::memcpy(buf.data(), msg.data(), buf.size());
  if (len > 0) host.broadcast(std::span<uint8_t>(buf), f.origin).wait();
  f.desc = json::parse(buf.begin(), buf.end(), nullptr, false);
  if (f.desc.is_discarded()) f.desc = json{{"kind", "error"}, {"what", "(unreadable error message)"}};
  return f;
}

// ---------------------------------------------------------------------------------------
// Reading elements [begin, begin + count) of group g, of the states in `outs` (nullptr:
// not wanted), from the writers' files. Elements at or beyond numel are padding: 0.
// Every writer segment touched is read whole and its checksum verified.

void read_range(const CheckpointInfo& info, size_t g, uint64_t begin, uint64_t count, float* const outs[kStates]) {
  const CheckpointGroup& gr = info.groups.at(g);
  const uint64_t end = begin + count;
  for (int k = 0; k < kStates; ++k)
    if (outs[k] && end > gr.numel) {
      const uint64_t from = std::max(begin, gr.numel);
      std::fill(outs[k] + (from - begin), outs[k] + count, 0.0f);
    }
  const uint64_t data_end = std::min(end, gr.numel);
  if (begin >= data_end) return;
  const uint64_t S = gr.shard;
  const uint64_t goff = group_offset(info, g);
  std::vector<float> seg;
  for (uint64_t w = begin / S; w <= (data_end - 1) / S; ++w) {
    const CheckpointFile& file = info.files.at(w);
    const std::string path = (fs::path(info.dir) / file.name).string();
    Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (f.fd < 0) {
      const int err = errno;
      if (err == ENOENT)
        throw CorruptionError("checkpoint file '" + path + "' is missing: the checkpoint is incomplete; resume from another one");
      throw IoError("opening checkpoint file", path, 0, 0, err, kCheckpointDiskFull);
    }
    const uint64_t lo = std::max(begin, w * S), hi = std::min(data_end, (w + 1) * S);  // global
    for (int k = 0; k < kStates; ++k) {
      if (!outs[k]) continue;
      const uint64_t off = goff + static_cast<uint64_t>(k) * S * 4;
      // Same sharding: the slice is the whole segment, read straight into place.
      const bool whole = lo == w * S && hi - lo == S;
      float* dst = whole ? outs[k] + (lo - begin) : nullptr;
      if (!whole) {
        seg.resize(S);
        dst = seg.data();
      }
      read_exact(f.fd, dst, S * 4, off, path);
      const uint64_t got = XXH3_64bits(dst, S * 4), want = file.segments[kStates * g + k];
      if (got != want)
        throw CorruptionError("checkpoint file '" + path + "' is corrupt: the " + kStateNames[k] + " of group '" +
                              gr.name + "' (bytes " + std::to_string(off) + " to " + std::to_string(off + S * 4) +
                              ") has xxh3 " + hex64(got) + ", the manifest expects " + hex64(want) +
                              "; resume from another checkpoint");
      if (!whole) std::memcpy(outs[k] + (lo - begin), seg.data() + (lo - w * S), (hi - lo) * 4);
    }
  }
}

// Groups saved in parts (gpt_parts, "block.3@1536") belong to the group they cut: the
// model's groups, each with its parts' indices and first elements. A name without '@' is a
// whole group. Parts must follow each other from element 0.
struct ModelGroup {
  std::string name;
  uint64_t numel = 0;
  std::vector<size_t> parts;      // indices into the list the groups came from
  std::vector<uint64_t> offsets;  // each part's first element in the model group
};

template <class NameOf, class NumelOf>
std::vector<ModelGroup> merge_parts(size_t n, NameOf name_of, NumelOf numel_of, const std::string& where) {
  std::vector<ModelGroup> out;
  for (size_t k = 0; k < n; ++k) {
    const PartName pn = parse_part_name(name_of(k));
    if (pn.offset == 0 || out.empty() || out.back().name != pn.group) out.push_back({pn.group, 0, {}, {}});
    ModelGroup& m = out.back();
    if (pn.offset != m.numel)
      throw CorruptionError(where + ": group '" + name_of(k) + "' starts at element " + std::to_string(pn.offset) +
                            " of '" + pn.group + "', whose parts before it end at " + std::to_string(m.numel));
    m.parts.push_back(k);
    m.offsets.push_back(m.numel);
    m.numel += numel_of(k);
  }
  return out;
}

std::vector<ModelGroup> model_groups(const CheckpointInfo& info) {
  return merge_parts(
      info.groups.size(), [&](size_t k) { return info.groups[k].name; }, [&](size_t k) { return info.groups[k].numel; },
      "checkpoint '" + info.dir + "'");
}

std::vector<ModelGroup> model_groups(const ZeroEngine& engine) {
  return merge_parts(
      static_cast<size_t>(engine.num_groups()), [&](size_t k) { return engine.group_name(static_cast<int>(k)); },
      [&](size_t k) { return engine.group_numel(static_cast<int>(k)); }, "the engine's groups");
}

// Elements [begin, begin + count) of the model's group m (within its numel), of the states
// in `outs`, from whichever saved groups (parts) hold them.
void read_model_range(const CheckpointInfo& info, const ModelGroup& m, uint64_t begin, uint64_t count,
                      float* const outs[kStates]) {
  const uint64_t end = begin + count;
  STRATA_CHECK(end <= m.numel, "read_model_range beyond its group");
  for (size_t i = 0; i < m.parts.size(); ++i) {
    const uint64_t lo_p = m.offsets[i], hi_p = lo_p + info.groups[m.parts[i]].numel;
    const uint64_t lo = std::max(begin, lo_p), hi = std::min(end, hi_p);
    if (lo >= hi) continue;
    float* sub[kStates];
    for (int k = 0; k < kStates; ++k) sub[k] = outs[k] ? outs[k] + (lo - begin) : nullptr;
    read_range(info, m.parts[i], lo - lo_p, hi - lo, sub);
  }
}

void check_groups(ZeroEngine& engine, const CheckpointInfo& info) {
  const std::string fix =
      "; resume with the model configuration (strata.model) the checkpoint was saved with, or start a new run with "
      "another strata.checkpoint_dir";
  const std::vector<ModelGroup> here = model_groups(engine), saved = model_groups(info);
  if (here.size() != saved.size())
    throw ConfigError("checkpoint is of another model shape: the model here has " + std::to_string(here.size()) +
                      " parameter groups, the checkpoint '" + info.dir + "' has " + std::to_string(saved.size()) + fix);
  for (size_t g = 0; g < here.size(); ++g)
    if (here[g].numel != saved[g].numel)
      throw ConfigError("checkpoint is of another model shape: group '" + saved[g].name + "' has " +
                        std::to_string(here[g].numel) + " elements here, " + std::to_string(saved[g].numel) +
                        " in the checkpoint '" + info.dir + "'" + fix);
}

void write_rank_file(ZeroEngine& engine, const fs::path& path, CheckpointFile& out) {
  const std::string p = path.string();
  Fd f(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (f.fd < 0) throw IoError("creating checkpoint file", p, 0, 0, errno, kCheckpointDiskFull);
  uint64_t off = 0;
  std::vector<float> states[kStates];
  for (int g = 0; g < engine.num_groups(); ++g) {
    const uint64_t n = engine.shard_numel(g);
    for (auto& s : states) s.resize(n);
    engine.read_optimizer_shard(g, states[0].data(), states[1].data(), states[2].data());
    for (auto& s : states) {
      out.segments.push_back(XXH3_64bits(s.data(), n * 4));
      write_all(f.fd, s.data(), n * 4, off, p);
      off += n * 4;
    }
  }
  fsync_fd(f.fd, p);
  f.close_checked(p);
  out.bytes = off;
}

void write_manifest(const fs::path& path, const CheckpointInfo& info) {
  json j = info_to_json(info);
  j["checksum"] = hex64(manifest_hash(j));
  const std::string text = j.dump(1) + "\n";
  const std::string p = path.string();
  Fd f(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (f.fd < 0) throw IoError("creating checkpoint manifest", p, 0, 0, errno, kCheckpointDiskFull);
  write_all(f.fd, text.data(), text.size(), 0, p);
  fsync_fd(f.fd, p);
  f.close_checked(p);
}

void fs_call(const std::error_code& ec, const char* what, const fs::path& p) {
  if (ec) throw IoError(what, p.string(), 0, 0, ec.value(), kCheckpointDiskFull);
}

// ---------------------------------------------------------------------------------------
// The directory lock (checkpoint.hpp): flock(2) on <root>/.strata-lock.

constexpr const char* kLockName = ".strata-lock";

// The directories whose lock this process holds, by (st_dev, st_ino), with a count: a
// save in a process that holds its directory's lock (train) needs no second one.
std::mutex g_held_mutex;
std::map<std::pair<uint64_t, uint64_t>, int> g_held;

bool held_here(const fs::path& root) {
  struct stat st {};
  if (::stat(root.c_str(), &st) != 0) return false;
  std::lock_guard<std::mutex> g(g_held_mutex);
  return g_held.count({st.st_dev, st.st_ino}) > 0;
}

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

// True for a directory Strata wrote as one checkpoint: one holding a manifest.json, a
// .step-<N>.tmp directory, or a step-<N> directory (N of 8 digits or more) holding a
// rank file (a damaged checkpoint; the name alone could be a user's "step-20240101").
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

// Every step-<N> directory under root (parsed name), and the leftover .tmp directories.
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

struct CheckpointDirLockAccess {
  // Takes the lock of root (an existing directory) or throws a ConfigError naming the
  // holder. A lock file that cannot be created means root is not writable.
  static CheckpointDirLock take(const fs::path& root) {
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
    if (::stat(root.c_str(), &st) != 0) throw IoError("stat of checkpoint directory", root.string(), 0, 0, errno, kCheckpointDiskFull);
    CheckpointDirLock lock;
    lock.fd_ = f.fd;
    f.fd = -1;
    lock.dev_ = st.st_dev;
    lock.ino_ = st.st_ino;
    std::lock_guard<std::mutex> g(g_held_mutex);
    ++g_held[{lock.dev_, lock.ino_}];
    return lock;
  }
};

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

// ---------------------------------------------------------------------------------------

namespace {

// Collective, the last stage of writing a checkpoint (a save or an import): rank 0 learns
// every rank's file (its size and segment checksums, `mine` from each), completes `info`
// with them, writes the manifest into tmp and renames tmp to final_dir. Rank 0's error,
// if any, is returned there (the caller agrees on it); the other ranks return null.
std::exception_ptr publish_checkpoint(coll::Communicator& host, CheckpointInfo info, const CheckpointFile& mine,
                                      const fs::path& tmp, const fs::path& final_dir) {
  const int rank = host.rank(), world = host.size();
  const size_t rec = 1 + mine.segments.size();  // [bytes, segments...] per rank
  std::vector<int64_t> send(rec), all(rec * static_cast<size_t>(world));
  send[0] = static_cast<int64_t>(mine.bytes);
  for (size_t i = 0; i < mine.segments.size(); ++i) send[1 + i] = static_cast<int64_t>(mine.segments[i]);
  host.all_gather(send, all).wait();
  if (rank != 0) return nullptr;
  try {
    info.world_size = world;
    info.files.clear();
    for (int r = 0; r < world; ++r) {
      CheckpointFile cf{rank_file(r), static_cast<uint64_t>(all[r * rec]), {}};
      for (size_t i = 1; i < rec; ++i) cf.segments.push_back(static_cast<uint64_t>(all[r * rec + i]));
      info.files.push_back(std::move(cf));
    }
    maybe_kill("before-manifest", rank);
    write_manifest(tmp / "manifest.json", info);
    fsync_dir(tmp);
    maybe_kill("before-rename", rank);
    if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
      throw IoError("renaming the finished checkpoint into place", final_dir.string(), 0, 0, errno, kCheckpointDiskFull);
    fsync_dir(final_dir.parent_path());
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

}  // namespace

std::string save_checkpoint(ZeroEngine& engine, coll::Communicator& host, const std::string& root,
                            const json& config, const json& extra, const std::vector<std::string>& group_names) {
  const int rank = host.rank(), world = host.size();
  STRATA_CHECK(world == engine.comm().size() && rank == engine.comm().rank(),
               "save_checkpoint: the host communicator must span the engine's ranks in the same order");
  STRATA_CHECK(group_names.empty() || group_names.size() == static_cast<size_t>(engine.num_groups()),
               "save_checkpoint: " + std::to_string(group_names.size()) + " group names for " +
                   std::to_string(engine.num_groups()) + " groups");
  const int64_t step = engine.iterations();
  const fs::path rootp(root);
  const fs::path final_dir = rootp / step_name(step);
  const fs::path tmp = rootp / ("." + step_name(step) + ".tmp");

  // 1. Rank 0 makes the temporary directory (replacing the leftover of a crashed save),
  // holding the directory's lock: its own run's (train), or one for this save.
  std::exception_ptr ep;
  CheckpointDirLock save_lock;
  if (rank == 0) {
    try {
      if (root.empty()) throw ConfigError("no checkpoint directory given: set strata.checkpoint_dir");
      std::error_code ec;
      fs::create_directories(rootp, ec);
      fs_call(ec, "creating checkpoint directory", rootp);
      if (!held_here(rootp)) save_lock = CheckpointDirLockAccess::take(rootp);
      if (fs::exists(final_dir, ec))
        throw ConfigError("checkpoint '" + final_dir.string() +
                          "' exists already and a checkpoint is never overwritten: move it away, or resume from it "
                          "(--resume) instead of starting over, or use another strata.checkpoint_dir");
      if (fs::exists(tmp, ec)) {
        log::warn("removing '" + tmp.string() + "', left by a save of step " + std::to_string(step) +
                  " that did not finish");
        fs::remove_all(tmp, ec);
        fs_call(ec, "removing a leftover temporary checkpoint", tmp);
      }
      fs::create_directory(tmp, ec);
      fs_call(ec, "creating temporary checkpoint directory", tmp);
    } catch (...) {
      ep = std::current_exception();
    }
  }
  if (auto f = agree(host, ep)) f->raise(rank);

  auto fail = [&](const Failure& f) {
    if (rank == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      if (ec) log::warn("could not remove '" + tmp.string() + "' after a failed save: " + ec.message());
    }
    f.raise(rank);
  };

  // 2. Every rank writes and fsyncs its shards.
  CheckpointFile mine{rank_file(rank), 0, {}};
  try {
    write_rank_file(engine, tmp / mine.name, mine);
  } catch (...) {
    ep = std::current_exception();
  }
  if (auto f = agree(host, ep)) fail(*f);

  // 3. Rank 0 writes the manifest with every rank's file, then renames the directory into place.
  CheckpointInfo info;
  info.step = step;
  info.optimizer_steps = engine.optimizer_steps();
  info.precision = precision_name(engine.dtype());
  if (engine.loss_scaler().enabled()) info.loss_scaler = engine.loss_scaler().state();
  info.config = config;
  info.extra = extra;
  for (int g = 0; g < engine.num_groups(); ++g) {
    const uint64_t shard = engine.shard_numel(g);
    info.groups.push_back({group_names.empty() ? "group." + std::to_string(g) : group_names[static_cast<size_t>(g)],
                           engine.group_numel(g), shard * world, shard});
  }
  ep = publish_checkpoint(host, std::move(info), mine, tmp, final_dir);
  if (auto f = agree(host, ep)) fail(*f);
  return final_dir.string();
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

CheckpointInfo read_checkpoint_info(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw ConfigError("checkpoint '" + dir + "' is not a directory: give a step-<N> directory written by Strata");
  const fs::path mpath = fs::path(dir) / "manifest.json";
  if (!fs::exists(mpath, ec))
    throw CorruptionError("checkpoint '" + dir +
                          "' has no manifest.json: it is incomplete (a save that did not finish, or files removed); "
                          "resume from another checkpoint");
  CheckpointInfo info = parse_manifest(fs::path(dir), mpath, read_text(mpath));
  for (const auto& f : info.files) {
    const fs::path p = fs::path(dir) / f.name;
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      if (errno == ENOENT)
        throw CorruptionError("checkpoint file '" + p.string() + "' is missing: the checkpoint is incomplete; resume from another one");
      throw IoError("stat of checkpoint file", p.string(), 0, 0, errno, kCheckpointDiskFull);
    }
    if (static_cast<uint64_t>(st.st_size) != f.bytes)
      throw CorruptionError("checkpoint file '" + p.string() + "' is " + std::to_string(st.st_size) +
                            " bytes, the manifest says " + std::to_string(f.bytes) +
                            (static_cast<uint64_t>(st.st_size) < f.bytes ? " (truncated)" : " (damaged)") +
                            "; resume from another checkpoint");
  }
  return info;
}

namespace {

// Collective: checks `dir` against the engine, then gives each rank its slice of every
// group: the masters and, unless weights_only, the moments (weights_only: zeros, and the
// optimizer's step count 0). Every rank gets the same error.
CheckpointInfo load_shards(ZeroEngine& engine, coll::Communicator& host, const std::string& dir, bool weights_only) {
  const int rank = host.rank();
  STRATA_CHECK(host.size() == engine.comm().size() && rank == engine.comm().rank(),
               "loading a checkpoint: the host communicator must span the engine's ranks in the same order");
  CheckpointInfo info;
  std::exception_ptr ep;
  try {
    info = read_checkpoint_info(dir);
    check_groups(engine, info);
  } catch (...) {
    ep = std::current_exception();
  }
  if (auto f = agree(host, ep)) f->raise(rank);

  // Each engine group (a whole group, or a part of one) reads its elements of the model's
  // group from whichever saved groups hold them: the same cut, or another.
  const std::vector<ModelGroup> here = model_groups(engine), saved = model_groups(info);
  for (size_t mg = 0; mg < here.size(); ++mg)
    for (size_t i = 0; i < here[mg].parts.size(); ++i) {
      const int g = static_cast<int>(here[mg].parts[i]);
      const uint64_t n = engine.shard_numel(g), numel = engine.group_numel(g);
      std::vector<float> m(n, 0.0f), a(n, 0.0f), v(n, 0.0f);
      try {
        float* outs[kStates] = {m.data(), weights_only ? nullptr : a.data(), weights_only ? nullptr : v.data()};
        const uint64_t lo = std::min(numel, static_cast<uint64_t>(rank) * n), hi = std::min(numel, lo + n);  // padding: 0
        if (hi > lo) read_model_range(info, saved[mg], here[mg].offsets[i] + lo, hi - lo, outs);  // these bytes only
      } catch (...) {
        ep = std::current_exception();
      }
      if (auto f = agree(host, ep)) f->raise(rank);
      engine.write_optimizer_shard(g, m.data(), a.data(), v.data(), weights_only ? 0 : info.optimizer_steps);
    }
  return info;
}

}  // namespace

CheckpointInfo load_checkpoint(ZeroEngine& engine, coll::Communicator& host, const std::string& dir) {
  CheckpointInfo info = load_shards(engine, host, dir, false);
  engine.set_iterations(info.step);
  const std::string now = precision_name(engine.dtype());
  if (info.precision != now && host.rank() == 0)
    log::warn("checkpoint '" + dir + "' trained in " + info.precision + "; resuming in " + now +
              ": its fp32 master weights and moments carry over exactly, the " + now +
              " working parameters are rebuilt from them");
  if (engine.loss_scaler().enabled() && info.loss_scaler) engine.loss_scaler().restore(*info.loss_scaler);
  return info;
}

CheckpointInfo load_checkpoint_weights(ZeroEngine& engine, coll::Communicator& host, const std::string& dir) {
  return load_shards(engine, host, dir, true);
}

// ---------------------------------------------------------------------------------------
// A checkpoint written without an engine (strata import).

struct InitialCheckpointWriter::State {
  fs::path root, tmp, final_dir;
  CheckpointDirLock lock;
  Fd file;
  uint64_t offset = 0;
  CheckpointInfo info;   // groups; files[0]: this rank's
  std::unique_ptr<coll::Communicator> self;  // the host communicator of a one-rank writer
  coll::Communicator* host = nullptr;
  bool done = false;
};

InitialCheckpointWriter::InitialCheckpointWriter(const std::string& root, coll::Communicator* host)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  if (!host) {
    s.self = coll::make_host_communicator(coll::HostBackend::Self);
    host = s.self.get();
  }
  s.host = host;
  rank_ = host->rank();
  world_ = host->size();
  std::exception_ptr ep;
  try {
    if (root.empty()) throw ConfigError("no output directory given: pass --out DIR");
    s.root = fs::absolute(fs::path(root)).lexically_normal();
    if (s.root.filename().empty()) s.root = s.root.parent_path();
    s.final_dir = s.root / step_name(0);
    s.tmp = s.root / ("." + step_name(0) + ".tmp");
    if (rank_ == 0) {
      for (fs::path q = s.root; q != q.root_path(); q = q.parent_path())
        if (is_checkpoint_dir(q))
          throw ConfigError("--out '" + root + "' is " +
                            (q == s.root ? std::string("a checkpoint") : "inside the checkpoint '" + q.string() + "'") +
                            ": give a new directory to hold the imported checkpoint");
      std::error_code ec;
      fs::create_directories(s.root, ec);
      if (ec) throw ConfigError("cannot create --out '" + root + "': " + ec.message());
      s.lock = CheckpointDirLockAccess::take(s.root);
      std::vector<fs::path> leftovers;
      if (!step_dirs(s.root.string(), &leftovers).empty())
        throw ConfigError("--out '" + root + "' holds checkpoints already, which an import never touches: give a new "
                          "directory");
      fs::remove_all(s.tmp, ec);
      fs::create_directory(s.tmp, ec);
      fs_call(ec, "creating temporary checkpoint directory", s.tmp);
    }
  } catch (...) {
    ep = std::current_exception();
  }
  if (auto f = agree(*host, ep)) f->raise(rank_);
  try {
    const fs::path rf = s.tmp / rank_file(rank_);
    s.file.fd = ::open(rf.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (s.file.fd < 0) throw IoError("creating checkpoint file", rf.string(), 0, 0, errno, kCheckpointDiskFull);
  } catch (...) {
    ep = std::current_exception();
  }
  if (auto f = agree(*host, ep)) {
    std::error_code ec;
    if (rank_ == 0) fs::remove_all(s.tmp, ec);  // the destructor does not run for a constructor that throws
    f->raise(rank_);
  }
  s.info.world_size = world_;
  s.info.files.push_back({rank_file(rank_), 0, {}});
}

InitialCheckpointWriter::~InitialCheckpointWriter() {
  if (s_ && !s_->done) {
    std::error_code ec;
    if (s_->file.fd >= 0) ::close(s_->file.fd), s_->file.fd = -1;
    if (rank_ == 0) fs::remove_all(s_->tmp, ec);
  }
}

uint64_t InitialCheckpointWriter::shard_size(uint64_t numel) const {
  return (numel + static_cast<uint64_t>(world_) - 1) / static_cast<uint64_t>(world_);
}

void InitialCheckpointWriter::add_group(const std::string& name, const float* shard, uint64_t numel) {
  State& s = *s_;
  const std::string p = (s.tmp / rank_file(rank_)).string();
  const uint64_t n = shard_size(numel);
  const std::vector<float> zeros(n, 0.0f);
  for (const float* seg : {shard, zeros.data(), zeros.data()}) {
    s.info.files[0].segments.push_back(XXH3_64bits(seg, n * 4));
    write_all(s.file.fd, seg, n * 4, s.offset, p);
    s.offset += n * 4;
  }
  s.info.groups.push_back({name, numel, n * static_cast<uint64_t>(world_), n});
}

std::string InitialCheckpointWriter::finish(const nlohmann::json& config, const std::string& precision,
                                            const nlohmann::json& extra, std::exception_ptr failed) {
  State& s = *s_;
  coll::Communicator& host = *s.host;
  std::exception_ptr ep = failed;
  if (!ep) try {
      const std::string p = (s.tmp / rank_file(rank_)).string();
      fsync_fd(s.file.fd, p);
      s.file.close_checked(p);
    } catch (...) {
      ep = std::current_exception();
    }
  if (auto f = agree(host, ep)) f->raise(rank_);  // the destructor removes the .tmp
  CheckpointInfo info = s.info;  // the groups
  info.step = 0;
  info.optimizer_steps = 0;
  info.precision = precision;
  info.config = config;
  info.extra = extra;
  CheckpointFile mine = s.info.files[0];
  mine.bytes = s.offset;
  ep = publish_checkpoint(host, std::move(info), mine, s.tmp, s.final_dir);
  if (auto f = agree(host, ep)) f->raise(rank_);
  s.done = true;
  return s.final_dir.string();
}

std::vector<float> read_checkpoint_group(const CheckpointInfo& info, int g) {
  const std::vector<ModelGroup> groups = model_groups(info);
  if (g < 0 || static_cast<size_t>(g) >= groups.size())
    throw Error("read_checkpoint_group: group " + std::to_string(g) + " of " + std::to_string(groups.size()));
  const ModelGroup& m = groups[static_cast<size_t>(g)];
  std::vector<float> out(m.numel);
  float* outs[kStates] = {out.data(), nullptr, nullptr};
  read_model_range(info, m, 0, out.size(), outs);
  return out;
}

std::vector<CheckpointGroup> checkpoint_model_groups(const CheckpointInfo& info) {
  std::vector<CheckpointGroup> out;
  for (const ModelGroup& m : model_groups(info)) out.push_back({m.name, m.numel, 0, 0});
  return out;
}

}  // namespace strata
