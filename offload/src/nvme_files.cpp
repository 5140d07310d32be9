// The swap space on real disks: one preallocated O_DIRECT file per nvme_path, one
// logical striped space over them, all I/O through the IoEngine. The files have no name
// (swap_lifetime.hpp): the kernel returns their space however the process ends.
//
// Striping: logical offset L lies in stripe unit k = L / S (S = the stripe unit); unit k
// lives in file k % N at file offset (k / N) * S + L % S. Consecutive units go to
// consecutive files, so one tensor is spread over every path.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <map>

#include "nvme_swap.hpp"
#include "swap_lifetime.hpp"
#include "strata/core/error.hpp"
#include "strata/core/log.hpp"

namespace strata::detail {

namespace {

uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

std::string hex64(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

// The engine starts a transfer once `after` has completed (waiting here, on the calling
// thread); a failed `after` fails it without any I/O.
Event failed_after(const Event& after) {
  std::exception_ptr err = after.result();
  if (!err) return Event();
  auto [ev, host] = HostEvent::make();
  host->complete(err);
  return ev;
}

// The swap files themselves, closed on destruction, also when the space's setup throws
// halfway (a member's destructor runs then; the space's own would not). Being nameless,
// a closed file's space goes back to its file system at once.
struct OpenFiles {
  std::vector<std::string> paths;   // /proc/self/fd/<fd>: the one way to reach a file
  std::vector<std::string> labels;  // "/proc/self/fd/<fd> (unnamed swap file in <dir>)", for errors
  std::vector<int> fds;
  OpenFiles() = default;
  OpenFiles(const OpenFiles&) = delete;
  OpenFiles& operator=(const OpenFiles&) = delete;
  ~OpenFiles() {
    for (int fd : fds)
      if (fd >= 0) close(fd);
  }
};

// Why a path cannot hold its share, with the fixes. Swap files of other running jobs
// take space without showing up in `ls`: named ones (older Strata) are counted here,
// unnamed ones only lsof +L1 lists.
std::string out_of_space(const std::string& dir, uint64_t need, uint64_t avail, const StaleSwapFiles& stale,
                         bool automatic) {
  std::string m = "not enough free space at '" + dir + "': " + format_bytes(avail) + " free, " + format_bytes(need) +
                  " needed";
  if (stale.live_files > 0)
    m += " (" + std::to_string(stale.live_files) + " named swap file(s) of running processes hold " +
         format_bytes(stale.live_bytes) + " there)";
  const std::string budget =
      automatic ? "keep fewer states on NVMe (offload_param or offload_optimizer device \"cpu\"): the NVMe budget is "
                  "automatic (strata.nvme_budget unset), what the states homed on NVMe need"
                : "lower strata.nvme_budget";
  return m + "; free space there, add nvme_path directories on other disks, or " + budget +
         " (swap files of running Strata jobs have no name; `lsof +L1 " + dir + "` lists them)";
}

// Every path is an existing, writable directory; returns the device of each.
std::vector<dev_t> check_swap_dirs(const std::vector<std::string>& paths) {
  std::vector<dev_t> devs;
  for (const auto& p : paths) {
    struct stat st {};
    if (stat(p.c_str(), &st) != 0) {
      int e = errno;
      throw ConfigError("nvme path '" + p + "': " + std::strerror(e) +
                        "; create the directory or point nvme_path at an existing one");
    }
    if (!S_ISDIR(st.st_mode)) throw ConfigError("nvme path '" + p + "' is not a directory; nvme_path lists directories");
    if (access(p.c_str(), W_OK | X_OK) != 0)
      throw ConfigError("nvme path '" + p + "' is not writable by this process; fix its permissions or pick another");
    devs.push_back(st.st_dev);
  }
  return devs;
}

// Free space for per_file bytes in every path, before anything is created: paths on one
// file system (devs) share it.
void check_free_space(const NvmeStoreOptions& opts, const std::vector<dev_t>& devs, uint64_t per_file,
                      const std::vector<StaleSwapFiles>& stale) {
  const auto& paths = opts.paths;
  const uint64_t n = paths.size();
  std::map<dev_t, uint64_t> need;
  for (size_t i = 0; i < paths.size(); ++i) need[devs[i]] += per_file;
  for (size_t i = 0; i < paths.size(); ++i) {
    auto it = need.find(devs[i]);
    if (it == need.end()) continue;  // already checked through another path on this device
    struct statvfs vs {};
    if (statvfs(paths[i].c_str(), &vs) != 0) {
      int e = errno;
      throw ConfigError("nvme path '" + paths[i] + "': statvfs failed: " + std::strerror(e));
    }
    const uint64_t avail = static_cast<uint64_t>(vs.f_bavail) * vs.f_frsize;
    if (it->second > avail)
      throw OutOfBudget("nvme store (" + std::string(opts.capacity_automatic ? "automatic NVMe budget " : "strata.nvme_budget ") +
                        format_bytes(opts.capacity) + " over " + std::to_string(n) +
                        " path(s)): " + out_of_space(paths[i], it->second, avail, stale[i], opts.capacity_automatic));
    need.erase(it);
  }
}

// Creates a swap file in every path, preallocated to per_file bytes, into files.
void create_swap_files(const NvmeStoreOptions& opts, uint64_t per_file, const std::vector<StaleSwapFiles>& stale,
                       OpenFiles& files) {
  const auto& paths = opts.paths;
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string& p = paths[i];
    const int fd = open_unnamed_swap_file(p);
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    const std::string label = path + " (unnamed swap file in " + p + ")";
    files.fds.push_back(fd);
    files.paths.push_back(path);
    files.labels.push_back(label);
    if (fallocate(fd, 0, 0, static_cast<off_t>(per_file)) != 0) {
      int e = errno;
      if (e == ENOSPC || e == EDQUOT) {
        struct statvfs vs {};
        uint64_t avail = statvfs(p.c_str(), &vs) == 0 ? static_cast<uint64_t>(vs.f_bavail) * vs.f_frsize : 0;
        throw OutOfBudget("nvme store: preallocating " + format_bytes(per_file) + " for " + label +
                          " failed: " + std::strerror(e) + "; " + out_of_space(p, per_file, avail, stale[i], opts.capacity_automatic));
      }
      if (e == EOPNOTSUPP) {
        log::warn_once("nvme-fallocate", "nvme store: the file system at '" + p +
                                             "' cannot preallocate; the swap file is sparse and a full disk will "
                                             "show up as write errors later");
        if (ftruncate(fd, static_cast<off_t>(per_file)) != 0) {
          int e2 = errno;
          throw IoError("sizing swap file failed", label, 0, per_file, e2, "free space on it or point nvme_path at a disk with room");
        }
      } else {
        throw IoError("preallocating swap file failed", label, 0, per_file, e, "free space on it or point nvme_path at a disk with room");
      }
    }
  }
}

class SwapFiles final : public SwapSpace {
 public:
  explicit SwapFiles(const NvmeStoreOptions& opts);

