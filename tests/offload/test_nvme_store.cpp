// The NVMe store over real swap files in temporary directories: round trips checked byte
// by byte on both engines, striping checked by reading the swap files directly, extent
// reuse, injected faults, corruption behind the store's back, full disks, and the swap
// files' lifetime: unnamed, so nothing stays behind a SIGKILL, and stale named ones of
// dead processes reclaimed at start while a live process's are left alone.
#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "strata/core/device.hpp"
#include "strata/core/error.hpp"
#include "strata/core/log.hpp"
#include "swap_lifetime.hpp"
#include "strata/memory/tier.hpp"
#include "strata/offload/fault_injection.hpp"
#include "strata/offload/nvme_store.hpp"

using namespace strata;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/strata-nvme-test-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string path;
};

struct AlignedBuf {
  explicit AlignedBuf(size_t n) : p(static_cast<uint8_t*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {}
  ~AlignedBuf() { std::free(p); }
  AlignedBuf(const AlignedBuf&) = delete;
  uint8_t* p;
};

void fill_random(uint8_t* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(rng() >> 13);
}

long first_mismatch(const uint8_t* a, const uint8_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return static_cast<long>(i);
  return -1;
}

size_t count_entries(const std::string& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

// Where a /proc/.../fd/<n> link points: "<dir>/<name> (deleted)" for an unnamed file.
std::string link_target(const std::string& link) {
  std::error_code ec;
  fs::path t = fs::read_symlink(link, ec);
  return ec ? std::string() : t.string();
}

uint64_t free_bytes(const std::string& dir) {
  struct statvfs vs {};
  EXPECT_EQ(statvfs(dir.c_str(), &vs), 0);
  return static_cast<uint64_t>(vs.f_bavail) * vs.f_frsize;
}

// A swap file named as older versions of Strata named them, `bytes` of it allocated.
std::string make_named_swap_file(const std::string& dir, long pid, int n, uint64_t bytes) {
  std::string path = dir + "/strata-swap-" + std::to_string(pid) + "-" + std::to_string(n) + ".bin";
  int fd = open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  EXPECT_GE(fd, 0) << path << ": " << std::strerror(errno);
  if (bytes) {
    EXPECT_EQ(fallocate(fd, 0, 0, static_cast<off_t>(bytes)), 0) << std::strerror(errno);
  }
  close(fd);
  return path;
}

// The pid of a child that has exited and been reaped: a process that is gone.
pid_t dead_pid() {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return pid;
}

NvmeStoreOptions opts(std::vector<std::string> paths, uint64_t capacity, IoEngineKind kind = IoEngineKind::Auto,
                      bool checksums = true, std::shared_ptr<FaultPlan> faults = nullptr) {
  NvmeStoreOptions o;
  o.paths = std::move(paths);
  o.capacity = capacity;
  o.aio.engine = kind;
  o.aio.block_size = 64 << 10;
  o.aio.queue_depth = 8;
  o.checksums = checksums;
  o.faults = std::move(faults);
  return o;
}

template <class E>
E expect_failure(const Event& ev) {
  try {
    ev.wait();
  } catch (const E& e) {
    return e;
  } catch (const std::exception& other) {
    ADD_FAILURE() << "failed with the wrong error: " << other.what();
    throw;
  }
  ADD_FAILURE() << "the event completed successfully; it must fail";
  throw std::runtime_error("no error");
}

}  // namespace

class NvmeStoreTest : public ::testing::TestWithParam<IoEngineKind> {};

INSTANTIATE_TEST_SUITE_P(Backends, NvmeStoreTest, ::testing::Values(IoEngineKind::Uring, IoEngineKind::ThreadPool),
                         [](const auto& info) { return info.param == IoEngineKind::Uring ? "io_uring" : "threadpool"; });

TEST_P(NvmeStoreTest, RoundTripOfManyRandomSizesOverTwoPaths) {
  TempDir a, b;
  NvmeStore store(opts({a.path, b.path}, 64ull << 20, GetParam()));
  EXPECT_EQ(store.engine_name(), GetParam() == IoEngineKind::Uring ? "io_uring" : "threadpool");
  EXPECT_EQ(store.files().size(), 2u);
  const uint64_t al = store.alignment();
  std::mt19937_64 rng(1234);
  struct T {
    Extent e;
    uint64_t bytes;
    std::unique_ptr<AlignedBuf> src;
  };
  std::vector<T> ts;
  std::vector<Event> evs;
  for (int i = 0; i < 40; ++i) {
    // Any byte count, including ones that are not a multiple of the alignment.
    uint64_t bytes = 1 + rng() % (900u << 10);
    T t{store.allocate(bytes), bytes, std::make_unique<AlignedBuf>(bytes + al)};
    ASSERT_TRUE(t.e.valid());
    EXPECT_EQ(t.e.offset % al, 0u);
    EXPECT_GE(t.e.bytes, bytes);
    fill_random(t.src->p, bytes, i);
    evs.push_back(store.write(t.e, t.src->p, bytes));
    ts.push_back(std::move(t));
  }
  for (auto& e : evs) e.wait();
  evs.clear();
  std::vector<std::unique_ptr<AlignedBuf>> dsts;
  for (auto& t : ts) {
    dsts.push_back(std::make_unique<AlignedBuf>(t.bytes + al));
    std::memset(dsts.back()->p, 0xEE, t.bytes);
    evs.push_back(store.read(t.e, dsts.back()->p, t.bytes));
  }
  for (size_t i = 0; i < ts.size(); ++i) {
    evs[i].wait();
    ASSERT_EQ(first_mismatch(ts[i].src->p, dsts[i]->p, ts[i].bytes), -1) << "extent " << i << ", " << ts[i].bytes;
  }
  for (auto& t : ts) store.free(t.e);
  EXPECT_EQ(store.used(), 0u);
}

TEST(NvmeStore, StripesOneExtentOverEveryPathInStripeUnits) {
  TempDir d0, d1, d2;
  NvmeStore store(opts({d0.path, d1.path, d2.path}, 24ull << 20, IoEngineKind::Auto, false));
  const uint64_t S = store.stripe_unit();
  ASSERT_EQ(S, 64u << 10);
  EXPECT_EQ(store.capacity(), 24ull << 20);
  ASSERT_EQ(store.files().size(), 3u);
  for (const auto& f : store.files()) {
    struct stat st {};
    ASSERT_EQ(stat(f.c_str(), &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), 8ull << 20);  // capacity / 3, preallocated
    EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, 8ull << 20);
    EXPECT_EQ(st.st_nlink, 0u) << f << " has a name: " << link_target(f);
  }
  EXPECT_EQ(link_target(store.files()[0]).rfind(d0.path + "/", 0), 0u) << link_target(store.files()[0]);
  EXPECT_EQ(link_target(store.files()[2]).rfind(d2.path + "/", 0), 0u) << link_target(store.files()[2]);

