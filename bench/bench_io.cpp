// strata bench io: NVMe bandwidth through Strata's IoEngine, and (with --vs-fio) through
// fio on the same file, with the same block size, depth, pattern and time, in the same
// run. Strata and fio alternate, repetition by repetition, so drift of the disk (or of
// the host under a virtual disk) falls on both alike.
//
// Both sides use O_DIRECT on a file that is written in full first (a preallocated but
// unwritten extent reads back as zeros without touching the disk), larger than the
// pinned buffers, so neither the page cache nor a buffer hit can help either side.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "strata/bench/commands.hpp"
#include "strata/bench/report.hpp"
#include "strata/core/device.hpp"
#include "strata/core/error.hpp"
#include "strata/memory/tier.hpp"
#include "strata/model/gpt.hpp"
#include "strata/offload/io_engine.hpp"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1
#endif

namespace strata::bench {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr long kTmpfsMagic = 0x01021994;

struct IoBenchOptions {
  std::string dir = ".";
  std::string size = "1G";
  std::vector<std::string> block_sizes{"64K", "256K", "1M", "4M"};
  std::vector<unsigned> depths{1, 4, 16, 32};
  std::vector<std::string> patterns{"read", "write", "randread", "randwrite"};
  double seconds = 1.0;   // per run
  std::string bytes;      // per run, instead of seconds
  unsigned reps = 0;      // 0: 1 alone, 3 with --vs-fio
  OutputOptions out;
  bool vs_fio = false;
  std::string pinned = "256M";
  std::string engine = "auto";
  bool sqpoll = false;
  std::string fio = "fio";
  bool huge_pages = false;
  std::string fio_extra;  // appended to every fio command line
  bool beside_compute = false;
};

struct Pattern {
  std::string name;  // fio's rw= value
  IoDir dir;
  bool random;
};

// How much of [base, base+bytes) the kernel backs with 2 MiB pages, from /proc/self/smaps.
std::string huge_page_note(const void* base, uint64_t bytes) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_pool = false;
  uint64_t huge_kib = 0;
  const auto start = reinterpret_cast<uintptr_t>(base);
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find('-')) {
      in_pool = lo >= start && hi <= start + bytes;
      continue;
    }
    unsigned long kib = 0;
    if (in_pool && std::sscanf(line.c_str(), "AnonHugePages: %lu kB", &kib) == 1) huge_kib += kib;
  }
  const uint64_t huge = huge_kib * 1024;
  if (huge == 0) return "on 4 KiB pages";
  return format_bytes(huge) + " of it on 2 MiB pages";
}


struct Stats {
  std::vector<double> runs;  // bytes/s
  double median = 0, min = 0, max = 0;
  double iops = 0;           // of the median run
  void finish(uint64_t block) {
    std::vector<double> s = runs;
    std::sort(s.begin(), s.end());
    if (s.empty()) return;
    median = s.size() % 2 ? s[s.size() / 2] : (s[s.size() / 2 - 1] + s[s.size() / 2]) / 2;
    min = s.front();
    max = s.back();
    iops = median / static_cast<double>(block);
  }
  json to_json() const {
    return json{{"runs_bytes_per_s", runs}, {"median_bytes_per_s", median}, {"min_bytes_per_s", min},
                {"max_bytes_per_s", max}, {"iops", iops}};
  }
};

// The scratch file: written in full before measuring, removed at the end.
class BenchFile {
 public:
  BenchFile(const std::string& dir, uint64_t bytes) {
    struct statfs sf {};
    if (statfs(dir.c_str(), &sf) != 0)
      throw ConfigError("--dir '" + dir + "': " + std::strerror(errno) + "; give an existing directory on the disk to test");
    if (static_cast<long>(sf.f_type) == kTmpfsMagic)
      throw ConfigError("--dir '" + dir + "' is on tmpfs (memory, not a disk); pass --dir on the disk to test");
    const uint64_t avail = static_cast<uint64_t>(sf.f_bavail) * static_cast<uint64_t>(sf.f_bsize);
    if (bytes > avail)
      throw OutOfBudget("--dir '" + dir + "' has " + format_bytes(avail) + " free, the test file needs " +
                        format_bytes(bytes) + "; lower --size or pick another --dir");
    path_ = dir + (dir.ends_with('/') ? "" : "/") + "strata-bench-io-" + std::to_string(getpid()) + ".bin";
    fd_ = open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
    if (fd_ < 0)
      throw ConfigError("cannot create '" + path_ + "' with O_DIRECT: " + std::strerror(errno) +
                        "; pass --dir on a local disk");
    if (fallocate(fd_, 0, 0, static_cast<off_t>(bytes)) != 0) {
      int e = errno;
      close(fd_);
      unlink(path_.c_str());
      throw OutOfBudget("preallocating " + format_bytes(bytes) + " for '" + path_ + "' failed: " + std::strerror(e));
    }
  }
  ~BenchFile() {
    close(fd_);
    unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }

