// Private to offload: the swap space under an NvmeStore, and the seam between the store
// and what holds its bytes.
//
// The store keeps what is the same on every backend: the extent allocator, what each
// extent holds (unwritten, written, failed; its checksums), the checks on its callers,
// and the accounting. A SwapSpace is the logical striped space those extents are cut
// from, and moves bytes in and out of it. Two implementations:
//  - swap files (nvme_files.cpp): one unnamed (swap_lifetime.hpp), preallocated O_DIRECT
//    file per nvme_path, striped, all I/O through the IoEngine (io_uring or the thread
//    pool), checksums per segment;
//  - sim (nvme_sim.cpp): no files and no I/O; a transfer completes at the virtual time
//    the cost model gives it, on one channel per direction.
//
// Why the sim sits here and not under the IoEngine as one more IoBackend: an IoBackend
// is driven by a ring thread and reports completions in real time, while simulated time
// is per thread and computed on the submitting thread, in call order (core/sim.hpp). A
// sim transfer starts at the latest of its channel's free time, the caller's now and
// `after`'s virtual time; behind a ring thread the caller's now is lost, and the order
// of transfers from different callers would depend on thread scheduling, so runs would
// no longer be deterministic. The cost model also charges one latency per transfer over
// all paths together, not one per block_size request per file as the engine issues
// them, and the sim's buffers hold no bytes to move or hash. So the sim replaces the
// whole data path below the store, and the store sees one interface either way.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/core/event.hpp"
#include "strata/offload/io_engine.hpp"
#include "strata/offload/nvme_store.hpp"

namespace strata::detail {

constexpr uint64_t kMinExtentGrain = 4096;  // bytes; extents stay page-granular even where O_DIRECT allows 512

// The space a backend settled on at setup; the store carves extents from it.
struct SwapLayout {
  uint64_t capacity = 0;               // bytes of logical swap space
  uint64_t align = kMinExtentGrain;    // bytes; buffers and transfer lengths are multiples
  uint64_t grain = kMinExtentGrain;    // bytes; extent granularity, max(align, 4 KiB)
  uint64_t stripe = 0;                 // bytes per stripe unit
};

// Called when a write has landed, with its error (null when every byte is in place) and
// the checksums of what was written (one per segment; empty without checksums). Not
// called when the write never started because its `after` failed: the extent then
// still holds what it held before. May run on an I/O thread; must not throw.
using WriteLanded = std::function<void(std::exception_ptr error, std::vector<uint64_t> hashes)>;

class SwapSpace {
 public:
  virtual ~SwapSpace() = default;  // finishes the transfers in flight first
  virtual const SwapLayout& layout() const = 0;
  virtual const std::vector<std::string>& files() const = 0;  // /proc/self/fd/<fd> each; none on sim

  // Moves `bytes` (rounded up to layout().align) between the buffer and the space at
  // logical `offset`, once `after` has completed; a failed `after` fails the transfer
  // with its error. On swap files a failed transfer's IoError names path, offset and
  // length; the sim has no I/O to fail. The buffer holds `bytes` rounded up and stays
  // valid until the event completes.
  virtual Event write(uint64_t offset, const void* src, uint64_t bytes, const Event& after, WriteLanded landed) = 0;
  // `expect`: the checksums given to WriteLanded by the last write of these bytes, or
  // empty to skip verification; on a mismatch the event fails with CorruptionError.
  virtual Event read(uint64_t offset, void* dst, uint64_t bytes, const Event& after, std::vector<uint64_t> expect) = 0;

  // Fixed-buffer registration (IoEngine::register_buffer); a no-op where there is no I/O.
  virtual void register_buffer(void* base, uint64_t bytes) = 0;
  virtual void unregister_buffer(void* base) = 0;

  virtual std::string engine_name() const = 0;  // "io_uring", "threadpool" or "sim"
  virtual IoStats io_stats() const = 0;
};

// Creates and preallocates the swap files (NvmeStore's constructor documents the errors).
std::unique_ptr<SwapSpace> make_swap_files(const NvmeStoreOptions& opts);
// The sim's virtual channels, priced by `cost`.
std::unique_ptr<SwapSpace> make_sim_swap(const NvmeStoreOptions& opts, const SimCostModel& cost);

// The one place that picks: the sim backend's device sets opts.sim.
inline std::unique_ptr<SwapSpace> make_swap_space(const NvmeStoreOptions& opts) {
  return opts.sim ? make_sim_swap(opts, *opts.sim) : make_swap_files(opts);
}

}  // namespace strata::detail