  const uint64_t n = 7 * S;  // units 0..6: files 0,1,2,0,1,2,0
  Extent e = store.allocate(n);
  ASSERT_EQ(e.offset, 0u);
  AlignedBuf src(n);
  for (uint64_t k = 0; k < 7; ++k) std::memset(src.p + k * S, static_cast<int>(0x10 + k), S);
  store.write(e, src.p, n).wait();
  // Read each file behind the store's back: unit k must sit in file k % 3 at (k / 3) * S.
  std::vector<uint8_t> unit(S);
  for (uint64_t k = 0; k < 7; ++k) {
    int fd = open(store.files()[k % 3].c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pread(fd, unit.data(), S, static_cast<off_t>((k / 3) * S)), static_cast<ssize_t>(S));
    close(fd);
    EXPECT_EQ(unit[0], 0x10 + k) << "unit " << k;
    EXPECT_EQ(unit[S - 1], 0x10 + k) << "unit " << k;
  }
}

TEST(NvmeStore, FreedExtentsAreReusedAndAccounted) {
  TempDir d;
  NvmeStore store(opts({d.path}, 1 << 20));
  EXPECT_EQ(store.capacity(), 1u << 20);
  Extent a = store.allocate(300 << 10);
  Extent b = store.allocate(300 << 10);
  Extent c = store.allocate(300 << 10);
  EXPECT_EQ(store.used(), 900u << 10);
  EXPECT_FALSE(store.try_allocate(200 << 10).valid());
  EXPECT_THROW(store.allocate(200 << 10), OutOfBudget);
  store.free(b);
  EXPECT_EQ(store.used(), 600u << 10);
  EXPECT_EQ(store.peak(), 900u << 10);
  Extent d2 = store.allocate(250 << 10);
  EXPECT_EQ(d2.offset, b.offset);  // the hole left by b, not fresh space
  store.free(a);
  store.free(c);
  store.free(d2);
  EXPECT_EQ(store.used(), 0u);
  EXPECT_EQ(store.largest_free(), 1u << 20);
  Extent all = store.allocate(1 << 20);
  EXPECT_EQ(all.offset, 0u);
  try {
    store.allocate(4096);
    FAIL() << "allocation beyond capacity succeeded";
  } catch (const OutOfBudget& err) {
    std::string m = err.what();
    EXPECT_NE(m.find("largest free"), std::string::npos) << m;
  }
}

