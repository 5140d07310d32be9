// strata bench capacity: the effective bandwidth of moving tensors to the device through
// the tiers, against the size of the working set, beside the raw bandwidth of the tiers
// involved, in the same run. The curve shows what each added tier of capacity costs.
//
// Setup: one TieredStore with small budgets (--device-budget, --pinned-budget) and an
// NVMe tier in --dir. Tensors of --tensor-size, homed on NVMe, are written once. For each
// working set W (a prefix of W / tensor-size tensors), the store is given the order of
// one pass as its schedule (so it evicts by Belady: furthest next use first), and a pass
// acquires every tensor on the device in that order, as a training step does: fetches run
// --lookahead tensors ahead of the acquire, each acquired tensor is released at once
// (the device copy stays a cache until evicted). While W fits in pinned memory the pass
// is pinned -> device copies; beyond it, part of every pass comes from NVMe.
//
// Effective bandwidth = W / (time of a pass), after one untimed warm-up pass.
// References, timed in the same run, alternating with the store's passes:
//  - memcpy: W bytes in tensor-sized memcpys, on the calling thread, from a pinned
//    buffer of --pinned-budget bytes into a device arena of --device-budget bytes (the
//    cpu backend's device memory is host RAM, so this is the copy tier's raw bandwidth;
//    on cuda the destination is host memory, and it is host memory bandwidth).
//  - nvme: for working sets whose passes read from NVMe, raw O_DIRECT reads of as many
//    bytes as the pass read, through an IoEngine with the store's aio settings, from the
//    store's own swap file, --lookahead tensors in flight.
//  - bound = W / max(pinned->device bytes per pass / memcpy, nvme bytes per pass / nvme):
//    what the tiers allow for the bytes that really had to move (a tensor still cached
//    on the device moves nothing) if every transfer overlapped perfectly.
//    ratio = effective / bound. While the whole working set stays on the device nothing
//    moves and there is no bound.
//  - serial = W / (pinned->device bytes / memcpy + NVMe bytes / nvme raw): the same
//    moves with no overlap at all, each tier waiting for the other.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
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
#include "strata/offload/io_engine.hpp"
#include "strata/offload/tiered_store.hpp"

