// NvmeStore: swap files over one or more directories, one logical striped space carved
// into extents by a RangeAllocator, all I/O through the IoEngine.
//
// Striping: logical offset L lies in stripe unit k = L / S (S = stripe_unit()); unit k
// lives in file k % N at file offset (k / N) * S + L % S. Consecutive units go to
// consecutive files, so one tensor is spread over every path.
#include "strata/offload/nvme_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "strata/core/error.hpp"
#include "strata/core/log.hpp"
#include "strata/memory/range_allocator.hpp"
#include "strata/offload/fault_injection.hpp"
#include "nvme_sim.hpp"

namespace strata {

namespace {

std::atomic<uint64_t> g_swap_serial{0};  // <n> in strata-swap-<pid>-<n>.bin, unique per process

constexpr uint64_t kMinGrain = 4096;  // extents stay page-granular even where O_DIRECT allows 512

uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

std::string hex64(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

}  // namespace

struct NvmeStore::Impl {
  NvmeStoreOptions opts;
  std::vector<std::string> files;
  std::vector<int> fds;
  uint64_t align = kMinGrain;  // O_DIRECT alignment probed from the file system
  uint64_t grain = kMinGrain;  // extent granularity: max(align, 4 KiB)
  uint64_t stripe = 0;         // bytes per stripe unit
  uint64_t per_file = 0;       // bytes preallocated in each file
  uint64_t capacity = 0;       // per_file * files
  std::unique_ptr<IoEngine> engine;
  std::unique_ptr<detail::SimNvme> sim;  // the sim backend's channels, instead of engine and files

  // What the store knows of an extent's contents. Checksums are kept per segment of the
  // last write (a stripe unit, or the whole extent with one file) so that a mismatch
  // names the file and the range that went bad.
  enum class Contents { Unwritten, Written, Failed };
  struct State {
    uint64_t gen = 0;  // tells a reallocated extent at the same offset from the old one
    Contents contents = Contents::Unwritten;
    uint64_t bytes = 0;             // bytes of the last write
    std::vector<uint64_t> hashes;   // XXH3_64bits per segment of the last write
  };
  mutable std::mutex mu;
  std::optional<RangeAllocator> ranges;
  std::unordered_map<uint64_t, State> states;  // extent offset -> state
  uint64_t next_gen = 1;

  ~Impl() {
    engine.reset();  // finishes in-flight I/O first
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i] >= 0) close(fds[i]);
    }
    for (const auto& f : files) unlink(f.c_str());
  }

  std::vector<IoSegment> map(uint64_t offset, char* buf, uint64_t bytes) const {
    std::vector<IoSegment> segs;
    const uint64_t n_files = files.size();
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

  // Hash of each segment's share of the first `data` bytes of the transfer.
  static std::vector<uint64_t> hash_segments(const std::vector<IoSegment>& segs, const char* base, uint64_t data) {
    std::vector<uint64_t> h;
    h.reserve(segs.size());
    for (const auto& s : segs) {
      const uint64_t start = static_cast<uint64_t>(static_cast<const char*>(s.buf) - base);
      const uint64_t len = start >= data ? 0 : std::min(s.bytes, data - start);
      h.push_back(XXH3_64bits(s.buf, len));
    }
    return h;
  }

  State& state_of(const Extent& e, const char* op) {
    STRATA_CHECK(e.valid(), std::string(op) + " of an invalid (empty) extent");
    auto it = states.find(e.offset);
    STRATA_CHECK(it != states.end() && ranges->size_of(e.offset) == e.bytes,
                 std::string(op) + " of an extent that is not allocated: offset " + std::to_string(e.offset) +
                     ", " + std::to_string(e.bytes) + " bytes");
    return it->second;
  }

  void check_buffer(const Extent& e, const void* buf, uint64_t bytes, const char* op) const {
    STRATA_CHECK(reinterpret_cast<uintptr_t>(buf) % align == 0,
                 std::string(op) + " buffer " + std::to_string(reinterpret_cast<uintptr_t>(buf)) +
                     " is not aligned to " + std::to_string(align) + " bytes (O_DIRECT)");
    STRATA_CHECK(bytes <= e.bytes, std::string(op) + " of " + std::to_string(bytes) + " bytes into an extent of " +
                                       std::to_string(e.bytes));
  }
};

