// The sim backend's clock and cost model (docs/architecture.md, "The sim backend and the
// trace").
//
// On the sim backend tensors have sizes but no bytes, and every operation takes the time
// the cost model gives it on a virtual clock. The real engine, memory manager and
// prefetcher run unchanged above it; what they would wait for in real time they wait for
// in simulated time instead:
//
//  - Each thread has its own virtual now (seconds). It advances only when the thread
//    waits: on an event (to the event's time) or in host work (Device::host_compute).
//  - An operation (a stream op, an NVMe transfer, a collective) starts at the latest of:
//    its lane's free time, the submitting thread's now, and the times of the events it
//    must follow; it ends its cost later, and returns an event at that time.
//  - A sim event is complete in real time the moment it is made; only its time matters.
//
// Everything is computed on the submitting thread in call order, so a run is
// deterministic: the same program gives bit-identical times. One simulation runs in a
// process at a time (a new sim device resets every thread's clock to 0).
#pragma once

#include <exception>

#include "strata/core/event.hpp"

namespace strata {

// What every simulated operation costs. Bandwidths in bytes/s, latencies in seconds.
// Defaults are of the order of one H100 with PCIe 5 and one data-centre NVMe drive.
struct SimCostModel {
  double device_flops = 400e12;          // FLOP/s, the model's kernels (Stream::compute)
  double device_bandwidth = 2.0e12;      // bytes/s, device memory: fill, add, device copies
  double h2d_bandwidth = 25e9;           // bytes/s, host -> device copies (one link)
  double d2h_bandwidth = 25e9;           // bytes/s, device -> host copies (one link)
  double pcie_latency = 10e-6;           // s, per host <-> device copy
  double nvme_read_bandwidth = 6e9;      // bytes/s, over all NVMe paths together
  double nvme_write_bandwidth = 4e9;     // bytes/s
  double nvme_latency = 80e-6;           // s, per transfer
  double collective_bandwidth = 100e9;   // bytes/s, bus bandwidth of one rank on the ring
  double collective_latency = 20e-6;     // s, per collective
  double host_bandwidth = 20e9;          // bytes/s the CPU streams through host memory
                                         // (the CPU optimizer: 28 bytes per parameter)
};

namespace sim {

// The calling thread's virtual now, in seconds.
double now();
// now = max(now, t) for the calling thread.
void advance_to(double t);
// Starts a new simulation: every thread's now reads 0 from here on.
void reset_clocks();

// An event that completes at virtual time t (failed with `error` when given).
Event event_at(double t, std::exception_ptr error = nullptr);

// The virtual time at which e completes: the latest time of its sim parts, 0 for an
// event with none (one that completes in real time, which is waited for). Does not
// change the calling thread's now. Rethrows e's error.
double time_of(const Event& e);

// Sets the calling thread's now for a scope (a stream's host task runs at the stream's
// time), then puts it back.
class ScopedNow {
 public:
  explicit ScopedNow(double t);
  ~ScopedNow();
  ScopedNow(const ScopedNow&) = delete;
  ScopedNow& operator=(const ScopedNow&) = delete;

 private:
  double saved_;
};

}  // namespace sim
}  // namespace strata
