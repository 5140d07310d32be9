// The NVMe tier: swap files on one or more directories (`nvme_path`), preallocated with
// fallocate and carved into extents that are reused when freed. The swap files have no
// name (O_TMPFILE, or unlinked right after creation), so their space returns to the file
// system however the process ends; named ones left by older versions are reclaimed at
// start when their process is gone. A tensor's extent is
// striped across every path. All I/O goes through the IoEngine (io_uring with O_DIRECT,
// or the thread-pool fallback), asynchronously, completing as events. On the sim
// backend the same store runs over simulated channels instead of files (`sim` below);
// callers see no difference but the times.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/core/event.hpp"
#include "strata/core/sim.hpp"
#include "strata/offload/aio_config.hpp"
#include "strata/offload/io_engine.hpp"

namespace strata {

class IoEngine;
struct FaultPlan;

struct NvmeStoreOptions {
  std::vector<std::string> paths;  // directories; one (unnamed) swap file is made in each
  uint64_t capacity = 0;           // bytes, over all paths together (the nvme budget)
  // Set when the capacity was sized automatically (what the states homed on NVMe need,
  // strata.nvme_budget unset), so that a refusal names the fix that applies.
  bool capacity_automatic = false;
  AioConfig aio;                   // block size, queue depth, rings, engine choice
  bool checksums = false;          // xxHash per extent, verified on every read
  std::shared_ptr<FaultPlan> faults;  // optional fault injection under the engine (tests)
  // Set on the sim backend (Device::cost_model()): no files are made and no I/O is done;
  // each transfer completes at the virtual time this model gives it, one channel per
  // direction. Paths are not touched; extents, capacity and peak are kept as usual.
  std::optional<SimCostModel> sim;
};

// A range of the swap space. Offsets and lengths are multiples of alignment().
struct Extent {
  uint64_t offset = 0;  // logical bytes into the striped swap space
  uint64_t bytes = 0;   // bytes reserved (rounded up)
  bool valid() const { return bytes != 0; }
};

class NvmeStore {
 public:
  // Removes stale named swap files of dead processes from the paths (logging what it
  // reclaimed), then creates and preallocates the swap files. Throws OutOfBudget (naming
  // the path, the free space and the need) when the file system cannot hold `capacity`,
  // before any I/O.
  explicit NvmeStore(NvmeStoreOptions opts);
  ~NvmeStore();

  // Throws OutOfBudget when no free extent is large enough.
  Extent allocate(uint64_t bytes);
  // nullopt-like: returns an invalid Extent instead of throwing.
  Extent try_allocate(uint64_t bytes);
  void free(const Extent& e);

  // Writes `bytes` from src (aligned to alignment(); pinned-pool memory uses registered
  // buffers) into the extent. `bytes` may be less than e.bytes; it is padded up to the
  // alignment on disk. The event fails with IoError naming path, offset and length.
  // The transfer starts once `after` completes (the source's data is in place, the
  // destination is no longer in use); the real engine waits for it on the calling thread.
  Event write(const Extent& e, const void* src, uint64_t bytes, const Event& after = {});
  // Reads back what was last written. On checksum mismatch the event fails with
  // CorruptionError; on any failure dst must not be taken as valid.
  // For both: the buffer must hold `bytes` rounded up to alignment(), and stay valid
  // until the event completes. With checksums on, a read of a written extent must ask
  // for exactly the bytes last written (anything else is a bug and aborts); a read of an
  // extent whose last write failed fails with CorruptionError.
  Event read(const Extent& e, void* dst, uint64_t bytes, const Event& after = {});

  // Registers a pinned region for fixed-buffer I/O (READ_FIXED/WRITE_FIXED).
  void register_buffer(void* base, uint64_t bytes);
  // Forgets a region given to register_buffer; call before releasing its memory.
  void unregister_buffer(void* base);

  uint64_t alignment() const;       // bytes; O_DIRECT alignment probed from the file system
  uint64_t capacity() const;        // bytes
  uint64_t used() const;            // bytes
  uint64_t peak() const;            // bytes
  uint64_t largest_free() const;    // bytes
  // /proc/self/fd/<fd> of each swap file, one per path: the files have no name, and
  // this path reaches them from this process while the store lives (tests, bench). I/O
  // errors name them as "/proc/self/fd/<fd> (unnamed swap file in <dir>)".
  const std::vector<std::string>& files() const;
  std::string engine_name() const;  // "io_uring", "threadpool" or "sim"
  uint64_t stripe_unit() const;     // bytes; consecutive units go to consecutive files
  IoStats io_stats() const;         // requests, resubmissions, retries, bytes moved

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