NvmeStore::NvmeStore(NvmeStoreOptions opts) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opts = std::move(opts);
  const auto& paths = m.opts.paths;
  if (paths.empty()) throw ConfigError("nvme store: no paths given; set strata.nvme_path to one or more directories");
  if (m.opts.capacity == 0) throw ConfigError("nvme store: capacity is 0 bytes; set the NVMe budget");
  if (m.opts.sim) {  // sim backend: extents and accounting only; no files, no I/O
    m.stripe = m.opts.aio.block_size;
    m.capacity = m.opts.capacity / kMinGrain * kMinGrain;
    m.ranges.emplace(m.capacity, m.grain);
    m.sim = std::make_unique<detail::SimNvme>(*m.opts.sim);
    return;
  }

  // 1. Every path is an existing, writable directory.
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

  // 2. Sizes. The stripe unit is the block size, halved for budgets too small to give
  // each file one unit; each file holds a whole number of units.
  const uint64_t n = paths.size();
  uint64_t share = m.opts.capacity / n;
  m.stripe = m.opts.aio.block_size;
  while (m.stripe > kMinGrain && share < m.stripe) m.stripe /= 2;
  m.per_file = share / m.stripe * m.stripe;
  if (m.per_file == 0)
    throw ConfigError("nvme store: capacity " + format_bytes(m.opts.capacity) + " over " + std::to_string(n) +
                      " paths leaves less than 4 KiB per swap file; raise the NVMe budget to at least " +
                      format_bytes(n * kMinGrain));
  m.capacity = m.per_file * n;

  // 3. Free space, before anything is created: paths on one file system share it.
  std::map<dev_t, uint64_t> need;
  for (size_t i = 0; i < paths.size(); ++i) need[devs[i]] += m.per_file;
  for (size_t i = 0; i < paths.size(); ++i) {
    auto it = need.find(devs[i]);
    if (it == need.end()) continue;  // already checked through another path on this device
    struct statvfs vs {};
    if (statvfs(paths[i].c_str(), &vs) != 0) {
      int e = errno;
      throw ConfigError("nvme path '" + paths[i] + "': statvfs failed: " + std::strerror(e));
    }
    const uint64_t avail = static_cast<uint64_t>(vs.f_bavail) * vs.f_frsize;
    if (it->second > avail) {
      std::ostringstream os;
      os << "nvme store: not enough free space at '" << paths[i] << "': " << format_bytes(avail)
         << " free, but its swap file" << (it->second > m.per_file ? "s need " : " needs ") << format_bytes(it->second)
         << " (NVMe budget " << format_bytes(m.opts.capacity) << " over " << n
         << " path(s)); free space there, lower the NVMe budget, or add nvme_path directories on other disks";
      throw OutOfBudget(os.str());
    }
    need.erase(it);
  }

  // 4. Create and preallocate. Impl's destructor removes whatever was created if a later
  // step throws.
  const long pid = static_cast<long>(getpid());
  for (const auto& p : paths) {
    std::string path = p + (p.ends_with('/') ? "" : "/") + "strata-swap-" + std::to_string(pid) + "-" +
                       std::to_string(g_swap_serial.fetch_add(1)) + ".bin";
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0) {
      int e = errno;
      if (e == EINVAL)
        throw ConfigError("nvme path '" + p + "' does not support O_DIRECT (tmpfs or a network file system?); "
                          "point nvme_path at a local disk");
      throw ConfigError("nvme store: cannot create swap file '" + path + "': " + std::strerror(e));
    }
    m.files.push_back(path);
    m.fds.push_back(fd);
    if (fallocate(fd, 0, 0, static_cast<off_t>(m.per_file)) != 0) {
      int e = errno;
      if (e == ENOSPC || e == EDQUOT) {
        struct statvfs vs {};
        uint64_t avail = statvfs(p.c_str(), &vs) == 0 ? static_cast<uint64_t>(vs.f_bavail) * vs.f_frsize : 0;
        throw OutOfBudget("nvme store: preallocating " + format_bytes(m.per_file) + " for '" + path +
                          "' failed: " + std::strerror(e) + " (" + format_bytes(avail) +
                          " free now); free space there, lower the NVMe budget, or add paths on other disks");
      }
      if (e == EOPNOTSUPP) {
        log::warn_once("nvme-fallocate", "nvme store: the file system at '" + p +
                                             "' cannot preallocate; the swap file is sparse and a full disk will "
                                             "show up as write errors later");
        if (ftruncate(fd, static_cast<off_t>(m.per_file)) != 0) {
          int e2 = errno;
          throw IoError("sizing swap file failed", path, 0, m.per_file, e2);
        }
      } else {
        throw IoError("preallocating swap file failed", path, 0, m.per_file, e);
      }
    }
  }

  // 5. Alignment, from the files themselves (statx reports it for regular files only).
  uint64_t a = 512;
  for (int fd : m.fds) a = std::max(a, probe_dio_alignment(fd));
  if (a > m.stripe)
    throw Unavailable("nvme store: the file system needs " + std::to_string(a) +
                      "-byte aligned direct I/O, more than the stripe unit " + std::to_string(m.stripe) +
                      "; raise aio.block_size or the NVMe budget");
  m.align = a;
  m.grain = std::max(a, kMinGrain);
  m.ranges.emplace(m.capacity, m.grain);

  IoEngineOptions eo;
  eo.aio = m.opts.aio;
  eo.alignment = m.align;
  eo.faults = m.opts.faults;
  for (size_t i = 0; i < m.files.size(); ++i) eo.files.push_back(IoFile{m.files[i], m.fds[i]});
  m.engine = std::make_unique<IoEngine>(std::move(eo));
}