namespace strata::bench {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct CapacityOptions {
  std::vector<std::string> working_sets{"128M", "192M", "256M", "384M", "512M", "1G", "2G"};
  std::string tensor_size = "8M";
  std::string device_budget = "64M";
  std::string pinned_budget = "256M";
  std::string dir = ".";
  unsigned lookahead = 4;  // tensors fetched ahead of the one acquired
  unsigned reps = 5;
  std::string block_size = "1M";  // NVMe requests
  unsigned queue_depth = 32;
  std::string backend = "cpu";
  OutputOptions out;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The swap file opened again, read-only with O_DIRECT, for the raw-read reference.
class RawFile {
 public:
  explicit RawFile(const std::string& path) : path_(path) {
    fd_ = open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd_ < 0) throw IoError("bench capacity: cannot open the swap file for the raw-read reference", path, 0, 0, errno);
  }
  ~RawFile() { close(fd_); }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// The options, checked: sizes in bytes, working sets ascending without repeats.
struct CapacitySizes {
  uint64_t tensor = 0;          // bytes per tensor
  uint64_t device_budget = 0;   // bytes
  uint64_t pinned_budget = 0;   // bytes
  uint64_t block = 0;           // bytes per NVMe request
  std::vector<uint64_t> sets;   // working sets, bytes
  Backend backend = Backend::Cpu;
};

CapacitySizes check_capacity_options(const CapacityOptions& o) {
  CapacitySizes z;
  z.tensor = parse_byte_count(o.tensor_size, "--tensor-size");
  z.device_budget = parse_byte_count(o.device_budget, "--device-budget");
  z.pinned_budget = parse_byte_count(o.pinned_budget, "--pinned-budget");
  z.block = parse_byte_count(o.block_size, "--block-size");
  const uint64_t tensor = z.tensor;
  if (tensor < 4096 || tensor % 4096 != 0) throw ConfigError("--tensor-size " + o.tensor_size + " must be a multiple of 4K");
  if (z.block < 4096 || (z.block & (z.block - 1)) != 0) throw ConfigError("--block-size " + o.block_size + " must be a power of two, at least 4K");
  if (o.queue_depth < 1 || o.queue_depth > 4096) throw ConfigError("--queue-depth must be from 1 to 4096");
  if (o.reps < 1) throw ConfigError("--reps must be at least 1");
  if (o.lookahead < 1) throw ConfigError("--lookahead must be at least 1 (tensors fetched ahead)");
  // The device holds the acquired tensor and the ones fetched ahead, with room to evict.
  if ((o.lookahead + 2) * tensor > z.device_budget)
    throw ConfigError("--device-budget " + o.device_budget + " holds " + std::to_string(z.device_budget / tensor) +
                      " tensors of " + o.tensor_size + "; --lookahead " + std::to_string(o.lookahead) + " needs " +
                      std::to_string(o.lookahead + 2) + " (the one in use, those ahead, one to evict): raise "
                      "--device-budget or lower --lookahead");
  // NVMe -> device moves stage in pinned memory: the same holds there.
  if ((o.lookahead + 2) * tensor > z.pinned_budget)
    throw ConfigError("--pinned-budget " + o.pinned_budget + " holds " + std::to_string(z.pinned_budget / tensor) +
                      " tensors of " + o.tensor_size + "; staging " + std::to_string(o.lookahead) +
                      " fetches ahead needs " + std::to_string(o.lookahead + 2) + ": raise --pinned-budget");
  for (const auto& w : o.working_sets) {
    const uint64_t v = parse_byte_count(w, "--working-sets");
    if (v < tensor || v % tensor != 0)
      throw ConfigError("--working-sets: " + w + " must be a positive multiple of --tensor-size " + o.tensor_size);
    if (v / tensor < 2) throw ConfigError("--working-sets: " + w + " holds one tensor; give at least two");
    z.sets.push_back(v);
  }
  if (z.sets.empty()) throw ConfigError("--working-sets needs at least one size");
  std::sort(z.sets.begin(), z.sets.end());
  z.sets.erase(std::unique(z.sets.begin(), z.sets.end()), z.sets.end());
  z.backend = parse_backend(o.backend);
  if (z.backend == Backend::Sim)
    throw ConfigError("--backend sim: simulated tiers have no bytes and no real bandwidth; use cpu or cuda");
  std::error_code ec;
  if (!std::filesystem::is_directory(o.dir, ec))
    throw ConfigError("--dir '" + o.dir + "' is not a directory; give an existing directory on the disk for the NVMe tier");
  return z;
}

// The store: small device and pinned budgets, an NVMe tier in --dir with room for the
// largest working set.
TieredStoreOptions store_options(const CapacityOptions& o, const CapacitySizes& z) {
  TieredStoreOptions so;
  so.device_budget = z.device_budget;
  so.pinned_budget = z.pinned_budget;
  so.nvme.paths = {o.dir};
  so.nvme.capacity = z.sets.back() / z.tensor * z.tensor + (16ull << 20);
  so.nvme.aio.block_size = z.block;
  so.nvme.aio.queue_depth = o.queue_depth;
  return so;
}

// The tensors, written once to their NVMe home. Each holds random bytes with its index
// in the first 8, which a pass checks.
std::vector<TensorId> write_tensors(TieredStore& store, uint64_t tensor, size_t count, const std::string& dir,
                                    Progress& progress) {
  std::vector<TensorId> ids;
  std::vector<char> pattern(tensor);
  std::mt19937_64 rng(7);
  for (uint64_t i = 0; i + 8 <= tensor; i += 8) {
    const uint64_t v = rng();
    std::memcpy(pattern.data() + i, &v, 8);
  }
  for (size_t i = 0; i < count; ++i) {
    if (i % 16 == 0) progress.show("writing " + std::to_string(i) + "/" + std::to_string(count) + " tensors to " + dir);
    const TensorId id = store.add({.name = "t." + std::to_string(i), .bytes = tensor, .home = Tier::Nvme,
                                   .owner = "bench"});
    Acquired a = store.acquire_for_overwrite(id, Tier::Pinned);
    a.ready.wait();
    std::memcpy(a.data, pattern.data(), tensor);
    const uint64_t tag = i;
    std::memcpy(a.data, &tag, 8);
    store.release(id, Tier::Pinned, Access::Write);
    store.flush(id).wait();
    store.drop(id, Tier::Pinned).wait();
    ids.push_back(id);
  }
  store.quiesce();
  return ids;
}

// The store's side: passes over a prefix of the tensors in order, as a training step
// acquires them, checking the tag of the first and last tensor of each.
class StorePasses {
 public:
  StorePasses(TieredStore& store, const std::vector<TensorId>& ids, unsigned lookahead, Device& dev)
      : store_(store), ids_(ids), lookahead_(lookahead), check_stream_(dev.create_stream("bench-capacity-check")) {}