TEST(NvmeStore, ReusedExtentDoesNotInheritTheOldChecksum) {
  TempDir d;
  NvmeStore store(opts({d.path}, 1 << 20));
  AlignedBuf a(8192), b(8192), out(8192);
  fill_random(a.p, 8192, 1);
  fill_random(b.p, 8192, 2);
  Extent e = store.allocate(8192);
  store.write(e, a.p, 8192).wait();
  store.free(e);
  Extent e2 = store.allocate(8192);
  ASSERT_EQ(e2.offset, e.offset);
  store.write(e2, b.p, 8192).wait();
  store.read(e2, out.p, 8192).wait();
  EXPECT_EQ(first_mismatch(b.p, out.p, 8192), -1);
}

TEST_P(NvmeStoreTest, ShortReadsAndWritesAreCompletedWithCorrectData) {
  TempDir d0, d1;
  auto plan = std::make_shared<FaultPlan>();
  plan->short_nth(FaultTarget::Writes, 0, 0.5).short_nth(FaultTarget::Writes, 3, 0.3);
  plan->short_nth(FaultTarget::Reads, 1, 0.5);
  NvmeStore store(opts({d0.path, d1.path}, 8 << 20, GetParam(), true, plan));
  const uint64_t n = 512 << 10;
  AlignedBuf src(n), dst(n);
  fill_random(src.p, n, 77);
  Extent e = store.allocate(n);
  store.write(e, src.p, n).wait();
  std::memset(dst.p, 0xEE, n);
  store.read(e, dst.p, n).wait();
  EXPECT_EQ(first_mismatch(src.p, dst.p, n), -1);
  EXPECT_EQ(plan->injected(), 3u);
  EXPECT_EQ(store.io_stats().short_resubmits, 3u);
}

