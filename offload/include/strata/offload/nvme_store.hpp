// The NVMe tier: swap files on one or more directories (`nvme_path`), preallocated with
// fallocate and carved into extents that are reused when freed. A tensor's extent is
// striped across every path. All I/O goes through the IoEngine (io_uring with O_DIRECT,
// or the thread-pool fallback), asynchronously, completing as events.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/core/event.hpp"
#include "strata/offload/aio_config.hpp"

namespace strata {

class IoEngine;
struct FaultPlan;

struct NvmeStoreOptions {
  std::vector<std::string> paths;  // directories; one swap file is made in each
  uint64_t capacity = 0;           // bytes, over all paths together (the nvme budget)
  AioConfig aio;                   // block size, queue depth, rings, engine choice
  bool checksums = false;          // xxHash per extent, verified on every read
  std::shared_ptr<FaultPlan> faults;  // optional fault injection under the engine (tests)
};

// A range of the swap space. Offsets and lengths are multiples of alignment().
struct Extent {
  uint64_t offset = 0;  // logical bytes into the striped swap space
  uint64_t bytes = 0;   // bytes reserved (rounded up)
  bool valid() const { return bytes != 0; }
};

class NvmeStore {
 public:
  // Creates and preallocates the swap files. Throws OutOfBudget (naming the path, the
  // free space and the need) when the file system cannot hold `capacity`, before any I/O.
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
  Event write(const Extent& e, const void* src, uint64_t bytes);
  // Reads back what was last written. On checksum mismatch the event fails with
  // CorruptionError; on any failure dst must not be taken as valid.
  Event read(const Extent& e, void* dst, uint64_t bytes);

  // Registers a pinned region for fixed-buffer I/O (READ_FIXED/WRITE_FIXED).
  void register_buffer(void* base, uint64_t bytes);

  uint64_t alignment() const;       // bytes; O_DIRECT alignment probed from the file system
  uint64_t capacity() const;        // bytes
  uint64_t used() const;            // bytes
  uint64_t peak() const;            // bytes
  uint64_t largest_free() const;    // bytes
  const std::vector<std::string>& files() const;  // swap file paths
  std::string engine_name() const;  // "io_uring" or "threadpool"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