NvmeStore::~NvmeStore() = default;

Extent NvmeStore::try_allocate(uint64_t bytes) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  auto off = m.ranges->allocate(bytes);
  if (!off) return Extent{};
  Impl::State st;
  st.gen = m.next_gen++;
  m.states[*off] = std::move(st);
  return Extent{*off, m.ranges->size_of(*off)};
}

Extent NvmeStore::allocate(uint64_t bytes) {
  Extent e = try_allocate(bytes);
  if (e.valid()) return e;
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  throw OutOfBudget("nvme store: no free extent of " + format_bytes(m.ranges->round(bytes)) + " (largest free " +
                    format_bytes(m.ranges->largest_free()) + ", " + format_bytes(m.ranges->used()) + " of " +
                    format_bytes(m.capacity) + " in use over " + std::to_string(m.files.size()) +
                    " swap file(s)); raise the NVMe budget or free tensors");
}

void NvmeStore::free(const Extent& e) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  m.state_of(e, "free");
  m.states.erase(e.offset);
  m.ranges->free(e.offset);
}

namespace {
// The real engine starts a transfer once `after` has completed; a failed `after` fails it.
Event failed_after(const Event& after) {
  std::exception_ptr err = after.result();
  if (!err) return Event();
  auto [ev, host] = HostEvent::make();
  host->complete(err);
  return ev;
}
}  // namespace

Event NvmeStore::write(const Extent& e, const void* src, uint64_t bytes, const Event& after) {
  Impl* m = impl_.get();
  m->check_buffer(e, src, bytes, "nvme write");
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(m->mu);
    Impl::State& st = m->state_of(e, "nvme write");
    gen = st.gen;
    if (m->sim) {
      st.contents = Impl::Contents::Written;
      st.bytes = bytes;
    }
  }
  if (m->sim) return m->sim->transfer(IoDir::Write, round_up(bytes, m->align), after);
  if (Event failed = failed_after(after); failed.impl()) return failed;
  const uint64_t io_bytes = round_up(bytes, m->align);
  auto segs = m->map(e.offset, static_cast<char*>(const_cast<void*>(src)), io_bytes);
  std::vector<uint64_t> hashes;
  if (m->opts.checksums) hashes = Impl::hash_segments(segs, static_cast<const char*>(src), bytes);
  const uint64_t off = e.offset;
  IoFinish finish = [m, off, gen, bytes, hashes = std::move(hashes)](std::exception_ptr err) mutable {
    std::lock_guard<std::mutex> lock(m->mu);
    auto it = m->states.find(off);
    if (it != m->states.end() && it->second.gen == gen) {
      Impl::State& st = it->second;
      st.contents = err ? Impl::Contents::Failed : Impl::Contents::Written;
      st.bytes = bytes;
      st.hashes = std::move(hashes);
    }
    return err;
  };
  return m->engine->submit(IoDir::Write, segs, std::move(finish));
}