 private:
  std::string path_;
  int fd_ = -1;
};

struct Run {
  uint64_t bytes = 0;
  double seconds = 0;
  double bps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds : 0; }
};

// One timed run through the engine. Transfers of `batch` blocks are kept `window` deep,
// so the engine always has more queued than its depth and never waits on this thread.
// Each outstanding block has its own buffer, and no more: like fio's iodepth buffers,
// the set stays small. On the virtual disk this was written on, cycling 64 KiB reads
// through all 256 MiB of the pool instead was about 25% slower (A/B, same run): the host
// copies into these pages, and how many pages and how scattered they are costs it time
// that says nothing about the engine (docs/bench-io.md).
Run run_strata(IoEngine& eng, const Pattern& pat, uint64_t bs, unsigned depth, uint64_t file_bytes, char* pool,
               uint64_t pool_bytes, double seconds, uint64_t bytes_target, uint64_t seed) {
  const uint64_t nblocks = file_bytes / bs;
  const unsigned batch = std::max(1u, depth / 2);
  const size_t window = 4;
  const uint64_t nslots = std::clamp<uint64_t>(pool_bytes / bs, 1, batch * window);
  std::mt19937_64 rng(seed);
  uint64_t seq = 0, slot = 0, issued = 0;
  std::deque<Event> inflight;
  std::vector<IoSegment> segs(batch);
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  for (;;) {
    if (bytes_target ? issued >= bytes_target : Clock::now() >= deadline) break;
    if (inflight.size() >= window) {
      inflight.front().wait();
      inflight.pop_front();
    }
    for (unsigned i = 0; i < batch; ++i) {
      uint64_t blk = pat.random ? rng() % nblocks : seq++ % nblocks;
      segs[i] = IoSegment{0, blk * bs, pool + (slot++ % nslots) * bs, bs};
    }
    inflight.push_back(eng.submit(pat.dir, segs));
    issued += batch * bs;
  }
  while (!inflight.empty()) {
    inflight.front().wait();
    inflight.pop_front();
  }
  Run r;
  r.bytes = issued;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

struct FioSetup {
  std::string exe;
  std::string extra;
  std::string version;
  bool fixedbufs = false;
  bool sqpoll = false;
};

Run run_fio(const FioSetup& f, const std::string& file, uint64_t file_bytes, const Pattern& pat, uint64_t bs,
            unsigned depth, double seconds, uint64_t bytes_target) {
  char tmpl[] = "/tmp/strata-bench-fio-XXXXXX";
  int tfd = mkstemp(tmpl);
  if (tfd < 0) throw Error(std::string("cannot create a temporary file for fio's output: ") + std::strerror(errno));
  close(tfd);
  const std::string out = tmpl;
  std::ostringstream cmd;
  cmd << shell_quote(f.exe) << " --name=strata-vs-fio --filename=" << shell_quote(file)
      << " --ioengine=io_uring --direct=1 --rw=" << pat.name << " --bs=" << bs << " --iodepth=" << depth
      << " --size=" << file_bytes << " --norandommap=1 --randrepeat=0 --invalidate=0 --allow_file_create=0"
      << " --registerfiles=1" << (f.fixedbufs ? " --fixedbufs=1" : "") << (f.sqpoll ? " --sqthread_poll=1" : "");
  if (bytes_target)
    cmd << " --io_size=" << bytes_target;
  else
    cmd << " --time_based=1 --runtime=" << std::max(1, static_cast<int>(seconds * 1000 + 0.5)) << "ms";
  cmd << " --output-format=json --output=" << shell_quote(out);
  if (!f.extra.empty()) cmd << " " << f.extra;
  std::string log;
  int rc = run_command(cmd.str(), &log);
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  unlink(out.c_str());
  if (rc != 0) throw Error("fio failed (exit " + std::to_string(rc) + "): " + cmd.str() + "\n" + log);
  // fio may print notes before the JSON object.
  std::string s = text.str();
  size_t brace = s.find('{');
  if (brace == std::string::npos) throw Error("fio wrote no JSON: " + cmd.str() + "\n" + log);
  json j = json::parse(s.substr(brace));
  const json& side = j.at("jobs").at(0).at(pat.dir == IoDir::Read ? "read" : "write");
  Run r;
  r.bytes = side.at("io_bytes").get<uint64_t>();
  r.seconds = side.at("runtime").get<double>() / 1000.0;
  if (side.contains("bw_bytes") && r.seconds > 0) {
    // fio's own figure, for agreement with what fio prints.
    double bw = side.at("bw_bytes").get<double>();
    r.seconds = bw > 0 ? static_cast<double>(r.bytes) / bw : r.seconds;
  }
  return r;
}

// The options, checked: sizes in bytes, the patterns by name.
struct IoPlan {
  uint64_t file_bytes = 0;    // the test file
  uint64_t pinned_bytes = 0;  // the pinned pool's budget
  uint64_t bytes_target = 0;  // bytes per run; 0: --seconds per run
  std::vector<uint64_t> blocks;
  std::vector<Pattern> patterns;
  IoEngineKind kind = IoEngineKind::Auto;
  unsigned reps = 1;          // runs per point (per side)
};

IoPlan check_io_options(const IoBenchOptions& o) {
  IoPlan z;
  z.file_bytes = parse_byte_count(o.size, "--size");
  z.pinned_bytes = parse_byte_count(o.pinned, "--pinned");
  z.bytes_target = o.bytes.empty() ? 0 : parse_byte_count(o.bytes, "--bytes");
  if (z.file_bytes < (1 << 20) || z.file_bytes % (1 << 20) != 0)
    throw ConfigError("--size " + o.size + " must be a whole number of MiB, at least 1M");
  if (z.pinned_bytes < (1 << 20)) throw ConfigError("--pinned " + o.pinned + " must be at least 1M");
  for (const auto& b : o.block_sizes) {
    uint64_t v = parse_byte_count(b, "--block-sizes");
    if (v < 4096 || (v & (v - 1)) != 0 || v > (64ull << 20))
      throw ConfigError("--block-sizes: " + b + " must be a power of two from 4K to 64M");
    if (v > z.pinned_bytes) throw ConfigError("--block-sizes: " + b + " is larger than --pinned " + o.pinned);
    if (v > z.file_bytes) throw ConfigError("--block-sizes: " + b + " is larger than --size " + o.size);
    z.blocks.push_back(v);
  }
  for (unsigned d : o.depths)
    if (d < 1 || d > 4096) throw ConfigError("--depths: " + std::to_string(d) + " must be from 1 to 4096");
  for (const auto& p : o.patterns) {
    if (p == "read") z.patterns.push_back({p, IoDir::Read, false});
    else if (p == "write") z.patterns.push_back({p, IoDir::Write, false});
    else if (p == "randread") z.patterns.push_back({p, IoDir::Read, true});
    else if (p == "randwrite") z.patterns.push_back({p, IoDir::Write, true});
    else throw ConfigError("--patterns: unknown '" + p + "'; use read, write, randread, randwrite (fio's names)");
  }
  if (z.blocks.empty() || o.depths.empty() || z.patterns.empty())
    throw ConfigError("--block-sizes, --depths and --patterns each need at least one value");
  if (!z.bytes_target && !(o.seconds > 0)) throw ConfigError("--seconds must be positive");
  if (z.file_bytes <= z.pinned_bytes)
    std::fprintf(stderr, "strata bench io: note: --size %s is not larger than --pinned %s; reads may repeat buffers\n",
                 o.size.c_str(), o.pinned.c_str());
  if (o.engine == "io_uring") z.kind = IoEngineKind::Uring;
  else if (o.engine == "threadpool") z.kind = IoEngineKind::ThreadPool;
  else if (o.engine != "auto") throw ConfigError("--engine: use auto, io_uring or threadpool");
  z.reps = o.reps ? o.reps : (o.vs_fio ? 3 : 1);
  return z;
}

// fio's executable and version for --vs-fio; false (with the fix on stderr) when
// `fio --version` fails.
bool probe_fio(const IoBenchOptions& o, FioSetup& fio) {
  std::string ver;
  int rc = run_command(shell_quote(o.fio) + " --version", &ver);
  if (rc != 0) {
    std::fprintf(stderr,
                 "strata bench io: --vs-fio needs fio, but '%s --version' failed (exit %d): %s"
                 "install fio (e.g. apt-get install fio) or run without --vs-fio\n",
                 o.fio.c_str(), rc, ver.c_str());
    return false;
  }
  fio.exe = o.fio;
  fio.extra = o.fio_extra;
  fio.version = ver.substr(0, ver.find('\n'));
  return true;
}

// What every run works on: the test file and a pinned pool of random bytes, registered
// with each engine made for a point.
struct IoTarget {
  BenchFile file;
  std::unique_ptr<Device> device;
  std::unique_ptr<TierPool> pool;
  char* buffers = nullptr;  // the whole pool
  uint64_t align = 0;       // O_DIRECT alignment of the file, bytes
  IoEngineKind kind;
  bool sqpoll;

  IoTarget(const IoBenchOptions& o, const IoPlan& z)
      : file(o.dir, z.file_bytes), device(make_device({})), pool(make_pinned_pool(*device, {.budget = z.pinned_bytes})),
        kind(z.kind), sqpoll(o.sqpoll) {
    buffers = static_cast<char*>(pool->try_allocate(pool->capacity(), "bench-io"));
    STRATA_CHECK(buffers != nullptr, "the pinned pool could not give its whole capacity");
    if (o.huge_pages) {
      // The pool already asks for transparent huge pages; this makes the kernel collapse
      // every range now, so the whole pool is on 2 MiB pages. fio's buffers stay on 4 KiB.
      if (madvise(pool->base(), pool->capacity(), MADV_COLLAPSE) != 0)
        std::fprintf(stderr, "strata bench io: --hugepages: the kernel refused MADV_COLLAPSE (%s)\n",
                     std::strerror(errno));
    }
    std::mt19937_64 rng(1);
    for (uint64_t i = 0; i + 8 <= pool->capacity(); i += 8) {
      uint64_t v = rng();
      std::memcpy(buffers + i, &v, 8);
    }
    align = probe_dio_alignment(file.fd());
  }

  std::unique_ptr<IoEngine> make_engine(uint64_t bs, unsigned depth) const {
    IoEngineOptions eo;
    eo.on_full = "free space on it or give --dir on a disk with room (or smaller --size)";
    eo.aio.block_size = bs;
    eo.aio.queue_depth = depth;
    eo.aio.engine = kind;
    eo.aio.use_sqpoll = sqpoll;
    eo.files = {IoFile{file.path(), file.fd()}};
    eo.alignment = align;
    auto eng = std::make_unique<IoEngine>(std::move(eo));
    eng->register_buffer(pool->base(), pool->capacity());
    return eng;
  }
};

// The engine as it came up (io_uring or the thread pool, registered buffers, SQPOLL).
struct EngineInfo {
  std::string name;
  std::string description;
};

// One pass of writes so every block is really on disk (an unwritten extent reads back as
// zeros without touching it). fio is set up to match what the engine got.
EngineInfo fill_file(IoTarget& t, uint64_t file_bytes, FioSetup& fio, Progress& progress) {
  progress.show("writing " + format_bytes(file_bytes) + " to " + t.file.path() + " first");
  auto eng = t.make_engine(1 << 20, 16);
  Pattern fill{"write", IoDir::Write, false};
  run_strata(*eng, fill, 1 << 20, 16, file_bytes, t.buffers, t.pool->capacity(), 0, file_bytes, 0);
  if (fsync(t.file.fd()) != 0) throw IoError("fsync of the bench file failed", t.file.path(), 0, file_bytes, errno);
  fio.fixedbufs = eng->fixed_buffers();
  fio.sqpoll = eng->config().use_sqpoll;
  EngineInfo info;
  info.name = eng->name();
  info.description = info.name + (eng->fixed_buffers() ? ", registered buffers" : ", unregistered buffers") +
                     (eng->config().use_sqpoll ? ", SQPOLL" : "");
  return info;
}

// --beside-compute: the cores' sgemm rate alone and while the engine moves the point's
// pattern beside it, and what the I/O did meanwhile.
struct Beside {
  double alone_flops = 0;   // sustained FLOP/s, the mean of a run before and one after
  double beside_flops = 0;  // sustained FLOP/s while the I/O ran
  double beside_seconds = 0;  // how long the compute ran beside it (the I/O's time, give or take a product)
  Run io;                   // the I/O beside the compute
  unsigned cores = 0;
  double ratio() const { return alone_flops > 0 ? beside_flops / alone_flops : 0; }
  // Core-seconds the compute lost per GiB moved: the share of the cores it lost, times
  // the cores and the time, over the bytes. Noise can make it slightly negative.
  double core_s_per_gib() const {
    const double gib = static_cast<double>(io.bytes) / (1024.0 * 1024.0 * 1024.0);
    return gib > 0 ? (1 - ratio()) * cores * io.seconds / gib : 0;
  }
};

struct Row {
  std::string pattern;
  uint64_t bs;
  unsigned depth;
  Stats strata, fio;
  Beside beside;
};

// The cost of I/O to the compute beside it, measured: sgemm (cpu_sgemm) on every core for
// the run's time alone, then while the engine runs the pattern on a thread of its own (as
// the runtime's transfers run beside the model), then alone again. On a virtual machine
// the host's side of a virtual disk can run on the cores the guest computes on, so a
// transfer the runtime overlaps perfectly still costs compute: this says how much.
Beside measure_beside(IoEngine& eng, const Pattern& pat, uint64_t bs, unsigned depth, const IoPlan& z,
                      const IoTarget& t, double seconds, uint64_t seed) {
  Beside b;
  b.cores = std::max(1u, std::thread::hardware_concurrency());
  auto alone_for = [](double s) {
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
    return cpu_matmul_rate_while([&] { return Clock::now() < until; }).flops_per_s;
  };
  // With --bytes the I/O takes what it takes; alone runs as long as it did.
  const double before = alone_for(z.bytes_target ? 1.0 : seconds);
  std::atomic<bool> io_done{false};
  std::exception_ptr failed;
  std::thread io([&] {
    try {
      b.io = run_strata(eng, pat, bs, depth, z.file_bytes, t.buffers, t.pool->capacity(), seconds, z.bytes_target,
                        seed);
    } catch (...) {
      failed = std::current_exception();
    }
    io_done.store(true);
  });
  const MatmulRate beside = cpu_matmul_rate_while([&] { return !io_done.load(); });
  b.beside_flops = beside.flops_per_s;
  b.beside_seconds = beside.seconds;
  io.join();
  if (failed) std::rethrow_exception(failed);
  const double after = alone_for(b.io.seconds);
  b.alone_flops = (before + after) / 2;
  return b;
}

// Every pattern x block size x depth: --reps runs through a fresh engine, alternating
// with fio (who goes first alternates too) under --vs-fio.
std::vector<Row> measure_points(const IoBenchOptions& o, const IoPlan& z, const IoTarget& t, const FioSetup& fio,
                                Progress& progress) {
  const size_t total = z.patterns.size() * z.blocks.size() * o.depths.size();
  size_t index = 0;
  std::vector<Row> rows;
  for (const auto& pat : z.patterns) {
    for (uint64_t bs : z.blocks) {
      for (unsigned depth : o.depths) {
        ++index;
        Row row{pat.name, bs, depth, {}, {}};
        auto eng = t.make_engine(bs, depth);
        for (unsigned rep = 0; rep < z.reps; ++rep) {
          char head[160];
          std::snprintf(head, sizeof head, "[%zu/%zu] %s bs=%s qd=%u rep %u/%u", index, total, pat.name.c_str(),
                        short_size(bs).c_str(), depth, rep + 1, z.reps);
          // Alternate who goes first, so a slow drift favours neither.
          for (int turn = 0; turn < (o.vs_fio ? 2 : 1); ++turn) {
            bool strata_turn = o.vs_fio ? ((rep + turn) % 2 == 0) : true;
            progress.show(std::string(head) + (strata_turn ? " strata" : " fio"));
            if (strata_turn) {
              Run r = run_strata(*eng, pat, bs, depth, z.file_bytes, t.buffers, t.pool->capacity(), o.seconds,
                                 z.bytes_target, 1000 * index + rep);
              row.strata.runs.push_back(r.bps());
            } else {
              Run r = run_fio(fio, t.file.path(), z.file_bytes, pat, bs, depth, o.seconds, z.bytes_target);
              row.fio.runs.push_back(r.bps());
            }
          }
        }
        if (o.beside_compute) {
          char head[160];
          std::snprintf(head, sizeof head, "[%zu/%zu] %s bs=%s qd=%u: compute alone, beside the I/O, alone", index,
                        total, pat.name.c_str(), short_size(bs).c_str(), depth);
          progress.show(head);
          row.beside = measure_beside(*eng, pat, bs, depth, z, t, o.seconds, 1000 * index + 999);
        }
        row.strata.finish(bs);
        row.fio.finish(bs);
        rows.push_back(std::move(row));
      }
    }
  }
  return rows;
}

// The human table: median [min-max] per point, beside fio's under --vs-fio.
void print_io_table(std::FILE* out, const std::vector<Row>& rows, bool vs_fio, bool beside) {
  const double mib = 1024.0 * 1024.0;
  if (vs_fio)
    std::fprintf(out, "%-10s %6s %5s  %-24s %9s  %-24s %10s", "pattern", "bs", "depth", "strata MiB/s", "IOPS",
                 "fio MiB/s", "strata/fio");
  else
    std::fprintf(out, "%-10s %6s %5s  %-24s %9s", "pattern", "bs", "depth", "strata MiB/s", "IOPS");
  if (beside) std::fprintf(out, "  %14s %15s %11s", "MiB/s beside", "compute beside", "core-s/GiB");
  std::fprintf(out, "\n");
  for (const auto& r : rows) {
    char sc[64], f[64];
    std::snprintf(sc, sizeof sc, "%.0f [%.0f-%.0f]", r.strata.median / mib, r.strata.min / mib, r.strata.max / mib);
    if (vs_fio) {
      std::snprintf(f, sizeof f, "%.0f [%.0f-%.0f]", r.fio.median / mib, r.fio.min / mib, r.fio.max / mib);
      std::fprintf(out, "%-10s %6s %5u  %-24s %9.0f  %-24s %10.3f", r.pattern.c_str(), short_size(r.bs).c_str(),
                   r.depth, sc, r.strata.iops, f, r.fio.median > 0 ? r.strata.median / r.fio.median : 0.0);
    } else {
      std::fprintf(out, "%-10s %6s %5u  %-24s %9.0f", r.pattern.c_str(), short_size(r.bs).c_str(), r.depth, sc,
                   r.strata.iops);
    }
    if (beside)
      std::fprintf(out, "  %14.0f %15.3f %11.3f", r.beside.io.bps() / mib, r.beside.ratio(), r.beside.core_s_per_gib());
    std::fprintf(out, "\n");
  }
}

Report io_report(const IoBenchOptions& o, const IoPlan& z, const IoTarget& t, const FioSetup& fio,
                 const EngineInfo& engine, const std::vector<Row>& rows, const std::string& command_line) {
  const std::string page_note = huge_page_note(t.pool->base(), t.pool->capacity());
  const double mib = 1024.0 * 1024.0;
  const uint64_t pinned = t.pool->capacity();
  Report report;
  report.benchmark = "io";
  report.command = command_line;
  char title[512];
  std::snprintf(title, sizeof title, "strata bench io: %s (%s), O_DIRECT, pinned pool %s (%s), engine %s",
                t.file.path().c_str(), format_bytes(z.file_bytes).c_str(), format_bytes(pinned).c_str(),
                page_note.c_str(), engine.description.c_str());
  report.title = title;
  report.config = {{"file_bytes", z.file_bytes}, {"pinned_bytes", pinned}, {"engine", engine.name},
                   {"reps", z.reps}, {"vs_fio", o.vs_fio},
                   {"seconds_per_run", z.bytes_target ? json(nullptr) : json(o.seconds)},
                   {"bytes_per_run", z.bytes_target ? json(z.bytes_target) : json(nullptr)}};
  report.table.columns = {{"pattern", "pattern", ""},
                          {"block_size", "bs", ""},
                          {"depth", "depth", ""},
                          {"strata_mibps", "strata MiB/s", "%.0f"},
                          {"strata_min_mibps", "min", "%.0f"},
                          {"strata_max_mibps", "max", "%.0f"},
                          {"strata_iops", "IOPS", "%.0f"}};
  if (o.vs_fio)
    report.table.columns.insert(report.table.columns.end(), {{"fio_mibps", "fio MiB/s", "%.0f"},
                                                             {"fio_min_mibps", "min", "%.0f"},
                                                             {"fio_max_mibps", "max", "%.0f"},
                                                             {"ratio", "strata/fio", "%.3f"}});
  if (o.beside_compute)
    report.table.columns.insert(report.table.columns.end(), {{"beside_mibps", "MiB/s beside", "%.0f"},
                                                             {"compute_beside", "compute beside", "%.3f"},
                                                             {"core_s_per_gib", "core-s/GiB", "%.3f"}});
  json points = json::array();
  for (const auto& r : rows) {
    json row{{"pattern", r.pattern}, {"block_size", r.bs}, {"depth", r.depth},
             {"strata_mibps", r.strata.median / mib}, {"strata_min_mibps", r.strata.min / mib},
             {"strata_max_mibps", r.strata.max / mib}, {"strata_iops", r.strata.iops}};
    json p{{"pattern", r.pattern}, {"block_size", r.bs}, {"depth", r.depth}, {"strata", r.strata.to_json()}};
    if (o.vs_fio) {
      row["fio_mibps"] = r.fio.median / mib;
      row["fio_min_mibps"] = r.fio.min / mib;
      row["fio_max_mibps"] = r.fio.max / mib;
      row["ratio"] = r.fio.median > 0 ? r.strata.median / r.fio.median : 0.0;
      p["fio"] = r.fio.to_json();
      p["ratio"] = r.fio.median > 0 ? r.strata.median / r.fio.median : 0.0;
    }
    if (o.beside_compute) {
      row["beside_mibps"] = r.beside.io.bps() / mib;
      row["compute_beside"] = r.beside.ratio();
      row["core_s_per_gib"] = r.beside.core_s_per_gib();
      p["beside_compute"] = {{"alone_flops", r.beside.alone_flops}, {"beside_flops", r.beside.beside_flops},
                             {"beside_seconds", r.beside.beside_seconds},
                             {"ratio", r.beside.ratio()}, {"io_bytes", r.beside.io.bytes},
                             {"io_seconds", r.beside.io.seconds}, {"cores", r.beside.cores},
                             {"core_s_per_gib", r.beside.core_s_per_gib()}};
    }
    report.table.rows.push_back(std::move(row));
    points.push_back(p);
  }
  std::string fio_note;
  if (o.vs_fio) fio_note = ", alternating with " + fio.version + (fio.extra.empty() ? "" : " (" + fio.extra + ")");
  report.print_human = [rows, fio_note, vs_fio = o.vs_fio, beside = o.beside_compute, seconds = o.seconds,
                        bytes_target = z.bytes_target, reps = z.reps](std::FILE* out) {
    if (bytes_target)
      std::fprintf(out, "%s per run, %u run(s) per point%s\n", format_bytes(bytes_target).c_str(), reps,
                   fio_note.c_str());
    else
      std::fprintf(out, "%.1f s per run, %u run(s) per point%s\n", seconds, reps, fio_note.c_str());
    std::fprintf(out, "bandwidth in MiB/s: median [min-max] over the runs\n\n");
    print_io_table(out, rows, vs_fio, beside);
    if (beside)
      std::fprintf(out,
                   "\ncompute beside: the cores' sustained sgemm rate (every core) while the engine ran the "
                   "point beside it, over its rate alone (the mean of a run before and one after); MiB/s beside: the "
                   "I/O meanwhile; core-s/GiB: the compute lost per GiB moved ((1 - compute beside) x cores x time "
                   "/ GiB). On a virtual disk the host's side of the I/O can run on the guest's cores: this is what a "
                   "perfectly overlapped transfer still costs the model.\n");
  };
  // The fields `strata bench io --json` has always had (bench/plot_io.py reads them).
  report.extra = {{"file", t.file.path()},
                  {"file_bytes", z.file_bytes},
                  {"pinned_bytes", pinned},
                  {"pinned_pages", page_note},
                  {"engine", engine.name},
                  {"engine_description", engine.description},
                  {"seconds_per_run", z.bytes_target ? json(nullptr) : json(o.seconds)},
                  {"bytes_per_run", z.bytes_target ? json(z.bytes_target) : json(nullptr)},
                  {"reps", z.reps},
                  {"vs_fio", o.vs_fio},
                  {"fio_version", o.vs_fio ? json(fio.version) : json(nullptr)},
                  {"fio_extra", o.fio_extra},
                  {"beside_compute", o.beside_compute},
                  {"points", points}};
  return report;
}

int run_io(const IoBenchOptions& o, const std::string& command_line) {
  check_output_options(o.out, {{o.fio, "--fio"}});
  const IoPlan z = check_io_options(o);
  FioSetup fio;
  if (o.vs_fio && !probe_fio(o, fio)) return 2;

  IoTarget target(o, z);
  Progress progress("strata bench io");
  const EngineInfo engine = fill_file(target, z.file_bytes, fio, progress);
  const std::vector<Row> rows = measure_points(o, z, target, fio, progress);
  progress.done();

  emit(io_report(o, z, target, fio, engine, rows, command_line), o.out);
  return 0;
}

}  // namespace

