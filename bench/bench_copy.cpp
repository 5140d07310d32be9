// strata bench copy: pinned <-> device copies through the device backend's copy stream
// (Stream::copy_async), both directions, across sizes, beside a plain memcpy of the
// same bytes between the same buffers in the same run.
//
// What is compared, per backend:
//  - cpu: the "device" is an arena of host RAM (make_device_arena) and a copy stream is
//    a worker thread running memcpy in queue order. The reference is std::memcpy of the
//    same sizes, between the same pinned and arena addresses, on the calling thread. The
//    ratio is what the stream (queueing, the hand-off to the worker, the record/wait)
//    costs against doing the copy inline; at large sizes both are bounded by host memory.
//  - cuda: the copies are cudaMemcpyAsync between the pinned pool (registered) and
//    device memory. Device memory cannot be memcpy'd, so the reference is memcpy between
//    the pinned pool and a second host buffer: host memory bandwidth, a ceiling that
//    PCIe usually stays under (on the one H100 it ran on, one core's memcpy did not reach
//    PCIe: docs/bench-copy.md).
//
// Each sample queues `count` copies of one size, cycling through --span bytes of both
// buffers (so small copies do not sit in the cache, as a training step's transfers do
// not), then waits for the last; bandwidth = count * size / elapsed. Strata and the
// reference alternate sample by sample, and who goes first alternates by repetition.
// After each Strata sample the first copied block is read back and compared, so a copy
// that did nothing cannot pass.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/bench/commands.hpp"
#include "strata/bench/report.hpp"
#include "strata/core/device.hpp"
#include "strata/core/error.hpp"
#include "strata/memory/tier.hpp"

namespace strata::bench {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct CopyOptions {
  std::vector<std::string> sizes{"4K", "64K", "1M", "16M", "64M"};
  std::vector<std::string> directions{"h2d", "d2h"};
  std::string span = "128M";            // bytes of each buffer the copies cycle through
  std::string bytes_per_sample = "256M";  // at least one copy per sample
  unsigned reps = 5;
  std::string backend = "cpu";
  int ordinal = 0;
  OutputOptions out;
};

enum class Direction { HostToDevice, DeviceToHost };
const char* name_of(Direction d) { return d == Direction::HostToDevice ? "h2d" : "d2h"; }

void fill_random(void* p, uint64_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* c = static_cast<char*>(p);
  for (uint64_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(c + i, &v, 8);
  }
}

// The options, checked: sizes in bytes, directions by name.
struct CopyPlan {
  uint64_t span = 0;        // bytes of each buffer the copies cycle through
  uint64_t per_sample = 0;  // bytes per timed sample (at least one copy)
  std::vector<uint64_t> sizes;
  std::vector<Direction> dirs;
  Backend backend = Backend::Cpu;
};

CopyPlan check_copy_options(const CopyOptions& o) {
  CopyPlan z;
  z.span = parse_byte_count(o.span, "--span");
  z.per_sample = parse_byte_count(o.bytes_per_sample, "--bytes-per-sample");
  if (z.span < 4096) throw ConfigError("--span " + o.span + " must be at least 4K");
  if (z.per_sample == 0) throw ConfigError("--bytes-per-sample must be positive");
  if (o.reps < 1) throw ConfigError("--reps must be at least 1");
  for (const auto& s : o.sizes) {
    const uint64_t v = parse_byte_count(s, "--sizes");
    if (v == 0) throw ConfigError("--sizes: " + s + " is zero; give sizes of at least 1 byte");
    if (v > z.span) throw ConfigError("--sizes: " + s + " is larger than --span " + o.span + "; raise --span");
    z.sizes.push_back(v);
  }
  for (const auto& d : o.directions) {
    if (d == "h2d") z.dirs.push_back(Direction::HostToDevice);
    else if (d == "d2h") z.dirs.push_back(Direction::DeviceToHost);
    else throw ConfigError("--directions: unknown '" + d + "'; use h2d (pinned to device) and/or d2h");
  }
  if (z.sizes.empty() || z.dirs.empty()) throw ConfigError("--sizes and --directions each need at least one value");
  z.backend = parse_backend(o.backend);
  if (z.backend == Backend::Sim)
    throw ConfigError("--backend sim: simulated memory has no bytes to copy; use cpu or cuda");
  return z;
}

struct Point {
  Direction dir;
  uint64_t size;
  uint64_t count;
  std::vector<double> strata, ref;  // bytes/s
  std::vector<double> ref_cpu;      // share of a core the memcpy thread got
};

// The buffers both sides copy between, and one timed sample of each side.
class CopyBuffers {
 public:
  CopyBuffers(Device& dev, Backend backend, uint64_t span)
      : span_(span), pinned_pool_(make_pinned_pool(dev, {.budget = span})), arena_(make_device_arena(dev, span)) {
    pinned_ = static_cast<char*>(pinned_pool_->try_allocate(span, "bench-copy"));
    device_ = static_cast<char*>(arena_->try_allocate(span, "bench-copy"));
    STRATA_CHECK(pinned_ && device_, "pools of --span bytes could not give --span bytes");
    // The reference's other side: the arena itself when it is host memory (cpu), else a
    // second host buffer (cuda: device memory cannot be memcpy'd).
    ref_device_ = device_;
    if (backend != Backend::Cpu) {
      host_side_storage_.reset(new char[span]);
      ref_device_ = host_side_storage_.get();
    }
    stream_ = dev.create_stream("bench-copy");
    // Touch everything first (the arena is mapped lazily), with different bytes on each
    // side so a copy in either direction is visible.
    fill_random(pinned_, span, 1);
    std::vector<char> other(span);
    fill_random(other.data(), span, 2);
    stream_->copy_async(device_, other.data(), span);
    stream_->synchronize();
    std::memcpy(ref_device_, other.data(), span);
    check_.resize(std::min<uint64_t>(span, 1 << 20));
  }