TEST_P(NvmeStoreTest, EioOnReadFailsTheEventNamingPathOffsetLength) {
  TempDir d0, d1;
  auto plan = std::make_shared<FaultPlan>();
  plan->fail_nth(FaultTarget::Reads, 3, EIO);
  NvmeStore store(opts({d0.path, d1.path}, 8 << 20, GetParam(), true, plan));
  const uint64_t n = 512 << 10;
  AlignedBuf src(n), dst(n);
  fill_random(src.p, n, 8);
  Extent e = store.allocate(n);
  store.write(e, src.p, n).wait();
  auto err = expect_failure<IoError>(store.read(e, dst.p, n));
  EXPECT_EQ(err.error_code(), EIO);
  // Errors name "/proc/self/fd/<n> (unnamed swap file in <dir>)".
  EXPECT_TRUE(err.path() == store.files()[0] + " (unnamed swap file in " + d0.path + ")" ||
              err.path() == store.files()[1] + " (unnamed swap file in " + d1.path + ")")
      << err.path();
  EXPECT_EQ(err.length(), 64u << 10);
  std::string m = err.what();
  EXPECT_NE(m.find(err.path()), std::string::npos) << m;
  EXPECT_NE(m.find("offset " + std::to_string(err.offset())), std::string::npos) << m;
  EXPECT_NE(m.find("length 65536"), std::string::npos) << m;
  // The error was one op: reading again gives the data.
  store.read(e, dst.p, n).wait();
  EXPECT_EQ(first_mismatch(src.p, dst.p, n), -1);
}

TEST_P(NvmeStoreTest, FailedWritesSurfaceAndTheExtentIsNotReadAsValid) {
  TempDir d;
  auto plan = std::make_shared<FaultPlan>();
  plan->fail_nth(FaultTarget::Writes, 2, ENOSPC);
  plan->fail_nth(FaultTarget::Writes, 20, EIO);
  NvmeStore store(opts({d.path}, 8 << 20, GetParam(), false, plan));
  const uint64_t n = 512 << 10;  // 8 requests of 64 KiB
  AlignedBuf src(n), dst(n);
  fill_random(src.p, n, 9);
  Extent e = store.allocate(n);

  auto full = expect_failure<IoError>(store.write(e, src.p, n));
  EXPECT_EQ(full.error_code(), ENOSPC);
  EXPECT_EQ(full.path(), store.files()[0] + " (unnamed swap file in " + d.path + ")");
  EXPECT_EQ(full.offset(), e.offset + (128u << 10));
  EXPECT_NE(std::string(full.what()).find("No space left"), std::string::npos) << full.what();
  // The extent's contents are not valid after a failed write, even without checksums.
  EXPECT_THROW(store.read(e, dst.p, n).wait(), CorruptionError);

  // Depth 8: each write queues all 8 requests at once, so the first write used ops 0..7.
  store.write(e, src.p, n).wait();  // ops 8..15 succeed
  store.read(e, dst.p, n).wait();
  EXPECT_EQ(first_mismatch(src.p, dst.p, n), -1);

  auto eio = expect_failure<IoError>(store.write(e, src.p, n));  // op 20: its fifth request
  EXPECT_EQ(eio.offset(), e.offset + (256u << 10));
  EXPECT_EQ(eio.error_code(), EIO);
  EXPECT_THROW(store.read(e, dst.p, n).wait(), CorruptionError);
}

