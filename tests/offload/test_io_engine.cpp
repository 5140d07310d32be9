// The I/O engine on both backends (io_uring and the thread pool), over a real O_DIRECT
// file: every byte read back is compared with what was written, buffers are poisoned
// before reads, and faults are injected under the engine.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/offload/fault_injection.hpp"
#include "strata/offload/io_engine.hpp"

using namespace strata;

namespace {

constexpr uint64_t kFileBytes = 32ull << 20;

struct AlignedBuf {
  explicit AlignedBuf(size_t n)
      : bytes(n), p(static_cast<uint8_t*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {}
  ~AlignedBuf() { std::free(p); }
  AlignedBuf(const AlignedBuf&) = delete;
  size_t bytes;
  uint8_t* p;
};

void fill_random(uint8_t* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(rng());
}

// First differing byte, or -1.
long first_mismatch(const uint8_t* a, const uint8_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return static_cast<long>(i);
  return -1;
}

// A scratch O_DIRECT file in /tmp (a disk here; O_DIRECT works on it).
class ScratchFile {
 public:
  explicit ScratchFile(uint64_t bytes) {
    char tmpl[] = "/tmp/strata-io-test-XXXXXX";
    int fd = mkstemp(tmpl);
    EXPECT_GE(fd, 0);
    close(fd);
    path_ = tmpl;
    fd_ = open(path_.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    EXPECT_GE(fd_, 0) << std::strerror(errno);
    // Gone from the directory at once: a test process that dies (death tests do, in a
    // child that re-runs the test body) leaves nothing behind. The path stays a name.
    unlink(path_.c_str());
    EXPECT_EQ(fallocate(fd_, 0, 0, static_cast<off_t>(bytes)), 0) << std::strerror(errno);
    align_ = probe_dio_alignment(fd_);
  }
  ~ScratchFile() { close(fd_); }
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  uint64_t align() const { return align_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t align_ = 4096;
};

IoEngineOptions options(const ScratchFile& f, IoEngineKind kind, uint64_t block, unsigned depth,
                        std::shared_ptr<FaultPlan> faults = nullptr) {
  IoEngineOptions o;
  o.aio.engine = kind;
  o.aio.block_size = block;
  o.aio.queue_depth = depth;
  o.files = {IoFile{f.path(), f.fd()}};
  o.alignment = f.align();
  o.faults = std::move(faults);
  return o;
}

// What a failed event threw, as an IoError; fails the test when it did not fail that way.
IoError expect_io_error(const Event& e) {
  try {
    e.wait();
  } catch (const IoError& err) {
    return err;
  } catch (const std::exception& other) {
    ADD_FAILURE() << "expected IoError, got: " << other.what();
    throw;
  }
  ADD_FAILURE() << "expected the event to fail with IoError, it succeeded";
  throw std::runtime_error("no error");
}

}  // namespace

class IoEngineTest : public ::testing::TestWithParam<IoEngineKind> {};

INSTANTIATE_TEST_SUITE_P(Backends, IoEngineTest, ::testing::Values(IoEngineKind::Uring, IoEngineKind::ThreadPool),
                         [](const auto& info) { return info.param == IoEngineKind::Uring ? "io_uring" : "threadpool"; });

TEST(IoEngine, ProbesAlignmentFromTheFileSystem) {
  ScratchFile f(1 << 20);
  uint64_t a = f.align();
  EXPECT_GE(a, 512u);
  EXPECT_LE(a, 4096u);
  EXPECT_EQ(a & (a - 1), 0u);
}

TEST_P(IoEngineTest, RoundTripOfManyRandomSizesIsByteExact) {
  ScratchFile f(kFileBytes);
  IoEngine eng(options(f, GetParam(), 64 << 10, 8));
  EXPECT_EQ(eng.name(), GetParam() == IoEngineKind::Uring ? "io_uring" : "threadpool");
  const uint64_t a = f.align();
  std::mt19937_64 rng(42);
  // Non-overlapping random slots: sizes from one alignment unit to 1 MiB + change, so
  // transfers both below and far above the block size (split into many requests).
  struct T {
    uint64_t off, bytes;
  };
  std::vector<T> ts;
  uint64_t off = 0;
  while (ts.size() < 60) {
    uint64_t bytes = (1 + rng() % ((1100u << 10) / a)) * a;
    if (off + bytes > kFileBytes) break;
    ts.push_back({off, bytes});
    off += bytes + (rng() % 4) * a;
  }
  ASSERT_GE(ts.size(), 20u);
  AlignedBuf src(off), dst(off);
  fill_random(src.p, off, 7);
  std::vector<Event> evs;
  for (const auto& t : ts) evs.push_back(eng.write(0, t.off, src.p + t.off, t.bytes));
  for (auto& e : evs) e.wait();
  std::memset(dst.p, 0xEE, off);  // poison: a read that moved nothing cannot pass
  evs.clear();
  for (const auto& t : ts) evs.push_back(eng.read(0, t.off, dst.p + t.off, t.bytes));
  for (auto& e : evs) e.wait();
  uint64_t total = 0;
  for (const auto& t : ts) {
    ASSERT_EQ(first_mismatch(src.p + t.off, dst.p + t.off, t.bytes), -1) << "transfer at " << t.off << ", " << t.bytes;
    total += t.bytes;
  }
  IoStats s = eng.stats();
  EXPECT_EQ(s.bytes, 2 * total);
  EXPECT_EQ(s.transfers, 2 * ts.size());
  EXPECT_GT(s.requests, 2 * ts.size());  // transfers over 64 KiB were split
  EXPECT_EQ(s.failed_transfers, 0u);
}

TEST_P(IoEngineTest, SeveralRingsSingleSubmitAndNoOverlapMoveTheSameBytes) {
  ScratchFile f(kFileBytes);
  for (int variant = 0; variant < 3; ++variant) {
    IoEngineOptions o = options(f, GetParam(), 128 << 10, 4);
    if (variant == 0) o.aio.intra_op_parallelism = 3;
    if (variant == 1) o.aio.single_submit = true;
    if (variant == 2) o.aio.overlap_events = false;
    IoEngine eng(std::move(o));
    const uint64_t n = 8ull << 20;
    AlignedBuf src(n), dst(n);
    fill_random(src.p, n, 100 + variant);
    std::memset(dst.p, 0, n);
    eng.write(0, 4 << 20, src.p, n).wait();
    eng.read(0, 4 << 20, dst.p, n).wait();
    EXPECT_EQ(first_mismatch(src.p, dst.p, n), -1) << "variant " << variant;
  }
}

TEST_P(IoEngineTest, ConcurrentCallersAndDestructionDrainEveryTransfer) {
  ScratchFile f(kFileBytes);
  const uint64_t per = 1 << 20;
  AlignedBuf src(8 * per), dst(8 * per);
  fill_random(src.p, 8 * per, 9);
  std::memset(dst.p, 0, 8 * per);
  std::vector<Event> reads(8);
  {
    IoEngine eng(options(f, GetParam(), 64 << 10, 16));
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&, t] {
        for (int k = 0; k < 2; ++k) {
          int i = t * 2 + k;
          eng.write(0, i * per, src.p + i * per, per).wait();
          reads[i] = eng.read(0, i * per, dst.p + i * per, per);
        }
      });
    for (auto& t : ts) t.join();
  }  // the engine is destroyed with reads possibly in flight: it must finish them
  for (auto& e : reads) {
    EXPECT_TRUE(e.ready());
    e.wait();
  }
  EXPECT_EQ(first_mismatch(src.p, dst.p, 8 * per), -1);
}

TEST_P(IoEngineTest, ShortReadsAndWritesAreCompletedTransparently) {
  ScratchFile f(kFileBytes);
  auto plan = std::make_shared<FaultPlan>();
  plan->short_nth(FaultTarget::Writes, 1, 0.5).short_nth(FaultTarget::Reads, 2, 0.25);
  IoEngine eng(options(f, GetParam(), 256 << 10, 4, plan));
  const uint64_t n = 1 << 20;  // four requests each way
  AlignedBuf src(n), dst(n);
  fill_random(src.p, n, 3);
  eng.write(0, 0, src.p, n).wait();
  std::memset(dst.p, 0xEE, n);
  eng.read(0, 0, dst.p, n).wait();
  EXPECT_EQ(first_mismatch(src.p, dst.p, n), -1);
  EXPECT_EQ(plan->injected(), 2u);
  EXPECT_EQ(eng.stats().short_resubmits, 2u);
  EXPECT_EQ(eng.stats().requests, 10u);  // 8 + one remainder per short op
}

TEST_P(IoEngineTest, EagainAndEintrAreRetried) {
  ScratchFile f(kFileBytes);
  auto plan = std::make_shared<FaultPlan>();
  plan->fail_nth(FaultTarget::Writes, 0, EAGAIN).fail_nth(FaultTarget::Reads, 1, EINTR);
  FaultRule again;  // three EAGAINs in a row on the same read
  again.target = FaultTarget::Reads;
  again.first = 3;
  again.count = 3;
  again.error = EAGAIN;
  plan->add(again);
  IoEngine eng(options(f, GetParam(), 64 << 10, 2, plan));
  const uint64_t n = 256 << 10;
  AlignedBuf src(n), dst(n);
  fill_random(src.p, n, 4);
  eng.write(0, 0, src.p, n).wait();
  std::memset(dst.p, 0, n);
  eng.read(0, 0, dst.p, n).wait();
  EXPECT_EQ(first_mismatch(src.p, dst.p, n), -1);
  EXPECT_EQ(eng.stats().retries, 5u);
}

TEST_P(IoEngineTest, EioAndEnospcFailTheTransferNamingPathOffsetAndLength) {
  ScratchFile f(kFileBytes);
  auto plan = std::make_shared<FaultPlan>();
  // The third write request (offset 2 * 64 KiB into the transfer) fails with ENOSPC;
  // every read request at file offset >= 1 MiB + 128 KiB fails with EIO.
  plan->fail_nth(FaultTarget::Writes, 2, ENOSPC);
  plan->fail_if(FaultTarget::Reads, [](const FaultOpInfo& op) { return op.offset >= (1 << 20) + (128 << 10); }, EIO);
  IoEngine eng(options(f, GetParam(), 64 << 10, 1, plan));
  const uint64_t n = 512 << 10;
  AlignedBuf buf(n);
  fill_random(buf.p, n, 5);

  IoError w = expect_io_error(eng.write(0, 1 << 20, buf.p, n));
  EXPECT_EQ(w.error_code(), ENOSPC);
  EXPECT_EQ(w.path(), f.path());
  EXPECT_EQ(w.offset(), (1u << 20) + (128u << 10));
  EXPECT_EQ(w.length(), 64u << 10);
  std::string msg = w.what();
  EXPECT_NE(msg.find(f.path()), std::string::npos) << msg;
  EXPECT_NE(msg.find("the disk is full: free space on it or point nvme_path at a disk with room"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("offset 1179648"), std::string::npos) << msg;
  EXPECT_NE(msg.find("length 65536"), std::string::npos) << msg;
  EXPECT_NE(msg.find("write"), std::string::npos) << msg;

  eng.write(0, 1 << 20, buf.p, n).wait();  // the ENOSPC was one op only
  IoError r = expect_io_error(eng.read(0, 1 << 20, buf.p, n));
  EXPECT_EQ(r.error_code(), EIO);
  EXPECT_EQ(r.offset(), (1u << 20) + (128u << 10));
  EXPECT_NE(std::string(r.what()).find("read"), std::string::npos);
  EXPECT_EQ(eng.stats().failed_transfers, 2u);
  // Depth 1: nothing after the failed request of the transfer was issued.
  EXPECT_EQ(eng.stats().requests, 3u + 8u + 3u);
  // A read below the failing range still works.
  eng.read(0, 1 << 20, buf.p, 128 << 10).wait();
}

TEST_P(IoEngineTest, FinishHookSeesTheErrorAndCanFailTheEvent) {
  ScratchFile f(kFileBytes);
  IoEngine eng(options(f, GetParam(), 64 << 10, 4));
  AlignedBuf buf(64 << 10);
  std::memset(buf.p, 1, 64 << 10);
  IoSegment seg{0, 0, buf.p, 64 << 10};
  bool saw_null = false;
  Event e = eng.submit(IoDir::Write, std::span<const IoSegment>(&seg, 1), [&](std::exception_ptr err) {
    saw_null = err == nullptr;
    return std::make_exception_ptr(CorruptionError("rejected by the hook"));
  });
  EXPECT_THROW(e.wait(), CorruptionError);
  EXPECT_TRUE(saw_null);
}

TEST(IoEngine, AutoFallsBackToTheThreadPoolWhenIoUringIsRefused) {
  ScratchFile f(1 << 20);
  auto plan = std::make_shared<FaultPlan>();
  plan->refuse_uring = true;
  IoEngine eng(options(f, IoEngineKind::Auto, 64 << 10, 4, plan));
  EXPECT_EQ(eng.name(), "threadpool");
  EXPECT_EQ(eng.config().engine, IoEngineKind::ThreadPool);
  AlignedBuf a(64 << 10), b(64 << 10);
  fill_random(a.p, 64 << 10, 1);
  eng.write(0, 0, a.p, 64 << 10).wait();
  eng.read(0, 0, b.p, 64 << 10).wait();
  EXPECT_EQ(first_mismatch(a.p, b.p, 64 << 10), -1);
  EXPECT_THROW(IoEngine{options(f, IoEngineKind::Uring, 64 << 10, 4, plan)}, Unavailable);
}

namespace {
// The kernel's SQPOLL threads of this process (named iou-sqp-<pid>; since Linux 5.12
// they are the process's own threads, so they show in /proc/self/task). -1 where the
// kernel is older and they cannot be seen.
int sqpoll_threads() {
  utsname u{};
  int major = 0, minor = 0;
  if (uname(&u) != 0 || std::sscanf(u.release, "%d.%d", &major, &minor) != 2 || major * 100 + minor < 512) return -1;
  int n = 0;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(t.path() / "comm");
    std::string name;
    if (std::getline(comm, name) && name.rfind("iou-sqp-", 0) == 0) ++n;
  }
  return n;
}
}  // namespace

TEST(IoEngine, SqpollIsReportedAsTheKernelRunsIt) {
  ScratchFile f(4 << 20);
  {
    IoEngineOptions o = options(f, IoEngineKind::ThreadPool, 64 << 10, 4);
    o.aio.use_sqpoll = true;
    IoEngine eng(std::move(o));
    EXPECT_FALSE(eng.config().use_sqpoll) << "the thread pool has no submission queue to poll";
  }
  IoEngineOptions o = options(f, IoEngineKind::Uring, 64 << 10, 4);
  o.aio.use_sqpoll = true;
  o.aio.intra_op_parallelism = 2;
  IoEngine eng(std::move(o));
  // Either every ring has a kernel thread polling it, or the engine says SQPOLL is off
  // and tells people why. A new SQPOLL thread names itself once it first runs, so its
  // name may lag the setup a little.
  const int want = eng.config().use_sqpoll ? 2 : 0;
  int threads = sqpoll_threads();
  for (int i = 0; i < 500 && threads >= 0 && threads != want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    threads = sqpoll_threads();
  }
  if (threads >= 0) {
    EXPECT_EQ(threads, want);
  }
  if (!eng.config().use_sqpoll) {
    EXPECT_FALSE(eng.notes().empty());
  }
  const uint64_t n = 1 << 20;
  AlignedBuf a(n), b(n);
  fill_random(a.p, n, 21);
  std::memset(b.p, 0, n);
  eng.write(0, 0, a.p, n).wait();
  eng.read(0, 0, b.p, n).wait();
  EXPECT_EQ(first_mismatch(a.p, b.p, n), -1);
}

TEST(IoEngine, RegisteredBuffersAreUsedAndSplitAtOneGiB) {
  ScratchFile f(kFileBytes);
  IoEngine eng(options(f, IoEngineKind::Uring, 256 << 10, 4));
  if (!eng.fixed_buffers()) GTEST_SKIP() << "the kernel refused registered buffers here";
  // A region just over 1 GiB: the kernel takes at most 1 GiB per buffer, so it must be
  // registered as two. Only its ends are touched by I/O.
  const uint64_t region = (1ull << 30) + (1 << 20);
  void* base = mmap(nullptr, region, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(base, MAP_FAILED);
  auto* p = static_cast<uint8_t*>(base);
  eng.register_buffer(base, region);
  const uint64_t n = 512 << 10;
  uint8_t* head = p;                     // in the first slice
  uint8_t* tail = p + region - n;        // in the second slice
  uint8_t* straddle = p + (1ull << 30) - (256 << 10);  // one request on each side of the cut
  fill_random(head, n, 11);
  eng.write(0, 0, head, n).wait();
  std::memset(tail, 0, n);
  eng.read(0, 0, tail, n).wait();
  EXPECT_EQ(first_mismatch(head, tail, n), -1);
  std::memset(straddle, 0, n);
  eng.read(0, 0, straddle, n).wait();
  EXPECT_EQ(first_mismatch(head, straddle, n), -1);
  IoStats s = eng.stats();
  EXPECT_EQ(s.requests, 6u);
  EXPECT_EQ(s.fixed_requests, 6u);
  // After unregistering, the same memory is used unregistered.
  eng.unregister_buffer(base);
  eng.read(0, 0, tail, n).wait();
  EXPECT_EQ(eng.stats().fixed_requests, 6u);
  EXPECT_EQ(eng.stats().requests, 8u);
  munmap(base, region);
}

TEST(IoEngineDeathTest, MisalignedRequestIsABug) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ScratchFile f(1 << 20);
  AlignedBuf buf(64 << 10);
  EXPECT_DEATH(
      {
        IoEngine eng(options(f, IoEngineKind::ThreadPool, 64 << 10, 2));
        eng.read(0, 100, buf.p, 4096).wait();
      },
      "misaligned read.*offset 100");
  EXPECT_DEATH(
      {
        IoEngine eng(options(f, IoEngineKind::ThreadPool, 64 << 10, 2));
        eng.write(0, 0, buf.p + 8, 4096).wait();
      },
      "misaligned write");
}

// The io_uring backend's own calls (submit, the wait after EAGAIN/EBUSY, registrations),
// failed by the fault plan in place of the kernel: every answer is read, and either
// retried, noted, or fatal naming the call.
namespace {
// Writes then reads back `n` bytes at offset 0; the transfers must complete, byte-exact.
void round_trip(IoEngine& eng, uint64_t n, uint64_t seed, void* region = nullptr) {
  AlignedBuf own(region ? 0 : 2 * n);
  auto* src = static_cast<uint8_t*>(region ? region : own.p);
  uint8_t* dst = src + n;
  fill_random(src, n, seed);
  std::memset(dst, 0xEE, n);
  eng.write(0, 0, src, n).wait();
  eng.read(0, 0, dst, n).wait();
  EXPECT_EQ(first_mismatch(src, dst, n), -1);
}

bool has_note(const IoEngine& eng, const std::string& text) {
  for (const auto& n : eng.notes())
    if (n.find(text) != std::string::npos) return true;
  return false;
}
}  // namespace

TEST(IoUringCalls, SubmitsInterruptedOrRefusedForNowAreRetried) {
  ScratchFile f(kFileBytes);
  auto plan = std::make_shared<FaultPlan>();
  plan->fail_uring_call(UringCall::Submit, 0, 3, EINTR)
      .fail_uring_call(UringCall::Submit, 5, 4, EAGAIN)
      .fail_uring_call(UringCall::Submit, 12, 4, EBUSY)
      .fail_uring_call(UringCall::WaitCqe, 1, 2, EINTR);  // the bounded wait after EAGAIN/EBUSY
  IoEngine eng(options(f, IoEngineKind::Uring, 64 << 10, 4, plan));
  for (int round = 0; round < 4; ++round) round_trip(eng, 1 << 20, 30 + round);
  EXPECT_EQ(plan->injected(), 13u) << "every injected answer was reached";
  EXPECT_EQ(eng.stats().failed_transfers, 0u);
}

TEST(IoUringCalls, RefusedRegistrationsAreNotedAndIoGoesOnUnregistered) {
  ScratchFile f(kFileBytes);
  auto plan = std::make_shared<FaultPlan>();
  plan->fail_uring_call(UringCall::RegisterFiles, 0, 1, EMFILE)
      .fail_uring_call(UringCall::RegisterRingFd, 0, 1, EINVAL)
      .fail_uring_call(UringCall::RegisterBuffer, 0, 1, ENOMEM);
  IoEngine eng(options(f, IoEngineKind::Uring, 64 << 10, 4, plan));
  EXPECT_TRUE(has_note(eng, "registered files refused: Too many open files (errno 24)"));
  EXPECT_TRUE(has_note(eng, "ring fd registration refused: Invalid argument (errno 22)"));
  const uint64_t n = 1 << 20;
  void* region = std::aligned_alloc(4096, 2 * n);
  ASSERT_NE(region, nullptr);
  eng.register_buffer(region, 2 * n);  // refused by the kernel (as the plan has it): used unregistered
  round_trip(eng, n, 40, region);
  EXPECT_EQ(eng.stats().fixed_requests, 0u);
  eng.unregister_buffer(region);  // nothing was registered: nothing to clear
  std::free(region);
  if (eng.fixed_buffers()) {
    EXPECT_EQ(plan->injected(), 3u);
  }
}

TEST(IoUringCallsDeathTest, SubmitAndWaitErrorsAreFatalNamingTheCallAndErrno) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ScratchFile f(1 << 20);
  AlignedBuf buf(64 << 10);
  EXPECT_DEATH(
      {
        auto plan = std::make_shared<FaultPlan>();
        plan->fail_uring_call(UringCall::Submit, 0, FaultRule::kEveryOp, EINVAL);
        IoEngine eng(options(f, IoEngineKind::Uring, 64 << 10, 2, plan));
        eng.write(0, 0, buf.p, 64 << 10).wait();
      },
      "io_uring_submit[a-z_]* failed: Invalid argument \\(io_uring code -22\\)");
  EXPECT_DEATH(
      {
        auto plan = std::make_shared<FaultPlan>();
        plan->fail_uring_call(UringCall::Submit, 0, FaultRule::kEveryOp, EAGAIN)
            .fail_uring_call(UringCall::WaitCqe, 0, 1, EFAULT);
        IoEngine eng(options(f, IoEngineKind::Uring, 64 << 10, 2, plan));
        eng.write(0, 0, buf.p, 64 << 10).wait();
      },
      "io_uring_wait_cqe_timeout failed: Bad address \\(io_uring code -14\\)");
}

// A real refusal by the kernel, no injection: a ring driven from a thread other than the
// one that set it up (its registered ring fd is that thread's; a single-issuer ring is
// that thread's alone) fails the submit, which names the call rather than hanging.
TEST(IoUringCallsDeathTest, RingDrivenFromAnotherThreadIsFatalNamingTheCall) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<std::string> notes;
  auto probe = make_uring_backend(2, false, &notes);
  bool ring_fd = true, single_issuer = true;
  for (const auto& n : notes) {
    if (n.find("ring fd registration refused") != std::string::npos) ring_fd = false;
    if (n.find("single issuer + deferred task running refused") != std::string::npos) single_issuer = false;
  }
  probe.reset();
  if (!ring_fd && !single_issuer) GTEST_SKIP() << "the kernel ties this ring to no thread";
  EXPECT_DEATH(
      {
        auto b = make_uring_backend(2, false, nullptr);
        std::thread other([&] { b->submit(1); });
        other.join();
      },
      "io_uring_submit_and_wait failed: .* \\(io_uring code -[0-9]+\\)");
}