  // `p.count` copies through the copy stream; bytes/s. The first block copied is read
  // back and compared with its source.
  double time_stream(const Point& p) {
    const uint64_t slots = span_ / p.size;
    char* src = p.dir == Direction::HostToDevice ? pinned_ : device_;
    char* dst = p.dir == Direction::HostToDevice ? device_ : pinned_;
    const auto t0 = Clock::now();
    for (uint64_t i = 0; i < p.count; ++i) {
      const uint64_t off = (i % slots) * p.size;
      stream_->copy_async(dst + off, src + off, p.size);
    }
    stream_->synchronize();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    // Read back the first block of the destination and compare it with the source.
    const uint64_t n = std::min<uint64_t>(p.size, check_.size());
    stream_->copy_async(check_.data(), p.dir == Direction::HostToDevice ? dst : src, n);
    stream_->synchronize();
    const char* expect = p.dir == Direction::HostToDevice ? src : dst;
    if (std::memcmp(check_.data(), expect, n) != 0) ++mismatches_;
    return static_cast<double>(p.count * p.size) / s;
  }

  // The same copies with memcpy on this thread; bytes/s. Adds the share of a core the
  // thread got to p.ref_cpu.
  double time_memcpy(Point& p) {
    const uint64_t slots = span_ / p.size;
    char* src = p.dir == Direction::HostToDevice ? pinned_ : ref_device_;
    char* dst = p.dir == Direction::HostToDevice ? ref_device_ : pinned_;
    const double cpu0 = thread_cpu_seconds();
    const auto t0 = Clock::now();
    for (uint64_t i = 0; i < p.count; ++i) {
      const uint64_t off = (i % slots) * p.size;
      std::memcpy(dst + off, src + off, p.size);
    }
    // Keeps the compiler from treating the copies as dead.
    asm volatile("" : : "r"(dst) : "memory");
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    p.ref_cpu.push_back((thread_cpu_seconds() - cpu0) / s);
    return static_cast<double>(p.count * p.size) / s;
  }

  uint64_t mismatches() const { return mismatches_; }
  void reset_mismatches() { mismatches_ = 0; }