TEST_P(NvmeStoreTest, CorruptionBehindTheStoresBackIsDetectedOnRead) {
  TempDir d0, d1;
  NvmeStore store(opts({d0.path, d1.path}, 8 << 20, GetParam(), true));
  const uint64_t n = 300 << 10;
  AlignedBuf src(n), dst(n);
  fill_random(src.p, n, 10);
  Extent e = store.allocate(n);
  store.write(e, src.p, n).wait();
  store.read(e, dst.p, n).wait();
  ASSERT_EQ(first_mismatch(src.p, dst.p, n), -1);
  // Flip one byte of the second stripe unit (file 1, offset 100) with a plain pwrite.
  const std::string& victim = store.files()[1];
  int fd = open(victim.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t byte = 0;
  ASSERT_EQ(pread(fd, &byte, 1, 100), 1);
  byte ^= 0x5A;
  ASSERT_EQ(pwrite(fd, &byte, 1, 100), 1);
  fsync(fd);
  close(fd);
  auto err = expect_failure<CorruptionError>(store.read(e, dst.p, n));
  std::string m = err.what();
  EXPECT_NE(m.find("checksum mismatch"), std::string::npos) << m;
  EXPECT_NE(m.find(victim + " (unnamed swap file in " + d1.path + ") at offset 0, length 65536"), std::string::npos)
      << m;
}

TEST(NvmeStore, PinnedPoolBuffersGoThroughRegisteredIo) {
  TempDir d;
  auto dev = make_device({});
  auto pool = make_pinned_pool(*dev, {.budget = 4 << 20});
  NvmeStore store(opts({d.path}, 8 << 20, IoEngineKind::Uring));
  store.register_buffer(pool->base(), pool->capacity());
  auto* src = static_cast<uint8_t*>(pool->try_allocate(1 << 20, "test"));
  auto* dst = static_cast<uint8_t*>(pool->try_allocate(1 << 20, "test"));
  ASSERT_TRUE(src && dst);
  fill_random(src, 1 << 20, 12);
  std::memset(dst, 0, 1 << 20);
  Extent e = store.allocate(1 << 20);
  store.write(e, src, 1 << 20).wait();
  store.read(e, dst, 1 << 20).wait();
  EXPECT_EQ(first_mismatch(src, dst, 1 << 20), -1);
  IoStats s = store.io_stats();
  EXPECT_EQ(s.requests, 32u);
  EXPECT_EQ(s.fixed_requests, 32u);
  store.unregister_buffer(pool->base());
}

TEST(NvmeStore, CapacityBeyondTheFreeSpaceIsOutOfBudgetBeforeAnyFileExists) {
  TempDir d;
  // A named swap file of a live process (this one) holds space; the message counts it.
  make_named_swap_file(d.path, getpid(), 9, 1 << 20);
  const uint64_t pib = 1ull << 50;
  try {
    NvmeStore store(opts({d.path}, pib));
    FAIL() << "a 1 PiB store was created";
  } catch (const OutOfBudget& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(d.path), std::string::npos) << m;
    EXPECT_NE(m.find("free"), std::string::npos) << m;
    EXPECT_NE(m.find("1.00 PiB"), std::string::npos) << m;
    EXPECT_NE(m.find("nvme store (strata.nvme_budget 1.00 PiB"), std::string::npos) << m;
    EXPECT_NE(m.find("or lower strata.nvme_budget"), std::string::npos) << m;
    EXPECT_NE(m.find("1 named swap file(s) of running processes hold 1.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("lsof +L1 " + d.path), std::string::npos) << m;
  }
  EXPECT_EQ(count_entries(d.path), 1u);  // the live process's file, and nothing new
  // Sized automatically (strata.nvme_budget unset), the budget cannot be lowered: the
  // message says what can be done instead.
  NvmeStoreOptions automatic = opts({d.path}, pib);
  automatic.capacity_automatic = true;
  try {
    NvmeStore store(automatic);
    FAIL() << "a 1 PiB store was created";
  } catch (const OutOfBudget& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("nvme store (automatic NVMe budget 1.00 PiB"), std::string::npos) << m;
    EXPECT_NE(m.find("keep fewer states on NVMe (offload_param or offload_optimizer device \"cpu\"): the NVMe budget "
                     "is automatic (strata.nvme_budget unset)"),
              std::string::npos)
        << m;
  }
}

TEST(NvmeStore, BadPathsAreConfigErrorsNamingThePath) {
  TempDir d;
  const std::string missing = d.path + "/does-not-exist";
  try {
    NvmeStore store(opts({d.path, missing}, 1 << 20));
    FAIL() << "created a store on a missing directory";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  const std::string file = d.path + "/plain-file";
  close(open(file.c_str(), O_CREAT | O_WRONLY, 0600));
  EXPECT_THROW(NvmeStore{opts({file}, 1 << 20)}, ConfigError);
  EXPECT_THROW(NvmeStore{opts({}, 1 << 20)}, ConfigError);
  EXPECT_THROW(NvmeStore{opts({d.path}, 0)}, ConfigError);
  EXPECT_EQ(count_entries(d.path), 1u);  // plain-file only
}

TEST(NvmeStore, SwapFilesHaveNoNameAndLeaveNothingBehind) {
  TempDir d0, d1;
  {
    NvmeStore store(opts({d0.path, d1.path}, 2 << 20));
    ASSERT_EQ(store.files().size(), 2u);
    EXPECT_EQ(count_entries(d0.path), 0u);
    EXPECT_EQ(count_entries(d1.path), 0u);
    for (const auto& f : store.files()) {
      EXPECT_EQ(f.rfind("/proc/self/fd/", 0), 0u) << f;
      EXPECT_NE(link_target(f).find("(deleted)"), std::string::npos) << link_target(f);
    }
  }
  EXPECT_EQ(count_entries(d0.path), 0u);
  EXPECT_EQ(count_entries(d1.path), 0u);
}

// The fallback for file systems without O_TMPFILE (ext4 here has it, so the store never
// takes this path in the tests above): the file has a name only between its create and
// its unlink, inside the call; it is a working O_DIRECT file; a name an earlier process
// with this pid left (a crash in that window) is skipped, not opened.
TEST(NvmeStore, NamedFallbackSwapFileIsUnlinkedBeforeItIsReturned) {
  TempDir d;
  const std::string stale = d.path + "/strata-swap-" + std::to_string(getpid()) + "-0.bin";
  {
    std::FILE* f = std::fopen(stale.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("an earlier process's", f);
    std::fclose(f);
  }
  const int fd = detail::open_named_swap_file(d.path);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(count_entries(d.path), 1u);  // only the earlier file: the new one has no name
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_EQ(st.st_nlink, 0u);
  EXPECT_EQ(st.st_size, 0);
  void* buf = nullptr;
  ASSERT_EQ(::posix_memalign(&buf, 4096, 4096), 0);
  std::memset(buf, 7, 4096);
  EXPECT_EQ(::pwrite(fd, buf, 4096, 0), 4096);  // O_DIRECT: an aligned write
  std::free(buf);
  EXPECT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);  // this descriptor's own lock
  ::close(fd);
  EXPECT_EQ(std::filesystem::file_size(stale), 20u);  // untouched
}

// The case the names made leak: a rank killed with SIGKILL (or SIGBUS, a segfault, an
// mpirun abort) runs no destructor. The child holds a 256 MiB store; once it is killed,
// the directory is empty and the file system has the space back.
TEST(NvmeStore, SigkilledProcessLeavesNoSwapFileAndItsSpaceReturns) {
  TempDir d;
  const uint64_t budget = 256ull << 20;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    close(ready[0]);
    try {
      NvmeStore store(opts({d.path}, budget));
      AlignedBuf buf(1 << 20);
      std::memset(buf.p, 0x42, 1 << 20);
      store.write(store.allocate(1 << 20), buf.p, 1 << 20).wait();
      char ok = 1;
      if (write(ready[1], &ok, 1) != 1) _exit(2);
      for (;;) pause();
    } catch (...) {
      _exit(1);
    }
  }
  close(ready[1]);
  char ok = 0;
  const bool started = read(ready[0], &ok, 1) == 1;
  close(ready[0]);
  if (!started) {
    int status = 0;
    waitpid(child, &status, 0);
    FAIL() << "the child could not make its store (exit status " << WEXITSTATUS(status) << ")";
  }
  // While it runs: its swap file is open in the directory, allocated, and has no name.
  EXPECT_EQ(count_entries(d.path), 0u);
  uint64_t held = 0;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(child) + "/fd")) {
    const std::string t = link_target(e.path().string());
    if (t.rfind(d.path + "/", 0) != 0) continue;
    EXPECT_NE(t.find("(deleted)"), std::string::npos) << t;
    struct stat st {};
    ASSERT_EQ(stat(e.path().c_str(), &st), 0);
    held += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  EXPECT_GE(held, budget);
  const uint64_t free_while_held = free_bytes(d.path);

  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_EQ(count_entries(d.path), 0u);
  // Other processes write to this disk too: ask for half the budget back, and give the
  // file system a moment to count the freed blocks.
  uint64_t free_after = 0;
  for (auto t0 = std::chrono::steady_clock::now(); std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10);) {
    free_after = free_bytes(d.path);
    if (free_after >= free_while_held + budget / 2) break;
    usleep(50'000);
  }
  EXPECT_GE(free_after, free_while_held + budget / 2)
      << "free while the child held its store: " << free_while_held << ", after SIGKILL: " << free_after;
}

