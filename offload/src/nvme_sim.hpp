// Private to offload: the NVMe store's sim backend. No files and no I/O: a read or a
// write completes at the virtual time the cost model gives it, on one channel per
// direction (a transfer waits for the previous one in its direction), after its `after`
// event and no earlier than the submitting thread's now.
#pragma once

#include <cstdint>
#include <mutex>

#include "strata/core/event.hpp"
#include "strata/core/sim.hpp"
#include "strata/offload/io_engine.hpp"

namespace strata::detail {

class SimNvme {
 public:
  explicit SimNvme(const SimCostModel& cost) : cost_(cost) {}
  // bytes: as moved on the device (rounded up to the alignment).
  Event transfer(IoDir dir, uint64_t bytes, const Event& after);
  IoStats stats() const;

 private:
  SimCostModel cost_;
  mutable std::mutex mu_;
  double read_free_ = 0, write_free_ = 0;  // virtual seconds
  IoStats stats_;
};

}  // namespace strata::detail