 private:
  uint64_t span_;  // bytes
  std::unique_ptr<TierPool> pinned_pool_;
  std::unique_ptr<TierPool> arena_;
  char* pinned_ = nullptr;      // span_ bytes of the pinned pool
  char* device_ = nullptr;      // span_ bytes of the device arena
  std::unique_ptr<char[]> host_side_storage_;
  char* ref_device_ = nullptr;  // the memcpy reference's "device" side
  std::unique_ptr<Stream> stream_;
  std::vector<char> check_;     // read-back of a copied block
  uint64_t mismatches_ = 0;
};

// One untimed round first (page tables, the worker's first wake-ups), then --reps
// samples of each point; the two sides alternate, and who goes first alternates by
// repetition and point.
void measure_points(std::vector<Point>& points, CopyBuffers& buffers, unsigned reps, Progress& progress) {
  for (auto& p : points) {
    progress.show("warm-up " + std::string(name_of(p.dir)) + " " + short_size(p.size));
    buffers.time_stream(p);
    buffers.time_memcpy(p);
  }
  buffers.reset_mismatches();
  for (auto& p : points) p.ref_cpu.clear();
  for (unsigned rep = 0; rep < reps; ++rep) {
    for (size_t i = 0; i < points.size(); ++i) {
      Point& p = points[i];
      progress.show("rep " + std::to_string(rep + 1) + "/" + std::to_string(reps) + ", " + name_of(p.dir) + " " +
                    short_size(p.size));
      if ((rep + i) % 2 == 0) {
        p.strata.push_back(buffers.time_stream(p));
        p.ref.push_back(buffers.time_memcpy(p));
      } else {
        p.ref.push_back(buffers.time_memcpy(p));
        p.strata.push_back(buffers.time_stream(p));
      }
    }
  }
}

Report copy_report(const CopyOptions& o, const CopyPlan& z, const Device& dev, const std::vector<Point>& points,
                   uint64_t mismatches, double load_start, const std::string& command) {
  Report r;
  r.benchmark = "copy";
  r.command = command;
  r.title = "strata bench copy: " + dev.description() + ", copy stream vs memcpy of the same bytes; GB/s = 1e9 B/s, "
            "median over " + std::to_string(o.reps) + " samples [min, max]";
  r.config = {{"backend", to_string(z.backend)},
              {"device", dev.description()},
              {"span_bytes", z.span},
              {"bytes_per_sample", z.per_sample},
              {"reps", o.reps},
              {"reference", z.backend == Backend::Cpu ? "memcpy between the same pinned and arena (host RAM) buffers"
                                                      : "memcpy between the pinned pool and a host buffer"},
              {"load_average_start", load_start},
              {"load_average_end", load_average()}};
  r.table.columns = {{"direction", "dir", ""},
                     {"size", "size", ""},
                     {"copies", "copies", ""},
                     {"strata_gbps", "strata GB/s", "%.2f"},
                     {"strata_min_gbps", "min", "%.2f"},
                     {"strata_max_gbps", "max", "%.2f"},
                     {"ref_gbps", "memcpy GB/s", "%.2f"},
                     {"ref_min_gbps", "min", "%.2f"},
                     {"ref_max_gbps", "max", "%.2f"},
                     {"ratio", "strata/memcpy", "%.3f"},
                     {"ref_cpu_share", "memcpy cpu", "%.2f"},
                     {"strata_us_per_copy", "strata us/copy", "%.2f"},
                     {"ref_us_per_copy", "memcpy us/copy", "%.2f"}};
  for (const Point& p : points) {
    const Summary s = summarize(p.strata), m = summarize(p.ref);
    r.table.rows.push_back({{"direction", name_of(p.dir)},
                            {"size", short_size(p.size)},
                            {"size_bytes", p.size},
                            {"copies", p.count},
                            {"strata_gbps", s.median / 1e9},
                            {"strata_min_gbps", s.min / 1e9},
                            {"strata_max_gbps", s.max / 1e9},
                            {"strata_spread", s.spread()},
                            {"ref_gbps", m.median / 1e9},
                            {"ref_min_gbps", m.min / 1e9},
                            {"ref_max_gbps", m.max / 1e9},
                            {"ref_spread", m.spread()},
                            {"ref_cpu_share", summarize(p.ref_cpu).median},
                            {"ratio", m.median > 0 ? s.median / m.median : 0.0},
                            {"strata_us_per_copy", s.median > 0 ? p.size / s.median * 1e6 : 0.0},
                            {"ref_us_per_copy", m.median > 0 ? p.size / m.median * 1e6 : 0.0},
                            {"strata_runs_bytes_per_s", p.strata},
                            {"ref_runs_bytes_per_s", p.ref}});
  }
  r.extra["read_back_mismatches"] = mismatches;
  r.notes.push_back("h2d: pinned -> device; d2h: device -> pinned. " + std::to_string(points.size() * o.reps) +
                    " copy-stream samples read back and compared: " + std::to_string(mismatches) + " mismatched.");
  r.notes.push_back("memcpy cpu: the share of a core the memcpy reference's thread got while it ran (median); below "
                    "1, other work on the machine took the rest.");
  return r;
}

int run_copy(const CopyOptions& o, const std::string& command) {
  check_output_options(o.out);
  const CopyPlan z = check_copy_options(o);
  const double load_start = load_average();

  auto dev = make_device({z.backend, o.ordinal});
  CopyBuffers buffers(*dev, z.backend, z.span);
  std::vector<Point> points;
  for (uint64_t size : z.sizes)
    for (Direction d : z.dirs) points.push_back({d, size, std::max<uint64_t>(1, z.per_sample / size), {}, {}, {}});

  Progress progress("strata bench copy");
  measure_points(points, buffers, o.reps, progress);
  progress.done();

  const uint64_t mismatches = buffers.mismatches();
  emit(copy_report(o, z, *dev, points, mismatches, load_start, command), o.out);
  return mismatches == 0 ? 0 : 1;
}

}  // namespace

void add_copy(CLI::App& bench, Runner& run) {
  auto* cmd = bench.add_subcommand("copy", "Pinned <-> device copies through the copy stream, beside memcpy");
  auto o = std::make_shared<CopyOptions>();
  cmd->add_option("--sizes", o->sizes, std::string("Copy sizes, comma-separated (") + kByteCountUnits + ")")->delimiter(',')->capture_default_str();
  cmd->add_option("--directions", o->directions, "h2d (pinned to device), d2h (device to pinned)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--span", o->span, "Bytes of each buffer the copies cycle through")->capture_default_str();
  cmd->add_option("--bytes-per-sample", o->bytes_per_sample, "Bytes copied per timed sample")->capture_default_str();
  cmd->add_option("--reps", o->reps, "Timed samples of each side per point")->capture_default_str();
  cmd->add_option("--backend", o->backend, "Device backend: cpu or cuda")->capture_default_str();
  cmd->add_option("--device", o->ordinal, "GPU ordinal (cuda)")->capture_default_str();
  add_output_options(*cmd, o->out, "bandwidth against copy size, per direction, beside memcpy");
  cmd->callback([&run, o, cmd] {
    run = [o, c = command_line(*cmd, "strata bench copy")] { return run_copy(*o, c); };
  });
}

}  // namespace strata::bench
