// The sim backend's virtual clocks and events (sim.hpp).
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "strata/core/sim.hpp"

namespace strata::sim {

namespace {

// A new simulation bumps the epoch; a thread whose clock is of an older epoch reads 0.
std::atomic<uint64_t> g_epoch{1};

struct ThreadClock {
  uint64_t epoch = 0;
  double now = 0;
};
thread_local ThreadClock t_clock;

ThreadClock& clock() {
  const uint64_t e = g_epoch.load(std::memory_order_acquire);
  if (t_clock.epoch != e) t_clock = ThreadClock{e, 0.0};
  return t_clock;
}

class SimEvent final : public detail::EventImpl {
 public:
  SimEvent(double t, std::exception_ptr error) : t_(t), error_(std::move(error)) {}
  // Waiting is the dependency: the waiting thread's now moves to the event's time.
  void wait() override {
    advance_to(t_);
    if (error_) std::rethrow_exception(error_);
  }
  bool ready() override { return true; }
  double virtual_time() override { return t_; }

 private:
  double t_;
  std::exception_ptr error_;
};

}  // namespace

double now() { return clock().now; }

void advance_to(double t) {
  ThreadClock& c = clock();
  c.now = std::max(c.now, t);
}

void reset_clocks() { g_epoch.fetch_add(1, std::memory_order_acq_rel); }

Event event_at(double t, std::exception_ptr error) {
  return Event(std::make_shared<SimEvent>(t, std::move(error)));
}

double time_of(const Event& e) {
  ScopedNow from_zero(0.0);
  e.wait();
  return now();
}

ScopedNow::ScopedNow(double t) : saved_(now()) { clock().now = t; }
ScopedNow::~ScopedNow() { clock().now = saved_; }

}  // namespace strata::sim