  // One sample: a pass over the first n tensors, fetching `lookahead` ahead. Returns
  // seconds; adds the pass's NVMe -> pinned bytes to *nvme_bytes and its pinned ->
  // device bytes to *copy_bytes.
  double run(size_t n, uint64_t* nvme_bytes, uint64_t* copy_bytes, std::vector<double>* cpu_share) {
    const StoreStats before = store_.stats();
    size_t issued = 0;
    const double cpu0 = process_cpu_seconds();
    const auto t0 = Clock::now();
    for (size_t i = 0; i < n; ++i) {
      store_.set_position(i);
      for (; issued < std::min(n, i + 1 + lookahead_); ++issued) store_.fetch(ids_[issued], Tier::Device);
      Acquired a = store_.acquire(ids_[i], Tier::Device);
      a.ready.wait();
      if (i == 0 || i + 1 == n) {  // the tensor arrived: its tag is its index
        check_stream_->copy_async(&check_buf_, a.data, 8);
        check_stream_->synchronize();
        if (check_buf_ != i) ++mismatches_;
      }
      store_.release(ids_[i], Tier::Device);
    }
    const double s = seconds_since(t0);
    if (cpu_share) cpu_share->push_back((process_cpu_seconds() - cpu0) / s);
    store_.quiesce();
    const StoreStats after = store_.stats();
    *nvme_bytes += after.bytes_moved[2][1] - before.bytes_moved[2][1];
    *copy_bytes += after.bytes_moved[1][0] - before.bytes_moved[1][0];
    return s;
  }

  uint64_t mismatches() const { return mismatches_; }

 private:
  TieredStore& store_;
  const std::vector<TensorId>& ids_;
  size_t lookahead_;
  std::unique_ptr<Stream> check_stream_;
  uint64_t check_buf_ = 0;
  uint64_t mismatches_ = 0;
};

// The references (see the header comment), with memory of their own: a pinned buffer
// like the pinned tier, a device-sized one (a device arena of its own on cpu, where that
// is host RAM of the same kind as the device tier's; plain host memory elsewhere), and
// read buffers for the raw NVMe reads of the store's swap file.
class References {
 public:
  References(Device& dev, const CapacitySizes& z, unsigned lookahead, const std::string& swap, const AioConfig& aio)
      : tensor_(z.tensor), src_bytes_(z.pinned_budget), dst_bytes_(z.device_budget), lookahead_(lookahead),
        pool_(make_pinned_pool(dev, {.budget = z.pinned_budget + (lookahead + 1) * z.tensor})), raw_(swap) {
    src_ = static_cast<char*>(pool_->try_allocate(z.pinned_budget, "bench-ref"));
    read_ = static_cast<char*>(pool_->try_allocate((lookahead + 1) * z.tensor, "bench-ref"));
    if (z.backend == Backend::Cpu) {
      arena_ = make_device_arena(dev, z.device_budget);
      dst_ = static_cast<char*>(arena_->try_allocate(z.device_budget, "bench-ref"));
    } else {
      dst_storage_.resize(z.device_budget);
      dst_ = dst_storage_.data();
    }
    STRATA_CHECK(src_ && read_ && dst_, "the reference pools could not give their budgets");
    std::memset(src_, 1, z.pinned_budget);
    std::memset(dst_, 2, z.device_budget);
    std::memset(read_, 3, (lookahead + 1) * z.tensor);
    IoEngineOptions eo;
    eo.aio = aio;
    eo.on_full = "free space on it or give --dir on a disk with room";
    eo.files = {IoFile{swap, raw_.fd()}};
    eo.alignment = probe_dio_alignment(raw_.fd());
    engine_ = std::make_unique<IoEngine>(std::move(eo));
    engine_->register_buffer(read_, (lookahead + 1) * z.tensor);
  }