  const SwapLayout& layout() const override { return layout_; }
  const std::vector<std::string>& files() const override { return files_.paths; }
  Event write(uint64_t offset, const void* src, uint64_t bytes, const Event& after, WriteLanded landed) override;
  Event read(uint64_t offset, void* dst, uint64_t bytes, const Event& after, std::vector<uint64_t> expect) override;
  void register_buffer(void* base, uint64_t bytes) override { engine_->register_buffer(base, bytes); }
  void unregister_buffer(void* base) override { engine_->unregister_buffer(base); }
  std::string engine_name() const override { return engine_->name(); }
  IoStats io_stats() const override { return engine_->stats(); }

 private:
  std::vector<IoSegment> map(uint64_t offset, char* buf, uint64_t bytes) const;
  // Hash of each segment's share of the first `data` bytes of the transfer.
  static std::vector<uint64_t> hash_segments(const std::vector<IoSegment>& segs, const char* base, uint64_t data);

  bool checksums_;
  SwapLayout layout_;
  OpenFiles files_;
  // Declared after files_, so destroyed first: it finishes the I/O in flight, whose
  // completions name the files, before they are closed.
  std::unique_ptr<IoEngine> engine_;
};

SwapFiles::SwapFiles(const NvmeStoreOptions& opts) : checksums_(opts.checksums) {
  const auto& paths = opts.paths;
  // 1. Every path is an existing, writable directory.
  const std::vector<dev_t> devs = check_swap_dirs(paths);
  // Before the free space is counted: stale files of dead runs would be counted as used.
  std::vector<StaleSwapFiles> stale;
  for (const auto& p : paths) stale.push_back(reclaim_stale_swap_files(p));

  // 2. Sizes. The stripe unit is the block size, halved for budgets too small to give
  // each file one unit; each file holds a whole number of units.
  const uint64_t n = paths.size();
  uint64_t share = opts.capacity / n;
  uint64_t stripe = opts.aio.block_size;
  while (stripe > kMinExtentGrain && share < stripe) stripe /= 2;
  const uint64_t per_file = share / stripe * stripe;  // bytes preallocated in each file
  if (per_file == 0)
    throw ConfigError("nvme store: capacity " + format_bytes(opts.capacity) + " over " + std::to_string(n) +
                      " paths leaves less than 4 KiB per swap file; raise strata.nvme_budget to at least " +
                      format_bytes(n * kMinExtentGrain));

  // 3. Free space, before anything is created: paths on one file system share it.
  check_free_space(opts, devs, per_file, stale);

  // 4. Create and preallocate. files_ closes whatever was opened if a later step throws.
  create_swap_files(opts, per_file, stale, files_);

  // 5. Alignment, from the files themselves (statx reports it for regular files only).
  uint64_t a = 512;
  for (int fd : files_.fds) a = std::max(a, probe_dio_alignment(fd));
  if (a > stripe)
    throw Unavailable("nvme store: the file system needs " + std::to_string(a) +
                      "-byte aligned direct I/O, more than the stripe unit " + std::to_string(stripe) +
                      "; raise aio.block_size or the NVMe budget");
  layout_.capacity = per_file * n;
  layout_.align = a;
  layout_.grain = std::max(a, kMinExtentGrain);
  layout_.stripe = stripe;

  IoEngineOptions eo;
  eo.aio = opts.aio;
  eo.alignment = a;
  eo.faults = opts.faults;
  for (size_t i = 0; i < files_.paths.size(); ++i) eo.files.push_back(IoFile{files_.labels[i], files_.fds[i]});
  engine_ = std::make_unique<IoEngine>(std::move(eo));
}

std::vector<IoSegment> SwapFiles::map(uint64_t offset, char* buf, uint64_t bytes) const {
  std::vector<IoSegment> segs;
  const uint64_t n_files = files_.paths.size(), stripe = layout_.stripe;
  while (bytes > 0) {
    const uint64_t k = offset / stripe, within = offset % stripe;
    const uint64_t take = std::min(stripe - within, bytes);
    const unsigned file = static_cast<unsigned>(k % n_files);
    const uint64_t foff = (k / n_files) * stripe + within;
    if (!segs.empty()) {
      IoSegment& b = segs.back();
      if (b.file == file && b.offset + b.bytes == foff && static_cast<char*>(b.buf) + b.bytes == buf) {
        b.bytes += take;
        offset += take, buf += take, bytes -= take;
        continue;
      }
    }
    segs.push_back(IoSegment{file, foff, buf, take});
    offset += take, buf += take, bytes -= take;
  }
  return segs;
}

std::vector<uint64_t> SwapFiles::hash_segments(const std::vector<IoSegment>& segs, const char* base, uint64_t data) {
  std::vector<uint64_t> h;
  h.reserve(segs.size());
  for (const auto& s : segs) {
    const uint64_t start = static_cast<uint64_t>(static_cast<const char*>(s.buf) - base);
    const uint64_t len = start >= data ? 0 : std::min(s.bytes, data - start);
    h.push_back(XXH3_64bits(s.buf, len));
  }
  return h;
}

Event SwapFiles::write(uint64_t offset, const void* src, uint64_t bytes, const Event& after, WriteLanded landed) {
  if (Event failed = failed_after(after); failed.impl()) return failed;
  auto segs = map(offset, static_cast<char*>(const_cast<void*>(src)), round_up(bytes, layout_.align));
  std::vector<uint64_t> hashes;
  if (checksums_) hashes = hash_segments(segs, static_cast<const char*>(src), bytes);
  IoFinish finish = [landed = std::move(landed), hashes = std::move(hashes)](std::exception_ptr err) mutable {
    landed(err, std::move(hashes));
    return err;
  };
  return engine_->submit(IoDir::Write, segs, std::move(finish));
}

Event SwapFiles::read(uint64_t offset, void* dst, uint64_t bytes, const Event& after, std::vector<uint64_t> expect) {
  if (Event failed = failed_after(after); failed.impl()) return failed;
  char* base = static_cast<char*>(dst);
  auto segs = map(offset, base, round_up(bytes, layout_.align));
  IoFinish finish;
  if (!expect.empty()) {
    finish = [this, segs, base, bytes, expect = std::move(expect), logical = offset](std::exception_ptr err) {
      if (err) return err;  // the bytes did not all arrive: the I/O error is the one to report
      auto got = hash_segments(segs, base, bytes);
      for (size_t i = 0; i < segs.size(); ++i) {
        if (got[i] == expect[i]) continue;
        const IoSegment& s = segs[i];
        const uint64_t start = static_cast<uint64_t>(static_cast<char*>(s.buf) - base);
        const uint64_t len = std::min(s.bytes, bytes - start);
        return std::make_exception_ptr(CorruptionError(
            "nvme store: checksum mismatch reading " + files_.labels[s.file] + " at offset " + std::to_string(s.offset) +
            ", length " + std::to_string(len) + " (extent at logical offset " + std::to_string(logical) +
            "): expected xxh3 " + hex64(expect[i]) + ", got " + hex64(got[i]) +
            "; the swap file was changed behind the store's back or the disk returned bad data"));
      }
      return std::exception_ptr();
    };
  }
  return engine_->submit(IoDir::Read, segs, std::move(finish));
}

}  // namespace

std::unique_ptr<SwapSpace> make_swap_files(const NvmeStoreOptions& opts) { return std::make_unique<SwapFiles>(opts); }

}  // namespace strata::detail