Event NvmeStore::read(const Extent& e, void* dst, uint64_t bytes, const Event& after) {
  Impl* m = impl_.get();
  m->check_buffer(e, dst, bytes, "nvme read");
  Impl::Contents contents;
  std::vector<uint64_t> expect;
  {
    std::lock_guard<std::mutex> lock(m->mu);
    const Impl::State& st = m->state_of(e, "nvme read");
    contents = st.contents;
    if (m->opts.checksums && contents == Impl::Contents::Written) {
      STRATA_CHECK(bytes == st.bytes, "nvme read of " + std::to_string(bytes) + " bytes from an extent last written with " +
                                          std::to_string(st.bytes) + " bytes: with checksums on, read what was written");
      expect = st.hashes;
    }
  }
  if (contents == Impl::Contents::Failed) {
    auto [ev, host] = HostEvent::make();
    host->complete(std::make_exception_ptr(CorruptionError(
        "nvme store: the extent at logical offset " + std::to_string(e.offset) + " (" + format_bytes(e.bytes) +
        ") holds no valid data: its last write failed")));
    return ev;
  }
  if (m->sim) return m->sim->transfer(IoDir::Read, round_up(bytes, m->align), after);
  if (Event failed = failed_after(after); failed.impl()) return failed;
  char* base = static_cast<char*>(dst);
  auto segs = m->map(e.offset, base, round_up(bytes, m->align));
  IoFinish finish;
  if (!expect.empty()) {
    finish = [m, segs, base, bytes, expect = std::move(expect), logical = e.offset](std::exception_ptr err) {
      if (err) return err;  // the bytes did not all arrive: the I/O error is the one to report
      auto got = Impl::hash_segments(segs, base, bytes);
      for (size_t i = 0; i < segs.size(); ++i) {
        if (got[i] == expect[i]) continue;
        const IoSegment& s = segs[i];
        const uint64_t start = static_cast<uint64_t>(static_cast<char*>(s.buf) - base);
        const uint64_t len = std::min(s.bytes, bytes - start);
        return std::make_exception_ptr(CorruptionError(
            "nvme store: checksum mismatch reading " + m->files[s.file] + " at offset " + std::to_string(s.offset) +
            ", length " + std::to_string(len) + " (extent at logical offset " + std::to_string(logical) +
            "): expected xxh3 " + hex64(expect[i]) + ", got " + hex64(got[i]) +
            "; the swap file was changed behind the store's back or the disk returned bad data"));
      }
      return std::exception_ptr();
    };
  }
  return m->engine->submit(IoDir::Read, segs, std::move(finish));
}

void NvmeStore::register_buffer(void* base, uint64_t bytes) {
  if (impl_->engine) impl_->engine->register_buffer(base, bytes);
}
void NvmeStore::unregister_buffer(void* base) {
  if (impl_->engine) impl_->engine->unregister_buffer(base);
}

uint64_t NvmeStore::alignment() const { return impl_->align; }
uint64_t NvmeStore::capacity() const { return impl_->capacity; }

uint64_t NvmeStore::used() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->ranges->used();
}

uint64_t NvmeStore::peak() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->ranges->peak();
}

uint64_t NvmeStore::largest_free() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->ranges->largest_free();
}

const std::vector<std::string>& NvmeStore::files() const { return impl_->files; }
std::string NvmeStore::engine_name() const { return impl_->sim ? "sim" : impl_->engine->name(); }
uint64_t NvmeStore::stripe_unit() const { return impl_->stripe; }
IoStats NvmeStore::io_stats() const { return impl_->sim ? impl_->sim->stats() : impl_->engine->stats(); }

}  // namespace strata