  // W bytes in tensor-sized memcpys. Returns seconds; adds the share of a core the
  // copying thread got to *cpu_share.
  double memcpy_pass(uint64_t bytes, std::vector<double>* cpu_share) {
    const uint64_t src_slots = src_bytes_ / tensor_, dst_slots = dst_bytes_ / tensor_;
    const double cpu0 = thread_cpu_seconds();
    const auto t0 = Clock::now();
    for (uint64_t i = 0; i < bytes / tensor_; ++i)
      std::memcpy(dst_ + (i % dst_slots) * tensor_, src_ + (i % src_slots) * tensor_, tensor_);
    asm volatile("" : : "r"(dst_) : "memory");
    const double s = seconds_since(t0);
    cpu_share->push_back((thread_cpu_seconds() - cpu0) / s);
    return s;
  }

  // Raw O_DIRECT reads of `bytes` (whole tensors) from the swap file's first n tensors.
  // Returns bytes/s.
  double nvme_pass(uint64_t bytes, size_t n) {
    const uint64_t count = std::max<uint64_t>(1, bytes / tensor_);
    std::deque<Event> inflight;
    const auto t0 = Clock::now();
    for (uint64_t i = 0; i < count; ++i) {
      if (inflight.size() > lookahead_) {
        inflight.front().wait();
        inflight.pop_front();
      }
      inflight.push_back(engine_->read(0, (i % n) * tensor_, read_ + (i % (lookahead_ + 1)) * tensor_, tensor_));
    }
    while (!inflight.empty()) {
      inflight.front().wait();
      inflight.pop_front();
    }
    return static_cast<double>(count * tensor_) / seconds_since(t0);
  }

