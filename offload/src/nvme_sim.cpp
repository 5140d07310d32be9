#include "nvme_sim.hpp"

#include <algorithm>

#include "strata/core/trace.hpp"

namespace strata::detail {

Event SimNvme::transfer(IoDir dir, uint64_t bytes, const Event& after) {
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

IoStats SimNvme::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace strata::detail