// Named files from older versions (or a kill between create and unlink): those of dead
// processes are removed at start with one info line; a live process's, a locked one,
// and other names stay.
TEST(NvmeStore, StaleNamedSwapFilesOfDeadProcessesAreReclaimedAtStart) {
  TempDir d;
  const pid_t dead = dead_pid(), dead2 = dead_pid();
  const std::string stale = make_named_swap_file(d.path, dead, 0, 1 << 20);
  const std::string mine = make_named_swap_file(d.path, getpid(), 3, 4096);
  const std::string parents = make_named_swap_file(d.path, getppid(), 1, 4096);
  const std::string locked = make_named_swap_file(d.path, dead2, 2, 4096);
  const std::string other = d.path + "/strata-swap-" + std::to_string(dead) + "-x.bin";
  close(open(other.c_str(), O_CREAT | O_WRONLY, 0600));
  // A lock means someone holds the file whatever its pid says (another pid namespace).
  int lock_fd = open(locked.c_str(), O_RDONLY);
  ASSERT_GE(lock_fd, 0);
  ASSERT_EQ(flock(lock_fd, LOCK_EX), 0);

  log::set_level(log::Level::Info);
  testing::internal::CaptureStderr();
  {
    NvmeStore store(opts({d.path}, 1 << 20));
  }
  const std::string log = testing::internal::GetCapturedStderr();
  close(lock_fd);

  EXPECT_FALSE(fs::exists(stale)) << stale;
  EXPECT_TRUE(fs::exists(mine)) << mine;
  EXPECT_TRUE(fs::exists(parents)) << parents;
  EXPECT_TRUE(fs::exists(locked)) << locked;
  EXPECT_TRUE(fs::exists(other)) << other;
  EXPECT_EQ(count_entries(d.path), 4u);
  EXPECT_NE(log.find("reclaimed 1 stale swap file (1.00 MiB) in '" + d.path + "'"), std::string::npos) << log;
  EXPECT_NE(log.find("(pid " + std::to_string(dead) + ")"), std::string::npos) << log;
  EXPECT_EQ(log.find(std::to_string(dead2)), std::string::npos) << log;

  // Unlocked, the second dead process's file goes at the next start; then nothing is left.
  testing::internal::CaptureStderr();
  {
    NvmeStore store(opts({d.path}, 1 << 20));
  }
  const std::string log2 = testing::internal::GetCapturedStderr();
  EXPECT_NE(log2.find("reclaimed 1 stale swap file (4.00 KiB) in '" + d.path + "'"), std::string::npos) << log2;
  EXPECT_NE(log2.find("(pid " + std::to_string(dead2) + ")"), std::string::npos) << log2;
  EXPECT_FALSE(fs::exists(locked)) << locked;
  EXPECT_EQ(count_entries(d.path), 3u);
  testing::internal::CaptureStderr();
  {
    NvmeStore store(opts({d.path}, 1 << 20));
  }
  const std::string log3 = testing::internal::GetCapturedStderr();
  EXPECT_EQ(log3.find("reclaimed"), std::string::npos) << log3;
  EXPECT_EQ(count_entries(d.path), 3u);
}
