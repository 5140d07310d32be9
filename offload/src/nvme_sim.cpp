// The swap space on the sim backend. No files and no I/O: a read or a write completes at
// the virtual time the cost model gives it, on one channel per direction (a transfer
// waits for the previous one in its direction), after its `after` event and no earlier
// than the submitting thread's now. Everything is computed on the submitting thread, in
// call order, so a run is deterministic (nvme_swap.hpp says why this is not an
// IoBackend). Extents, capacity and peak are kept by the store as usual.
#include <algorithm>
#include <mutex>

#include "nvme_swap.hpp"
#include "strata/core/sim.hpp"
#include "strata/core/trace.hpp"

namespace strata::detail {

namespace {

class SimSwap final : public SwapSpace {
 public:
  SimSwap(const NvmeStoreOptions& opts, const SimCostModel& cost) : cost_(cost) {
    // No file system to ask: the store's 4 KiB grain, one stripe unit of block_size.
    layout_.capacity = opts.capacity / kMinExtentGrain * kMinExtentGrain;
    layout_.stripe = opts.aio.block_size;
  }

  const SwapLayout& layout() const override { return layout_; }
  const std::vector<std::string>& files() const override { return no_files_; }

  Event write(uint64_t offset, const void* src, uint64_t bytes, const Event& after, WriteLanded landed) override {
    Event ev = transfer(IoDir::Write, bytes, after);
    // A sim event is complete in real time when it is made, and only a failed `after`
    // fails it: there are no bytes that could fail to land. So the write is recorded
    // now, as landed, unless it never started.
    if (!ev.result()) landed(nullptr, {});
    return ev;
  }
  // Nothing was hashed (no bytes), so `expect` is always empty here.
  Event read(uint64_t offset, void* dst, uint64_t bytes, const Event& after, std::vector<uint64_t> expect) override {
    return transfer(IoDir::Read, bytes, after);
  }

  void register_buffer(void*, uint64_t) override {}
  void unregister_buffer(void*) override {}
  std::string engine_name() const override { return "sim"; }
  IoStats io_stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  Event transfer(IoDir dir, uint64_t bytes, const Event& after);

  SimCostModel cost_;
  SwapLayout layout_;
  const std::vector<std::string> no_files_;
  mutable std::mutex mu_;
  double read_free_ = 0, write_free_ = 0;  // virtual seconds
  IoStats stats_;
};

Event SimSwap::transfer(IoDir dir, uint64_t bytes, const Event& after) {
  // As moved on the device: rounded up to the alignment.
  bytes = (bytes + layout_.align - 1) / layout_.align * layout_.align;
  double ready = 0;
  std::exception_ptr err;
  try {
    ready = sim::time_of(after);
  } catch (...) {
    // The data to write (or the buffer to read into) never became valid: the transfer
    // fails as the real engine's would not start. Its time still counts from `after`.
    err = std::current_exception();
    ready = after.impl() && after.impl()->virtual_time() >= 0 ? after.impl()->virtual_time() : 0;
  }
  const bool read = dir == IoDir::Read;
  double t0, t1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    double& free = read ? read_free_ : write_free_;
    t0 = std::max({free, sim::now(), ready});
    t1 = t0 + cost_.nvme_latency + static_cast<double>(bytes) / (read ? cost_.nvme_read_bandwidth
                                                                      : cost_.nvme_write_bandwidth);
    free = t1;
    ++stats_.transfers;
    if (err) {
      ++stats_.failed_transfers;
    } else {
      stats_.bytes += bytes;
    }
  }
  if (trace::Recorder* r = trace::active())
    r->record(read ? "nvme:read" : "nvme:write", read ? "read" : "write", t0, t1);
  return sim::event_at(t1, err);
}

}  // namespace

std::unique_ptr<SwapSpace> make_sim_swap(const NvmeStoreOptions& opts, const SimCostModel& cost) {
  return std::make_unique<SimSwap>(opts, cost);
}

}  // namespace strata::detail