void add_io(CLI::App& bench, Runner& run) {
  auto* io = bench.add_subcommand("io", "NVMe read/write bandwidth through the io_uring engine, beside fio");
  auto o = std::make_shared<IoBenchOptions>();
  io->add_option("--dir", o->dir, "Directory for the test file (on the disk to measure)")->capture_default_str();
  io->add_option("--size", o->size, std::string("Test file size (") + kByteCountUnits + "); larger than --pinned")->capture_default_str();
  io->add_option("--block-sizes", o->block_sizes, "Block sizes, comma-separated")->delimiter(',')->capture_default_str();
  io->add_option("--depths", o->depths, "Queue depths, comma-separated")->delimiter(',')->capture_default_str();
  io->add_option("--patterns", o->patterns, "read, write, randread, randwrite (comma-separated)")
      ->delimiter(',')
      ->capture_default_str();
  auto* secs = io->add_option("--seconds", o->seconds, "Seconds per run")->capture_default_str();
  io->add_option("--bytes", o->bytes, std::string("Bytes per run instead of --seconds (") + kByteCountUnits + ")")->excludes(secs);
  io->add_option("--reps", o->reps, "Runs per point (default 1, or 3 with --vs-fio)");
  io->add_flag("--vs-fio", o->vs_fio, "Run fio (io_uring, O_DIRECT) on each point too, alternating, and compare");
  io->add_option("--fio", o->fio, "The fio executable")->capture_default_str();
  io->add_option("--fio-extra", o->fio_extra, "Extra arguments for every fio run, e.g. \"--mem=shmhuge\"");
  io->add_option("--pinned", o->pinned, std::string("Pinned buffer budget (") + kByteCountUnits + ")")->capture_default_str();
  io->add_option("--engine", o->engine, "auto, io_uring or threadpool")->capture_default_str();
  io->add_flag("--sqpoll", o->sqpoll, "Use SQPOLL (kernel-side submission) on both sides");
  io->add_flag("--hugepages", o->huge_pages,
               "Collapse the whole pinned pool into 2 MiB pages now (MADV_COLLAPSE); fio's buffers stay on 4 KiB pages");
  io->add_flag("--beside-compute", o->beside_compute,
               "Also measure what the I/O costs compute: sgemm on every core alone, and while each point runs "
               "beside it (the compute's rate beside / alone, and core-seconds lost per GiB)");
  add_output_options(*io, o->out, "bandwidth against block size and queue depth, per pattern (fio dashed)");
  io->callback([&run, o, io] {
    run = [o, cmd = command_line(*io, "strata bench io")] { return run_io(*o, cmd); };
  });
}

}  // namespace strata::bench