 private:
  uint64_t tensor_, src_bytes_, dst_bytes_;  // bytes
  uint64_t lookahead_;
  std::unique_ptr<TierPool> pool_;    // src_ and read_
  std::unique_ptr<TierPool> arena_;   // dst_ on cpu
  std::vector<char> dst_storage_;     // dst_ elsewhere
  char* src_ = nullptr;
  char* read_ = nullptr;
  char* dst_ = nullptr;
  RawFile raw_;
  std::unique_ptr<IoEngine> engine_;  // over raw_, reading into read_
};

struct Point {
  uint64_t bytes;
  size_t tensors;
  std::vector<double> strata, memcpy_bw, nvme_bw;  // bytes/s
  std::vector<double> memcpy_cpu;                  // share of a core the memcpy thread got
  std::vector<double> strata_cpu;                  // cores the whole process used during a pass
  uint64_t nvme_bytes = 0;                         // NVMe -> pinned, over the timed passes
  uint64_t copy_bytes = 0;                         // pinned -> device, over the timed passes
};

// For each working set: the pass order as the store's schedule, one untimed warm-up
// pass, then --reps store passes alternating with the references (which goes first
// alternates too).
std::vector<Point> measure_points(const CapacityOptions& o, const CapacitySizes& z, TieredStore& store,
                                  const std::vector<TensorId>& ids, StorePasses& passes, References& refs,
                                  Progress& progress) {
  std::vector<Point> points;
  for (uint64_t w : z.sets) {
    Point p{w, static_cast<size_t>(w / z.tensor), {}, {}, {}, {}, {}, 0, 0};
    std::vector<TensorId> order(ids.begin(), ids.begin() + static_cast<long>(p.tensors));
    store.set_schedule(order);
    uint64_t warm_nvme = 0, warm_copy = 0;
    progress.show(short_size(w) + ": warm-up pass");
    passes.run(p.tensors, &warm_nvme, &warm_copy, nullptr);
    for (unsigned rep = 0; rep < o.reps; ++rep) {
      progress.show(short_size(w) + ": rep " + std::to_string(rep + 1) + "/" + std::to_string(o.reps));
      const bool strata_first = rep % 2 == 0;
      auto run_refs = [&] {
        p.memcpy_bw.push_back(static_cast<double>(w) / refs.memcpy_pass(w, &p.memcpy_cpu));
        // Sized by what the store's passes read from NVMe so far at this size.
        const uint64_t read = p.strata.empty() ? warm_nvme : p.nvme_bytes / p.strata.size();
        if (read > 0) p.nvme_bw.push_back(refs.nvme_pass(read, p.tensors));
      };
      if (!strata_first) run_refs();
      uint64_t nb = 0, cb = 0;
      p.strata.push_back(static_cast<double>(w) / passes.run(p.tensors, &nb, &cb, &p.strata_cpu));
      p.nvme_bytes += nb;
      p.copy_bytes += cb;
      if (strata_first) run_refs();
    }
    points.push_back(std::move(p));
  }
  return points;
}

// One row of the table: the store's bandwidth beside the references, the bound and the
// serial time they give for the bytes that moved.
json point_row(const Point& p, const CapacitySizes& z) {
  const Summary s = summarize(p.strata), m = summarize(p.memcpy_bw), nv = summarize(p.nvme_bw);
  const double nvme_per_pass = static_cast<double>(p.nvme_bytes) / static_cast<double>(p.strata.size());
  const double copy_per_pass = static_cast<double>(p.copy_bytes) / static_cast<double>(p.strata.size());
  const double w = static_cast<double>(p.bytes);
  double bound_time = m.median > 0 ? copy_per_pass / m.median : 0;
  if (nvme_per_pass > 0 && nv.median > 0) bound_time = std::max(bound_time, nvme_per_pass / nv.median);
  const double bound = bound_time > 0 ? w / bound_time : 0;
  double serial_time = m.median > 0 ? copy_per_pass / m.median : 0;
  if (nvme_per_pass > 0 && nv.median > 0) serial_time += nvme_per_pass / nv.median;
  const double serial = serial_time > 0 ? w / serial_time : 0;
  return json{{"working_set", short_size(p.bytes)},
              {"working_set_bytes", p.bytes},
              {"tensors", p.tensors},
              {"x_pinned", w / static_cast<double>(z.pinned_budget)},
              {"tier", nvme_per_pass > 0 ? "nvme" : p.bytes <= z.device_budget ? "device" : "pinned"},
              {"nvme_fraction", nvme_per_pass / w},
              {"nvme_bytes_per_pass", nvme_per_pass},
              {"copy_bytes_per_pass", copy_per_pass},
              {"device_hit_fraction", 1.0 - copy_per_pass / w},
              {"strata_gbps", s.median / 1e9},
              {"strata_min_gbps", s.min / 1e9},
              {"strata_max_gbps", s.max / 1e9},
              {"strata_spread", s.spread()},
              {"strata_cpu_share", summarize(p.strata_cpu).median},
              {"memcpy_gbps", m.median / 1e9},
              {"memcpy_min_gbps", m.min / 1e9},
              {"memcpy_max_gbps", m.max / 1e9},
              {"memcpy_cpu_share", summarize(p.memcpy_cpu).median},
              {"nvme_raw_gbps", p.nvme_bw.empty() ? json() : json(nv.median / 1e9)},
              {"nvme_raw_min_gbps", p.nvme_bw.empty() ? json() : json(nv.min / 1e9)},
              {"nvme_raw_max_gbps", p.nvme_bw.empty() ? json() : json(nv.max / 1e9)},
              {"bound_gbps", bound > 0 ? json(bound / 1e9) : json()},
              {"ratio", bound > 0 ? json(s.median / bound) : json()},
              {"serial_gbps", serial > 0 ? json(serial / 1e9) : json()},
              {"strata_runs_bytes_per_s", p.strata},
              {"memcpy_runs_bytes_per_s", p.memcpy_bw},
              {"nvme_raw_runs_bytes_per_s", p.nvme_bw}};
}

Report capacity_report(const CapacityOptions& o, const CapacitySizes& z, const Device& dev, TieredStore& store,
                       const StoreStats& st, const std::vector<Point>& points, uint64_t mismatches,
                       double load_start, const std::string& command) {
  Report r;
  r.benchmark = "capacity";
  r.command = command;
  r.title = "strata bench capacity: tensors of " + format_bytes(z.tensor) + " to the device through device " +
            format_bytes(z.device_budget) + " / pinned " + format_bytes(z.pinned_budget) + " / NVMe (" + o.dir +
            ") tiers; GB/s = 1e9 B/s, median over " + std::to_string(o.reps) + " passes [min, max]";
  r.config = {{"backend", to_string(z.backend)},
              {"device", dev.description()},
              {"tensor_bytes", z.tensor},
              {"device_budget_bytes", z.device_budget},
              {"pinned_budget_bytes", z.pinned_budget},
              {"nvme_dir", o.dir},
              {"nvme_engine", store.nvme()->engine_name()},
              {"block_size", z.block},
              {"queue_depth", o.queue_depth},
              {"lookahead_tensors", o.lookahead},
              {"reps", o.reps},
              {"eviction", "Belady (the pass order is the store's schedule)"},
              {"load_average_start", load_start},
              {"load_average_end", load_average()}};
  r.table.columns = {{"working_set", "working set", ""},
                     {"x_pinned", "x pinned", "%.2f"},
                     {"tier", "spills to", ""},
                     {"device_hit_fraction", "on device", "%.2f"},
                     {"nvme_fraction", "from NVMe", "%.2f"},
                     {"strata_gbps", "strata GB/s", "%.3f"},
                     {"strata_min_gbps", "min", "%.3f"},
                     {"strata_max_gbps", "max", "%.3f"},
                     {"strata_cpu_share", "strata cpu", "%.2f"},
                     {"memcpy_gbps", "memcpy GB/s", "%.2f"},
                     {"memcpy_cpu_share", "memcpy cpu", "%.2f"},
                     {"nvme_raw_gbps", "nvme raw GB/s", "%.3f"},
                     {"serial_gbps", "serial GB/s", "%.3f"},
                     {"bound_gbps", "bound GB/s", "%.3f"},
                     {"ratio", "strata/bound", "%.3f"}};
  for (const Point& p : points) r.table.rows.push_back(point_row(p, z));
  r.extra["tag_mismatches"] = mismatches;
  r.extra["store"] = {{"moves", st.moves},
                      {"evictions", st.evictions},
                      {"writebacks", st.writebacks},
                      {"failed_moves", st.failed_moves},
                      {"bytes_nvme_to_pinned", st.bytes_moved[2][1]},
                      {"bytes_pinned_to_device", st.bytes_moved[1][0]},
                      {"peak_device_bytes", st.tiers[0].peak},
                      {"peak_pinned_bytes", st.tiers[1].peak}};
  r.notes.push_back("on device: share of each pass still cached on the device (nothing moved); from NVMe: share read "
                    "from NVMe; the rest was copied from pinned memory.");
  r.notes.push_back("strata cpu: CPU seconds of all the process's threads (copy stream, I/O rings and their kernel "
                    "workers, completers, the bench thread) per second of a pass (median).");
  r.notes.push_back("memcpy cpu: the share of a core the memcpy reference's thread got while it ran (median); "
                    "below 1, other work on the machine took the rest, and every column is slowed by it.");
  r.notes.push_back("bound: the bandwidth the tiers allow for the bytes that moved, with perfect overlap (memcpy and "
                    "nvme raw columns, measured in the same run); serial: the same with no overlap at all.");
  char peaks[200];
  std::snprintf(peaks, sizeof peaks, "peak device %s of %s, peak pinned %s of %s; %llu tensors checked, %llu wrong",
                format_bytes(st.tiers[0].peak).c_str(), format_bytes(z.device_budget).c_str(),
                format_bytes(st.tiers[1].peak).c_str(), format_bytes(z.pinned_budget).c_str(),
                static_cast<unsigned long long>(2 * (o.reps + 1) * points.size()),
                static_cast<unsigned long long>(mismatches));
  r.notes.push_back(peaks);
  return r;
}

int run_capacity(const CapacityOptions& o, const std::string& command) {
  check_output_options(o.out);
  const CapacitySizes z = check_capacity_options(o);
  const double load_start = load_average();

  // Setup: the store, its tensors on NVMe, and the references.
  auto dev = make_device({z.backend, 0});
  const TieredStoreOptions so = store_options(o, z);
  TieredStore store(*dev, so);
  Progress progress("strata bench capacity");
  const std::vector<TensorId> ids = write_tensors(store, z.tensor, z.sets.back() / z.tensor, o.dir, progress);
  References refs(*dev, z, o.lookahead, store.nvme()->files().at(0), so.nvme.aio);
  StorePasses passes(store, ids, o.lookahead, *dev);

  const std::vector<Point> points = measure_points(o, z, store, ids, passes, refs, progress);
  progress.done();

  const StoreStats st = store.stats();
  emit(capacity_report(o, z, *dev, store, st, points, passes.mismatches(), load_start, command), o.out);
  return passes.mismatches() == 0 && st.failed_moves == 0 ? 0 : 1;
}

}  // namespace

void add_capacity(CLI::App& bench, Runner& run) {
  auto* cmd = bench.add_subcommand(
      "capacity", "Bandwidth of moving tensors to the device against working-set size, through pinned memory and NVMe");
  auto o = std::make_shared<CapacityOptions>();
  cmd->add_option("--working-sets", o->working_sets, std::string("Working-set sizes, comma-separated (") + kByteCountUnits + ")")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--tensor-size", o->tensor_size, "Bytes per tensor")->capture_default_str();
  cmd->add_option("--device-budget", o->device_budget, "Device tier budget")->capture_default_str();
  cmd->add_option("--pinned-budget", o->pinned_budget, "Pinned tier budget")->capture_default_str();
  cmd->add_option("--dir", o->dir, "Directory for the NVMe tier's swap file")->capture_default_str();
  cmd->add_option("--lookahead", o->lookahead, "Tensors fetched ahead of the one acquired")->capture_default_str();
  cmd->add_option("--reps", o->reps, "Timed passes per working set")->capture_default_str();
  cmd->add_option("--block-size", o->block_size, "NVMe request size")->capture_default_str();
  cmd->add_option("--queue-depth", o->queue_depth, "NVMe requests in flight")->capture_default_str();
  cmd->add_option("--backend", o->backend, "Device backend: cpu or cuda")->capture_default_str();
  add_output_options(*cmd, o->out, "bandwidth against working-set size, beside the tiers' raw bandwidth");
  cmd->callback([&run, o, cmd] {
    run = [o, c = command_line(*cmd, "strata bench capacity")] { return run_capacity(*o, c); };
  });
}

}  // namespace strata::bench
